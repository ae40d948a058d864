package dataplane

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"dataplane/dataplane/openai"
	"dataplane/dataplane/worker"
	"dataplane/router"
)

// Encode/prefill overlap: a request whose media must encode is routed while they encode
// (lifecycle.go); meanwhile its worker can already prefill the text before the first item.
// warmUp sends that worker a completion of those token ids with max_tokens 1, whose answer is
// thrown away: stock vLLM's prefix cache then holds the prefix's full blocks, and the request,
// when its features are ready, prefills only the rest. Their hashes are the same in both: a
// full block's hash covers its parent's, its token ids and extra keys, and a block before the
// first item has none but the cache salt (first block) and the LoRA name (vllm-project/vllm
// vllm/v1/core/kv_cache_utils.py at 001cabc1: hash_block_tokens; generate_block_hash_extra_keys
// adds an item's identifier only to the blocks its placeholder range overlaps).
//
// Sound for the in-process workers and the ec hand-off, whose requests' blocks are keyed by the
// same token ids. Not for the embeds hand-off: there the request's blocks are keyed by the
// SHA-256 of each block's prompt_embeds (the same file: _gen_prompt_embeds_extra_hash_keys;
// embeds.go), so a token-id warm-up fills blocks it never reads; a prompt_embeds warm-up of the
// prefix's text rows would hit, but sends those rows twice (hidden × 2 bytes a token, 32 MiB
// for 4k tokens at 4,096 wide) and needs its own merge: skipped with reason "handoff". The tokens hand-off encodes nothing here (the engine
// encodes and prefills itself): nothing to overlap.

// WarmupOptions bound the prefix warm-ups. DefaultWarmupOptions has the defaults.
type WarmupOptions struct {
	MinTokens int           // least text before the first item worth a warm-up; 0: none sent
	InFlight  int           // warm-ups at once; past it one is dropped (counted "busy")
	Timeout   time.Duration // one warm-up, sent to answered
}

// DefaultWarmupOptions: off, 16 at once, 30 s each.
func DefaultWarmupOptions() WarmupOptions {
	return WarmupOptions{InFlight: 16, Timeout: 30 * time.Second}
}

// Why a request with media got no warm-up (dataplane_warmup_skipped_total's reason).
var warmupSkips = []string{"reused", "handoff", "short", "cached", "busy", "closing"}

// warmups sends them: a semaphore of InFlight slots, a context Close ends, their metrics.
type warmups struct {
	opts    WarmupOptions
	log     *slog.Logger
	sem     chan struct{}
	ctx     context.Context
	cancel  context.CancelFunc
	mu      sync.Mutex // closed and wg.Add, so that none is added once close waits
	closed  bool
	wg      sync.WaitGroup
	sent    prometheus.Counter
	failed  prometheus.Counter
	skipped *prometheus.CounterVec
}

func newWarmups(opts WarmupOptions, log *slog.Logger) *warmups {
	def := DefaultWarmupOptions()
	if opts.InFlight <= 0 {
		opts.InFlight = def.InFlight
	}
	if opts.Timeout <= 0 {
		opts.Timeout = def.Timeout
	}
	w := &warmups{opts: opts, log: log, sem: make(chan struct{}, opts.InFlight),
		sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "dataplane_warmup_sent_total",
			Help: "Prefix warm-ups sent to the chosen worker while a request's media encoded."}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "dataplane_warmup_failed_total",
			Help: "Prefix warm-ups the worker refused or did not answer in time."}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dataplane_warmup_skipped_total",
			Help: "Requests with media not warmed up, by reason: reused (nothing to encode), handoff (embeds), short (prefix under the minimum), cached (already there), busy (in-flight limit), closing."},
			[]string{"reason"}),
	}
	for _, r := range warmupSkips {
		w.skipped.WithLabelValues(r) // exported from the start at 0
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	return w
}

func (w *warmups) collectors() []prometheus.Collector {
	return []prometheus.Collector{w.sent, w.failed, w.skipped}
}

// close ends the warm-ups in flight and waits for them.
func (w *warmups) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.cancel()
	w.wg.Wait()
}

// start registers a warm-up about to run; false once closing.
func (w *warmups) start() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.wg.Add(1)
	return true
}

// warmUp sends the prefix warm-up for a request routed by d, if it pays (see above). It
// returns at once: the warm-up runs on its own goroutine, bounded by the semaphore.
func (r *request) warmUp(d router.Decision) {
	s := r.s
	w := s.warm
	if w == nil || w.opts.MinTokens <= 0 || len(r.items) == 0 || !r.encodes() {
		return
	}
	if !slices.ContainsFunc(r.items, func(it *item) bool { return it.job != nil }) {
		w.skipped.WithLabelValues("reused").Inc()
		return
	}
	if s.handoff.http && s.handoff.mode == worker.HandoffEmbeds {
		w.skipped.WithLabelValues("handoff").Inc()
		return
	}
	n := r.pm.Spans[0].Start // the text before the first item: its first n rows are text
	if n < w.opts.MinTokens {
		w.skipped.WithLabelValues("short").Inc()
		return
	}
	name := d.Worker
	if d.Prefill != "" {
		name = d.Prefill // a disaggregated request prefills there
	}
	if sc := d.Score(name); sc != nil && sc.Overlap >= n/s.router.Options().BlockSize {
		w.skipped.WithLabelValues("cached").Inc()
		return
	}
	e := s.entry(name)
	if e == nil {
		return // gone since routing: the request will fail over, nothing to warm
	}
	req := &worker.Request{ID: r.id + "-warmup", TokenIDs: slices.Clone(r.pm.TextIDs[:n]),
		Sampling: openai.Sampling{MaxTokens: 1}, CacheSalt: r.p.Ext.CacheSalt}
	if why := w.send(e.w, req); why != "" {
		w.skipped.WithLabelValues(why).Inc()
	}
}

// send runs req on wk in the background if a slot is free: "" when it went, else why not
// ("busy", "closing"). A failure is counted, and logged at debug level.
func (w *warmups) send(wk worker.Worker, req *worker.Request) string {
	select {
	case w.sem <- struct{}{}:
	default:
		return "busy"
	}
	if !w.start() {
		<-w.sem
		return "closing"
	}
	w.sent.Inc()
	go func() {
		defer w.wg.Done()
		defer func() { <-w.sem }()
		ctx, cancel := context.WithTimeout(w.ctx, w.opts.Timeout)
		defer cancel()
		if !drainWarmup(ctx, wk, req) {
			w.failed.Inc()
			w.log.Debug("prefix warm-up failed", "request", req.ID)
		}
	}()
	return ""
}

// drainWarmup runs one warm-up to its end, its output discarded; false if it failed.
func drainWarmup(ctx context.Context, wk worker.Worker, req *worker.Request) bool {
	events, err := wk.Generate(ctx, req)
	if err != nil {
		return false
	}
	ok := false
	for ev := range events {
		if ev.Done {
			ok = ev.Err == nil
		}
	}
	return ok
}
