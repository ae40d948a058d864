package router

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"dataplane/router/index"
)

// Slots tracks each worker's load from the request lifecycle the router sees: blocks in use by
// requests in flight, ref-counted by block (sequence hash) so a prefix shared by many
// requests counts once, and prefill tokens not yet computed (dropped at the first output token). It is the
// router's own view: authoritative for what the router sent, blind to traffic that bypassed it.
//
// Writes (Start, FirstToken, Finish, Expire) take one mutex; reads for scoring do not: the
// per-worker totals are atomics and "which blocks are active where" is an Index.
type Slots struct {
	blockSize int
	ttl       time.Duration
	max       int
	maxBlocks int // of all tracked requests' full blocks (Options.MaxTrackedBlocks)

	active *index.Index // bit set: the worker has at least one request in flight using the block
	loads  []workerLoad

	mu    sync.Mutex
	refs  *index.Counts // requests in flight per (block, worker)
	reqs  map[string]*slotRequest
	held  int       // full blocks of the tracked requests
	order []started // in start order, for expiry (may hold finished starts; compactOrder bounds them)
	seq   uint64    // starts so far
	buf   []uint64
}

type workerLoad struct {
	blocks  atomic.Int64 // distinct blocks in use, the unhashed tail blocks included
	prefill atomic.Int64 // prompt tokens still to compute
	reqs    atomic.Int64

	report atomic.Pointer[reported] // the worker's own last report (Report); nil: none
}

// LoadReport is a worker's load as the worker reported it (its load subject in a fleet): what
// every router sent it and what bypassed them. A negative count is one the worker does not
// know (a vLLM engine exports no prompt tokens still to compute).
type LoadReport struct {
	ActiveBlocks  int64 `json:"active_blocks"`  // KV blocks held by its requests
	PrefillTokens int64 `json:"prefill_tokens"` // prompt tokens not computed yet
	Requests      int64 `json:"requests"`       // running and waiting
}

// reported is a report and this router's own counts when it arrived.
type reported struct {
	LoadReport
	base LoadReport // the local counts then
	at   time.Time  // when it arrived, the router's clock
}

type slotRequest struct {
	worker  index.Worker
	seqs    []uint64 // the prompt's full blocks (sequence hashes)
	keys    []uint64 // and their index keys
	private int      // blocks of the request nobody else can share (a partial last block)
	prefill int64
	started time.Time
	seq     uint64 // which start of the id this is: an id may start again once finished
}

// started is a start in Slots.order: an id, and which of its starts (slotRequest.seq).
type started struct {
	id  string
	seq uint64
}

// ErrDuplicateRequest reports a Start for a request id already in flight.
type ErrDuplicateRequest struct{ ID string }

func (e *ErrDuplicateRequest) Error() string {
	return fmt.Sprintf("request %q is already tracked", e.ID)
}

// ErrTooLong reports a Start for a request with more blocks than are tracked in all
// (Options.MaxTrackedBlocks).
type ErrTooLong struct {
	ID          string
	Blocks, Max int
}

func (e *ErrTooLong) Error() string {
	return fmt.Sprintf("request %q: %d blocks, more than the %d tracked in all", e.ID, e.Blocks, e.Max)
}

// NewSlots tracks up to maxRequests requests in flight for workers of an index with maxWorkers
// slots; requests older than ttl are dropped by Expire.
func NewSlots(maxWorkers, blockSize int, ttl time.Duration, maxRequests int) (*Slots, error) {
	ix, err := index.New(index.Options{MaxWorkers: maxWorkers, Tiers: 1, Shards: 64})
	if err != nil {
		return nil, err
	}
	return &Slots{blockSize: blockSize, ttl: ttl, max: max(maxRequests, 1), maxBlocks: DefaultMaxTrackedBlocks, active: ix,
		loads: make([]workerLoad, ix.Options().MaxWorkers), refs: index.NewCounts(), reqs: map[string]*slotRequest{}}, nil
}

// Load is a worker's load as this router counted it: distinct active blocks, outstanding
// prefill tokens and requests in flight, of the requests it started.
func (s *Slots) Load(w index.Worker) (blocks, prefillTokens, requests int64) {
	l := &s.loads[w]
	return l.blocks.Load(), l.prefill.Load(), l.reqs.Load()
}

// Report records a worker's own load report, received now. Safe from any goroutine.
func (s *Slots) Report(w index.Worker, rep LoadReport, now time.Time) {
	l := &s.loads[w]
	b, p, r := l.blocks.Load(), l.prefill.Load(), l.reqs.Load()
	l.report.Store(&reported{LoadReport: rep, base: LoadReport{ActiveBlocks: b, PrefillTokens: p, Requests: r}, at: now})
}

// LoadAt is the load the cost uses at now: this router's own counts, combined per count with
// the worker's last report when one arrived within ttl. The report counts everything at the
// worker when it was made (other replicas' requests, requests that bypassed routers); what
// this router started and finished since is known here exactly, so it is added to the report:
// reported + (local now − local when the report arrived). It is never below the local count,
// which is what this router knows to be in flight (a report can miss requests still on their
// way to the worker). Adding the local count instead would count this router's requests twice;
// taking the larger of the two would miss a burst routed here since the last report.
func (s *Slots) LoadAt(w index.Worker, now time.Time, ttl time.Duration) (blocks, prefillTokens, requests int64, fresh bool) {
	l := &s.loads[w]
	blocks, prefillTokens, requests = l.blocks.Load(), l.prefill.Load(), l.reqs.Load()
	rep := l.report.Load()
	if rep == nil || now.Sub(rep.at) > ttl {
		return blocks, prefillTokens, requests, false
	}
	combine := func(local, reported, base int64) int64 {
		if reported < 0 {
			return local
		}
		return max(local, reported+local-base)
	}
	return combine(blocks, rep.ActiveBlocks, rep.base.ActiveBlocks), combine(prefillTokens, rep.PrefillTokens, rep.base.PrefillTokens),
		combine(requests, rep.Requests, rep.base.Requests), true
}

