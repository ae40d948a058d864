package kvevents

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"

	"dataplane/router"
	"dataplane/router/index"
)

// Options configure how KV events become index entries. DefaultOptions has the defaults.
type Options struct {
	// Media maps an event's medium to an index tier; events on other media are dropped and
	// counted. An event without a medium counts as "GPU". Default {"GPU": 0}.
	Media map[string]int
	// MaxEngineBlocks bounds the engine-hash → router-hash map kept per engine (needed to resolve
	// parents and removals) while the engine has no capacity (Engine.SetCapacity). Past it the
	// oldest half is forgotten: later removals of those blocks cannot be resolved, and the
	// index's per-worker cap has to reclaim them. Under a capacity the map holds only what the
	// engine holds, at most the capacity per tier. Default 1<<20.
	MaxEngineBlocks int
	// Log receives one line per worker and reason the first time an engine drops something
	// (Stats counts every time); nil logs nothing.
	Log *slog.Logger
}

// DefaultOptions: device tier only, 1M engine blocks per engine.
func DefaultOptions() Options {
	return Options{Media: map[string]int{"GPU": 0}, MaxEngineBlocks: 1 << 20}
}

// check validates the options against an index with the given number of tiers.
func (o *Options) check(tiers int) error {
	for medium, tier := range o.Media {
		if tier < 0 || tier >= tiers {
			return fmt.Errorf("kv events options: medium %q maps to tier %d, the index has %d tiers", medium, tier, tiers)
		}
	}
	return nil
}

// Stats count what happened to events, across engines. Read them with Load. Each counter of
// something dropped has its reason (metrics.go's outcome label) in reasonNames.
type Stats struct {
	Batches        atomic.Int64 // batches applied (live and replayed)
	BadPayloads    atomic.Int64 // payloads that did not decode: skipped
	BadMessages    atomic.Int64 // transport messages that carry no batch (NATS: under 8 bytes; ZMQ: not 3 frames)
	UnknownWorkers atomic.Int64 // NATS messages for a worker name the feed does not have
	BadEvents      atomic.Int64 // events that decoded but made no sense (token count vs blocks): skipped
	SparseStores   atomic.Int64 // BlockStored with fewer hashes than blocks of tokens (null or masked blocks): skipped
	UnknownEvents  atomic.Int64 // events of a type the decoder does not know (newer vLLM): skipped
	FilteredMedium atomic.Int64 // events for a medium Options.Media does not map
	FilteredGroup  atomic.Int64 // events of a KV-cache group the router does not follow (not full attention, or not the first)
	SizeMismatch   atomic.Int64 // BlockStored with another block size
	UnknownParent  atomic.Int64 // BlockStored whose parent the router never saw, and no skipped context to reach it: skipped
	UnknownBlocks  atomic.Int64 // removed blocks the router never saw
	SkippedContext atomic.Int64 // BlockStored applied by hashing its skipped context (its parent was unknown)
	BlocksStored   atomic.Int64
	BlocksRemoved  atomic.Int64
	Evicted        atomic.Int64 // index entries dropped to keep a worker within its capacity (Engine.SetCapacity)
	Clears         atomic.Int64 // AllBlocksCleared
	Duplicates     atomic.Int64 // batches seen twice (same seq): ignored
	Gaps           atomic.Int64 // sequence gaps detected
	Replayed       atomic.Int64 // batches applied from a replay
	Unrecoverable  atomic.Int64 // gaps a replay could not fill: the engine's state was dropped
	Restarts       atomic.Int64 // sequences that went backwards: the engine's state was dropped
	ReplayFailures atomic.Int64 // replay requests that failed outright
}

// reason is why something was dropped: a Stats counter and the outcome that metrics.go exports
// it under.
type reason uint8

const (
	reasonBadPayload reason = iota
	reasonBadMessage
	reasonUnknownWorker
	reasonBadEvent
	reasonSparseStore
	reasonUnknownEvent
	reasonFilteredMedium
	reasonFilteredGroup
	reasonBlockSize
	reasonUnknownParent
	reasonUnknownBlock
	numReasons
)

var reasonNames = [numReasons]string{"bad_payload", "bad_message", "unknown_worker", "bad_event", "sparse_store",
	"unknown_event", "filtered_medium", "filtered_group", "block_size_mismatch", "unknown_parent", "unknown_block"}

