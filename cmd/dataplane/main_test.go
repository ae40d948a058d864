package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"version"}, &out, io.Discard))
	require.Regexp(t, `^dataplane \S+ \(go1\.\d+`, out.String())
	require.Contains(t, out.String(), "native kernels: ")
}

func TestUsageErrors(t *testing.T) {
	var errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), nil, io.Discard, &errOut))
	require.Contains(t, errOut.String(), "Usage:")
	errOut.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"frobnicate"}, io.Discard, &errOut))
	require.Contains(t, errOut.String(), `unknown command "frobnicate"`)
	errOut.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"serve", "--no-such-flag"}, io.Discard, &errOut))
	require.Contains(t, errOut.String(), "flag provided but not defined: -no-such-flag")
	require.Equal(t, 2, run(context.Background(), []string{"serve", "--log-level", "loud"}, io.Discard, io.Discard))
	require.Equal(t, 0, run(context.Background(), []string{"serve", "-h"}, io.Discard, io.Discard))
	require.Equal(t, 1, run(context.Background(), []string{"serve", "--listen", "256.0.0.1:99999"}, io.Discard, io.Discard))
}

// serve starts, logs its address and backends, answers /healthz, and exits 0 when its
// context ends (what SIGINT/SIGTERM do).
func TestServeRunsAndDrains(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logR, logW := io.Pipe()
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0"}, io.Discard, logW)
		logW.Close()
	}()

	var addr string
	lines := bufio.NewScanner(logR)
	listen := regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`)
	for addr == "" && lines.Scan() {
		if m := listen.FindStringSubmatch(lines.Text()); m != nil {
			addr = m[1]
		}
	}
	require.NotEmpty(t, addr, "no listen address logged")
	require.True(t, lines.Scan())
	require.Contains(t, lines.Text(), "msg=backends cpu=")
	go io.Copy(io.Discard, logR) //nolint:errcheck // keep the logger from blocking

	resp, err := http.Get("http://" + addr + "/healthz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, "ok\n", string(body))

	cancel()
	select {
	case c := <-code:
		require.Equal(t, 0, c)
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not exit after its context ended")
	}
}

// The test binary stands in for the dataplane binary when serve runs it as a child
// (`dataplane gpu-probe`): dispatch like main does instead of running the tests again.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "gpu-probe" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