// ActiveMatch reports, per worker, how many leading blocks of a prompt are already in use there;
// seqs are the prompt's sequence hashes.
func (s *Slots) ActiveMatch(seqs []uint64, m *index.Match) { s.active.Match(seqs, m) }

// Start records a request sent to worker w: its full-block sequence hashes, its prompt length
// (the partial last block counts as one unshared block) and the prompt tokens the worker must
// compute. Past maxRequests the oldest request is dropped first.
func (s *Slots) Start(id string, w index.Worker, hashes []uint64, promptTokens int, prefillTokens int, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.reqs[id]; ok {
		return &ErrDuplicateRequest{ID: id}
	}
	if len(hashes) > s.maxBlocks {
		return &ErrTooLong{ID: id, Blocks: len(hashes), Max: s.maxBlocks}
	}
	for (len(s.reqs) >= s.max || s.held+len(hashes) > s.maxBlocks) && len(s.order) > 0 {
		if s.live(s.order[0]) {
			s.finishLocked(s.order[0].id)
		}
		s.order[0] = started{}
		s.order = s.order[1:]
	}
	total := (promptTokens + s.blockSize - 1) / s.blockSize
	req := &slotRequest{worker: w, seqs: slices.Clone(hashes), private: max(total-len(hashes), 0),
		prefill: int64(max(prefillTokens, 0)), started: now}
	s.seq++
	req.seq = s.seq
	s.reqs[id] = req
	s.held += len(req.seqs)
	s.order = append(s.order, started{id, req.seq})
	if len(s.order) > 2*len(s.reqs)+1024 {
		s.compactOrder()
	}
	// Storing the whole chain gives every block's key (those in use already keep theirs) and sets
	// w's bit on the blocks no request of w used yet: exactly those whose count becomes 1.
	req.keys = make([]uint64, len(hashes))
	fresh := s.active.Store(w, 0, 0, hashes, req.keys)
	s.refs.Incr(hashes, w)
	l := &s.loads[w]
	l.blocks.Add(int64(fresh + req.private))
	l.prefill.Add(req.prefill)
	l.reqs.Add(1)
	return nil
}

// FirstToken records a request's first output token: its prefill is done. Unknown ids (already
// finished or expired) are ignored.
func (s *Slots) FirstToken(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if req, ok := s.reqs[id]; ok {
		s.loads[req.worker].prefill.Add(-req.prefill)
		req.prefill = 0
	}
}

// Finish records a request's end (completed or cancelled) and reports whether it was tracked.
func (s *Slots) Finish(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finishLocked(id)
}

func (s *Slots) finishLocked(id string) bool {
	req, ok := s.reqs[id]
	if !ok {
		return false
	}
	delete(s.reqs, id)
	s.held -= len(req.seqs)
	gone := s.refs.Decr(req.seqs, req.keys, req.worker, s.buf[:0])
	s.active.Remove(req.worker, 0, gone)
	s.buf = gone
	l := &s.loads[req.worker]
	l.blocks.Add(-int64(len(gone) + req.private))
	l.prefill.Add(-req.prefill)
	l.reqs.Add(-1)
	return true
}

// live reports whether st is a request still tracked, not an earlier start of its id (mu held).
func (s *Slots) live(st started) bool {
	req, ok := s.reqs[st.id]
	return ok && req.seq == st.seq
}

// compactOrder drops finished starts from order (mu held). Expire drops them only from its
// front, so one long request there would keep every later finished start for up to the TTL;
// compacting when they outnumber the tracked ones bounds order (to twice the tracked requests
// plus 1024 after a Start: each tracked request has one live start) and costs O(1) a Start,
// amortized.
func (s *Slots) compactOrder() {
	kept := s.order[:0]
	for _, st := range s.order {
		if s.live(st) {
			kept = append(kept, st)
		}
	}
	clear(s.order[len(kept):])
	s.order = kept
}

// Expire drops requests started more than the TTL before now (lost finishes: a client that
// vanished, a router restart) and returns how many.
func (s *Slots) Expire(now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for len(s.order) > 0 {
		st := s.order[0]
		live := s.live(st)
		if live && now.Sub(s.reqs[st.id].started) < s.ttl {
			break
		}
		if live && s.finishLocked(st.id) {
			n++
		}
		s.order[0] = started{}
		s.order = s.order[1:]
	}
	if cap(s.order) > 1024 && len(s.order) < cap(s.order)/4 {
		s.order = append([]started(nil), s.order...) // let a drained queue's array go
	}
	return n
}

// ForgetWorker drops every request of worker w (it left the fleet), and its report.
func (s *Slots) ForgetWorker(w index.Worker) {
	s.loads[w].report.Store(nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, req := range s.reqs {
		if req.worker == w {
			s.finishLocked(id)
		}
	}
}

// InFlight is the number of requests tracked.
func (s *Slots) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}
