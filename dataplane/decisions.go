package dataplane

import (
	"sync"

	"dataplane/router"
)

// decisionLog keeps the last routing decisions for /debug/route: a ring, bounded.
type decisionLog struct {
	mu    sync.Mutex
	ring  []loggedDecision
	next  int
	count int
}

type loggedDecision struct {
	ID       string          `json:"request_id"`
	Decision router.Decision `json:"decision"`
}

func newDecisionLog(n int) *decisionLog { return &decisionLog{ring: make([]loggedDecision, n)} }

func (l *decisionLog) add(id string, d router.Decision) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d.Hashes = nil // not needed to explain, and large
	l.ring[l.next] = loggedDecision{ID: id, Decision: d}
	l.next = (l.next + 1) % len(l.ring)
	l.count = min(l.count+1, len(l.ring))
}

// get returns the decision for a request id, or the latest when id is "".
func (l *decisionLog) get(id string) (loggedDecision, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.count {
		d := l.ring[(l.next-1-i+len(l.ring))%len(l.ring)]
		if id == "" || d.ID == id {
			return d, true
		}
	}
	return loggedDecision{}, false
}
