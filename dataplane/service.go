package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"dataplane/dataplane/encoderpool"
	"dataplane/dataplane/media"
	"dataplane/dataplane/media/fetch"
	"dataplane/dataplane/memory"
	"dataplane/dataplane/openai"
	"dataplane/dataplane/worker"
	"dataplane/features"
	"dataplane/router"
	"dataplane/router/kvevents"
)

// ServiceOptions configure the request path. DefaultServiceOptions has every default.
type ServiceOptions struct {
	Models    ModelOptions
	Tokenizer TokenizerOptions
	Features  features.Options
	Pool      encoderpool.Options
	Router    router.Options
	KVEvents  kvevents.Options
	Fetch     fetch.Options
	Limits    openai.Limits
	Media     media.Options
	// MediaKey names the preprocessing options that change features (part of the cache key).
	MediaKey string
	// MaxMediaBytes bounds one media item's encoded bytes (data: URLs, inline data, fetches).
	MaxMediaBytes int64
	// ItemTimeout bounds one request's media from arrival to encoded: fetch, decode, encode.
	ItemTimeout time.Duration
	// MaxFetches bounds the media fetches (file://, http(s)://) running at once.
	MaxFetches int
	// MaxPromptTokens bounds the merged prompt (the model's context).
	MaxPromptTokens int
	// DefaultMaxTokens is max_tokens when a request gives none.
	DefaultMaxTokens int
	// CachePolicy applies when a request gives none (features.ParsePolicy).
	CachePolicy string
	// MaxUUIDs and MaxUUIDBytes bound the table of client uuids: entries, and their bytes
	// (uuids, salts and keys are clients' strings of up to 1 KiB).
	MaxUUIDs, MaxUUIDBytes int
	// Transfer estimates the cost of sending features to a remote worker (bytes a second).
	TransferBytesPerSecond float64
	// MemoryBytes is the process's memory budget (--memory-bytes); 0: no accounting. What is
	// left of it after the feature store, what the process holds once its models are loaded and
	// memory.RuntimeReserve is the budget of everything requests make (Memory().Capacity()).
	MemoryBytes int64
	// RequestMemoryBytes, when > 0, is the request budget itself, whatever MemoryBytes says
	// (an embedding program that knows what it can spare).
	RequestMemoryBytes int64
	// MemoryWait is how long a request waits for memory, in all its reservations, before a 503
	// (0: memory's default).
	MemoryWait time.Duration
	// HealthInterval is how often the prober asks every worker whether it is healthy
	// (worker.Prober; a worker that is not one is always healthy); HealthTimeout bounds one
	// probe. After HealthFailures failed probes in a row a worker leaves routing and its blocks
	// leave the index; the first probe that succeeds brings it back. A request that finds a
	// worker unavailable takes it out of routing at once; only the prober brings it back.
	// 1s, 1s, 2.
	HealthInterval, HealthTimeout time.Duration
	HealthFailures                int
	// Handoff is how requests with media reach HTTP engines, and so how the router hashes them
	// (handoff.go): "embeds", "ec" or "tokens" (worker.ParseHandoff); "" for in-process
	// workers. ECDir is the EC directory of the ec hand-off (vLLM's shared_storage_path), ECBytes
	// its capacity (0: the feature store's host capacity).
	Handoff string
	ECDir   string
	ECBytes int64
	// Warmup: prefix warm-ups while media encode (warmup.go); MinTokens 0 sends none.
	Warmup WarmupOptions
	// WrapEncoder, if set, wraps the encoder every job runs on (instrumentation; tests inject
	// faults with it).
	WrapEncoder func(encoderpool.Model) encoderpool.Model
	Log         *slog.Logger
}

