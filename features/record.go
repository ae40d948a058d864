package features

import (
	"context"
	"fmt"
	"time"
)

// Record is one media item's features: what they are (key, media id), where they
// are (a host allocation, maybe a device copy), how far they have got (State) and who holds
// them (requests, by refcount). Records are created by Request.Admit and shared by every
// request that admits the same key while the record lives. Methods are safe for concurrent use.
type Record struct {
	s         *Store
	id        uint64
	key       Key
	mediaID   string
	estimated int64
	created   time.Time
	ready     chan struct{} // closed when encoding ends, successfully or not

	// Guarded by s.mu.
	state    State
	actual   int64 // settled size; 0 while encoding
	host     allocation
	device   *allocation // the staged copy, if any
	holds    []*hold     // one per (request, admission); len is the refcount
	keepTTL  time.Duration
	expires  time.Time // CACHED: when the entry may be dropped; kept across reuse as a floor
	encoded  time.Time
	released time.Time // when the last holder let go
	err      error     // the encoding failure, once failed
	indexed  bool      // in s.index under key
	orphaned bool      // every holder left while encoding: discard when the encoder finishes
	cancel   context.CancelFunc
	lruPrev  *Record
	lruNext  *Record
}

// ID is unique within the store.
func (r *Record) ID() uint64 { return r.id }

// Key is the reuse-cache key.
func (r *Record) Key() Key { return r.key }

// MediaID is the id of the item in the request that created the record.
func (r *Record) MediaID() string { return r.mediaID }

// EstimatedBytes is the size reserved before encoding.
func (r *Record) EstimatedBytes() int64 { return r.estimated }

// Created is when the record was admitted.
func (r *Record) Created() time.Time { return r.created }

// Ready is closed when encoding has ended; then Err says whether it failed.
func (r *Record) Ready() <-chan struct{} { return r.ready }

// State is the record's state now.
func (r *Record) State() State {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.state
}

// ActualBytes is the settled size (0 until encoded).
func (r *Record) ActualBytes() int64 {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.actual
}

// Encoded is when the encoder completed it (zero before).
func (r *Record) Encoded() time.Time {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.encoded
}

// Err is the *EncodeError of a failed encoding, else nil.
func (r *Record) Err() error {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return r.err
}

// Refs is the number of holds on the record (0 when CACHED or gone).
func (r *Record) Refs() int {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	return len(r.holds)
}

// Requests lists the ids of the requests holding the record, once per hold.
func (r *Record) Requests() []string {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	ids := make([]string, len(r.holds))
	for i, h := range r.holds {
		ids[i] = h.req.id
	}
	return ids
}

// Host is a read view of the encoded features (ActualBytes long). It fails while encoding
// and after the record is gone. The view stays valid while the caller's request holds the
// record.
func (r *Record) Host() (View, error) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	switch r.state {
	case StateEncoding, StateDiscarded:
		return View{}, &TransitionError{Op: "Host", Record: r.id, MediaID: r.mediaID, From: r.state, To: StateEncodedHost}
	}
	return r.s.host.view(r.host, r.actual), nil
}

// Device is the staged copy's view, if the record has one.
func (r *Record) Device() (View, bool) {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	if r.device == nil {
		return View{}, false
	}
	return r.s.device.view(*r.device, r.actual), true
}

// setState moves the record, keeping the per-state counts. s.mu must be held. Callers only
// make moves the lifecycle allows; a move it does not is a bug in this package, refused.
func (s *Store) setState(r *Record, to State) {
	if !Legal(r.state, to) {
		panic(&TransitionError{Op: "internal", Record: r.id, MediaID: r.mediaID, From: r.state, To: to})
	}
	s.states[r.state]--
	s.states[to]++
	r.state = to
}

// advance moves a held record forward to step if it is behind (a shared record shows the
// furthest step of any holder). s.mu must be held.
func (s *Store) advance(r *Record, step State) {
	if r.state < step {
		s.setState(r, step)
	}
}

// discard frees everything a record holds and forgets it. s.mu must be held and the record
// must have no holders and no encoder writing to it.
func (s *Store) discard(r *Record) {
	if r.state == StateCached {
		s.lru.remove(r)
		s.host.idle -= r.host.units * s.host.unit
	}
	s.unindex(r)
	s.host.give(&r.host)
	if r.device != nil {
		s.device.give(r.device)
		r.device = nil
	}
	s.setState(r, StateDiscarded)
	s.states[StateDiscarded]-- // gone records are not counted
	r.cancel()
}

// unindex drops a record from the cache index, if it is there, and tells OnForget. s.mu must
// be held.
func (s *Store) unindex(r *Record) {
	if !r.indexed {
		return
	}
	delete(s.index, r.key)
	r.indexed = false
	if s.opts.OnForget != nil {
		s.opts.OnForget(r.key)
	}
}

// Job is the encoder's handle on a record it must fill: the buffer to write the features
// into, and Complete or Fail to call exactly once when done. The buffer belongs to the encoder
// until then, even if every request has left (Context says so); the store frees it only after.
type Job struct {
	rec *Record
	buf View
	ctx context.Context
}

// Record is the record being encoded.
func (j *Job) Record() *Record { return j.rec }

// Buffer is where the encoder writes: EstimatedBytes long, host memory.
func (j *Job) Buffer() View { return j.buf }

// Context is cancelled when no request wants the item any more: the encoder may stop early
// (and then call Fail).
func (j *Job) Context() context.Context { return j.ctx }

// Complete settles the reservation to the n bytes the encoder wrote (n <= EstimatedBytes; the
// rest goes back to the pool) and makes the record ENCODED_HOST. If every request left while
// encoding, the record is discarded instead and Complete returns ErrAbandoned.
func (j *Job) Complete(n int64) error {
	r, s := j.rec, j.rec.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.state != StateEncoding {
		return &TransitionError{Op: "Complete", Record: r.id, MediaID: r.mediaID, From: r.state, To: StateEncodedHost}
	}
	if n <= 0 || n > r.estimated {
		kind := ErrInvalid
		if n > 0 {
			kind = ErrOverEstimate
		}
		return fmt.Errorf("features: Complete: item %q (record %d): %d bytes written, %d reserved: %w", r.mediaID, r.id, n, r.estimated, kind)
	}
	s.host.settle(&r.host, n)
	r.actual = n
	r.encoded = s.opts.Now()
	close(r.ready)
	if r.orphaned {
		s.discard(r)
		return ErrAbandoned
	}
	s.setState(r, StateEncodedHost)
	return nil
}

// Fail ends a failed encoding: the reservation goes back, the key is forgotten (the next
// admission encodes afresh) and every holder sees an *EncodeError.
func (j *Job) Fail(cause error) error {
	r, s := j.rec, j.rec.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.state != StateEncoding {
		return &TransitionError{Op: "Fail", Record: r.id, MediaID: r.mediaID, From: r.state, To: StateDiscarded}
	}
	r.err = &EncodeError{Record: r.id, MediaID: r.mediaID, Cause: cause}
	close(r.ready)
	s.discard(r)
	return nil
}
