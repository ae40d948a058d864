package router

import (
	"sync"
	"sync/atomic"
)

// DecisionLog keeps the last decisions, each under its request id, for a debug endpoint to
// explain: a ring of fixed size, safe for concurrent use. Add takes a slot by an atomic count
// and copies the decision into the slot's own slices under the slot's lock (no lock shared by
// all requests, no allocation once a slot's slices have grown), so a caller may reuse its
// Decision's slices afterwards.
type DecisionLog struct {
	n     atomic.Uint64 // decisions added
	slots []logSlot
}

type logSlot struct {
	mu  sync.Mutex
	seq uint64 // the decision's number (1 for the first); 0: never written
	d   LoggedDecision
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
func NewDecisionLog(n int) *DecisionLog { return &DecisionLog{slots: make([]logSlot, max(n, 1))} }

// Len is how many decisions the log can hold.
func (l *DecisionLog) Len() int { return len(l.slots) }

// Add logs a copy of d under id, dropping the oldest when full.
func (l *DecisionLog) Add(id string, d Decision) {
	n := l.n.Add(1)
	s := &l.slots[(n-1)%uint64(len(l.slots))]
	s.mu.Lock()
	defer s.mu.Unlock()
	if n < s.seq {
		return // a newer decision took the slot while this Add was late: it is the one to keep
	}
	old := s.d.Decision
	s.seq = n
	s.d.RequestID = id
	s.d.Decision = d
	s.d.Decision.Hashes = nil // not needed to explain, and large
	s.d.Decision.Scores = copyInto(old.Scores, d.Scores)
	s.d.Decision.PrefillScores = copyInto(old.PrefillScores, d.PrefillScores)
	s.d.Decision.Encoders = copyInto(old.Encoders, d.Encoders)
}

// copyInto is src in dst's room; nil stays nil and empty stays empty (the JSON shows null or
// [], as the decision had it).
func copyInto[T any](dst, src []T) []T {
	if len(src) == 0 {
		return src[:0:0]
	}
	return append(dst[:0], src...)
}

// Get returns the latest decision logged under id, or the latest of all when id is "". The
// answer is the caller's (its slices copied out of the log).
func (l *DecisionLog) Get(id string) (LoggedDecision, bool) {
	n := l.n.Load()
	for i := range min(n, uint64(len(l.slots))) {
		s := &l.slots[(n-1-i)%uint64(len(l.slots))]
		s.mu.Lock()
		if s.seq != 0 && (id == "" || s.d.RequestID == id) {
			out := s.d
			out.Decision.Scores = copyInto[WorkerScore](nil, s.d.Decision.Scores)
			out.Decision.PrefillScores = copyInto[WorkerScore](nil, s.d.Decision.PrefillScores)
			out.Decision.Encoders = copyInto[EncoderOption](nil, s.d.Decision.Encoders)
			s.mu.Unlock()
			return out, true
		}
		s.mu.Unlock()
	}
	return LoggedDecision{}, false
}
