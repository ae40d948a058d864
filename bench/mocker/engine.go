package mocker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"dataplane/router"
)

// Options configure one mock engine. DefaultOptions has every default (Dynamo's mocker's).
type Options struct {
	Name      string // the worker name (KV events and the router use it)
	BlockSize int    // tokens per KV block; 16
	Blocks    int    // KV cache size in blocks; 16,384
	MaxSeqs   int    // most requests running at once; 256
	// MaxBatchedTokens is the step's token budget (decodes count one each); 8,192.
	MaxBatchedTokens int
	// Watermark is the fraction of blocks a newly admitted request must leave free; 0.01.
	Watermark float64
	// ChunkedPrefill splits long prompts over steps within the token budget; true. Without
	// it a prompt waits until it fits whole (alone in a step if longer than the budget).
	ChunkedPrefill bool
	Perf           PerfModel // step timing; Polynomial
	MaxWaiting     int       // most requests queued; beyond, Submit fails; 4,096
	DPRank         int       // the data_parallel_rank in KV-event batches; 0
	MapEvents      bool      // KV events in vLLM's newer map layout instead of arrays; false
	Vocab          int       // generated token ids are drawn from [0, Vocab); 32,000
	Seed           uint64    // for generated tokens; 0: random
}

// DefaultOptions are Dynamo's mocker defaults.
func DefaultOptions() Options {
	return Options{BlockSize: 16, Blocks: 16384, MaxSeqs: 256, MaxBatchedTokens: 8192, Watermark: 0.01,
		ChunkedPrefill: true, Perf: Polynomial{}, MaxWaiting: 4096, Vocab: 32000}
}

// ErrOptions names an unusable option.
type ErrOptions struct{ Field, Problem string }

func (e *ErrOptions) Error() string { return "mocker options: " + e.Field + " " + e.Problem }

func (o *Options) check() error {
	switch {
	case o.BlockSize <= 0:
		return &ErrOptions{"BlockSize", fmt.Sprintf("%d: must be positive", o.BlockSize)}
	case o.Blocks <= 1:
		return &ErrOptions{"Blocks", fmt.Sprintf("%d: need at least 2", o.Blocks)}
	case o.MaxSeqs <= 0:
		return &ErrOptions{"MaxSeqs", fmt.Sprintf("%d: must be positive", o.MaxSeqs)}
	case o.MaxBatchedTokens <= 0:
		return &ErrOptions{"MaxBatchedTokens", fmt.Sprintf("%d: must be positive", o.MaxBatchedTokens)}
	case o.Watermark < 0 || o.Watermark >= 1:
		return &ErrOptions{"Watermark", fmt.Sprintf("%v: want [0, 1)", o.Watermark)}
	case o.Perf == nil:
		return &ErrOptions{"Perf", "is nil"}
	case o.MaxWaiting <= 0:
		return &ErrOptions{"MaxWaiting", fmt.Sprintf("%d: must be positive", o.MaxWaiting)}
	case o.Vocab <= 0:
		return &ErrOptions{"Vocab", fmt.Sprintf("%d: must be positive", o.Vocab)}
	}
	return nil
}

// Request is one generation for an engine.
type Request struct {
	ID        string
	Tokens    []uint32       // the prompt, media placeholder runs expanded; not modified
	Media     []router.Media // media items and the tokens they occupy
	MediaIDs  []string       // their identifiers (Media[i]'s), listed in KV events' extra_keys
	Salt      string         // cache salt
	MaxTokens int            // tokens to generate (at least 1)
	// Seed, when set, draws the request's tokens from a generator of its own seeded with it
	// (the same seed, the same tokens, whatever else runs); else from the engine's.
	Seed *int64
	// RemotePrefill: the prompt's KV cache was computed by a prefill engine and arrives with the
	// request (a disaggregated decode step, vLLM's do_remote_prefill): at its first admission
	// every prompt token but the last counts as computed, its blocks stored without prefill
	// time (vLLM's decode worker recomputes the last token to get its first output). After a
	// preemption the engine recomputes the prompt itself, as vLLM does.
	RemotePrefill bool
	// Sink receives the request's outputs, in order, on the engine's loop goroutine; it must
	// not block (hand off to a channel with room, or record and return).
	Sink func(Output)
	// Ctx, when set, aborts the request once it ends, as Abort would, noticed when the engine
	// plans its next step: a context.AfterFunc per request cost the daemon's text-only path
	// allocations and a lock (issue 26). An engine holding a request is always stepping, so
	// this is as soon as Abort takes effect.
	Ctx context.Context
}

