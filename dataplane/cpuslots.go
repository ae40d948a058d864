package dataplane

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// cpuSlots bounds concurrent media preprocessing to the CPUs and sheds what could not start
// before its deadline: an item that would wait longer than its deadline leaves is refused at
// once (503 with Retry-After) instead of queueing, being cut at its deadline (504) and holding
// its memory all that time. The wait is predicted from the items waiting and how long a slot
// is held (an EWMA of the last holds).
type cpuSlots struct {
	sem     chan struct{}
	waiting atomic.Int64

	mu   sync.Mutex
	hold time.Duration // EWMA (weight 1/5) of how long a slot is held; 0 before the first
}

func newCPUSlots(n int) *cpuSlots { return &cpuSlots{sem: make(chan struct{}, max(n, 1))} }

// busyError is a refusal of cpuSlots.acquire: the predicted wait passes the deadline.
type busyError struct {
	wait, left time.Duration
	ahead      int64
}

func (e *busyError) Error() string {
	return fmt.Sprintf("the CPUs are busy: %d items wait to be preprocessed, about %.1fs, and this one has %.1fs left of --item-timeout",
		e.ahead, e.wait.Seconds(), e.left.Seconds())
}

// acquire takes a slot, waiting at most until ctx ends; it refuses with a *busyError when the
// predicted wait and the item's own hold would pass ctx's deadline. release gives the slot
// back and counts how long it was held.
func (c *cpuSlots) acquire(ctx context.Context) (release func(), err error) {
	select {
	case c.sem <- struct{}{}:
		return c.releaser(), nil
	default:
	}
	ahead := c.waiting.Add(1)
	defer c.waiting.Add(-1)
	if deadline, ok := ctx.Deadline(); ok {
		c.mu.Lock()
		hold := c.hold
		c.mu.Unlock()
		// The items ahead drain len(sem) at a time; this one then holds a slot itself.
		wait := time.Duration((ahead + int64(cap(c.sem)) - 1) / int64(cap(c.sem)) * int64(hold))
		if left := time.Until(deadline); wait+hold > left {
			return nil, &busyError{wait: wait, left: left, ahead: ahead - 1}
		}
	}
	select {
	case c.sem <- struct{}{}:
		return c.releaser(), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *cpuSlots) releaser() func() {
	start := time.Now()
	return func() {
		held := time.Since(start)
		c.mu.Lock()
		if c.hold == 0 {
			c.hold = held
		} else {
			c.hold += (held - c.hold) / 5
		}
		c.mu.Unlock()
		<-c.sem
	}
}
