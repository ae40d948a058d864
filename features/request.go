package features

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Request is one client request's hold on the store: its media items' records, in admission
// order, and optionally the buffer of its merged sequence. Its phase moves
//
//	open → merged → (prefilled →) finished, or → cancelled from any phase.
//
// Methods are safe for concurrent use; Cancel in particular may come from a disconnect
// handler while Admit waits for memory.
type Request struct {
	s      *Store
	id     string
	policy Policy

	// Guarded by s.mu.
	phase      phase
	holds      []*hold
	merged     *allocation // the merged sequence's buffer, until prefill
	mergedPool *pool
}

type phase uint8

const (
	phaseOpen      phase = iota // admitting, encoding, staging
	phaseMerged                 // merged; waiting for prefill
	phasePrefilled              // prefilled; holding items until generation completes
	phaseFinished
	phaseCancelled
)

var phaseNames = [...]string{"open", "merged", "prefilled", "finished", "cancelled"}

func (p phase) String() string { return phaseNames[p] }

// hold is one admission of a record by a request; step is that request's own progress with it
// (ENCODED_HOST until it stages or merges; the record's ENCODING shows through while encoding).
type hold struct {
	req  *Request
	rec  *Record
	step State
}

// Item describes a media item to admit.
type Item struct {
	Key     Key
	MediaID string // the item's id in the request (content part uuid or index), for errors
	Bytes   int64  // the exact feature size: tokens × hidden size × dtype size
}

// Begin starts a request. Nothing is reserved until Admit.
func (s *Store) Begin(id string, p Policy) (*Request, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	if len(id) > maxKeyField {
		return nil, invalidf("request id of %d bytes (at most %d)", len(id), maxKeyField)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("features: Begin: %w: store", ErrClosed)
	}
	return &Request{s: s, id: id, policy: p}, nil
}

// ID is the id given to Begin.
func (r *Request) ID() string { return r.id }

// Policy is the request's cache policy.
func (r *Request) Policy() Policy { return r.policy }

// Records lists the records the request holds, in admission order.
func (r *Request) Records() []*Record {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	out := make([]*Record, len(r.holds))
	for i, h := range r.holds {
		out[i] = h.rec
	}
	return out
}

func (r *Request) phaseError(op string, want phase) error {
	return fmt.Errorf("features: %s: request %q is %v, not %v: %w", op, r.id, r.phase, want, ErrIllegalTransition)
}

// Admit adds a media item. On a reuse hit (a live record with the same key: cached, encoded,
// or being encoded for another request) it returns that record, shared, and a nil *Job: the
// caller skips encoding and waits on rec.Ready() if it is still ENCODING. On a miss it
// reserves it.Bytes of host memory (evicting idle cached entries, then waiting up to ctx's
// deadline or MaxWait) and returns a new ENCODING record and the *Job the encoder fills.
// A refusal is a *BudgetError.
func (r *Request) Admit(ctx context.Context, it Item) (*Record, *Job, error) {
	if err := it.Key.validate(); err != nil {
		return nil, nil, err
	}
	if it.Bytes <= 0 {
		return nil, nil, invalidf("item %q: %d bytes", it.MediaID, it.Bytes)
	}
	if len(it.MediaID) > maxKeyField {
		return nil, nil, invalidf("item id longer than %d bytes", maxKeyField)
	}
	s := r.s
	s.mu.Lock()
	if err := r.admissible(); err != nil {
		s.mu.Unlock()
		return nil, nil, err
	}
	if rec := s.lookup(it.Key); rec != nil {
		s.attach(r, rec)
		s.mu.Unlock()
		return rec, nil, nil
	}
	s.mu.Unlock()

	a, err := s.reserve(ctx, s.host, it.Bytes, false)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := r.admissible(); err != nil { // cancelled while waiting
		s.host.give(&a)
		return nil, nil, err
	}
	if rec := s.lookup(it.Key); rec != nil { // another request admitted it while we waited
		s.host.give(&a)
		s.attach(r, rec)
		return rec, nil, nil
	}
	s.misses++
	s.nextID++
	jobCtx, cancel := context.WithCancel(context.Background())
	rec := &Record{
		s: s, id: s.nextID, key: it.Key, mediaID: it.MediaID, estimated: it.Bytes,
		created: s.opts.Now(), ready: make(chan struct{}),
		state: StateEncoding, host: a, indexed: true, cancel: cancel,
	}
	s.states[StateEncoding]++
	s.index[it.Key] = rec
	r.holds = append(r.holds, &hold{req: r, rec: rec, step: StateEncodedHost})
	rec.holds = append(rec.holds, r.holds[len(r.holds)-1])
	return rec, &Job{rec: rec, buf: s.host.view(a, it.Bytes), ctx: jobCtx}, nil
}

