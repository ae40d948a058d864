// Package features is the feature store: it owns every byte of encoded media features, from
// the reservation made before encoding to the release after prefill. Records move through
// explicit states (state.go) under two byte budgets, host and device staging, each a region
// mapped once and carved into exact-size extents (extents.go). Admission never exceeds a budget: it
// evicts idle cached entries (LRU), then waits in a bounded FIFO queue until a deadline, then
// fails with a *BudgetError the API maps to 429/503 with Retry-After. A reuse cache keyed by
// (tenant salt, content hash, model, preprocessing) lets requests share records by refcount.
//
// One mutex guards all state; no method holds it while waiting. See README.md.
package features

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// PoolOptions configure one budget.
type PoolOptions struct {
	// Capacity is the budget in bytes, rounded down to whole blocks. 0 for the device pool:
	// no device staging (a CPU-only node).
	Capacity int64
	// BlockBytes is the allocation unit (power of two, >= 4 KiB). Default 64 KiB: at most
	// 64 KiB lost per item to rounding (1.4% of a 4.5 MiB LLaVA image), 16 Ki blocks per GiB.
	BlockBytes int64
	// Allocator supplies the region. Default for the host pool: &MmapAllocator{HugePages: true}.
	// The device pool has no default: the CUDA plugin supplies one.
	Allocator Allocator
}

// Options configure a Store. Zero fields take the defaults DefaultOptions documents.
type Options struct {
	Host   PoolOptions
	Device PoolOptions
	// MaxWait bounds how long an allocation waits for memory (a context deadline may cut it
	// shorter). Default 2s. Negative: never wait, refuse at once.
	MaxWait time.Duration
	// MaxWaiters bounds each pool's wait queue; admissions beyond it are refused at once
	// (RejectQueueFull, 429). Default 1024.
	MaxWaiters int
	// RetryAfter is what refusals tell clients to wait. Default 1s.
	RetryAfter time.Duration
	// MaxItemsPerRequest bounds a request's media items. Default 1024.
	MaxItemsPerRequest int
	// Now is the clock for TTLs and timestamps. Default time.Now.
	Now func() time.Time
	// OnForget, when set, is told each key the store stops holding: its record was discarded
	// (after its last holder, a TTL, an eviction, a failed encode) or orphaned while encoding.
	// What was kept about the key outside (the EC hand-off's file) can go. It is called with
	// the store's lock held: it must not block or call the store.
	OnForget func(Key)
}

// DefaultOptions: a 1 GiB host budget (about 220 LLaVA images of 576 × 4096 bf16) in 64 KiB blocks of
// transparent-huge-page-backed anonymous memory, no device pool, 2 s of backpressure, queues of
// 1024, Retry-After 1 s.
func DefaultOptions() Options {
	return Options{
		Host:               PoolOptions{Capacity: 1 << 30, BlockBytes: 64 << 10, Allocator: &MmapAllocator{HugePages: true}},
		MaxWait:            2 * time.Second,
		MaxWaiters:         1024,
		RetryAfter:         time.Second,
		MaxItemsPerRequest: 1024,
		Now:                time.Now,
	}
}

func (o *Options) fillDefaults() {
	d := DefaultOptions()
	if o.Host.Capacity == 0 {
		o.Host.Capacity = d.Host.Capacity
	}
	if o.Host.BlockBytes == 0 {
		o.Host.BlockBytes = d.Host.BlockBytes
	}
	if o.Host.Allocator == nil {
		o.Host.Allocator = d.Host.Allocator
	}
	if o.Device.BlockBytes == 0 {
		o.Device.BlockBytes = d.Host.BlockBytes
	}
	if o.MaxWait == 0 {
		o.MaxWait = d.MaxWait
	}
	if o.MaxWaiters == 0 {
		o.MaxWaiters = d.MaxWaiters
	}
	if o.RetryAfter == 0 {
		o.RetryAfter = d.RetryAfter
	}
	if o.MaxItemsPerRequest == 0 {
		o.MaxItemsPerRequest = d.MaxItemsPerRequest
	}
	if o.Now == nil {
		o.Now = d.Now
	}
}

