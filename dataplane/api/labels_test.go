package api

import (
	"strconv"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// The cache hands out the vector's own children (counts land where the vector's lookup finds
// them), asks the vector once per label set, stays correct under concurrent misses, and stops
// growing at maxLabelSets.
func TestLabelCache(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total"}, []string{"a", "b"})
	count := func(a, b string) float64 {
		var m dto.Metric
		require.NoError(t, vec.WithLabelValues(a, b).Write(&m))
		return m.GetCounter().GetValue()
	}
	var mu sync.Mutex // asked is counted under it
	asked := 0
	c := newLabelCache(func(a, b string) prometheus.Counter {
		mu.Lock()
		asked++
		mu.Unlock()
		return vec.WithLabelValues(a, b)
	})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 100 {
				c.get("r", strconv.Itoa(i%3)).Inc()
			}
		})
	}
	wg.Wait()
	require.Equal(t, 3, asked, "one lookup per label set")
	for i, want := range []float64{8 * 34, 8 * 33, 8 * 33} {
		require.Equal(t, want, count("r", strconv.Itoa(i)))
	}
	for i := range maxLabelSets + 10 {
		c.get("many", strconv.Itoa(i)).Inc()
	}
	require.Len(t, *c.m.Load(), maxLabelSets)
	c.get("many", strconv.Itoa(maxLabelSets+5)).Inc() // not cached, still counted
	require.Equal(t, 2.0, count("many", strconv.Itoa(maxLabelSets+5)))
}