// admissible checks the request may take another item. s.mu must be held.
func (r *Request) admissible() error {
	if r.phase != phaseOpen {
		return r.phaseError("Admit", phaseOpen)
	}
	if len(r.holds) >= r.s.opts.MaxItemsPerRequest {
		return invalidf("request %q: more than %d media items", r.id, r.s.opts.MaxItemsPerRequest)
	}
	return nil
}

// attach adds a hold on a live record (a reuse hit). s.mu must be held.
func (s *Store) attach(r *Request, rec *Record) {
	s.hits++
	if rec.state == StateCached {
		s.lru.remove(rec)
		s.host.idle -= rec.host.units * s.host.unit
		s.setState(rec, StateEncodedHost)
	}
	h := &hold{req: r, rec: rec, step: StateEncodedHost}
	r.holds = append(r.holds, h)
	rec.holds = append(rec.holds, h)
}

// Stage gives the request a device copy of an encoded record: the record's existing copy if
// another request staged it, else a new device allocation of ActualBytes (with the same
// evict-wait-refuse admission as host memory; nothing is evictable on the device). The caller
// (the CUDA plugin) copies host → device into the returned view. Without a device pool it
// returns ErrNoDevice and changes nothing: a CPU-only node skips this step.
func (r *Request) Stage(ctx context.Context, rec *Record) (View, error) {
	s := r.s
	if s.device == nil {
		return View{}, fmt.Errorf("features: Stage: item %q: %w", rec.mediaID, ErrNoDevice)
	}
	s.mu.Lock()
	if err := r.canStep("Stage", rec, StateStagedDevice); err != nil {
		s.mu.Unlock()
		return View{}, err
	}
	if rec.device == nil {
		n := rec.actual
		s.mu.Unlock()
		a, err := s.reserve(ctx, s.device, n, true)
		if err != nil {
			return View{}, err
		}
		s.mu.Lock()
		if err := r.canStep("Stage", rec, StateStagedDevice); err != nil { // cancelled meanwhile
			s.device.give(&a)
			s.mu.Unlock()
			return View{}, err
		}
		if rec.device == nil {
			rec.device = &a
		} else { // another holder staged it meanwhile
			s.device.give(&a)
		}
	}
	defer s.mu.Unlock()
	r.step(rec, StateStagedDevice)
	return s.device.view(*rec.device, rec.actual), nil
}

// canStep checks that the request holds rec and every one of its holds may move to step.
// s.mu must be held.
func (r *Request) canStep(op string, rec *Record, step State) error {
	if r.phase != phaseOpen {
		return r.phaseError(op, phaseOpen)
	}
	held := false
	for _, h := range r.holds {
		if h.rec != rec {
			continue
		}
		held = true
		if err := h.check(op, step); err != nil {
			return err
		}
	}
	if !held {
		return fmt.Errorf("features: %s: item %q (record %d): %w", op, rec.mediaID, rec.id, ErrNotHeld)
	}
	return nil
}

// check says whether this hold may move to step. s.mu must be held.
func (h *hold) check(op string, step State) error {
	rec := h.rec
	if rec.err != nil {
		return rec.err
	}
	from := h.step
	if rec.state == StateEncoding || rec.state == StateDiscarded {
		from = rec.state
	}
	if !Legal(from, step) {
		return &TransitionError{Op: op, Record: rec.id, MediaID: rec.mediaID, From: from, To: step}
	}
	return nil
}

// step moves every hold of rec by r to step and the record along. s.mu must be held.
func (r *Request) step(rec *Record, step State) {
	for _, h := range r.holds {
		if h.rec == rec {
			h.step = step
		}
	}
	r.s.advance(rec, step)
}

