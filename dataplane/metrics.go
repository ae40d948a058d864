package dataplane

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"dataplane/dataplane/encoderpool"
	"dataplane/dataplane/sequence"
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
	}
}

func (m *serviceMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.ttft, m.items, m.encode, m.batchItems, m.batchSeconds,
		m.queueWait, m.batchErrors, m.mergeSeconds}
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