func (s *Stats) counter(r reason) *atomic.Int64 {
	return [numReasons]*atomic.Int64{&s.BadPayloads, &s.BadMessages, &s.UnknownWorkers, &s.BadEvents,
		&s.SparseStores, &s.UnknownEvents, &s.FilteredMedium, &s.FilteredGroup, &s.SizeMismatch,
		&s.UnknownParent, &s.UnknownBlocks}[r]
}

// Replayer fetches an engine's buffered batches with seq ≥ from, calling deliver for each in
// order, and returns when the engine says it has no more (vLLM's end marker).
type Replayer func(from uint64, deliver func(seq uint64, payload []byte)) error

// Engine follows one vLLM event publisher (one data-parallel rank: one KV cache) and keeps its
// worker's index entries in step. Its methods must be called from one goroutine, Forget aside.
type Engine struct {
	ix     *index.Index
	worker index.Worker
	opts   *Options
	stats  *Stats
	hasher *router.Hasher

	// forgotten is set by Forget (any goroutine) and taken by the next Live (the engine's).
	forgotten atomic.Bool

	haveSeq bool
	last    uint64 // last applied sequence number

	// Engine block hash → our block; two generations bound the memory (see MaxEngineBlocks).
	blocks, older map[uint64]engineBlock
	group         int      // the attention group routed on; -1 until a store names one
	kvcap         capacity // the worker's KV capacity and the store order (capacity.go)

	batch Batch
	seqs  []uint64 // scratch: the sequence hashes of an event's blocks
	keys  []uint64 // scratch: their index keys

	name   string // the worker's, for logs (Feed.AddWorker)
	logged uint32 // reasons already logged, a bit each: one line per worker and reason
}

type engineBlock struct {
	seq   uint64 // our sequence hash
	key   uint64 // its index key (router/index: keys.go)
	seed  uint64 // the seed its sequence was hashed with (LoRA and salt mixed in)
	stamp uint32 // when the engine came to hold it, in stores (capacity.go)
	tiers uint8  // tiers the engine holds it on
}

// NewEngine follows an engine whose blocks go to worker w of ix. blockSize is the engines' KV
// block size in tokens (vLLM --block-size), the router's: events with another block size are
// dropped and counted, since their hashes could never match a request. opts and stats may be
// shared by engines (a Feed's are).
func NewEngine(ix *index.Index, w index.Worker, blockSize int, opts *Options, stats *Stats) (*Engine, error) {
	h, err := router.NewHasher(blockSize)
	if err != nil {
		return nil, err
	}
	if err := opts.check(ix.Options().Tiers); err != nil {
		return nil, err
	}
	return &Engine{ix: ix, worker: w, opts: opts, stats: stats, hasher: h,
		blocks: map[uint64]engineBlock{}, older: map[uint64]engineBlock{}, group: -1}, nil
}

// Worker is the index slot this engine's blocks are recorded under.
func (e *Engine) Worker() index.Worker { return e.worker }

// Live handles one batch from the live stream. Sequence numbers count batches per publisher
// from 0: the next one is applied; a repeat is ignored; a jump ahead is a gap, filled from
// replay before the batch is applied; a step back means the engine restarted, so its state is
// dropped and its new history replayed from 0. Without a replayer (nil) or when the replay
// cannot fill a gap, the engine's state is dropped (lost removals would otherwise leave entries
// behind that it no longer holds) and the stream continues from this batch.
func (e *Engine) Live(seq uint64, payload []byte, replay Replayer) {
	if e.forgotten.Swap(false) {
		e.reset() // and, having no sequence now, replay from 0 below
	}
	switch {
	case e.haveSeq && seq == e.last+1:
	case e.haveSeq && seq == e.last:
		e.stats.Duplicates.Add(1)
		return
	case e.haveSeq && seq < e.last:
		e.stats.Restarts.Add(1)
		e.reset()
		e.catchUp(0, seq, replay)
	case e.haveSeq: // seq > last+1
		e.stats.Gaps.Add(1)
		e.catchUp(e.last+1, seq, replay)
		if e.last+1 != seq {
			e.stats.Unrecoverable.Add(1)
			e.reset()
		}
	default: // the first batch seen: recover what the engine buffered before it
		if seq > 0 {
			e.catchUp(0, seq, replay)
		}
	}
	e.apply(seq, payload)
}

// catchUp applies replayed batches from..upTo-1 that follow on from what is applied.
func (e *Engine) catchUp(from, upTo uint64, replay Replayer) {
	if replay == nil {
		return
	}
	broken := false
	err := replay(from, func(seq uint64, payload []byte) {
		switch {
		case broken || seq >= upTo || (e.haveSeq && seq <= e.last):
		case e.haveSeq && seq != e.last+1:
			broken = true // the replay itself has a hole: stop here
		default:
			e.stats.Replayed.Add(1)
			e.apply(seq, payload)
		}
	})
	if err != nil {
		e.stats.ReplayFailures.Add(1)
	}
}

