package router

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports a Router's state as Prometheus metrics, read at scrape time (no hot-path
// cost). Register it with NewCollector(r) on any registry.
type Collector struct {
	r *Router

	blocks, entries, inflight                   *prometheus.Desc
	workerBlocks, active, prefill, reqs, health *prometheus.Desc
	events, kvBlocks, stream, decisions         *prometheus.Desc
}

// NewCollector describes r's metrics.
func NewCollector(r *Router) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("dataplane_router_"+name, help, labels, nil)
	}
	return &Collector{
		r:            r,
		blocks:       d("index_blocks", "Distinct KV blocks in the index (its nodes)."),
		entries:      d("index_entries", "(block, worker, tier) entries in the index."),
		inflight:     d("requests_in_flight", "Requests tracked by the slot tracker."),
		workerBlocks: d("worker_cached_blocks", "Blocks the index says a worker holds, per tier.", "worker", "tier"),
		active:       d("worker_active_blocks", "Blocks in use by the worker's requests in flight (shared prefixes once).", "worker"),
		prefill:      d("worker_prefill_tokens", "Prompt tokens routed to the worker and not yet past their first output token.", "worker"),
		reqs:         d("worker_requests", "Requests in flight on the worker.", "worker"),
		health:       d("worker_healthy", "1 if the worker takes new requests.", "worker"),
		events:       d("kv_events_total", "KV events and batches by outcome.", "outcome"),
		kvBlocks:     d("kv_blocks_total", "Index entries added or removed by KV events.", "op"),
		stream:       d("kv_stream_total", "Event stream incidents.", "incident"),
		decisions:    d("decisions_total", "Routing decisions made."),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.blocks, c.entries, c.inflight, c.workerBlocks, c.active, c.prefill,
		c.reqs, c.health, c.events, c.kvBlocks, c.stream, c.decisions} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	n := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	r := c.r
	g(c.blocks, float64(r.ix.Blocks()))
	g(c.entries, float64(r.ix.Entries()))
	g(c.inflight, float64(r.slots.InFlight()))
	for _, w := range r.Snapshot() {
		for t, b := range w.Blocks {
			g(c.workerBlocks, float64(b), w.Worker, strconv.Itoa(t))
		}
		g(c.active, float64(w.ActiveBlocks), w.Worker)
		g(c.prefill, float64(w.PrefillTokens), w.Worker)
		g(c.reqs, float64(w.Requests), w.Worker)
		h := 0.0
		if w.Healthy {
			h = 1
		}
		g(c.health, h, w.Worker)
	}
	s := &r.stats
	n(c.events, s.Batches.Load(), "batch_applied")
	n(c.events, s.BadPayloads.Load(), "bad_payload")
	n(c.events, s.BadEvents.Load(), "bad_event")
	n(c.events, s.UnknownEvents.Load(), "unknown_event")
	n(c.events, s.Filtered.Load(), "filtered")
	n(c.events, s.SizeMismatch.Load(), "block_size_mismatch")
	n(c.events, s.UnknownParent.Load(), "unknown_parent")
	n(c.events, s.UnknownBlocks.Load(), "unknown_block")
	n(c.events, s.Clears.Load(), "all_blocks_cleared")
	n(c.kvBlocks, s.BlocksStored.Load(), "stored")
	n(c.kvBlocks, s.BlocksRemoved.Load(), "removed")
	n(c.stream, s.Duplicates.Load(), "duplicate")
	n(c.stream, s.Gaps.Load(), "gap")
	n(c.stream, s.Replayed.Load(), "replayed_batch")
	n(c.stream, s.Unrecoverable.Load(), "unrecoverable_gap")
	n(c.stream, s.Restarts.Load(), "restart")
	n(c.stream, s.ReplayFailures.Load(), "replay_failure")
	n(c.decisions, r.decisions.Load())
}
