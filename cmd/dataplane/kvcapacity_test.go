package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/kvevents"
)

// serve without --kv-blocks asks each http:// engine for its block count until it answers
// (vLLM's vllm:cache_config_info; its exact format is pinned in dataplane/worker's
// TestKVCapacity), then caps the worker there; it logs the wait and the answer once each, and
// stops asking when serve stops.
func TestLearnKVCapacity(t *testing.T) {
	var asked atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if asked.Add(1) <= 3 { // still starting
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n" +
			`vllm:cache_config_info{block_size="16",num_gpu_blocks="27283",engine="0"} 1.0` + "\n"))
	}))
	defer srv.Close()
	r, err := router.New(router.DefaultOptions())
	require.NoError(t, err)
	feed, err := kvevents.NewFeed(r, kvevents.DefaultOptions())
	require.NoError(t, err)
	eng, err := feed.AddWorker(srv.URL)
	require.NoError(t, err)
	require.Zero(t, eng.Capacity(), "no cap until it is known")

	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	learnKVCapacity(context.Background(), feed, srv.URL, srv.URL, time.Millisecond, log)
	require.Equal(t, int64(27283), eng.Capacity())
	require.Equal(t, int64(4), asked.Load())
	require.Equal(t, 1, strings.Count(logs.String(), "worker KV capacity not known yet"), logs.String())
	require.Equal(t, 1, strings.Count(logs.String(), "kv_blocks=27283"), logs.String())

	// An engine that never answers: the goroutine ends with serve's context.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	done := make(chan struct{})
	go func() {
		learnKVCapacity(ctx, feed, "nobody", "http://127.0.0.1:1", 5*time.Millisecond, log)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("learnKVCapacity outlived its context")
	}
}
