package dataplane

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"dataplane/dataplane/encoderpool"
	"dataplane/dataplane/memory"
	"dataplane/dataplane/sequence"
	"dataplane/transfer"
)

// serviceMetrics are the request path's own metrics; the feature store and the router export
// theirs through their collectors, dataplane/api the requests by endpoint and outcome.
type serviceMetrics struct {
	ttft         prometheus.Histogram     // arrival to the first token
	items        *prometheus.CounterVec   // modality, cache (hit, miss)
	encode       *prometheus.HistogramVec // modality: an item's encode time, queue wait included
	batchItems   *prometheus.HistogramVec // modality
	batchSeconds *prometheus.HistogramVec // modality: one batch's run time
	queueWait    *prometheus.HistogramVec // modality: the oldest item's wait in a batch
	batchErrors  *prometheus.CounterVec   // modality
	mergeSeconds prometheus.Histogram
	remoteItems  *prometheus.CounterVec // outcome: items sent to other daemons' encoders
}

func newServiceMetrics() *serviceMetrics {
	secs := prometheus.ExponentialBuckets(0.001, 2, 16) // 1 ms .. 33 s
	return &serviceMetrics{
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dataplane_ttft_seconds",
			Help: "Arrival to the first token from the LLM worker.", Buckets: secs}),
		items: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dataplane_media_items_total",
			Help: "Media items admitted, by modality and whether the reuse cache had their features."}, []string{"modality", "cache"}),
		encode: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "dataplane_encode_seconds",
			Help: "One media item from submission to its last input encoded.", Buckets: secs}, []string{"modality"}),
		batchItems: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "dataplane_encode_batch_items",
			Help: "Inputs per encoder batch.", Buckets: []float64{1, 2, 4, 8, 16, 32, 64}}, []string{"modality"}),
		batchSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "dataplane_encode_batch_seconds",
			Help: "Time an encoder batch ran.", Buckets: secs}, []string{"modality"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "dataplane_encode_queue_wait_seconds",
			Help: "Time the oldest input of a batch waited in the encoder queue.", Buckets: secs}, []string{"modality"}),
		batchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dataplane_encode_batch_errors_total",
			Help: "Encoder batches that failed as a whole (then rerun item by item)."}, []string{"modality"}),
		mergeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dataplane_merge_seconds",
			Help: "Time to merge a request's text and media into its sequence.", Buckets: prometheus.ExponentialBuckets(1e-5, 4, 10)}),
		remoteItems: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dataplane_remote_encode_items_total",
			Help: "Media items sent to other daemons' encoders, by outcome: sent, fell_back (encoded here after the encoder failed or overran), failed."}, []string{"outcome"}),
	}
}

func (m *serviceMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.ttft, m.items, m.encode, m.batchItems, m.batchSeconds,
		m.queueWait, m.batchErrors, m.mergeSeconds, m.remoteItems}
}

func (m *serviceMetrics) item(mod sequence.Modality, hit bool) {
	cache := "miss"
	if hit {
		cache = "hit"
	}
	m.items.WithLabelValues(mod.String(), cache).Inc()
}

func (m *serviceMetrics) encoded(mod sequence.Modality, d time.Duration) {
	m.encode.WithLabelValues(mod.String()).Observe(d.Seconds())
}

func (m *serviceMetrics) observeBatch(b encoderpool.BatchStats) {
	mod := b.Modality.String()
	m.batchItems.WithLabelValues(mod).Observe(float64(b.Items))
	m.batchSeconds.WithLabelValues(mod).Observe(b.Took.Seconds())
	m.queueWait.WithLabelValues(mod).Observe(b.Waited.Seconds())
	if b.Err != nil {
		m.batchErrors.WithLabelValues(mod).Inc()
	}
}

// memoryCollector exports how --memory-bytes was divided and the request budget's use.
type memoryCollector struct {
	plan     memory.Plan
	budget   *memory.Budget // nil: no accounting (only the plan is exported)
	parts    *prometheus.Desc
	requests *prometheus.Desc
	refusals *prometheus.Desc
}

func newMemoryCollector(plan memory.Plan, b *memory.Budget) *memoryCollector {
	return &memoryCollector{plan: plan, budget: b,
		parts: prometheus.NewDesc("dataplane_memory_budget_bytes",
			"How --memory-bytes is divided: total, features (the feature store), baseline (resident with the models loaded), reserve (runtime), requests.", []string{"part"}, nil),
		requests: prometheus.NewDesc("dataplane_memory_request_bytes",
			"The request budget (bodies, decoded media, encoder inputs): capacity, used now, of it intake (bodies still arriving), peak since start.", []string{"use"}, nil),
		refusals: prometheus.NewDesc("dataplane_memory_refusals_total",
			"Reservations the request budget refused, by reason (too_large: 413; full, queue_full: 503).", []string{"reason"}, nil),
	}
}

func (c *memoryCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.parts
	ch <- c.requests
	ch <- c.refusals
}

func (c *memoryCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.plan
	for _, part := range []struct {
		name string
		v    int64
	}{{"total", p.Total}, {"features", p.Features}, {"baseline", p.Baseline}, {"reserve", p.Reserve}, {"requests", p.Requests}} {
		ch <- prometheus.MustNewConstMetric(c.parts, prometheus.GaugeValue, float64(part.v), part.name)
	}
	if c.budget == nil {
		return
	}
	s := c.budget.Stats()
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(s.Capacity), "capacity")
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(s.Used), "used")
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(s.Intake), "intake")
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(s.Peak), "peak")
	for _, r := range []memory.Reason{memory.TooLarge, memory.Full, memory.QueueFull} {
		ch <- prometheus.MustNewConstMetric(c.refusals, prometheus.CounterValue, float64(s.Refused[r]), r.String())
	}
}

// ecCollector exports the EC directory's use (--handoff ec): bytes and files held, and what
// Put did.
type ecCollector struct {
	dir          *transfer.ECDir
	bytes, files *prometheus.Desc
	puts         *prometheus.Desc
}

func newECCollector(d *transfer.ECDir) *ecCollector {
	return &ecCollector{dir: d,
		bytes: prometheus.NewDesc("dataplane_ec_dir_bytes",
			"The EC directory (--handoff ec): capacity (--ec-bytes) and bytes of the files it holds now.", []string{"use"}, nil),
		files: prometheus.NewDesc("dataplane_ec_dir_files", "Item files in the EC directory now.", nil, nil),
		puts: prometheus.NewDesc("dataplane_ec_dir_items_total",
			"Items handed to the EC directory, by outcome: written, reused (the file was there), refused (past --ec-bytes: the engine encodes it), failed; and removed (their features forgotten).", []string{"outcome"}, nil),
	}
}

func (c *ecCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.bytes
	ch <- c.files
	ch <- c.puts
}

func (c *ecCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.dir.Stats()
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(c.dir.Cap()), "capacity")
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.Bytes), "used")
	ch <- prometheus.MustNewConstMetric(c.files, prometheus.GaugeValue, float64(st.Files))
	for _, o := range []struct {
		name string
		n    int64
	}{{"written", st.Writes}, {"reused", st.Reused}, {"refused", st.Refused}, {"failed", st.Failed}, {"removed", st.Removed}} {
		ch <- prometheus.MustNewConstMetric(c.puts, prometheus.CounterValue, float64(o.n), o.name)
	}
}
