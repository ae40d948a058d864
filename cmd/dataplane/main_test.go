package main

import (
	"bufio"
	"bytes"
	"context"
	"dataplane/cuda"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
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
	m, stop := startCommand(t, []string{"serve", "--listen", "127.0.0.1:0"},
		regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`), regexp.MustCompile(`msg=backends cpu=`))
	resp, err := http.Get("http://" + m[0][1] + "/healthz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, "ok\n", string(body))
	stop()
}

// startCommand runs `dataplane args...` in-process and reads its log until lines matching
// each of res have appeared, in order; it returns each one's submatches. stop (also run when
// the test ends) cancels the command's context and checks it exits 0, as it does on
// SIGINT/SIGTERM.
func startCommand(t testing.TB, args []string, res ...*regexp.Regexp) (matches [][]string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logR, logW := io.Pipe()
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, args, io.Discard, logW)
		logW.Close()
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case c := <-code:
				require.Equal(t, 0, c, "%v", args)
			case <-time.After(30 * time.Second):
				t.Errorf("%v did not exit after its context ended", args)
			}
		})
	}
	t.Cleanup(stop)
	// Once the lines are found (or a require failed), the rest of the log is discarded so the
	// logger never blocks.
	defer func() { go io.Copy(io.Discard, logR) }() //nolint:errcheck
	lines := bufio.NewScanner(logR)
	lines.Buffer(nil, 1<<20)
	for _, re := range res {
		var m []string
		for m == nil && lines.Scan() {
			m = re.FindStringSubmatch(lines.Text())
		}
		require.NotNil(t, m, "%v logged no line matching %s", args, re)
		matches = append(matches, m)
	}
	return matches, stop
}

// The test binary stands in for the dataplane binary when serve runs it as a child
// (`dataplane gpu-probe`): dispatch like main does instead of running the tests again.
//
// serve runs an embedded NATS server on 127.0.0.1:4222 by default, its store in the user's
// cache: the tests run it without (DATAPLANE_NATS=none) unless they ask for one with --nats,
// so they neither share a port and a store nor leave state behind.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "gpu-probe" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	if os.Getenv("DATAPLANE_NATS") == "" {
		os.Setenv("DATAPLANE_NATS", "none")
	}
	os.Exit(m.Run())
}

// The plugin's search path comes from the flag, then the environment, then the executable's
// folder and a checkout's build/cuda/.
func TestPluginSearchPath(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	exe, err := os.Executable()
	require.NoError(t, err)
	require.Equal(t, cuda.SearchPath{ExeDir: filepath.Dir(exe), BuildDir: cuda.DevBuildDir}, pluginSearchPath("", getenv))
	env[cuda.EnvPlugin] = "/env/p.so"
	require.Equal(t, "/env/p.so", pluginSearchPath("", getenv).Explicit)
	require.Equal(t, "/flag/p.so", pluginSearchPath("/flag/p.so", getenv).Explicit)
}
