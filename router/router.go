package router

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"dataplane/router/index"
)

// Options configure a Router. DefaultOptions has every default.
type Options struct {
	BlockSize     int           // tokens per KV block, as the engines use (vLLM --block-size); 16
	OverlapWeight float64       // weight of prefill blocks against decode blocks in the cost; 1
	Temperature   float64       // 0: cheapest worker; > 0: softmax over normalised costs; 0
	Index         index.Options // index.DefaultOptions: 64 workers, device tier only, 256 shards
	Capacity      int64         // default per-worker cap on index blocks per tier (0: none); 0
	RequestTTL    time.Duration // in-flight requests older than this are dropped; 5m (Dynamo's)
	MaxRequests   int           // most requests tracked in flight; 1<<20
	// MaxTrackedBlocks bounds the prompt blocks of the requests tracked in flight, about 50
	// bytes each (their hashes, keys and the active index's entries): requests are as long as
	// their clients make them. The oldest go first, as with MaxRequests. 1<<21.
	MaxTrackedBlocks int
	Seed             uint64 // for temperature draws; 0: random
	// PrefillSecondsPerToken is how long a worker takes to prefill one prompt token: it turns
	// times (an encode ETA, a transfer) into blocks of prefill, the unit of the cost (BlocksIn).
	// 15e-6, Dynamo's mocker model (0.24 ms a 16-token block).
	PrefillSecondsPerToken float64
	// LoadReportTTL is how long a worker's own load report (ReportLoad) counts in the cost;
	// older, the router's own counts alone do. 3s: a fleet's workers report at least every
	// second (router/fleet).
	LoadReportTTL time.Duration
	// Disagg configures the two-step decisions of a disaggregated fleet (disagg.go): topology
	// filter and soft transfer cost.
	Disagg DisaggOptions
}

// DefaultMaxTrackedBlocks is Options.MaxTrackedBlocks' default, and NewSlots'.
const DefaultMaxTrackedBlocks = 1 << 21

// DefaultOptions are the defaults above.
func DefaultOptions() Options {
	return Options{BlockSize: 16, OverlapWeight: 1, Index: index.DefaultOptions(),
		RequestTTL: 5 * time.Minute, MaxRequests: 1 << 20, MaxTrackedBlocks: DefaultMaxTrackedBlocks, PrefillSecondsPerToken: 15e-6, LoadReportTTL: 3 * time.Second,
		Disagg: DefaultDisaggOptions()}
}

// Router ties the pieces together: the cache index (fed by KV events: package kvevents), the
// slot tracker fed by the request lifecycle, and the scorer. Each piece is usable alone; the
// Router keeps worker names and health, and answers Decide without taking a lock.
type Router struct {
	opts  Options
	ix    *index.Index
	slots *Slots

	regMu   sync.Mutex                // serialises worker registration
	workers atomic.Pointer[[]*worker] // copy-on-write, sorted by name

	randMu sync.Mutex
	rand   *rand.Rand

	decisions atomic.Int64
	hashers   sync.Pool
	disagg    disaggState
}

type worker struct {
	name    string
	slot    index.Worker
	healthy atomic.Bool
	info    atomic.Pointer[WorkerInfo] // role and topology (SetWorkerInfo); nil: aggregated, no labels
}

// ErrUnknownWorker names a worker the router does not have.
type ErrUnknownWorker struct{ Name string }

func (e *ErrUnknownWorker) Error() string { return fmt.Sprintf("no worker %q", e.Name) }

// ErrNoWorker means no worker was eligible for a request.
type ErrNoWorker struct{ Workers int }

func (e *ErrNoWorker) Error() string {
	return fmt.Sprintf("no eligible worker among %d (unhealthy or not allowed)", e.Workers)
}