// Output is one step's result for a request.
type Output struct {
	Token        uint32        // the token generated (when Done is false, or Done with Err nil)
	First        bool          // the first generated token: prefill finished
	Done         bool          // the last output; the request holds no blocks any more
	FinishReason string        // on Done: "length", or "abort"
	Err          error         // on Done after an abort
	PromptTokens int           // on Done
	CachedTokens int           // on Done: prompt tokens found in the prefix cache at admission
	At           time.Duration // engine time of the step's end
}

// Errors from Submit.
var (
	ErrQueueFull = errors.New("mock engine: waiting queue full")
	ErrClosed    = errors.New("mock engine: closed")
)

// ErrBadRequest names what is wrong with a request.
type ErrBadRequest struct{ ID, Problem string }

func (e *ErrBadRequest) Error() string {
	return fmt.Sprintf("mock engine: request %q: %s", e.ID, e.Problem)
}

// seq is a request inside the engine.
type seq struct {
	req      *Request
	tokens   []uint32 // the prompt, then generated tokens
	hashes   []uint64 // sequence hashes of the full blocks of tokens, as far as known
	seed     uint64
	rand     *rand.Rand   // the request's own generator (Request.Seed); nil: the engine's
	extra    []blockExtra // per prompt block: what its extra_keys list (nil when nothing)
	computed int          // tokens whose KV is computed
	held     int          // full blocks referenced in the KV cache (hashes[:held])
	partial  bool         // holds a partial block
	gen      int          // tokens generated
	cached   int          // prompt tokens found cached at first admission
	admitted bool         // admitted once (cached is set)
	aborted  bool
	running  bool
}

// Engine is one mock LLM engine: KV cache, scheduler and perf model, driven by a Loop (see
// loop.go) that calls Submit and Step from one goroutine. Time is the loop's: a Duration since
// it started, real or virtual.
type Engine struct {
	opts   Options
	kv     *KV
	hasher *router.Hasher
	rand   *rand.Rand
	events *eventLog

	waiting []*seq // FIFO; preempted requests go back to the front
	running []*seq // admission order: the front is the oldest
	byID    map[string]*seq

	inStep  bool
	stepEnd time.Duration
	queued  bool // its loop has a step of it due (Loop.Wake; loop goroutine only)
	batch   []scheduled
	order   []*seq // scratch: the running queue as a step's planning began

	stats EngineStats
	cur   *seq // the sequence whose blocks are being allocated (for the KV observer)
}

type scheduled struct {
	s *seq
	n int // tokens computed this step
}

// EngineStats count what an engine did.
type EngineStats struct {
	Steps, PrefillTokens, DecodeTokens int64
	Requests, Finished, Aborted        int64
	PromptTokens, CachedTokens         int64
	RemoteTokens                       int64 // prompt tokens received computed (RemotePrefill)
	Preemptions                        int64
	Busy                               time.Duration // engine time spent in steps
}

