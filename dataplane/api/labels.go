package api

import (
	"sync"
	"sync/atomic"
)

// labelCache keeps a metric vector's children by their label values (one or two), so that the
// request path resolves each once: prometheus's own lookup hashes the values and takes the
// vector's lock on every call, four times per generation request. Reads are a pointer load and
// a map lookup; a miss copies the map (the label sets are small and fixed: routes, endpoints,
// outcomes, status codes). Past maxLabelSets it stops caching and asks the vector.
type labelCache[M any] struct {
	m       atomic.Pointer[map[[2]string]M]
	mu      sync.Mutex          // serializes misses
	resolve func(a, b string) M // the vector's WithLabelValues
}

const maxLabelSets = 1024

func newLabelCache[M any](resolve func(a, b string) M) *labelCache[M] {
	return &labelCache[M]{resolve: resolve}
}

// get is the child for labels a and b (b "" for a one-label vector).
func (c *labelCache[M]) get(a, b string) M {
	k := [2]string{a, b}
	if m := c.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var old map[[2]string]M
	if p := c.m.Load(); p != nil {
		old = *p
	}
	if v, ok := old[k]; ok {
		return v
	}
	v := c.resolve(a, b)
	if len(old) >= maxLabelSets {
		return v
	}
	next := make(map[[2]string]M, len(old)+1)
	for key, val := range old {
		next[key] = val
	}
	next[k] = v
	c.m.Store(&next)
	return v
}