// reset drops everything the engine holds: its index entries and its hash map.
func (e *Engine) reset() {
	e.clearView()
	e.haveSeq = false
	e.group = -1
}

// Close drops the engine's entries from the index (the engine left).
func (e *Engine) Close() { e.reset() }

// Forget drops the worker's entries from the index now and, at the next batch Live gets, the
// engine's own state too; that batch then replays the engine's history from 0 (when Live is
// given a replayer), so the entries come back once the engine publishes again. Unlike the
// other methods it is safe from any goroutine, while another feeds the engine: the daemon's
// health prober calls it for a worker that stopped answering. A batch being applied while it
// runs may leave a few entries behind until that next batch.
func (e *Engine) Forget() {
	e.forgotten.Store(true)
	e.ix.ClearWorker(e.worker)
}

func (e *Engine) apply(seq uint64, payload []byte) {
	e.haveSeq, e.last = true, seq
	// Counted once the batch is in the index (or dropped): a reader that sees the count reach
	// what was published finds every block in place (TestEventsOverNATS waits on it).
	defer e.stats.Batches.Add(1)
	if err := DecodeBatch(payload, &e.batch); err != nil {
		if e.drop(reasonBadPayload, 1) {
			e.logDrop(reasonBadPayload, "seq", seq, "error", err)
		}
		return
	}
	if n := e.batch.Unknown; n > 0 && e.drop(reasonUnknownEvent, int64(n)) {
		e.logDrop(reasonUnknownEvent, "seq", seq, "events", n)
	}
	for i := range e.batch.Events {
		e.applyEvent(&e.batch.Events[i])
	}
}

func (e *Engine) applyEvent(ev *Event) {
	if ev.Kind == AllBlocksCleared {
		e.stats.Clears.Add(1)
		haveSeq := e.haveSeq
		e.reset()
		e.haveSeq = haveSeq
		return
	}
	medium := ev.Medium
	if medium == "" {
		medium = "GPU"
	}
	tier, ok := e.opts.Media[medium]
	if !ok {
		if e.drop(reasonFilteredMedium, 1) {
			e.logDrop(reasonFilteredMedium, "medium", medium)
		}
		return
	}
	if !e.routedGroup(ev) {
		if e.drop(reasonFilteredGroup, 1) {
			e.logDrop(reasonFilteredGroup, "group", ev.Group, "kind", ev.SpecKind, "sliding_window", ev.Window,
				"followed_group", e.group)
		}
		return
	}
	if ev.Kind == BlockStored {
		e.store(ev, tier)
	} else {
		e.remove(ev, tier)
	}
}

// routedGroup says whether an event belongs to the KV-cache group the router follows. Hybrid
// models publish one store per group for the same blocks (vLLM's block hashes do not name the
// group), and only a full-attention group holds every block of a sequence; sliding-window,
// chunked-local and Mamba groups hold a tail, or nothing the router could match. A store names
// its group's kind (kv_cache_spec_kind), so any other kind is ignored from its first event; the
// router follows the first full-attention group a store names, and removes (which carry only
// group_idx) of that group. vLLM without kv_cache_spec_kind: the first group a store names.
// vLLM without group_idx: every event (one group).
func (e *Engine) routedGroup(ev *Event) bool {
	if ev.Group < 0 {
		return true
	}
	if ev.Kind == BlockStored {
		if ev.SpecKind != "" && !fullAttention(ev.SpecKind) {
			return false
		}
		if e.group < 0 {
			e.group = ev.Group
		}
	}
	return ev.Group == e.group
}

// fullAttention says whether a kv_cache_spec_kind is one whose group caches every block of a
// sequence: vLLM's FullAttentionSpec and its subclasses MLAAttentionSpec and
// SinkFullAttentionSpec (get_kv_cache_spec_kind, vllm/v1/kv_cache_interface.py; README.md).
func fullAttention(kind string) bool {
	switch kind {
	case "full_attention", "mla_attention", "sink_full_attention":
		return true
	}
	return false
}

// drop counts n of something dropped for reason r and says whether to log it: the first time
// for this engine, when there is a logger. Callers build the log's attributes only then, so a
// dropped event costs no allocation.
func (e *Engine) drop(r reason, n int64) bool {
	e.stats.counter(r).Add(n)
	if e.logged&(1<<r) != 0 || e.opts.Log == nil {
		return false
	}
	e.logged |= 1 << r
	return true
}

