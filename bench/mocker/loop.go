package mocker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Loop drives engines on one goroutine: a min-heap of due engine steps and timed callbacks,
// and an inbox for work handed in from other goroutines. Engines cost nothing while idle, so a
// loop can hold thousands of them.
//
// Time is a Duration since the loop started: real (wall time × Speedup) or virtual (jumps to
// the next due entry: a discrete-event simulation that runs as fast as the CPU allows and
// gives the same answer every time). An engine's steps are timed from when the previous one was
// due, not from when the loop got to it, so a loop that falls behind delivers late (measured as
// lag) but never changes what the engines compute.
type Loop struct {
	virtual bool
	speedup float64
	start   time.Time

	h   timerHeap
	seq uint64
	now time.Duration // the loop's time (loop goroutine only)

	mu     sync.Mutex
	inbox  []func(now time.Duration)
	spare  []func(now time.Duration)
	notify chan struct{}

	steps, lagNanos, lagMax atomic.Int64 // real time: how late entries ran
	lags                    atomic.Int64 // entries counted in lagNanos
}

// Clock chooses a loop's time.
type Clock struct {
	Virtual bool    // discrete-event: no sleeping
	Speedup float64 // real time only: engine time runs this many times faster than wall time; 1
}

// NewLoop returns a loop that has not started.
func NewLoop(c Clock) *Loop {
	if c.Speedup <= 0 {
		c.Speedup = 1
	}
	return &Loop{virtual: c.Virtual, speedup: c.Speedup, notify: make(chan struct{}, 1)}
}

type timerEntry struct {
	at  time.Duration
	seq uint64 // FIFO among equal times
	e   *Engine
	fn  func(now time.Duration)
}

// timerHeap is a min-heap by (at, seq), written out rather than through container/heap,
// whose interface boxes every entry pushed and popped (two allocations per engine step).
type timerHeap []timerEntry

func (h timerHeap) less(i, j int) bool {
	return h[i].at < h[j].at || (h[i].at == h[j].at && h[i].seq < h[j].seq)
}

func (h *timerHeap) push(x timerEntry) {
	*h = append(*h, x)
	q := *h
	for i := len(q) - 1; i > 0; {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			break
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

func (h *timerHeap) pop() timerEntry {
	q := *h
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q[last] = timerEntry{} // drop its references
	q = q[:last]
	for i := 0; ; {
		small, l, r := i, 2*i+1, 2*i+2
		if l < len(q) && q.less(l, small) {
			small = l
		}
		if r < len(q) && q.less(r, small) {
			small = r
		}
		if small == i {
			break
		}
		q[i], q[small] = q[small], q[i]
		i = small
	}
	*h = q
	return top
}

// Do runs fn on the loop goroutine soon, with the loop's time. Safe from any goroutine.
func (l *Loop) Do(fn func(now time.Duration)) {
	l.mu.Lock()
	l.inbox = append(l.inbox, fn)
	l.mu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

// At runs fn at time t (loop goroutine only: from Do, At or an engine's sink).
func (l *Loop) At(t time.Duration, fn func(now time.Duration)) {
	l.seq++
	l.h.push(timerEntry{at: max(t, l.now), seq: l.seq, fn: fn})
}

// Wake makes sure engine e steps at now or when its step in flight ends (loop goroutine only).
func (l *Loop) Wake(e *Engine) {
	if e.queued {
		return
	}
	e.queued = true
	l.seq++
	l.h.push(timerEntry{at: l.now, seq: l.seq, e: e})
}

// Now is the loop's time (loop goroutine only).
func (l *Loop) Now() time.Duration { return l.now }

// Lag reports, for a real-time loop, how many entries ran and how late on average and at
// worst (wall time).
func (l *Loop) Lag() (entries int64, mean, worst time.Duration) {
	n := l.lags.Load()
	if n == 0 {
		return l.steps.Load(), 0, 0
	}
	return l.steps.Load(), time.Duration(l.lagNanos.Load() / n), time.Duration(l.lagMax.Load())
}

// wallNow is real time's engine time.
func (l *Loop) wallNow() time.Duration {
	return time.Duration(float64(time.Since(l.start)) * l.speedup)
}

// Run drives the loop until ctx ends; a virtual loop also returns when it has nothing left
// to do (no entry due and nothing in the inbox).
func (l *Loop) Run(ctx context.Context) error {
	l.start = time.Now()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !l.virtual {
			l.now = max(l.now, l.wallNow())
		}
		l.drainInbox()
		if len(l.h) == 0 {
			if l.virtual {
				return nil
			}
			select {
			case <-l.notify:
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		next := l.h[0].at
		if !l.virtual && next > l.now {
			wait := time.Duration(float64(next-l.now) / l.speedup)
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-l.notify:
				timer.Stop() // Go ≥ 1.23: no stale value is delivered after Stop; Reset re-arms
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		ent := l.h.pop()
		if !l.virtual {
			lag := time.Duration(float64(l.now-ent.at) / l.speedup)
			l.lags.Add(1)
			l.lagNanos.Add(int64(lag))
			if int64(lag) > l.lagMax.Load() {
				l.lagMax.Store(int64(lag))
			}
		}
		l.steps.Add(1)
		t := ent.at
		if l.virtual {
			l.now = max(l.now, t)
		}
		if ent.fn != nil {
			ent.fn(t)
			continue
		}
		e := ent.e
		next, busy := e.Step(t)
		if busy {
			l.seq++
			l.h.push(timerEntry{at: next, seq: l.seq, e: e})
		} else {
			e.queued = false
		}
	}
}

func (l *Loop) drainInbox() {
	l.mu.Lock()
	work := l.inbox
	l.inbox, l.spare = l.spare[:0], nil
	l.mu.Unlock()
	for i, fn := range work {
		fn(l.now)
		work[i] = nil
	}
	l.mu.Lock()
	if l.spare == nil {
		l.spare = work[:0]
	}
	l.mu.Unlock()
}