// DefaultServiceOptions are the embedded defaults `make run` serves with.
func DefaultServiceOptions() ServiceOptions {
	return ServiceOptions{
		Models:                 DefaultModelOptions(),
		Tokenizer:              DefaultTokenizerOptions(),
		Features:               features.DefaultOptions(),
		Pool:                   encoderpool.DefaultOptions(),
		Router:                 router.DefaultOptions(),
		KVEvents:               kvevents.DefaultOptions(),
		Limits:                 openai.DefaultLimits(),
		MediaKey:               "default",
		MaxMediaBytes:          32 << 20,
		ItemTimeout:            60 * time.Second,
		MaxFetches:             64,
		MaxPromptTokens:        32768,
		DefaultMaxTokens:       256,
		MaxUUIDs:               1 << 16,
		MaxUUIDBytes:           32 << 20,
		TransferBytesPerSecond: 10e9,
		HealthInterval:         time.Second,
		HealthTimeout:          time.Second,
		HealthFailures:         2,
		Warmup:                 DefaultWarmupOptions(),
	}
}

// Service is the daemon's request path: models, tokenizer, feature store, encoder pool,
// router and LLM workers.
type Service struct {
	opts    ServiceOptions
	log     *slog.Logger
	models  *Models
	tok     *Tok
	store   *features.Store
	pool    *encoderpool.Pool
	router  *router.Router
	feed    *kvevents.Feed
	fetcher *fetch.Fetcher
	uuids   *uuidTable
	metrics *serviceMetrics
	routes  *router.DecisionLog
	memPlan memory.Plan
	memory  *memory.Budget // nil: no accounting
	handoff handoff
	remote  *remoteState // nil: items are encoded here only (SetRemote)
	warm    *warmups

	mu      sync.Mutex
	workers map[string]*workerEntry
	closed  bool
	active  sync.WaitGroup // requests in flight, for the drain
	nextID  atomic.Uint64
	prep    *cpuSlots // bounds concurrent media preprocessing to the CPU count, sheds what would miss its deadline
	// fetchSem bounds concurrent media fetches (MaxFetches), apart from prep.
	fetchSem chan struct{}

	// Worker health (health.go): healthMu guards every entry's health fields and is held while
	// the router is told (an atomic store); healthy counts the healthy workers for Ready.
	healthMu   sync.Mutex
	healthy    atomic.Int32
	health     *healthMetrics
	stopProber context.CancelFunc
	prober     sync.WaitGroup
}

