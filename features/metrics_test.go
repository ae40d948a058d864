package features

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/stretchr/testify/require"
)

func TestMetrics(t *testing.T) {
	s := newTestStore(t, 16, 8, nil)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(s.Collector()))

	keep, _ := s.Begin("a", Policy{Kind: KeepForReuse, TTL: time.Hour})
	admitEncode(t, keep, item("cat", 10*kib), 1)
	require.NoError(t, keep.Merged())
	require.NoError(t, keep.Prefilled()) // cat: CACHED, 12 KiB idle
	r, _ := s.Begin("b", Policy{})
	_, _, err := r.Admit(context.Background(), item("cat", 10*kib)) // a hit
	require.NoError(t, err)
	_, _, err = r.Admit(context.Background(), item("dog", 20*kib)) // a miss, ENCODING: 20 KiB reserved
	require.NoError(t, err)
	_, _, err = r.Admit(context.Background(), item("cow", 64*kib+1)) // too large
	require.ErrorIs(t, err, ErrBudget)

	want := map[string]float64{
		"dataplane_features_cache_hits_total":                                      1,
		"dataplane_features_cache_misses_total":                                    2,
		`dataplane_features_pool_bytes{pool="host",use="capacity"}`:                64 * kib,
		`dataplane_features_pool_bytes{pool="host",use="used"}`:                    12 * kib,
		`dataplane_features_pool_bytes{pool="host",use="reserved"}`:                20 * kib,
		`dataplane_features_pool_bytes{pool="host",use="idle"}`:                    0,
		`dataplane_features_pool_bytes{pool="host",use="free"}`:                    32 * kib,
		`dataplane_features_pool_bytes{pool="device",use="capacity"}`:              32 * kib,
		`dataplane_features_pool_bytes{pool="device",use="free"}`:                  32 * kib,
		`dataplane_features_pool_rejections_total{pool="host",reason="too_large"}`: 1,
		`dataplane_features_pool_rejections_total{pool="host",reason="timeout"}`:   0,
		`dataplane_features_records{state="CACHED"}`:                               0,
		`dataplane_features_records{state="ENCODED_HOST"}`:                         1,
		`dataplane_features_records{state="ENCODING"}`:                             1,
		`dataplane_features_evictions_total{reason="lru"}`:                         0,
		`dataplane_features_pool_fragmentation_ratio{kind="internal",pool="host"}`: 2.0 / 32,
		`dataplane_features_pool_waiting{pool="host"}`:                             0,
	}
	got := gather(t, reg)
	for name, v := range want {
		require.Contains(t, got, name)
		require.InDelta(t, v, got[name], 1e-9, name)
	}
	require.Len(t, got, 2*5+2*2+2+2+2*3+6+3+2, "series: pool bytes, fragmentation, waiting, waits, rejections, records, evictions, hits+misses")
	// Fragmentation: 10 KiB in 12 KiB + 20 KiB in 20 KiB carved → 2 KiB of 32 KiB lost.
	require.InDelta(t, 2.0/32, s.Stats().Host.InternalFragmentation(), 1e-9)
	families, err := reg.Gather()
	require.NoError(t, err)
	problems, err := promlint.NewWithMetricFamilies(families).Lint()
	require.NoError(t, err)
	require.Empty(t, problems)
	r.Cancel()
}

// gather flattens a registry's metrics to "name{label="value",...}" → value, labels sorted.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+`="`+l.GetValue()+`"`)
			}
			sort.Strings(labels)
			name := f.GetName()
			if len(labels) > 0 {
				name += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.GetGauge() != nil:
				out[name] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}
