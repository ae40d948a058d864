package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/kvevents"
)

// mockEngine is one engine as `dataplane mock`'s GET /engines lists it.
type mockEngine struct {
	Name   string `json:"name"`
	Events string `json:"kv_events"`
	Replay string `json:"kv_replay"`
}

// startMockEngines runs `dataplane mock` with n engines, ZMQ KV events on loopback and engine
// time sped up, and returns its HTTP address and its engines.
func startMockEngines(t *testing.T, n int, speedup float64, extra ...string) (addr string, engines []mockEngine, stop func()) {
	t.Helper()
	m, stop := startCommand(t, append([]string{"mock", "--engines", fmt.Sprint(n), "--listen", "127.0.0.1:0", "--kv-events", "zmq",
		"--zmq-port", "0", "--speedup", fmt.Sprint(speedup)}, extra...), regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`))
	addr = m[0][1]
	resp, err := http.Get("http://" + addr + "/engines")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&engines))
	require.Len(t, engines, n)
	return addr, engines, stop
}

// `dataplane mock` with ZMQ KV events on loopback: /engines lists each engine's endpoints; a
// completion on engine 1 streams tokens, and the router's real subscriber, fed from engine 1's
// endpoints, then holds the prompt's blocks.
func TestMockCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, engines, stop := startMockEngines(t, 2, 10)
	require.Equal(t, "mock-1", engines[1].Name)
	require.True(t, strings.HasPrefix(engines[1].Events, "tcp://127.0.0.1:"))

	rt, err := router.New(router.DefaultOptions())
	require.NoError(t, err)
	kv, err := kvevents.NewFeed(rt, kvevents.DefaultOptions())
	require.NoError(t, err)
	feed, err := kv.AddWorker("mock-1")
	require.NoError(t, err)
	go func() {
		_ = kvevents.SubscribeZMQ(ctx, kvevents.DefaultZMQOptions(engines[1].Events, engines[1].Replay), kv.Stats(),
			func(int) (*kvevents.Engine, error) { return feed, nil })
	}()
	time.Sleep(200 * time.Millisecond) // let the subscription reach the PUB socket (replay covers the rest)
	prompt := make([]string, 64)
	for i := range prompt {
		prompt[i] = "7"
	}
	body := `{"prompt": [` + strings.Join(prompt, ",") + `], "max_tokens": 3, "stream": true}`
	resp, err := http.Post("http://"+addr+"/engines/1/v1/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 3, strings.Count(string(raw), `"text":" t`), string(raw))
	require.Contains(t, string(raw), "data: [DONE]")
	require.Eventually(t, func() bool { return rt.Index().Held(feed.Worker(), 0) == 4 }, 10*time.Second, 20*time.Millisecond,
		"the router sees the 4 full blocks of the 64-token prompt")
	stop()
}

// Flags that make no sense are usage errors.
func TestMockUsage(t *testing.T) {
	require.Equal(t, 2, run(context.Background(), []string{"mock", "--engines"}, io.Discard, io.Discard))
	require.Equal(t, 2, run(context.Background(), []string{"mock", "extra"}, io.Discard, io.Discard))
	require.Equal(t, 1, run(context.Background(), []string{"mock", "--kv-events", "carrier-pigeon", "--listen", ""}, io.Discard, io.Discard))
	require.Equal(t, 1, run(context.Background(), []string{"mock", "--engines", "0", "--listen", ""}, io.Discard, io.Discard))
}