// logDrop logs the first drop for a reason (drop said so).
func (e *Engine) logDrop(r reason, attrs ...any) {
	level, what := slog.LevelWarn, "kv events dropped"
	if r == reasonFilteredMedium || r == reasonFilteredGroup {
		level, what = slog.LevelInfo, "kv events ignored" // by design: another tier or attention type
	}
	attrs = append([]any{"worker", e.name, "reason", reasonNames[r]}, attrs...)
	e.opts.Log.Log(context.Background(), level, what+" (logged once per worker and reason; kv_events_total counts them all)", attrs...)
}

func (e *Engine) lookup(h uint64) (engineBlock, bool) {
	if b, ok := e.blocks[h]; ok {
		return b, true
	}
	b, ok := e.older[h]
	return b, ok
}

func (e *Engine) remember(h uint64, b engineBlock) {
	if _, ok := e.blocks[h]; !ok && e.kvcap.limit == 0 && len(e.blocks) >= max(e.opts.MaxEngineBlocks/2, 1) {
		e.older, e.blocks = e.blocks, e.older
		clear(e.blocks)
	}
	delete(e.older, h)
	e.blocks[h] = b
}

func (e *Engine) forget(h uint64) {
	delete(e.blocks, h)
	delete(e.older, h)
}

func (e *Engine) store(ev *Event, tier int) {
	if want := e.kvcap.want.Load(); want != e.kvcap.limit {
		e.adoptCap(want)
	}
	bs := e.hasher.BlockSize()
	if ev.BlockSize != 0 && ev.BlockSize != bs {
		if e.drop(reasonBlockSize, 1) {
			e.logDrop(reasonBlockSize, "block_size", ev.BlockSize, "router_block_size", bs)
		}
		return
	}
	if len(ev.Tokens) != len(ev.Hashes)*bs || (len(ev.Extra) != 0 && len(ev.Extra) != len(ev.Hashes)) ||
		!e.skippedFits(ev) {
		r := reasonBadEvent
		if len(ev.Tokens) > len(ev.Hashes)*bs && len(ev.Tokens)%bs == 0 {
			// vLLM's stores over null or masked blocks (sliding window, Mamba align mode) list
			// only the blocks they cached but the tokens of all: which tokens belong to which
			// hash is lost (vLLM issue #44451).
			r = reasonSparseStore
		}
		if e.drop(r, 1) {
			e.logDrop(r, "group", ev.Group, "kind", ev.SpecKind, "hashes", len(ev.Hashes), "tokens", len(ev.Tokens),
				"extra_keys", len(ev.Extra), "skipped_tokens", len(ev.SkippedTokens), "skipped_extra_keys", len(ev.SkippedExtra))
		}
		return
	}
	capped := e.kvcap.limit > 0
	if n := int(e.kvcap.limit); capped && len(ev.Hashes) > n { // only the chain's head fits
		ev.Hashes, ev.Tokens = ev.Hashes[:n], ev.Tokens[:n*bs]
		if len(ev.Extra) > 0 {
			ev.Extra = ev.Extra[:n]
		}
	}
	var parent, parentKey, seed uint64
	var p engineBlock
	known := false
	if ev.HasParent {
		p, known = e.lookup(ev.Parent)
	}
	switch {
	case ev.HasParent && known:
		parent, parentKey, seed = p.seq, p.key, p.seed
	case ev.HasParent && len(ev.SkippedTokens) > 0:
		if parent, parentKey, seed, known = e.skippedChain(ev); !known {
			if e.drop(reasonUnknownParent, 1) {
				e.logDrop(reasonUnknownParent, "group", ev.Group, "skipped_parent", ev.SkippedParent)
			}
			return
		}
		e.stats.SkippedContext.Add(1)
	case ev.HasParent:
		if e.drop(reasonUnknownParent, 1) {
			e.logDrop(reasonUnknownParent, "group", ev.Group, "parent", ev.Parent)
		}
		return
	default:
		salt := ""
		if len(ev.Extra) > 0 {
			salt = ev.Extra[0].Salt
		}
		seed = router.SeedFor(ev.LoraName, salt)
	}
	e.seqs = e.seqs[:0]
	for i := range ev.Hashes {
		var media []uint64
		if len(ev.Extra) > 0 {
			media = ev.Extra[i].Media
		}
		h := e.hasher.LocalBlock(ev.Tokens[i*bs:(i+1)*bs], seed, media)
		if i > 0 || ev.HasParent {
			h = router.ChainHash(parent, h)
		}
		parent = h
		e.seqs = append(e.seqs, h)
	}
	if capped { // make room first: past its cap the index would evict in table order
		e.evictOldest(tier, e.kvcap.order[tier].held+int64(len(ev.Hashes))-e.kvcap.limit)
	}
	e.keys = slices.Grow(e.keys[:0], len(e.seqs))[:len(e.seqs)]
	e.stats.BlocksStored.Add(int64(e.ix.Store(e.worker, tier, parentKey, e.seqs, e.keys)))
	// Tail first: the order of storing is the order of eviction (capacity.go).
	for i := len(ev.Hashes) - 1; i >= 0; i-- {
		eh := ev.Hashes[i]
		b, known := e.lookup(eh)
		had := b.tiers
		if known && b.tiers != 0 && b.key != e.keys[i] {
			pk := parentKey
			if i > 0 {
				pk = e.keys[i-1]
			}
			b.tiers = e.ix.MoveKey(e.worker, b.tiers, b.key, pk, e.seqs[i], e.keys[i], tier)
		}
		if had == 0 {
			b.stamp = e.kvcap.stamp
			e.kvcap.stamp++
		}
		b.seq, b.key, b.seed, b.tiers = e.seqs[i], e.keys[i], seed, b.tiers|1<<tier
		e.remember(eh, b)
		if capped {
			e.countStored(eh, b, had, tier)
		}
	}
}

