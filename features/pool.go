package features

import (
	"fmt"
	"time"
)

// pool is one memory budget: a region mapped once and carved into exact-size extents in units
// of unit bytes. Every field is guarded by the store's lock; every method needs it held.
//
// Accounting is in carved bytes (whole units), since that is what leaves the pool; requested
// counts the bytes asked for, so the difference is the rounding lost (internal fragmentation).
type pool struct {
	name     string // "host" or "device"
	alloc    Allocator
	region   Region
	carver   *extents
	unit     int64
	capacity int64 // carver units × unit: the budget

	reserved  int64 // carved bytes of allocations not settled yet (encodings in flight)
	used      int64 // carved bytes of settled allocations
	requested int64 // bytes asked for by every live allocation
	idle      int64 // carved bytes of idle CACHED records here: what eviction could free

	waiters []*waiter // admissions waiting for memory, first come first served

	waits      uint64
	rejections [numRejections]uint64
}

// allocation is a carved span: units [off, off+units) holding n requested bytes.
type allocation struct {
	off, units int64
	n          int64
	settled    bool
}

// waiter is an admission waiting in a pool's queue; ready gets a token when it should retry.
type waiter struct{ ready chan struct{} }

func newPool(name string, a Allocator, capacity, unit int64) (*pool, error) {
	if unit < 4096 || unit&(unit-1) != 0 {
		return nil, invalidf("%s pool: block size %d is not a power of two >= 4096", name, unit)
	}
	units := capacity / unit
	if units < 1 {
		return nil, invalidf("%s pool: capacity %d is below one block of %d bytes", name, capacity, unit)
	}
	if units > 1<<31-1 {
		return nil, invalidf("%s pool: %d blocks of %d bytes is too many: raise the block size", name, units, unit)
	}
	r, err := a.Map(units * unit)
	if err != nil {
		return nil, fmt.Errorf("features: %s pool: %w", name, err)
	}
	return &pool{name: name, alloc: a, region: r, carver: newExtents(int(units)), unit: unit, capacity: units * unit}, nil
}

// unitsFor is n bytes rounded up to whole units.
func (p *pool) unitsFor(n int64) int64 { return (n + p.unit - 1) / p.unit }

// take carves n bytes, or reports false when no block is large enough.
func (p *pool) take(n int64, settled bool) (allocation, bool) {
	u := p.unitsFor(n)
	if u > int64(p.carver.units) {
		return allocation{}, false
	}
	off, ok := p.carver.alloc(int(u))
	if !ok {
		return allocation{}, false
	}
	a := allocation{off: int64(off), units: u, n: n, settled: settled}
	if settled {
		p.used += u * p.unit
	} else {
		p.reserved += u * p.unit
	}
	p.requested += n
	return a, true
}

// settle turns a reservation into a settled allocation of n <= a.n bytes, giving the tail back.
func (p *pool) settle(a *allocation, n int64) {
	u := p.unitsFor(n)
	if u < a.units {
		p.carver.release(int(a.off+u), int(a.off+a.units))
		p.wakeHead()
	}
	p.reserved -= a.units * p.unit
	p.used += u * p.unit
	p.requested += n - a.n
	a.units, a.n, a.settled = u, n, true
}

// give returns an allocation to the pool and lets the first waiter retry.
func (p *pool) give(a *allocation) {
	p.carver.release(int(a.off), int(a.off+a.units))
	if a.settled {
		p.used -= a.units * p.unit
	} else {
		p.reserved -= a.units * p.unit
	}
	p.requested -= a.n
	*a = allocation{}
	p.wakeHead()
}

// view is the allocation's first n bytes.
func (p *pool) view(a allocation, n int64) View {
	return View{region: &p.region, off: a.off * p.unit, n: n}
}

func (p *pool) free() int64 { return int64(p.carver.free) * p.unit }

// maxAlloc is the largest allocation the pool could ever give: all of it.
func (p *pool) maxAlloc() int64 { return p.capacity }

// wakeHead gives the first waiter a token (never blocks: the channel holds one).
func (p *pool) wakeHead() {
	if len(p.waiters) > 0 {
		select {
		case p.waiters[0].ready <- struct{}{}:
		default:
		}
	}
}

// dequeue removes w from the queue; if it was first, the next one gets to try.
func (p *pool) dequeue(w *waiter) {
	for i, x := range p.waiters {
		if x == w {
			copy(p.waiters[i:], p.waiters[i+1:])
			p.waiters[len(p.waiters)-1] = nil
			p.waiters = p.waiters[:len(p.waiters)-1]
			if i == 0 {
				p.wakeHead()
			}
			return
		}
	}
}

// reject counts a refusal and builds its error.
func (p *pool) reject(reason Rejection, n int64, retryAfter time.Duration) *BudgetError {
	p.rejections[reason]++
	e := &BudgetError{Pool: p.name, Reason: reason, Need: n, Free: p.free(), Capacity: p.capacity}
	if reason != RejectTooLarge {
		e.RetryAfter = retryAfter
	}
	return e
}

// PoolStats is a snapshot of one pool.
type PoolStats struct {
	Name        string
	Allocator   string
	Capacity    int64 // the budget, bytes
	Used        int64 // carved for settled allocations
	Reserved    int64 // carved for reservations not settled yet
	Requested   int64 // asked for by live allocations (Used + Reserved minus rounding)
	Idle        int64 // held by idle CACHED records (evictable)
	Free        int64 // Capacity - Used - Reserved
	LargestFree int64 // the largest allocation that would succeed now
	Waiting     int   // admissions waiting now
	Waits       uint64
	Rejections  [numRejections]uint64
}

func (p *pool) stats() PoolStats {
	return PoolStats{
		Name: p.name, Allocator: p.alloc.Name(), Capacity: p.capacity, Used: p.used, Reserved: p.reserved,
		Requested: p.requested, Idle: p.idle, Free: p.free(), LargestFree: int64(p.carver.largestFree()) * p.unit,
		Waiting: len(p.waiters), Waits: p.waits, Rejections: p.rejections,
	}
}

// InternalFragmentation is the share of carved bytes lost to rounding up to whole blocks.
func (s PoolStats) InternalFragmentation() float64 {
	if c := s.Used + s.Reserved; c > 0 {
		return 1 - float64(s.Requested)/float64(c)
	}
	return 0
}

// ExternalFragmentation is the share of free bytes that no single allocation can reach:
// 1 - LargestFree/Free (0 when nothing is free).
func (s PoolStats) ExternalFragmentation() float64 {
	if s.Free > 0 {
		return 1 - float64(s.LargestFree)/float64(s.Free)
	}
	return 0
}