// NewService loads the models and the tokenizer and builds the pieces. Workers are added
// with AddWorker.
func NewService(opts ServiceOptions) (*Service, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	def := DefaultServiceOptions()
	if opts.HealthInterval <= 0 {
		opts.HealthInterval = def.HealthInterval
	}
	if opts.HealthTimeout <= 0 {
		opts.HealthTimeout = def.HealthTimeout
	}
	if opts.HealthFailures <= 0 {
		opts.HealthFailures = def.HealthFailures
	}
	if opts.MaxUUIDBytes <= 0 {
		opts.MaxUUIDBytes = def.MaxUUIDBytes
	}
	s := &Service{opts: opts, log: opts.Log, workers: map[string]*workerEntry{}, health: newHealthMetrics(),
		uuids:  newUUIDTable(max(opts.MaxUUIDs, 1), opts.MaxUUIDBytes),
		routes: router.NewDecisionLog(router.RecentDecisions), prep: newCPUSlots(runtime.GOMAXPROCS(0)),
		fetchSem: make(chan struct{}, max(opts.MaxFetches, 1))}
	var err error
	if s.tok, err = LoadTokenizer(opts.Tokenizer); err != nil {
		return nil, err
	}
	if opts.Models.Embeddings == "" {
		opts.Models.DemoVocab = s.tok.VocabSize()
	}
	opts.Models.TokenizerDir = opts.Tokenizer.Dir // its processor files, when it has some
	opts.Models.CountOnly = opts.Handoff == worker.HandoffTokens.String()
	if s.models, err = LoadModels(opts.Models); err != nil {
		return nil, err
	}
	if s.models.Table.Rows < s.tok.VocabSize() {
		s.models.Close()
		return nil, fmt.Errorf("%w: the embedding table has %d rows, the tokenizer %d tokens", ErrModels, s.models.Table.Rows, s.tok.VocabSize())
	}
	if err := s.setupHandoff(&opts); err != nil {
		s.closePieces()
		return nil, fmt.Errorf("--handoff: %w", err)
	}
	s.opts = opts
	if s.store, err = features.New(opts.Features); err != nil {
		s.closePieces()
		return nil, err
	}
	if s.fetcher, err = fetch.New(opts.Fetch); err != nil {
		s.closePieces()
		return nil, err
	}
	if s.router, err = router.New(opts.Router); err != nil {
		s.closePieces()
		return nil, err
	}
	if opts.KVEvents.Log == nil {
		opts.KVEvents.Log = opts.Log // the first drop per worker and reason
	}
	if s.feed, err = kvevents.NewFeed(s.router, opts.KVEvents); err != nil {
		s.closePieces()
		return nil, err
	}
	switch {
	case opts.RequestMemoryBytes > 0:
		s.memPlan = memory.Plan{Requests: opts.RequestMemoryBytes}
	case opts.MemoryBytes > 0:
		if s.memPlan, err = memory.NewPlan(opts.MemoryBytes, opts.Features.Host.Capacity, memory.RSS()); err != nil {
			s.closePieces()
			return nil, err
		}
	}
	if s.memPlan.Requests > 0 {
		s.memory, _ = memory.New(memory.Options{Capacity: s.memPlan.Requests, MaxWait: opts.MemoryWait}) // Requests > 0: no error
	}
	s.metrics = newServiceMetrics()
	s.warm = newWarmups(opts.Warmup, opts.Log)
	po := opts.Pool
	po.Observe = s.metrics.observeBatch
	s.pool = encoderpool.New(po)
	s.startProber()
	return s, nil
}

// AddWorker puts an LLM worker behind the router, healthy; its KV events come through the
// returned engine (the caller feeds it, e.g. kvevents.SubscribeZMQ or a mocker's sink). The
// prober asks it how it is from the next round on (worker.Prober).
func (s *Service) AddWorker(w worker.Worker) (*kvevents.Engine, error) {
	return s.AddWorkerVia(w, s.feed.AddWorker)
}

// AddWorkerVia is AddWorker with the router's registration done by register (of the service's
// feed; a kvevents.StreamFeed's AddWorker, which applies what the stream holds for the worker
// first, so it may take a while: no lock is held meanwhile). The worker is in the service
// before the router can choose it.
func (s *Service) AddWorkerVia(w worker.Worker, register func(name string) (*kvevents.Engine, error)) (*kvevents.Engine, error) {
	name := w.Name()
	s.mu.Lock()
	if _, dup := s.workers[name]; dup {
		s.mu.Unlock()
		return nil, fmt.Errorf("worker %q added twice", name)
	}
	entry := s.newEntry(w)
	s.workers[name] = entry
	s.mu.Unlock()
	e, err := register(name)
	if err != nil {
		s.mu.Lock()
		delete(s.workers, name)
		s.mu.Unlock()
		s.dropEntry(entry)
		return nil, err
	}
	return e, nil
}

// RemoveWorker takes a worker out of routing (unregister: the router's side, e.g. the feed's or
// a kvevents.StreamFeed's RemoveWorker, which also drops its blocks from the index), then out of
// the service. Generations it has begun finish.
func (s *Service) RemoveWorker(name string, unregister func(name string) error) error {
	s.mu.Lock()
	e := s.workers[name]
	s.mu.Unlock()
	if e == nil {
		return fmt.Errorf("worker %q: not a worker of this service", name)
	}
	err := unregister(name)
	s.mu.Lock()
	if s.workers[name] == e {
		delete(s.workers, name)
	}
	s.mu.Unlock()
	s.dropEntry(e)
	e.w.Close() //nolint:errcheck // idle connections only; streams in flight keep theirs
	return err
}