// skippedFits says whether a store's skipped context is whole blocks, with extra keys for each
// or none (vLLM sends one entry per skipped block).
func (e *Engine) skippedFits(ev *Event) bool {
	bs := e.hasher.BlockSize()
	n := len(ev.SkippedTokens) / bs
	return len(ev.SkippedTokens)%bs == 0 && (len(ev.SkippedExtra) == 0 || len(ev.SkippedExtra) == n) &&
		(n == 0 || ev.HasParent) // a skipped span ends at the stored blocks' parent
}

// skippedChain hashes a store's skipped context: the blocks between the last block vLLM
// announced for the request (SkippedParent; none: the sequence's start) and the store's parent,
// which vLLM cached without announcing (or announced in a group the router does not follow).
// It returns the parent's sequence hash and the index key it would have (the chain's child keys:
// none of the skipped blocks is in this worker's view), and the seed, or !ok when SkippedParent
// is unknown too. The skipped blocks are not stored: the engine does not hold them.
func (e *Engine) skippedChain(ev *Event) (parent, parentKey, seed uint64, ok bool) {
	chained := ev.HasSkippedParent
	if chained {
		p, known := e.lookup(ev.SkippedParent)
		if !known {
			return 0, 0, 0, false
		}
		parent, parentKey, seed = p.seq, p.key, p.seed
	} else {
		salt := ""
		if len(ev.SkippedExtra) > 0 {
			salt = ev.SkippedExtra[0].Salt
		}
		seed = router.SeedFor(ev.LoraName, salt)
	}
	bs := e.hasher.BlockSize()
	for i := range len(ev.SkippedTokens) / bs {
		var media []uint64
		if len(ev.SkippedExtra) > 0 {
			media = ev.SkippedExtra[i].Media
		}
		h := e.hasher.LocalBlock(ev.SkippedTokens[i*bs:(i+1)*bs], seed, media)
		if i > 0 || chained {
			h = router.ChainHash(parent, h)
		}
		parent, parentKey = h, index.ChildKey(parentKey, h)
	}
	return parent, parentKey, seed, true
}

func (e *Engine) remove(ev *Event, tier int) {
	e.keys = e.keys[:0]
	for _, eh := range ev.Hashes {
		b, ok := e.lookup(eh)
		if !ok || b.tiers&(1<<tier) == 0 {
			if e.drop(reasonUnknownBlock, 1) {
				e.logDrop(reasonUnknownBlock, "group", ev.Group, "medium", ev.Medium, "block", eh)
			}
			continue
		}
		e.keys = append(e.keys, b.key)
		if e.kvcap.limit > 0 {
			e.kvcap.order[tier].held--
		}
		if b.tiers &^= 1 << tier; b.tiers == 0 {
			e.forget(eh)
		} else {
			e.remember(eh, b)
		}
	}
	e.stats.BlocksRemoved.Add(int64(e.ix.Remove(e.worker, tier, e.keys)))
}
