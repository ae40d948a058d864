package kvevents

import "github.com/prometheus/client_golang/prometheus"

// Collector exports a Feed's event counters as Prometheus metrics, read at scrape time (no
// hot-path cost), under the router's names: register it wherever the router's own
// router.Collector is registered.
type Collector struct {
	s                      *Stats
	events, blocks, stream *prometheus.Desc
}

// NewCollector describes f's metrics.
func NewCollector(f *Feed) *Collector {
	d := func(name, help, label string) *prometheus.Desc {
		return prometheus.NewDesc("dataplane_router_"+name, help, []string{label}, nil)
	}
	return &Collector{
		s:      &f.stats,
		events: d("kv_events_total", "KV events and batches by outcome.", "outcome"),
		blocks: d("kv_blocks_total", "Index entries added or removed by KV events, or evicted to keep a worker within its KV capacity.", "op"),
		stream: d("kv_stream_total", "Event stream incidents.", "incident"),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.events
	ch <- c.blocks
	ch <- c.stream
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	n := func(d *prometheus.Desc, v int64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label)
	}
	s := c.s
	n(c.events, s.Batches.Load(), "batch_applied")
	for r := range numReasons {
		n(c.events, s.counter(r).Load(), reasonNames[r])
	}
	n(c.events, s.SkippedContext.Load(), "skipped_context")
	n(c.events, s.Clears.Load(), "all_blocks_cleared")
	n(c.blocks, s.BlocksStored.Load(), "stored")
	n(c.blocks, s.BlocksRemoved.Load(), "removed")
	n(c.blocks, s.Evicted.Load(), "evicted")
	n(c.stream, s.Duplicates.Load(), "duplicate")
	n(c.stream, s.Gaps.Load(), "gap")
	n(c.stream, s.Replayed.Load(), "replayed_batch")
	n(c.stream, s.Unrecoverable.Load(), "unrecoverable_gap")
	n(c.stream, s.Restarts.Load(), "restart")
	n(c.stream, s.ReplayFailures.Load(), "replay_failure")
}