// Store owns the pools, the records and the reuse cache. Safe for concurrent use.
type Store struct {
	opts Options

	mu     sync.Mutex // guards everything below, and every record's and request's mutable fields
	host   *pool
	device *pool // nil on a node without device staging
	index  map[Key]*Record
	lru    lruList // idle CACHED records, least recently released first
	nextID uint64
	closed bool

	states    [numStates]int // live records per state
	hits      uint64
	misses    uint64
	evictions [numEvictReasons]uint64
}

// New maps the pools' regions and returns an empty store.
func New(opts Options) (*Store, error) {
	opts.fillDefaults()
	if opts.MaxWaiters < 0 || opts.MaxItemsPerRequest < 0 || opts.RetryAfter < 0 {
		return nil, invalidf("negative limit in options")
	}
	s := &Store{opts: opts, index: make(map[Key]*Record)}
	var err error
	if s.host, err = newPool("host", opts.Host.Allocator, opts.Host.Capacity, opts.Host.BlockBytes); err != nil {
		return nil, err
	}
	if opts.Device.Capacity > 0 {
		if opts.Device.Allocator == nil {
			_ = s.host.alloc.Unmap(s.host.region)
			return nil, invalidf("device pool of %d bytes has no allocator", opts.Device.Capacity)
		}
		if s.device, err = newPool("device", opts.Device.Allocator, opts.Device.Capacity, opts.Device.BlockBytes); err != nil {
			_ = s.host.alloc.Unmap(s.host.region)
			return nil, err
		}
	}
	return s, nil
}

// HasDevice reports whether the store has a device staging pool. Without one, records go
// from ENCODED_HOST straight to MERGED and Stage returns ErrNoDevice.
func (s *Store) HasDevice() bool { return s.device != nil }

// Close discards idle cached entries and unmaps the pools. While any record or merged
// sequence still holds memory it returns an error wrapping ErrInUse and unmaps nothing, since
// views into the pools may still be in use.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	for s.lru.head != nil {
		s.evict(s.lru.head, evictClose)
	}
	for _, p := range s.pools() {
		if held := p.used + p.reserved; held > 0 {
			return fmt.Errorf("features: close: %w: %s pool has %d bytes allocated (%d waiting)", ErrInUse, p.name, held, len(p.waiters))
		}
	}
	s.closed = true
	var first error
	for _, p := range s.pools() {
		if err := p.alloc.Unmap(p.region); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (s *Store) pools() []*pool {
	if s.device != nil {
		return []*pool{s.host, s.device}
	}
	return []*pool{s.host}
}

// Stats is a consistent snapshot of the store.
type Stats struct {
	Host      PoolStats
	Device    *PoolStats     // nil without a device pool
	Records   [numStates]int // live records per state, indexed by State (DISCARDED: 0, they are gone)
	Hits      uint64         // admissions that found their key (cached or being encoded)
	Misses    uint64         // admissions that reserved memory to encode
	Evictions [numEvictReasons]uint64
}

// Stats takes a snapshot under the lock.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Host: s.host.stats(), Records: s.states, Hits: s.hits, Misses: s.misses, Evictions: s.evictions}
	if s.device != nil {
		d := s.device.stats()
		st.Device = &d
	}
	return st
}