// New builds a router with no workers.
func New(opts Options) (*Router, error) {
	if opts.BlockSize <= 0 {
		return nil, ErrBlockSize(opts.BlockSize)
	}
	if opts.OverlapWeight < 0 || opts.Temperature < 0 {
		return nil, fmt.Errorf("router options: overlap weight %v and temperature %v must not be negative", opts.OverlapWeight, opts.Temperature)
	}
	if !(opts.PrefillSecondsPerToken > 0) {
		return nil, fmt.Errorf("router options: prefill seconds per token %v must be positive", opts.PrefillSecondsPerToken)
	}
	if err := opts.Disagg.check(); err != nil {
		return nil, err
	}
	ix, err := index.New(opts.Index)
	if err != nil {
		return nil, err
	}
	slots, err := NewSlots(opts.Index.MaxWorkers, opts.BlockSize, opts.RequestTTL, opts.MaxRequests)
	if err != nil {
		return nil, err
	}
	if opts.MaxTrackedBlocks > 0 {
		slots.maxBlocks = opts.MaxTrackedBlocks
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	r := &Router{opts: opts, ix: ix, slots: slots, rand: rand.New(rand.NewPCG(seed, 0x5eed))}
	r.workers.Store(&[]*worker{})
	r.hashers.New = func() any { return newScratch(opts.BlockSize) }
	return r, nil
}

// Index and Slots expose the parts (for metrics, debugging, and package kvevents, which keeps
// the index in step with the engines).
func (r *Router) Index() *index.Index { return r.ix }
func (r *Router) Slots() *Slots       { return r.slots }
func (r *Router) Options() Options    { return r.opts }
func (r *Router) Decisions() int64    { return r.decisions.Load() }

// AddWorker registers a healthy worker and returns its slot in the index, where what it caches
// is recorded (kvevents.Feed.AddWorker registers a worker with an engine that records it from
// its KV events).
func (r *Router) AddWorker(name string) (index.Worker, error) {
	r.regMu.Lock()
	defer r.regMu.Unlock()
	old := *r.workers.Load()
	if slices.ContainsFunc(old, func(w *worker) bool { return w.name == name }) {
		return -1, fmt.Errorf("worker %q already registered", name)
	}
	slot, err := r.ix.AddWorker(r.opts.Capacity)
	if err != nil {
		return -1, err
	}
	w := &worker{name: name, slot: slot}
	w.healthy.Store(true)
	next := append(slices.Clone(old), w)
	slices.SortFunc(next, func(a, b *worker) int { return cmp.Compare(a.name, b.name) })
	r.workers.Store(&next)
	return slot, nil
}

// RemoveWorker forgets a worker: its index entries and its requests in flight. Stop feeding its
// index entries first (kvevents.Feed.RemoveWorker does both).
func (r *Router) RemoveWorker(name string) error {
	r.regMu.Lock()
	defer r.regMu.Unlock()
	old := *r.workers.Load()
	i := slices.IndexFunc(old, func(w *worker) bool { return w.name == name })
	if i < 0 {
		return &ErrUnknownWorker{Name: name}
	}
	next := slices.Delete(slices.Clone(old), i, i+1)
	r.workers.Store(&next)
	r.forgetInfo(old[i])
	r.slots.ForgetWorker(old[i].slot)
	r.ix.RemoveWorker(old[i].slot)
	return nil
}

// SetHealthy marks a worker eligible or not for new requests.
func (r *Router) SetHealthy(name string, healthy bool) error {
	w := r.find(name)
	if w == nil {
		return &ErrUnknownWorker{Name: name}
	}
	w.healthy.Store(healthy)
	return nil
}

// ReportLoad records a worker's own report of its load (in a fleet, from its load subject):
// the cost then counts what other routers sent it too (Slots.LoadAt says how the two combine).
func (r *Router) ReportLoad(name string, rep LoadReport) error {
	w := r.find(name)
	if w == nil {
		return &ErrUnknownWorker{Name: name}
	}
	r.slots.Report(w.slot, rep, time.Now())
	return nil
}

// SetCapacity sets a worker's cap on index blocks (its engine's KV block count).
func (r *Router) SetCapacity(name string, blocks int64) error {
	w := r.find(name)
	if w == nil {
		return &ErrUnknownWorker{Name: name}
	}
	r.ix.SetCapacity(w.slot, blocks)
	return nil
}

func (r *Router) find(name string) *worker {
	ws := *r.workers.Load() // sorted by name (AddWorker)
	if i, ok := slices.BinarySearchFunc(ws, name, func(w *worker, name string) int { return strings.Compare(w.name, name) }); ok {
		return ws[i]
	}
	return nil
}

// BlocksIn is how many blocks of prefill a worker computes in that many seconds
// (Options.PrefillSecondsPerToken): the unit of Request.ReadyIn and Request.Transfer.
func (r *Router) BlocksIn(seconds float64) float64 {
	return seconds / (float64(r.opts.BlockSize) * r.opts.PrefillSecondsPerToken)
}

// Workers lists the registered worker names, sorted.
func (r *Router) Workers() []string {
	var out []string
	for _, w := range *r.workers.Load() {
		out = append(out, w.name)
	}
	return out
}

// Request is what a routing decision needs.
type Request struct {
	Tokens []uint32 // the prompt's token ids
	Media  []Media  // multimodal items and the token positions their placeholders occupy
	LoRA   string   // adapter name, mixed into block hashes
	Salt   string   // cache salt (tenant isolation), mixed into block hashes
	Allow  []string // if not empty, only these workers are eligible
	// ReadyIn is how long until the request's media features are ready (the encoder's ETA), in
	// blocks of prefill time (Router.BlocksIn converts seconds). A worker cannot start the
	// prefill before then, but its own prefill backlog drains meanwhile: each worker is charged
	// only the part of the wait its backlog does not already cover (WorkerScore.EncodeWait), so
	// a request with a long encode leans towards cache overlap over a short queue.
	ReadyIn float64
	// Transfer, if set, is the cost of moving the request's features to a worker, in blocks of
	// prefill time (Router.BlocksIn).
	Transfer func(worker string) float64
	// Encoders, if set, are the places the media can be encoded (joint routing, encoders.go):
	// the decision takes the one whose features are ready first, names it (Decision.Encoder) and
	// uses its ready time as ReadyIn.
	Encoders []EncoderOption
}

// Decision is a routing answer and its explanation.
type Decision struct {
	Worker string        `json:"worker"`
	Blocks int           `json:"blocks"` // full blocks of the prompt
	Tokens int           `json:"tokens"`
	Hashes []uint64      `json:"-"` // the prompt's sequence hashes, for Start
	Scores []WorkerScore `json:"scores"`
	// A disaggregated decision (DecideDisagg) also names the prefill worker; Worker and Decode
	// are then the decode worker, Scores the decode step's, PrefillScores the prefill step's.
	Prefill       string          `json:"prefill,omitempty"`
	Decode        string          `json:"decode,omitempty"`
	PrefillScores []WorkerScore   `json:"prefill_scores,omitempty"`
	Topology      *TopologyChoice `json:"topology,omitempty"`
	// With Request.Encoders: the encoder chosen and every option's terms.
	Encoder  string          `json:"encoder,omitempty"`
	Encoders []EncoderOption `json:"encoders,omitempty"`
}

// Score is the named worker's line in the explanation, or nil.
func (d *Decision) Score(worker string) *WorkerScore {
	// Decide lists the workers by name: a binary search finds it in a large fleet.
	if i, ok := slices.BinarySearchFunc(d.Scores, worker, func(s WorkerScore, name string) int { return strings.Compare(s.Worker, name) }); ok {
		return &d.Scores[i]
	}
	for i := range d.Scores { // a list in another order
		if d.Scores[i].Worker == worker {
			return &d.Scores[i]
		}
	}
	return nil
}

// scratch is per-call state Decide takes from a pool.
type scratch struct {
	hasher         *Hasher
	cached, active index.Match
}

func newScratch(blockSize int) *scratch {
	h, _ := NewHasher(blockSize) // blockSize was checked by New
	return &scratch{hasher: h}
}

// Decide scores every worker for a request, picks one and writes the answer and its
// explanation into d, reusing d's slices (a caller that keeps one Decision per goroutine
// allocates nothing). It changes nothing else: call Start to record the request against the
// chosen worker. Errors: *ErrBadMedia, *ErrNoWorker (d then still explains why).
func (r *Router) Decide(req Request, d *Decision) error {
	sc := r.hashers.Get().(*scratch)
	defer r.hashers.Put(sc)
	total, err := r.lookup(&req, d, sc)
	if err != nil {
		return err
	}
	workers := *r.workers.Load()
	ttft := r.msPerBlock()
	d.Scores = slices.Grow(d.Scores[:0], len(workers))[:len(workers)]
	bs, isl, lastTier := r.opts.BlockSize, len(req.Tokens), r.opts.Index.Tiers-1
	now := time.Now()
	for i, w := range workers {
		s := &d.Scores[i]
		// scoreWorker's terms, written out: the call per worker (it does not inline) made a
		// decision over 10,000 workers 16 % slower (Decide4K, 8 alternating runs, benchstat).
		*s = WorkerScore{Worker: w.name}
		s.Overlap = sc.cached.Blocks(w.slot, 0)
		s.OverlapAny = sc.cached.Blocks(w.slot, lastTier)
		s.ActiveBlocks, s.PrefillTokens, _, s.Reported = r.slots.LoadAt(w.slot, now, r.opts.LoadReportTTL)
		s.NewBlocks = total - sc.active.Blocks(w.slot, 0)
		s.Uncached = max(isl-s.Overlap*bs, 0)
		s.PrefillBlocks = float64(s.PrefillTokens+int64(s.Uncached)) / float64(bs)
		s.DecodeBlocks = float64(s.ActiveBlocks + int64(s.NewBlocks))
		s.EncodeWait = max(req.ReadyIn-float64(s.PrefillTokens)/float64(bs), 0)
		if req.Transfer != nil {
			s.Transfer = req.Transfer(w.name)
		}
		s.Cost = r.opts.OverlapWeight*(s.PrefillBlocks+s.EncodeWait) + s.DecodeBlocks + s.Transfer
		s.TTFT = (s.PrefillBlocks + s.EncodeWait + s.Transfer) * ttft
		switch {
		case !w.healthy.Load():
			s.Excluded = "unhealthy"
		case len(req.Allow) > 0 && !slices.Contains(req.Allow, w.name):
			s.Excluded = "not in allow-list"
		case w.prefillOnly():
			s.Excluded = excludedPrefillOnly
		default:
			s.Eligible = true
		}
	}
	pick := Choose(d.Scores, r.opts.Temperature, r.draw())
	if pick < 0 {
		return &ErrNoWorker{Workers: len(workers)}
	}
	d.Worker = d.Scores[pick].Worker
	r.decisions.Add(1)
	return nil
}

// lookup is what every decision starts with: the prompt's sequence hashes into d (with its
// block and token counts), matched against the cache index and the blocks in flight into sc;
// with encoder options, the encoder chosen (d.Encoder) and its ready time as req.ReadyIn.
// It returns the prompt's blocks, the last one partial included.
func (r *Router) lookup(req *Request, d *Decision, sc *scratch) (total int, err error) {
	hashes, err := sc.hasher.Sequence(d.Hashes[:0], req.Tokens, SeedFor(req.LoRA, req.Salt), req.Media)
	if err != nil {
		return 0, err
	}
	r.ix.Match(hashes, &sc.cached)
	r.slots.ActiveMatch(hashes, &sc.active)
	d.Worker, d.Blocks, d.Tokens, d.Hashes = "", len(hashes), len(req.Tokens), hashes
	if req.ReadyIn, err = r.chooseEncoder(*req, d); err != nil {
		return 0, err
	}
	bs := r.opts.BlockSize
	return (len(req.Tokens) + bs - 1) / bs, nil
}

// msPerBlock is a block of prefill in milliseconds: WorkerScore.TTFT's unit conversion.
func (r *Router) msPerBlock() float64 {
	return float64(r.opts.BlockSize) * r.opts.PrefillSecondsPerToken * 1e3
}

// Start records a request routed by d (to d.Worker, or another worker the caller chose) with the
// lifecycle tracker, until FirstToken, Finish or expiry.
func (r *Router) Start(id string, d Decision, workerName string, now time.Time) error {
	w := r.find(workerName)
	if w == nil {
		return &ErrUnknownWorker{Name: workerName}
	}
	if d.Prefill != "" {
		return r.startDisagg(id, d, w, now)
	}
	uncached := d.Tokens
	if s := d.Score(workerName); s != nil {
		uncached = s.Uncached
	}
	return r.slots.Start(id, w.slot, d.Hashes, d.Tokens, uncached, now)
}

// FirstToken, Finish: the rest of the lifecycle (Finish also serves cancellation); either ends
// a disaggregated request's prefill step too (PrefillDone).
func (r *Router) FirstToken(id string) {
	r.slots.FirstToken(id)
	r.PrefillDone(id)
}

// Finish records the end of a request; false if it was not tracked (finished or expired).
func (r *Router) Finish(id string) bool {
	ok := r.slots.Finish(id)
	r.PrefillDone(id)
	return ok
}

// Expire drops requests older than the TTL; call it now and then (the standalone router does
// every TTL/10).
func (r *Router) Expire(now time.Time) int { return r.slots.Expire(now) }

// WorkerLoad is a worker's row in Snapshot.
type WorkerLoad struct {
	Worker        string       `json:"worker"`
	Slot          index.Worker `json:"slot"`
	Healthy       bool         `json:"healthy"`
	Blocks        []int64      `json:"cached_blocks"` // index blocks held, per tier
	ActiveBlocks  int64        `json:"active_blocks"`
	PrefillTokens int64        `json:"prefill_tokens"`
	Requests      int64        `json:"requests"`
	// The worker's own last report (ReportLoad) while it counts, and what the cost uses.
	Reported  *LoadReport `json:"reported,omitempty"`
	Effective *LoadReport `json:"effective,omitempty"`
}

// Snapshot reports every worker's state (for metrics and debugging).
func (r *Router) Snapshot() []WorkerLoad {
	var out []WorkerLoad
	now := time.Now()
	for _, w := range *r.workers.Load() {
		l := WorkerLoad{Worker: w.name, Slot: w.slot, Healthy: w.healthy.Load()}
		for t := range r.opts.Index.Tiers {
			l.Blocks = append(l.Blocks, r.ix.Held(w.slot, t))
		}
		l.ActiveBlocks, l.PrefillTokens, l.Requests = r.slots.Load(w.slot)
		if b, p, q, fresh := r.slots.LoadAt(w.slot, now, r.opts.LoadReportTTL); fresh {
			rep := r.slots.loads[w.slot].report.Load().LoadReport
			l.Reported, l.Effective = &rep, &LoadReport{ActiveBlocks: b, PrefillTokens: p, Requests: q}
		}
		out = append(out, l)
	}
	return out
}
