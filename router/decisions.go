package router

import "sync"

// DecisionLog keeps the last decisions, each under its request id, for a debug endpoint to
// explain: a ring of fixed size, safe for concurrent use.
type DecisionLog struct {
	mu    sync.Mutex
	ring  []LoggedDecision
	next  int
	count int
}

// RecentDecisions is how many decisions the debug endpoints (GET /debug/route of the daemon and
// of the standalone router) can look up by request id.
const RecentDecisions = 256

// LoggedDecision is a decision as a debug endpoint answers it.
type LoggedDecision struct {
	RequestID string   `json:"request_id"`
	Decision  Decision `json:"decision"`
}

// NewDecisionLog keeps the last n decisions (at least one).
func NewDecisionLog(n int) *DecisionLog { return &DecisionLog{ring: make([]LoggedDecision, max(n, 1))} }

// Len is how many decisions the log can hold.
func (l *DecisionLog) Len() int { return len(l.ring) }

// Add logs d under id, dropping the oldest when full.
func (l *DecisionLog) Add(id string, d Decision) {
	d.Hashes = nil // not needed to explain, and large
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.next] = LoggedDecision{RequestID: id, Decision: d}
	l.next = (l.next + 1) % len(l.ring)
	l.count = min(l.count+1, len(l.ring))
}

// Get returns the latest decision logged under id, or the latest of all when id is "".
func (l *DecisionLog) Get(id string) (LoggedDecision, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.count {
		d := l.ring[(l.next-1-i+len(l.ring))%len(l.ring)]
		if id == "" || d.RequestID == id {
			return d, true
		}
	}
	return LoggedDecision{}, false
}