// dropEntry retires a worker taken out of the service: it no longer counts as healthy, and its
// probe counters go.
func (s *Service) dropEntry(e *workerEntry) {
	s.healthMu.Lock()
	if e.healthy {
		s.healthy.Add(-1)
	}
	e.healthy, e.removed = false, true
	s.healthMu.Unlock()
	s.health.probes.DeleteLabelValues(e.name, "ok")
	s.health.probes.DeleteLabelValues(e.name, "failed")
}

// Memory is the budget requests reserve against (nil: no accounting), and MemoryPlan how
// --memory-bytes was divided.
func (s *Service) Memory() *memory.Budget  { return s.memory }
func (s *Service) MemoryPlan() memory.Plan { return s.memPlan }

// Router is the service's router (for metrics and the debug endpoint).
func (s *Service) Router() *router.Router { return s.router }

// Decisions are the latest routing decisions, for the debug endpoint.
func (s *Service) Decisions() *router.DecisionLog { return s.routes }

// Limits bound what one request may contain, for the API's parser.
func (s *Service) Limits() openai.Limits { return s.opts.Limits }

// FeatureStats are the feature store's counters now.
func (s *Service) FeatureStats() features.Stats { return s.store.Stats() }

// Feed keeps the router's index in step with the workers' KV events.
func (s *Service) Feed() *kvevents.Feed { return s.feed }

// Models and Tokenizer are what the service serves with.
func (s *Service) Models() *Models { return s.models }
func (s *Service) Tokenizer() *Tok { return s.tok }

// Collectors are the service's Prometheus collectors: its own (the workers' health probes
// and the memory budget among them), the feature store's and the router's (its KV events' counters
// included).
func (s *Service) Collectors() []prometheus.Collector {
	cs := append(s.metrics.collectors(), s.health.probes, s.store.Collector(), router.NewCollector(s.router),
		kvevents.NewCollector(s.feed), newMemoryCollector(s.memPlan, s.memory))
	if s.handoff.ec != nil {
		cs = append(cs, newECCollector(s.handoff.ec))
	}
	return append(cs, s.warm.collectors()...)
}

// Why Ready refuses (allocated once: a probe allocates nothing).
var (
	errShuttingDown    = errors.New("shutting down")
	errNoWorker        = errors.New("no LLM worker")
	errNoHealthyWorker = errors.New("no healthy LLM worker")
)

// Ready says whether the service can take requests (an error says why not): not while it
// shuts down, nor while no LLM worker is healthy.
func (s *Service) Ready() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errShuttingDown
	case len(s.workers) == 0:
		return errNoWorker
	case s.healthy.Load() == 0:
		return errNoHealthyWorker
	}
	return nil
}

// Close waits for requests in flight (up to ctx), then stops the prober, the pool, the workers
// and the store.
func (s *Service) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("requests still in flight: %w", ctx.Err())
	}
	s.warm.close()
	s.stopProber()
	s.prober.Wait()
	s.pool.Close()
	s.mu.Lock()
	for _, e := range s.workers {
		e.w.Close()
	}
	s.mu.Unlock()
	s.closePieces()
	return err
}

func (s *Service) closePieces() {
	if s.store != nil {
		if err := s.store.Close(); err != nil {
			s.log.Warn("feature store close", "err", err)
		}
	}
	if s.handoff.ec != nil { // after the store: its last forgets are in
		if err := s.handoff.ec.Close(); err != nil {
			s.log.Warn("EC directory close", "err", err)
		}
	}
	if s.models != nil {
		s.models.Close()
	}
}

// begin registers a request in flight; false once the service is closing.
func (s *Service) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.active.Add(1)
	return true
}

// entry is the worker with that name, or nil.
func (s *Service) entry(name string) *workerEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.workers[name]
}

// entries are the workers, by name.
func (s *Service) entries() []*workerEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*workerEntry, 0, len(s.workers))
	for _, e := range s.workers {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *workerEntry) int { return strings.Compare(a.name, b.name) })
	return out
}
