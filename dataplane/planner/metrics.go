package planner

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the planner's inputs and decisions (the role TensorBoard has in Dynamo's
// planner). A nil *Metrics records nothing.
type Metrics struct {
	prefillQueue, decodeKV prometheus.Gauge     // the last pull
	avgQueue, avgKV        prometheus.Gauge     // the last interval's means
	predicted              prometheus.Gauge     // the last prefill trend prediction
	workers                *prometheus.GaugeVec // pool
	gpus                   prometheus.Gauge
	pulls                  *prometheus.CounterVec // result
	decisions              *prometheus.CounterVec // pool, action (add, remove, hold, skipped)
	changes                *prometheus.CounterVec // pool, change (add, remove), result (ok, error)
	changeSeconds          *prometheus.HistogramVec
}

// NewMetrics makes the planner's metrics; register them with Collectors.
func NewMetrics() *Metrics {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	}
	return &Metrics{
		prefillQueue: g("dataplane_planner_prefill_queue_requests", "Requests waiting for prefill per prefill worker, at the last pull (NaN: not measured)."),
		decodeKV:     g("dataplane_planner_decode_kv_usage_ratio", "Mean KV-cache use of decode workers, 0..1, at the last pull (NaN: not measured)."),
		avgQueue:     g("dataplane_planner_interval_prefill_queue_requests", "The last adjustment interval's mean prefill queue."),
		avgKV:        g("dataplane_planner_interval_decode_kv_usage_ratio", "The last adjustment interval's mean decode KV-cache use."),
		predicted:    g("dataplane_planner_predicted_prefill_queue_requests", "The prefill queue the last interval's trend predicts 3 intervals on (NaN: not computed)."),
		workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dataplane_planner_workers",
			Help: "Workers per pool at the last pull."}, []string{"pool"}),
		gpus: g("dataplane_planner_gpus", "GPUs the pools use at the last pull."),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dataplane_planner_pulls_total",
			Help: "Metric pulls, by result (ok, error)."}, []string{"result"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dataplane_planner_decisions_total",
			Help: "Decisions per pool at the end of adjustment intervals: add, remove, hold, or skipped (the workers changed, no pull)."}, []string{"pool", "action"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dataplane_planner_changes_total",
			Help: "Changes applied through the backend, by pool, change and result."}, []string{"pool", "change", "result"}),
		changeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "dataplane_planner_change_seconds",
			Help: "Time from a change's start to its completion.", Buckets: prometheus.ExponentialBuckets(0.1, 2, 14)}, []string{"pool", "change"}),
	}
}

// Collectors lists what to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.prefillQueue, m.decodeKV, m.avgQueue, m.avgKV, m.predicted, m.workers, m.gpus,
		m.pulls, m.decisions, m.changes, m.changeSeconds}
}

func (m *Metrics) pullFailed() {
	if m != nil {
		m.pulls.WithLabelValues("error").Inc()
	}
}

func (m *Metrics) pulled(s Sample, p Pools, r Rules) {
	if m == nil {
		return
	}
	m.pulls.WithLabelValues("ok").Inc()
	m.prefillQueue.Set(s.PrefillQueue)
	m.decodeKV.Set(s.DecodeKV)
	m.workers.WithLabelValues(string(PoolPrefill)).Set(float64(p.Prefill))
	m.workers.WithLabelValues(string(PoolDecode)).Set(float64(p.Decode))
	m.gpus.Set(float64(p.gpus(r)))
}

func (m *Metrics) decided(action string) {
	if m != nil {
		m.decisions.WithLabelValues(string(PoolPrefill), action).Inc()
		m.decisions.WithLabelValues(string(PoolDecode), action).Inc()
	}
}

func (m *Metrics) decision(d Decision) {
	if m == nil {
		return
	}
	m.avgQueue.Set(d.AvgPrefillQueue)
	m.avgKV.Set(d.AvgDecodeKV)
	m.predicted.Set(d.Predicted)
	for pool, delta := range map[Pool]int{PoolPrefill: d.Prefill, PoolDecode: d.Decode} {
		action := "hold"
		switch {
		case delta > 0:
			action = "add"
		case delta < 0:
			action = "remove"
		}
		m.decisions.WithLabelValues(string(pool), action).Inc()
	}
}

func (m *Metrics) changed(p Pool, change string, err error, took time.Duration) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.changes.WithLabelValues(string(p), change, result).Inc()
	m.changeSeconds.WithLabelValues(string(p), change).Observe(took.Seconds())
}