// AllocMerged reserves the buffer for the request's merged [L, d] sequence, n bytes of host
// memory (or device memory with onDevice), for native.Merge to write into (View.Matrix). It
// is freed at Prefilled or Cancel.
func (r *Request) AllocMerged(ctx context.Context, onDevice bool, n int64) (View, error) {
	s := r.s
	p := s.host
	if onDevice {
		if s.device == nil {
			return View{}, fmt.Errorf("features: AllocMerged: %w", ErrNoDevice)
		}
		p = s.device
	}
	if n <= 0 {
		return View{}, invalidf("merged sequence of %d bytes", n)
	}
	s.mu.Lock()
	if r.phase != phaseOpen || r.merged != nil {
		defer s.mu.Unlock()
		if r.merged != nil {
			return View{}, fmt.Errorf("features: AllocMerged: request %q has a merged buffer: %w", r.id, ErrIllegalTransition)
		}
		return View{}, r.phaseError("AllocMerged", phaseOpen)
	}
	s.mu.Unlock()
	a, err := s.reserve(ctx, p, n, true)
	if err != nil {
		return View{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.phase != phaseOpen || r.merged != nil {
		p.give(&a)
		return View{}, r.phaseError("AllocMerged", phaseOpen)
	}
	r.merged, r.mergedPool = &a, p
	return p.view(a, n), nil
}

// Drop lets go of one item before the merge, as if the request had never admitted it (an item
// the request leaves out after all: it failed and the client allowed text-only, or it is
// replaced by a smaller encoding). Whatever only this request held of it is freed (an item
// still ENCODING is freed when its encoder ends).
func (r *Request) Drop(rec *Record) error {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.phase != phaseOpen {
		return r.phaseError("Drop", phaseOpen)
	}
	kept := r.holds[:0]
	found := false
	for _, h := range r.holds {
		if h.rec == rec {
			s.release(h, 0)
			found = true
			continue
		}
		kept = append(kept, h)
	}
	clear(r.holds[len(kept):])
	r.holds = kept
	if !found {
		return fmt.Errorf("features: Drop: request %q does not hold record %d: %w", r.id, rec.id, ErrIllegalTransition)
	}
	return nil
}

// Merged records that the request's sequence has been merged: every item must be encoded
// (an item still ENCODING or failed is an error, and nothing changes).
func (r *Request) Merged() error {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.phase != phaseOpen {
		return r.phaseError("Merged", phaseOpen)
	}
	for _, h := range r.holds {
		if err := h.check("Merged", StateMerged); err != nil {
			return err
		}
	}
	for _, h := range r.holds {
		h.step = StateMerged
		s.advance(h.rec, StateMerged)
	}
	r.phase = phaseMerged
	return nil
}

// Prefilled records that the LLM worker has prefilled the merged sequence: the merged buffer
// is freed and the items are released per the policy (DiscardAfterPrefill: discarded unless
// another request holds or keeps them; KeepForReuse: CACHED for the TTL once idle;
// KeepUntilDone: held until Done).
func (r *Request) Prefilled() error {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.phase != phaseMerged {
		return r.phaseError("Prefilled", phaseMerged)
	}
	for _, h := range r.holds {
		h.step = StatePrefilled
		s.advance(h.rec, StatePrefilled)
	}
	r.freeMerged()
	if r.policy.Kind == KeepUntilDone {
		r.phase = phasePrefilled
		return nil
	}
	r.releaseAll(r.policy.TTL)
	r.phase = phaseFinished
	return nil
}

// Done records that generation has completed and releases whatever the request still holds
// (KeepUntilDone). After a Prefilled that already released everything it does nothing.
func (r *Request) Done() error {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	switch r.phase {
	case phaseFinished:
		return nil
	case phasePrefilled:
		r.releaseAll(0)
		r.phase = phaseFinished
		return nil
	}
	return r.phaseError("Done", phasePrefilled)
}

// Cancel ends the request in any phase (a client disconnect): every hold is released without
// a keep, so whatever only this request held is freed (an item still being encoded is freed
// when its encoder finishes; Job.Context tells the encoder to stop). Idempotent.
func (r *Request) Cancel() {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.phase == phaseFinished || r.phase == phaseCancelled {
		return
	}
	r.freeMerged()
	r.releaseAll(0)
	r.phase = phaseCancelled
}

// freeMerged gives back the merged buffer. s.mu must be held.
func (r *Request) freeMerged() {
	if r.merged != nil {
		r.mergedPool.give(r.merged)
		r.merged, r.mergedPool = nil, nil
	}
}

// releaseAll drops every hold; keep > 0 asks for the records to be cached that long.
// s.mu must be held.
func (r *Request) releaseAll(keep time.Duration) {
	for _, h := range r.holds {
		r.s.release(h, keep)
	}
	r.holds = nil
}

// release drops one hold. When it was the last: a record still encoding is orphaned (freed when
// its encoder ends), one that some releasing holder asked to keep (or whose earlier TTL has
// not passed) becomes CACHED, host memory only, and any other is discarded. s.mu must be held.
func (s *Store) release(h *hold, keep time.Duration) {
	rec := h.rec
	if i := slices.Index(rec.holds, h); i >= 0 {
		rec.holds = slices.Delete(rec.holds, i, i+1)
	}
	rec.keepTTL = max(rec.keepTTL, keep)
	if len(rec.holds) > 0 || rec.state == StateDiscarded {
		return
	}
	if rec.state == StateEncoding {
		rec.orphaned = true
		s.unindex(rec)
		rec.cancel()
		return
	}
	now := s.opts.Now()
	rec.released = now
	expires := rec.expires
	if rec.keepTTL > 0 {
		expires = later(expires, now.Add(rec.keepTTL))
	}
	rec.keepTTL = 0
	if !now.Before(expires) {
		s.discard(rec)
		return
	}
	if rec.device != nil {
		s.device.give(rec.device)
		rec.device = nil
	}
	rec.expires = expires
	s.setState(rec, StateCached)
	s.lru.pushBack(rec)
	s.host.idle += rec.host.units * s.host.unit
	s.host.wakeHead() // a waiter may now evict it
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