// reserve allocates n bytes from p: at once if it fits (evicting idle cached entries if that
// makes it fit), else after waiting in p's queue until min(ctx's deadline, MaxWait). No lock
// may be held by the caller.
func (s *Store) reserve(ctx context.Context, p *pool, n int64, settled bool) (allocation, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return allocation{}, fmt.Errorf("features: %w: store", ErrClosed)
	}
	if n > p.maxAlloc() {
		err := p.reject(RejectTooLarge, n, 0)
		s.mu.Unlock()
		return allocation{}, err
	}
	if len(p.waiters) == 0 { // nobody queued ahead: no barging past waiters
		if a, ok := s.tryTake(p, n, settled); ok {
			s.mu.Unlock()
			return a, nil
		}
	}
	wait := s.opts.MaxWait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl))
	}
	if wait <= 0 {
		err := p.reject(RejectTimeout, n, s.opts.RetryAfter)
		s.mu.Unlock()
		return allocation{}, err
	}
	if len(p.waiters) >= s.opts.MaxWaiters {
		err := p.reject(RejectQueueFull, n, s.opts.RetryAfter)
		s.mu.Unlock()
		return allocation{}, err
	}
	w := &waiter{ready: make(chan struct{}, 1)}
	p.waiters = append(p.waiters, w)
	p.waits++
	s.mu.Unlock()

	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-w.ready:
			s.mu.Lock()
			if p.waiters[0] == w {
				if s.closed {
					p.dequeue(w)
					s.mu.Unlock()
					return allocation{}, fmt.Errorf("features: %w: store", ErrClosed)
				}
				if a, ok := s.tryTake(p, n, settled); ok {
					p.dequeue(w) // wakes the next in line: there may be room for it too
					s.mu.Unlock()
					return a, nil
				}
			}
			s.mu.Unlock()
		case <-timer.C:
			s.mu.Lock()
			p.dequeue(w)
			err := p.reject(RejectTimeout, n, s.opts.RetryAfter)
			s.mu.Unlock()
			return allocation{}, err
		case <-ctx.Done():
			s.mu.Lock()
			p.dequeue(w)
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The deadline bounded the wait, so the timer fires at the same moment and
				// select picks either: a deadline passed in the queue is the budget's timeout.
				err := p.reject(RejectTimeout, n, s.opts.RetryAfter)
				s.mu.Unlock()
				return allocation{}, err
			}
			s.mu.Unlock()
			return allocation{}, fmt.Errorf("features: waiting for %d bytes of %s memory: %w", n, p.name, ctx.Err())
		}
	}
}

// tryTake carves n bytes from p, first discarding expired cache entries and then evicting idle
// ones, least recently used first, but only when the bytes they free could make n fit.
// s.mu must be held.
func (s *Store) tryTake(p *pool, n int64, settled bool) (allocation, bool) {
	if a, ok := p.take(n, settled); ok {
		return a, true
	}
	if p != s.host || s.lru.head == nil { // cached records hold host memory only
		return allocation{}, false
	}
	if s.sweep() > 0 {
		if a, ok := p.take(n, settled); ok {
			return a, true
		}
	}
	if p.unitsFor(n)*p.unit > p.free()+p.idle {
		return allocation{}, false // evicting everything would not be enough: keep the cache
	}
	for s.lru.head != nil {
		s.evict(s.lru.head, evictLRU)
		if a, ok := p.take(n, settled); ok {
			return a, true
		}
	}
	return allocation{}, false
}

// Sweep discards cache entries whose TTL has passed and returns how many. Admission sweeps
// when it needs memory; a daemon may also call Sweep from a ticker.
func (s *Store) Sweep() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sweep()
}

func (s *Store) sweep() int {
	now := s.opts.Now()
	n := 0
	for r := s.lru.head; r != nil; {
		next := r.lruNext
		if !now.Before(r.expires) {
			s.evict(r, evictTTL)
			n++
		}
		r = next
	}
	return n
}

// lookup finds the live entry for k, dropping it if its TTL has passed. s.mu must be held.
func (s *Store) lookup(k Key) *Record {
	r := s.index[k]
	if r != nil && r.state == StateCached && !s.opts.Now().Before(r.expires) {
		s.evict(r, evictTTL)
		return nil
	}
	return r
}

// evictReason says why an idle entry was dropped.
type evictReason uint8

const (
	evictLRU   evictReason = iota // its memory was needed
	evictTTL                      // its TTL passed
	evictClose                    // the store closed
	numEvictReasons
)

var evictReasonNames = [numEvictReasons]string{"lru", "ttl", "close"}

// evict discards an idle CACHED record. s.mu must be held.
func (s *Store) evict(r *Record, why evictReason) {
	s.evictions[why]++
	s.discard(r)
}

// lruList is an intrusive doubly linked list of records (no allocation per entry).
type lruList struct{ head, tail *Record }

func (l *lruList) pushBack(r *Record) {
	r.lruPrev, r.lruNext = l.tail, nil
	if l.tail != nil {
		l.tail.lruNext = r
	} else {
		l.head = r
	}
	l.tail = r
}

func (l *lruList) remove(r *Record) {
	if r.lruPrev != nil {
		r.lruPrev.lruNext = r.lruNext
	} else {
		l.head = r.lruNext
	}
	if r.lruNext != nil {
		r.lruNext.lruPrev = r.lruPrev
	} else {
		l.tail = r.lruPrev
	}
	r.lruPrev, r.lruNext = nil, nil
}