// NewEngine builds an idle engine that publishes its KV events to pub (nil: none).
func NewEngine(opts Options, pub Publisher) (*Engine, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	h, err := router.NewHasher(opts.BlockSize)
	if err != nil {
		return nil, err
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	e := &Engine{opts: opts, hasher: h, rand: rand.New(rand.NewPCG(seed, 0x6d6f636b)), byID: map[string]*seq{}}
	e.events = newEventLog(opts, pub)
	e.kv = NewKV(opts.Blocks, e)
	return e, nil
}

// Name is the engine's worker name.
func (e *Engine) Name() string { return e.opts.Name }

// Options returns the engine's options.
func (e *Engine) Options() Options { return e.opts }

// KV exposes the block manager (tests and metrics; owned by the loop goroutine).
func (e *Engine) KV() *KV { return e.kv }

// Stats returns the counters (call from the loop goroutine).
func (e *Engine) Stats() EngineStats { return e.stats }

// Load is the engine's queue: requests waiting and running.
func (e *Engine) Load() (waiting, running int) { return len(e.waiting), len(e.running) }

// Submit queues a request. It reports whether the engine was idle (the loop must then Step it
// at now).
func (e *Engine) Submit(r *Request, now time.Duration) (wake bool, err error) {
	switch {
	case len(r.Tokens) == 0:
		return false, &ErrBadRequest{r.ID, "empty prompt"}
	case r.MaxTokens < 1:
		return false, &ErrBadRequest{r.ID, fmt.Sprintf("max tokens %d: want at least 1", r.MaxTokens)}
	case len(r.MediaIDs) != len(r.Media):
		return false, &ErrBadRequest{r.ID, fmt.Sprintf("%d media identifiers for %d media items", len(r.MediaIDs), len(r.Media))}
	case blocksFor(len(r.Tokens)+r.MaxTokens, e.opts.BlockSize) > e.opts.Blocks:
		return false, &ErrBadRequest{r.ID, fmt.Sprintf("%d prompt + %d generated tokens need more than the KV cache's %d blocks of %d",
			len(r.Tokens), r.MaxTokens, e.opts.Blocks, e.opts.BlockSize)}
	case e.byID[r.ID] != nil:
		return false, &ErrBadRequest{r.ID, "already in this engine"}
	case len(e.waiting) >= e.opts.MaxWaiting:
		return false, ErrQueueFull
	}
	s := &seq{req: r, seed: router.SeedFor("", r.Salt), tokens: make([]uint32, len(r.Tokens), len(r.Tokens)+r.MaxTokens)}
	copy(s.tokens, r.Tokens)
	if r.Seed != nil {
		s.rand = rand.New(rand.NewPCG(uint64(*r.Seed), 0x73656564))
	}
	var err2 error
	if s.hashes, err2 = e.hasher.Sequence(nil, s.tokens, s.seed, r.Media); err2 != nil {
		return false, &ErrBadRequest{r.ID, err2.Error()}
	}
	s.extra = blockExtras(r, len(s.hashes), e.opts.BlockSize)
	e.waiting = append(e.waiting, s)
	e.byID[r.ID] = s
	e.stats.Requests++
	return !e.inStep, nil
}

// Abort ends a request early (the client went away). Its Done output comes with the next step
// (or at once if it is waiting), with FinishReason "abort".
func (e *Engine) Abort(id string, now time.Duration) (wake bool) {
	s := e.byID[id]
	if s == nil || s.aborted {
		return false
	}
	s.aborted = true
	return !e.inStep
}

// Idle reports whether the engine has nothing to do.
func (e *Engine) Idle() bool { return !e.inStep && len(e.waiting) == 0 && len(e.running) == 0 }

// Step finishes the step in flight (if its end is due) and plans the next one. It returns the
// time the next step ends, or busy false when there is nothing to run.
func (e *Engine) Step(now time.Duration) (next time.Duration, busy bool) {
	if e.inStep {
		if now < e.stepEnd {
			return e.stepEnd, true
		}
		e.finishStep(e.stepEnd)
	}
	e.dropAborted(now)
	d := e.plan()
	if len(e.batch) == 0 {
		e.inStep = false
		return 0, false
	}
	e.inStep, e.stepEnd = true, now+d
	e.stats.Steps++
	e.stats.Busy += d
	return e.stepEnd, true
}

// plan schedules the next step: running requests first (in order), then waiting ones while
// the token budget, MaxSeqs and the KV watermark allow. It returns the step's duration.
func (e *Engine) plan() time.Duration {
	e.batch = e.batch[:0]
	budget := e.opts.MaxBatchedTokens
	prefill, decodes, activeKV := 0, 0, 0
	add := func(s *seq, n, want int) {
		e.batch = append(e.batch, scheduled{s, n})
		budget -= n
		if want == 1 {
			decodes++
			activeKV += s.computed + 1
		} else {
			prefill += n
		}
	}
	e.order = append(e.order[:0], e.running...)
	for _, s := range e.order {
		if budget <= 0 {
			break
		}
		if !s.running {
			continue // preempted earlier in this plan to make room
		}
		want := len(s.tokens) - s.computed
		n, ok := e.chunk(want, budget)
		if !ok {
			continue
		}
		if e.allocate(s, s.computed+n, true) {
			add(s, n, want)
		}
	}
	for len(e.waiting) > 0 && budget > 0 && len(e.running) < e.opts.MaxSeqs {
		s := e.waiting[0]
		if !e.admit(s) {
			break
		}
		want := len(s.tokens) - s.computed
		n, ok := e.chunk(want, budget)
		if !ok || !e.allocate(s, s.computed+n, false) {
			e.release(s)
			break
		}
		e.waiting = e.waiting[1:]
		s.running = true
		e.running = append(e.running, s)
		add(s, n, want)
	}
	if len(e.batch) == 0 {
		return 0
	}
	usage := float64(e.kv.Active()) / float64(e.kv.Capacity())
	return max(e.opts.Perf.Prefill(prefill)+e.opts.Perf.Decode(decodes, activeKV, usage), time.Millisecond)
}

// chunk is how many of want tokens a request computes this step with budget left: all that
// fit (chunked prefill), or all or nothing (without; a prompt longer than the whole budget runs
// alone).
func (e *Engine) chunk(want, budget int) (int, bool) {
	switch {
	case want <= budget:
		return want, true
	case e.opts.ChunkedPrefill:
		return budget, true
	case len(e.batch) == 0 && budget == e.opts.MaxBatchedTokens:
		return want, true
	}
	return 0, false
}

func (e *Engine) indexOfRunning(s *seq) int {
	for i, r := range e.running {
		if r == s {
			return i
		}
	}
	return -1
}

// admit checks the watermark for a waiting request and references its cached prompt prefix
// (vLLM recomputes at least the last prompt token, so a fully cached prompt still prefills
// one token). false: not now.
func (e *Engine) admit(s *seq) bool {
	bs := e.opts.BlockSize
	hit := e.kv.CachedPrefix(s.hashes)
	hit = min(hit, (len(s.tokens)-1)/bs)
	have := hit // full blocks the prompt gets without computing them
	remote := s.req.RemotePrefill && !s.admitted
	if remote {
		have = (len(s.tokens) - 1) / bs
	}
	need := blocksFor(len(s.tokens), bs) - hit
	reuse := 0 // cached blocks that are inactive now: referencing them takes free room too
	for _, h := range s.hashes[:hit] {
		if e.kv.Refs(h) == 0 {
			reuse++
		}
	}
	watermark := int(e.opts.Watermark * float64(e.opts.Blocks))
	if e.kv.Free()-need-reuse < watermark && len(e.running) > 0 {
		return false
	}
	e.cur = s
	n, err := e.kv.Use(s.hashes[:have], 0) // the cached ones, and the received ones stored (events)
	e.cur = nil
	if err != nil {
		e.kv.Deref(s.hashes[:n])
		return false
	}
	s.held, s.computed = have, have*bs
	if remote {
		s.computed = len(s.tokens) - 1 // its partial last block is taken by the step's allocate
	}
	if !s.admitted {
		s.admitted = true
		s.cached = min(hit*bs, len(s.req.Tokens))
		e.stats.PromptTokens += int64(len(s.req.Tokens))
		e.stats.CachedTokens += int64(s.cached)
		if remote {
			e.stats.RemoteTokens += int64(s.computed - s.cached)
		}
	}
	return true
}

// allocate makes s hold the blocks for its first upTo tokens: the partial block it had is
// promoted if it filled, new full blocks are referenced, and a partial block is taken for a
// last block that stays unfinished. When the cache is full and preempt is set (s is running),
// running requests are preempted (see victim) until it fits or s itself is preempted; false if
// the room could not be made (s keeps what it got, or nothing if it was preempted).
func (e *Engine) allocate(s *seq, upTo int, preempt bool) bool {
	bs := e.opts.BlockSize
	full := upTo / bs
	e.cur = s
	defer func() { e.cur = nil }()
	e.extendHashes(s, full)
	if s.partial && s.held < full {
		var parent uint64
		if s.held > 0 {
			parent = s.hashes[s.held-1]
		}
		e.kv.Promote(s.hashes[s.held], parent, s.held)
		s.held++
		s.partial = false
	}
	makeRoom := func() bool {
		if !preempt {
			return false
		}
		v := e.victim(s)
		e.preempt(v)
		return v != s
	}
	for {
		n, err := e.kv.Use(s.hashes[:full], s.held)
		s.held += n
		if err == nil {
			break
		}
		if !makeRoom() {
			return false
		}
	}
	if upTo%bs != 0 && !s.partial {
		for e.kv.UsePartial() != nil {
			if !makeRoom() {
				return false
			}
		}
		s.partial = true
	}
	return true
}

// victim picks the running request to preempt when s needs a block the cache cannot give:
// the oldest decoding request not yet in this step's batch (s itself, if it is that one), else
// the newest one still in prefill, else s.
func (e *Engine) victim(s *seq) *seq {
	for _, r := range e.running {
		if len(r.tokens)-r.computed == 1 && (r == s || !e.inBatch(r)) {
			return r
		}
	}
	for i := len(e.running) - 1; i >= 0; i-- {
		if r := e.running[i]; r != s && !e.inBatch(r) {
			return r
		}
	}
	return s
}

// preempt sends a running request back to the front of the queue with nothing allocated.
func (e *Engine) preempt(r *seq) {
	if i := e.indexOfRunning(r); i >= 0 {
		e.running = append(e.running[:i], e.running[i+1:]...)
	}
	r.running = false
	e.release(r)
	e.waiting = append([]*seq{r}, e.waiting...)
	e.stats.Preemptions++
}

func (e *Engine) inBatch(s *seq) bool {
	for _, b := range e.batch {
		if b.s == s {
			return true
		}
	}
	return false
}

// release frees every block s holds; its KV must be recomputed (vLLM's recompute preemption),
// though the full blocks stay cached until evicted.
func (e *Engine) release(s *seq) {
	e.kv.Deref(s.hashes[:s.held])
	if s.partial {
		e.kv.Destroy(1)
	}
	s.held, s.partial, s.computed = 0, false, 0
}

// extendHashes computes the sequence hashes of s's full blocks up to full (generated tokens
// make new ones).
func (e *Engine) extendHashes(s *seq, full int) {
	bs := e.opts.BlockSize
	for b := len(s.hashes); b < full; b++ {
		h := e.hasher.LocalBlock(s.tokens[b*bs:(b+1)*bs], s.seed, nil)
		if b > 0 {
			h = router.ChainHash(s.hashes[b-1], h)
		}
		s.hashes = append(s.hashes, h)
	}
}

// finishStep applies the step that ended at t: computed tokens advance, requests that reached
// their end generate a token, finished ones release their blocks; then the step's KV events go
// out as one batch.
func (e *Engine) finishStep(t time.Duration) {
	for _, b := range e.batch {
		s := b.s
		if !s.running { // preempted after it was scheduled (cannot happen today; kept safe)
			continue
		}
		if len(s.tokens)-s.computed == 1 {
			e.stats.DecodeTokens++
		} else {
			e.stats.PrefillTokens += int64(b.n)
		}
		s.computed += b.n
		if s.computed < len(s.tokens) {
			continue // a prefill chunk
		}
		draw := e.rand
		if s.rand != nil {
			draw = s.rand
		}
		tok := uint32(draw.IntN(e.opts.Vocab))
		s.tokens = append(s.tokens, tok)
		s.gen++
		out := Output{Token: tok, First: s.gen == 1, At: t}
		if s.gen >= s.req.MaxTokens {
			out.Done, out.FinishReason = true, "length"
			out.PromptTokens, out.CachedTokens = len(s.req.Tokens), s.cached
			e.finish(s)
		}
		s.req.Sink(out)
	}
	e.batch = e.batch[:0]
	e.inStep = false
	e.events.publish(t)
}

// finish removes a request that is done (or aborted) from the engine.
func (e *Engine) finish(s *seq) {
	e.release(s)
	if s.running {
		if i := e.indexOfRunning(s); i >= 0 {
			e.running = append(e.running[:i], e.running[i+1:]...)
		}
		s.running = false
	}
	delete(e.byID, s.req.ID)
	e.stats.Finished++
}

// dropAborted ends aborted requests (between steps, so none is in a batch).
func (e *Engine) dropAborted(now time.Duration) {
	drop := func(q []*seq) []*seq {
		out := q[:0]
		for _, s := range q {
			if !s.aborted && s.req.Ctx != nil && s.req.Ctx.Err() != nil {
				s.aborted = true
			}
			if !s.aborted {
				out = append(out, s)
				continue
			}
			if s.running {
				e.release(s)
				s.running = false
			}
			delete(e.byID, s.req.ID)
			e.stats.Aborted++
			s.req.Sink(Output{Done: true, FinishReason: "abort", Err: errAborted, PromptTokens: len(s.req.Tokens), CachedTokens: s.cached, At: now})
		}
		return out
	}
	e.waiting = drop(e.waiting)
	e.running = drop(e.running)
}

var errAborted = errors.New("mock engine: request aborted")

// Stored and Evicted make the engine the KV manager's observer: they become KV events.
func (e *Engine) Stored(hash, parent uint64, block int) {
	s := e.cur
	bs := e.opts.BlockSize
	var x *blockExtra
	if block < len(s.extra) && s.extra[block].any() {
		x = &s.extra[block]
	}
	e.events.stored(hash, parent, block > 0, s.tokens[block*bs:(block+1)*bs], x)
}

func (e *Engine) Evicted(hash uint64) { e.events.removed(hash) }

// ClearCache drops every inactive block (an AllBlocksCleared event follows when nothing is
// active, as vLLM's reset_prefix_cache does only then). It reports whether the cache was reset.
func (e *Engine) ClearCache(now time.Duration) bool {
	if e.kv.Active() > 0 {
		return false
	}
	e.kv.obs = nopObserver{}
	e.kv.Clear()
	e.kv.obs = e
	e.events.cleared()
	if !e.inStep {
		e.events.publish(now)
	}
	return true
}

func blocksFor(tokens, bs int) int { return (tokens + bs - 1) / bs }
