package router

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports a Router's state as Prometheus metrics, read at scrape time (no hot-path
// cost). Register it with NewCollector(r) on any registry; the KV events' counters are
// kvevents.Collector's, under the same dataplane_router_ prefix.
type Collector struct {
	r *Router

	blocks, entries, bytes, inflight            *prometheus.Desc
	workerBlocks, active, prefill, reqs, health *prometheus.Desc
	decisions                                   *prometheus.Desc
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
		bytes:        d("index_bytes", "Memory of the index's tables, summaries and overflow bitmaps."),
		inflight:     d("requests_in_flight", "Requests tracked by the slot tracker."),
		workerBlocks: d("worker_cached_blocks", "Blocks the index says a worker holds, per tier.", "worker", "tier"),
		active:       d("worker_active_blocks", "Blocks in use by the worker's requests in flight (shared prefixes once).", "worker"),
		prefill:      d("worker_prefill_tokens", "Prompt tokens routed to the worker and not yet past their first output token.", "worker"),
		reqs:         d("worker_requests", "Requests in flight on the worker.", "worker"),
		health:       d("worker_healthy", "1 if the worker takes new requests.", "worker"),
		decisions:    d("decisions_total", "Routing decisions made."),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.blocks, c.entries, c.bytes, c.inflight, c.workerBlocks, c.active, c.prefill,
		c.reqs, c.health, c.decisions} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	r := c.r
	g(c.blocks, float64(r.ix.Blocks()))
	g(c.entries, float64(r.ix.Entries()))
	g(c.bytes, float64(r.ix.Bytes()))
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
	ch <- prometheus.MustNewConstMetric(c.decisions, prometheus.CounterValue, float64(r.decisions.Load()))
}
