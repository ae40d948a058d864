package main

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"dataplane/dataplane/worker"
	"dataplane/router/kvevents"
)

// learnKVCapacity asks the vLLM engine at baseURL for its KV block count (worker.KVCapacity)
// every interval until it answers or ctx ends, then sets it as worker name's capacity in feed:
// until then the router does not cap the worker's index entries. It logs the first failure and
// the answer, once each.
func learnKVCapacity(ctx context.Context, feed *kvevents.Feed, name, baseURL string, interval time.Duration, log *slog.Logger) {
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	warned := false
	for {
		blocks, err := worker.KVCapacity(ctx, client, baseURL)
		if err == nil {
			if err := feed.SetCapacity(name, blocks); err != nil {
				log.Warn("worker KV capacity", "worker", name, "err", err)
				return
			}
			log.Info("worker KV capacity learned: its index entries are capped there, oldest evicted first", "worker", name, "kv_blocks", blocks)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if !warned {
			log.Warn("worker KV capacity not known yet (give --kv-blocks to set it): its index entries are not capped until it is; retrying",
				"worker", name, "every", interval, "err", err)
			warned = true
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
