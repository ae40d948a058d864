package features

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the store's state as Prometheus metrics, read under the store's lock at
// scrape time (nothing is updated on the hot path). Register it with the daemon's registry:
//
//	reg.MustRegister(store.Collector())
func (s *Store) Collector() prometheus.Collector { return &collector{s: s} }

type collector struct{ s *Store }

var (
	descPoolBytes = prometheus.NewDesc("dataplane_features_pool_bytes",
		"Bytes of a feature pool by use: capacity (the budget), used (settled), reserved (encodings in flight), idle (cached, evictable), free.",
		[]string{"pool", "use"}, nil)
	descFragmentation = prometheus.NewDesc("dataplane_features_pool_fragmentation_ratio",
		"internal: share of carved bytes lost to block rounding; external: share of free bytes no single allocation can reach.",
		[]string{"pool", "kind"}, nil)
	descWaiting = prometheus.NewDesc("dataplane_features_pool_waiting",
		"Allocations waiting for memory now.", []string{"pool"}, nil)
	descWaits = prometheus.NewDesc("dataplane_features_pool_waits_total",
		"Allocations that had to wait for memory (backpressure).", []string{"pool"}, nil)
	descRejections = prometheus.NewDesc("dataplane_features_pool_rejections_total",
		"Allocations refused: queue_full (429), timeout (503), too_large (413).", []string{"pool", "reason"}, nil)
	descRecords = prometheus.NewDesc("dataplane_features_records",
		"Live feature records by state.", []string{"state"}, nil)
	descEvictions = prometheus.NewDesc("dataplane_features_evictions_total",
		"Idle cached entries dropped: lru (memory needed), ttl (expired), close.", []string{"reason"}, nil)
	descHits = prometheus.NewDesc("dataplane_features_cache_hits_total",
		"Admissions that reused a live record (cached or being encoded) and skipped encoding.", nil, nil)
	descMisses = prometheus.NewDesc("dataplane_features_cache_misses_total",
		"Admissions that reserved memory to encode.", nil, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPoolBytes, descFragmentation, descWaiting, descWaits, descRejections,
		descRecords, descEvictions, descHits, descMisses} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	pools := []PoolStats{st.Host}
	if st.Device != nil {
		pools = append(pools, *st.Device)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, p := range pools {
		for use, v := range map[string]int64{"capacity": p.Capacity, "used": p.Used, "reserved": p.Reserved, "idle": p.Idle, "free": p.Free} {
			gauge(descPoolBytes, float64(v), p.Name, use)
		}
		gauge(descFragmentation, p.InternalFragmentation(), p.Name, "internal")
		gauge(descFragmentation, p.ExternalFragmentation(), p.Name, "external")
		gauge(descWaiting, float64(p.Waiting), p.Name)
		counter(descWaits, p.Waits, p.Name)
		for r, n := range p.Rejections {
			counter(descRejections, n, p.Name, Rejection(r).String())
		}
	}
	for _, state := range AllStates[:len(AllStates)-1] { // DISCARDED records are gone
		gauge(descRecords, float64(st.Records[state]), state.String())
	}
	for why, n := range st.Evictions {
		counter(descEvictions, n, evictReasonNames[why])
	}
	counter(descHits, st.Hits)
	counter(descMisses, st.Misses)
}
