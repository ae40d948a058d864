package dataplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"dataplane/dataplane/encoderpool"
	"dataplane/dataplane/memory"
	"dataplane/dataplane/openai"
	"dataplane/dataplane/remote"
	"dataplane/dataplane/sequence"
	"dataplane/dataplane/worker"
	"dataplane/features"
	"dataplane/native"
	"dataplane/router"
)

// A request's life: parse → prepare its media (preprocess, token counts, cache keys) → admit
// them to the feature store (reuse hits skip encoding; misses reserve memory and go to the
// encoder pool at once) → place them in the prompt → route (while encoding runs) → wait for
// the last item → merge into feature-store memory → hand to the chosen worker → stream its
// tokens; then release per the cache policy. Run returns once the worker's first event has
// arrived (a worker that fails before it is replaced once by the next-best healthy one); a
// text-only request never waits behind media. Any failure, or the client leaving, releases
// everything the request holds.

// Prompt is a parsed request in the form every endpoint reduces to.
type Prompt struct {
	// ID is the client's request id (X-Request-Id, checked by the API); "": one is made.
	ID string
	// IDMade says ID came from Service.NewRequestID: unique already, the router and the
	// feature store know the request by it as it is.
	IDMade bool
	// Received is when the request arrived (the API's reading of the clock; zero: when Run
	// starts). Time-to-first-token counts from it, and answers' created is its second.
	Received time.Time
	Tokens   []int32                   // prompt token ids with the media placeholders
	Style    sequence.PlaceholderStyle // how those placeholders are written
	Media    []*openai.Media           // in placeholder order
	Sampling openai.Sampling
	Ext      openai.Extensions
	// Messages is the client's chat, when the request came as one (the chat hand-offs send it).
	Messages []openai.Message
	// Memory is the request's account on the service's memory budget (the API opened it for
	// the body); the request closes it when it ends. nil: nothing accounted.
	Memory *memory.Account
}

// Generation is a request handed to an LLM worker: its events and how it was routed. One
// goroutine reads it (Events) and then closes it (Close).
type Generation struct {
	ID           string
	Model        string
	Worker       string
	PromptTokens int

	// The reader takes the worker's events straight from its channel, with no goroutine
	// between: a relay cost a goroutine start and two hand-offs a request (issue 26).
	r     *request
	e     *workerEntry
	ctx   context.Context
	in    <-chan worker.Event
	first worker.Event // the worker's first event, already received (held until read)
	held  bool         // first is still to be read
	ended bool         // the last event was read, or the generation ended without it
}

// Started is when the request arrived (Prompt.Received, else when Run began).
func (g *Generation) Started() time.Time { return g.r.start }

// Events yields the worker's events in order, the Done event last (its Err, when the worker
// failed, is an upstreamError naming it). It stops early, without a Done event, when the
// request's context ends or the worker's stream ends without one. The request releases what it
// holds when its Done event is read; Close releases it otherwise.
func (g *Generation) Events(yield func(worker.Event) bool) {
	for {
		ev, ok := g.next()
		if !ok || !yield(ev) || ev.Done {
			return
		}
	}
}

// next is the next event; false once the generation ended.
func (g *Generation) next() (worker.Event, bool) {
	if g.ended {
		return worker.Event{}, false
	}
	ev := g.first
	if g.held {
		g.first, g.held = worker.Event{}, false
	} else {
		var ok bool
		select {
		case ev, ok = <-g.in:
			if !ok {
				g.end(errors.New("the worker's stream ended without a final event"))
				return worker.Event{}, false
			}
		case <-g.ctx.Done(): // the worker ends the generation with ctx
			g.end(g.ctx.Err())
			return worker.Event{}, false
		}
	}
	if !ev.Done {
		return ev, true
	}
	final := ev.Err
	switch {
	case final == nil:
		final = errDone
	case g.ctx.Err() == nil:
		r, e := g.r, g.e
		r.s.log.Warn("LLM worker failed mid-stream", "request", r.id, "worker", e.name, "err", final)
		if unavailable(final) {
			r.s.markDown(e, final)
		}
		ev.Err = &upstreamError{msg: e.label + ": " + worker.Public(final), cause: final}
	}
	g.end(final)
	return ev, true
}

func (g *Generation) end(err error) {
	g.ended = true
	g.r.release(err)
}

// Close releases everything the request still holds (nothing once its Done event was read):
// the reader calls it when it stops reading, whatever the reason. The worker's generation ends
// with the request's context, which the caller cancels.
func (g *Generation) Close() {
	if !g.ended {
		err := g.ctx.Err()
		if err == nil {
			err = context.Canceled
		}
		g.end(err)
	}
}

// storeError is a feature-store refusal about param: its chain keeps the *features.BudgetError
// (or the context error of a wait the request gave up).
func storeError(err error, param string) *Error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &Error{Param: param, Kind: ErrUnavailable, Err: err}
	}
	return &Error{Param: param, Err: err}
}

// Run takes a prompt through the whole path and returns once the worker's first event has
// arrived; it owns p from then on. The caller reads the generation's events on one goroutine
// and closes it, then cancels ctx. Its errors are *Error, or the context's error when ctx ends
// first.
func (s *Service) Run(ctx context.Context, p *Prompt) (*Generation, error) {
	if !s.begin() {
		p.Memory.Close()
		return nil, fail(ErrUnavailable, "", "the server is shutting down")
	}
	start := p.Received
	if start.IsZero() {
		start = time.Now()
	}
	r := &request{s: s, id: p.ID, p: p, start: start}
	if r.id == "" {
		r.id = s.NewRequestIDAt(start)
	}
	r.key = s.requestKey(r.id, p.ID != "" && !p.IDMade)
	g, err := r.run(ctx)
	r.freeRoute()
	if err != nil {
		r.release(err)
		return nil, err
	}
	return g, nil
}

// request is one request's state through run.
type request struct {
	s     *Service
	id    string // in logs, the decision log, the response and to the worker
	key   string // unique: the router's and the feature store's name for it
	p     *Prompt
	start time.Time
	items []*item
	fr    *features.Request
	pm    *sequence.PositionMap
	// textPM is pm for a text-only prompt (textOnlyMap): no allocation of its own.
	textPM   sequence.PositionMap
	routeBuf *routeBuf // the route's pooled scratch (route, freeRoute)
	once     sync.Once
	emb      *embedsPlan // the prompt_embeds blocks as routed (handoff embeds)
	// remotes are the fleet's encoders the route weighed (remoteenc.go).
	remotes []remote.Candidate
	// routed is set once the router counts this request against a worker.
	routed atomic.Bool
}

func (r *request) run(ctx context.Context) (*Generation, error) {
	s := r.s
	if r.p.Sampling.MaxTokens == 0 {
		r.p.Sampling.MaxTokens = s.opts.DefaultMaxTokens
	}
	if err := s.checkSampling(&r.p.Sampling); err != nil {
		return nil, err
	}
	policyName := r.p.Ext.CachePolicy
	if policyName == "" {
		policyName = s.opts.CachePolicy
	}
	policy, err := features.ParsePolicy(policyName)
	if err != nil {
		return nil, fail(ErrInvalid, "cache_policy", "%v", err)
	}
	// --item-timeout covers the media's fetch, decode and encode: one deadline for every wait.
	// A text-only request has none of them, and no timer to make and stop.
	ictx := ctx
	if len(r.p.Media) > 0 {
		var cancel context.CancelFunc
		ictx, cancel = context.WithDeadline(ctx, r.start.Add(s.opts.ItemTimeout))
		defer cancel()
	}
	if err := r.checkHandoff(); err != nil {
		return nil, err
	}
	if err := r.prepareAll(ictx); err != nil {
		return nil, err
	}
	if err := r.place(); err != nil {
		return nil, err
	}
	if len(r.items) > 0 && r.encodes() {
		if err := r.checkFits(); err != nil {
			return nil, err
		}
		if r.fr, err = s.store.Begin(r.key, policy); err != nil {
			return nil, storeError(err, "")
		}
		if err := r.admit(ictx); err != nil {
			return nil, err
		}
	}
	decision, err := r.route()
	if err != nil {
		r.failHeld(err)
		return nil, err
	}
	if err := r.dispatch(ictx, &decision, r.priority()); err != nil {
		return nil, err
	}
	r.warmUp(decision) // the text before the media prefills while they encode (warmup.go)
	var embeds native.Matrix
	if len(r.items) > 0 && r.encodes() {
		if err := r.await(ictx); err != nil {
			return nil, err
		}
		if embeds, err = r.handOff(ctx); err != nil {
			return nil, err
		}
	}
	return r.generate(ctx, decision, embeds)
}

// prepareAll reads and preprocesses every media item, several at once: fetches in their own
// bounded pool, decoding and preprocessing bounded by the CPUs, every wait ending at the
// items' deadline (ctx). With text_fallback, items that cannot be prepared are dropped from
// the prompt instead.
func (r *request) prepareAll(ctx context.Context) error {
	if len(r.p.Media) == 0 {
		return nil // text only (and no WaitGroup on the heap for it)
	}
	s := r.s
	items := make([]*item, len(r.p.Media))
	errs := make([]error, len(r.p.Media))
	var wg sync.WaitGroup
	for i, m := range r.p.Media {
		wg.Add(1)
		go func() { // bounded: at most MaxMediaItems per request
			defer wg.Done()
			src, err := s.read(ctx, m, r.p.Memory)
			if err != nil {
				errs[i] = err
				return
			}
			defer src.release() // the bytes are garbage once preprocessed
			release, err := s.prep.acquire(ctx)
			var busy *busyError
			switch {
			case errors.As(err, &busy): // it would be cut at its deadline anyway: shed it now
				errs[i] = &Error{Param: m.Path, Kind: ErrUnavailable, Err: busy, RetryAfter: min(max(busy.wait, time.Second), 30*time.Second)}
				return
			case err != nil:
				errs[i] = itemError(m, fmt.Errorf("waiting for a CPU to preprocess it: %w", err))
				return
			}
			defer release()
			items[i], errs[i] = s.prepare(ctx, m, src, r.p.Ext.CacheSalt, r.p.Memory)
		}()
	}
	wg.Wait()
	var dropped []int
	for i, err := range errs {
		if err == nil {
			continue
		}
		if !r.p.Ext.TextFallback || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) {
			return err
		}
		s.log.Info("dropping a media item (text_fallback)", "request", r.id, "item", r.p.Media[i].Path, "err", err)
		dropped = append(dropped, i)
	}
	r.items = items
	return r.drop(dropped)
}

// drop removes items (indexes into r.items, ascending) and their placeholders from the prompt.
func (r *request) drop(idx []int) error {
	if len(idx) == 0 {
		return nil
	}
	ph := r.s.tok.Placeholders()
	gone := map[int]bool{}
	for _, i := range idx {
		gone[i] = true
	}
	var kept []*item
	var keptMedia []*openai.Media
	var tokens []int32
	k := 0 // which item's placeholder comes next
	for pos := 0; pos < len(r.p.Tokens); {
		mod := ph.ModalityOf(r.p.Tokens[pos])
		if mod == 0 || k >= len(r.items) {
			tokens = append(tokens, r.p.Tokens[pos])
			pos++
			continue
		}
		width := 1
		if r.p.Style == sequence.PlaceholderExpanded && r.items[k] != nil {
			width = r.items[k].tokens
		} else if r.p.Style == sequence.PlaceholderExpanded {
			for pos+width < len(r.p.Tokens) && r.p.Tokens[pos+width] == r.p.Tokens[pos] {
				width++ // an item that never got a token count: drop its whole run
			}
		}
		if !gone[k] {
			tokens = append(tokens, r.p.Tokens[pos:min(pos+width, len(r.p.Tokens))]...)
			kept = append(kept, r.items[k])
			keptMedia = append(keptMedia, r.p.Media[k])
		} else if it := r.items[k]; it != nil && it.rec != nil {
			if err := r.fr.Drop(it.rec); err != nil {
				return &Error{Param: it.src.Path, Err: err}
			}
		}
		pos += width
		k++
	}
	r.p.Tokens, r.items, r.p.Media = tokens, kept, keptMedia
	return nil
}

// checkFits refuses a request whose features and merged sequence together outgrow the
// feature store: waiting could never help (413, not 503).
func (r *request) checkFits() error {
	s := r.s
	row := int64(s.models.Hidden) * int64(s.models.DType.Size())
	need := int64(r.pm.Len) * row
	have := s.opts.Features.Host.Capacity
	for _, it := range r.items {
		if one := int64(it.tokens) * row; one > have {
			return fail(ErrTooLarge, it.src.Path, "its features need %d bytes; the feature store holds %d (--feature-bytes)", one, have)
		}
		need += int64(it.tokens) * row
	}
	if need > have {
		return fail(ErrTooLarge, "messages", "its media's features and the merged sequence need %d bytes; the feature store holds %d (--feature-bytes)", need, have)
	}
	return nil
}

// admit asks the feature store for every item's features: a hit shares a record (maybe still
// encoding for another request); a miss reserves memory and sends the inputs to the encoders.
func (r *request) admit(ctx context.Context) error {
	s := r.s
	width, es := s.models.Hidden, int64(s.models.DType.Size())
	priority := r.priority()
	for _, it := range r.items {
		rec, job, err := r.fr.Admit(ctx, features.Item{Key: it.key, MediaID: it.id, Bytes: int64(it.tokens) * int64(width) * es})
		if err != nil {
			return storeError(err, it.src.Path)
		}
		it.rec, it.job = rec, job
		s.metrics.item(it.modality, job == nil)
		if job == nil {
			continue
		}
		if it.inputs == nil { // named by uuid, evicted since: nothing to encode from
			job.Fail(errors.New("evicted"))
			return fail(ErrInvalid, it.src.Path, "uuid %q: its features are no longer cached; send the media with it", it.src.UUID)
		}
		if s.remote != nil && s.remote.o.Catalog.Len() > 0 { // the route chooses the encoder
			it.held = true
			continue
		}
		if err := s.shedEncode(ctx, it, job); err != nil {
			return err
		}
		if err := r.encode(it, job, priority); err != nil {
			return err
		}
	}
	return nil
}

// priority is the encoder pool's priority for the request's items.
func (r *request) priority() encoderpool.Priority {
	if r.p.Ext.Priority == "batch" {
		return encoderpool.Batch
	}
	return encoderpool.Interactive
}

// shedEncode refuses (503 with Retry-After) an item the encoders could not finish before its
// deadline (ctx's) by their own estimate: queued, it would be cut at the deadline with a 504
// after taking its share of the encoders.
func (s *Service) shedEncode(ctx context.Context, it *item, job *features.Job) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	eta, left := s.pool.ETA(it.model, it.tokens), time.Until(deadline)
	if eta <= left {
		return nil
	}
	err := fmt.Errorf("the encoders are busy: this item would be encoded in about %.1fs, and it has %.1fs left of --item-timeout", eta.Seconds(), left.Seconds())
	job.Fail(err) //nolint:errcheck // the record reports it to its holders
	return &Error{Param: it.src.Path, Kind: ErrUnavailable, Err: err, RetryAfter: min(max(eta-left, time.Second), 30*time.Second)}
}

// encode sends an item's inputs to the pool, each writing its rows of the job's buffer; the
// last to finish completes or fails the job.
func (r *request) encode(it *item, job *features.Job, pri encoderpool.Priority) error {
	s := r.s
	buf := job.Buffer()
	es := s.models.DType.Size()
	rowBytes := s.models.Hidden * es
	left := atomic.Int32{}
	left.Store(int32(len(it.inputs)))
	var firstErr atomic.Pointer[error]
	start := time.Now()
	done := func(err error) {
		if err != nil {
			firstErr.CompareAndSwap(nil, &err)
		}
		if left.Add(-1) > 0 {
			return
		}
		s.metrics.encoded(it.modality, time.Since(start))
		if e := firstErr.Load(); e != nil {
			job.Fail(*e) //nolint:errcheck // the record reports it to its holders
			return
		}
		job.Complete(int64(it.tokens * rowBytes)) //nolint:errcheck // an abandoned job frees itself
	}
	row := 0
	for i, in := range it.inputs {
		out, err := buf.Matrix(s.models.DType, it.tokens, s.models.Hidden)
		if err == nil {
			out.Data, out.Rows = out.Data[row*rowBytes:(row+it.rows[i])*rowBytes], it.rows[i]
		}
		if err == nil {
			var model encoderpool.Model = it.model
			if s.opts.WrapEncoder != nil {
				model = s.opts.WrapEncoder(model)
			}
			err = s.pool.Submit(&encoderpool.Job{Model: model, Modality: it.modality, Input: in, Out: out,
				Tokens: it.rows[i], Priority: pri, Ctx: job.Context(), Done: done})
		}
		if err != nil {
			// The inputs not submitted count as failed so the job still ends exactly once.
			for range len(it.inputs) - i {
				done(err)
			}
			if errors.Is(err, encoderpool.ErrQueueFull) {
				return fail(encoderpool.ErrQueueFull, it.src.Path, "the encoders' queue is full")
			}
			return &Error{Param: it.src.Path, Kind: ErrUnavailable, Err: err}
		}
		row += it.rows[i]
	}
	return nil
}

// place builds the position map: where every item's rows go in the merged sequence.
func (r *request) place() error {
	pm, err := r.textOnlyMap()
	if pm == nil && err == nil {
		mi := make([]sequence.MediaItem, len(r.items))
		for i, it := range r.items {
			mi[i] = sequence.MediaItem{ID: r.s.mediaID(it), Modality: it.modality, Tokens: it.tokens}
		}
		pm, err = sequence.BuildPositionMap(r.p.Tokens, r.s.tok.Placeholders(), r.p.Style, mi)
	}
	if err != nil {
		param := "messages"
		var pe *sequence.PositionError
		if errors.As(err, &pe) && pe.Item >= 0 && pe.Item < len(r.items) {
			param = r.items[pe.Item].src.Path
		}
		return &Error{Param: param, Kind: ErrInvalid, Err: err}
	}
	if pm.Len > r.s.opts.MaxPromptTokens {
		return fail(ErrInvalid, "messages", "the prompt is %d tokens with its media, the model takes at most %d", pm.Len, r.s.opts.MaxPromptTokens)
	}
	if pm.Len == 0 {
		return fail(ErrInvalid, "messages", "the prompt is empty")
	}
	r.pm = pm
	return nil
}

// textOnlyMap is the position map of a prompt without media, as BuildPositionMap makes it but
// without its two allocations: the request's own map over the prompt's ids (Run owns them, and
// nothing writes them). Nil (with a nil error) when the prompt has media or a placeholder
// BuildPositionMap must explain.
func (r *request) textOnlyMap() (*sequence.PositionMap, error) {
	if len(r.items) > 0 {
		return nil, nil
	}
	ph := r.s.tok.Placeholders()
	if err := ph.Validate(); err != nil {
		return nil, err
	}
	for _, t := range r.p.Tokens {
		if ph.ModalityOf(t) != 0 {
			return nil, nil
		}
	}
	r.textPM = sequence.PositionMap{Len: len(r.p.Tokens), TextIDs: r.p.Tokens}
	return &r.textPM, nil
}

// expanded is the prompt as the engine's KV cache holds it: each item's placeholder repeated
// over its rows (vLLM's expanded form), for the router and the worker.
func (r *request) expanded() ([]int32, []worker.MediaSpan) {
	spans := make([]worker.MediaSpan, len(r.pm.Spans))
	if len(spans) == 0 { // text only: the prompt's ids as they are (read only, full: an append copies)
		return r.pm.TextIDs[:len(r.pm.TextIDs):len(r.pm.TextIDs)], spans
	}
	ids := make([]int32, r.pm.Len)
	ph := r.s.tok.Placeholders()
	t, row := 0, 0
	for i, sp := range r.pm.Spans {
		for ; row < sp.Start; row++ {
			ids[row] = r.pm.TextIDs[t]
			t++
		}
		for ; row < sp.End; row++ {
			ids[row] = ph.ID(sp.Modality)
		}
		spans[i] = worker.MediaSpan{Start: sp.Start, End: sp.End, ID: sp.MediaID}
	}
	for ; row < r.pm.Len; row++ {
		ids[row] = r.pm.TextIDs[t]
		t++
	}
	return ids, spans
}

// routeBuf is a route's scratch, pooled: the router's token ids and the decision's slices
// (scores, prompt hashes).
type routeBuf struct {
	toks []uint32
	d    router.Decision
}

var routeBufs = sync.Pool{New: func() any { return new(routeBuf) }}

// freeRoute gives the route's scratch back once run has returned (nothing uses it after).
func (r *request) freeRoute() {
	b := r.routeBuf
	if b == nil {
		return
	}
	r.routeBuf = nil
	if cap(b.d.Scores) <= maxPooledScores && cap(b.d.Hashes) <= maxPooledHashes && cap(b.toks) <= maxPooledTokens {
		routeBufs.Put(b)
	}
}

// A pooled route's room at most: a large fleet's or prompt's slices are left to the GC.
const (
	maxPooledScores = 1024
	maxPooledHashes = 4096
	maxPooledTokens = 64 << 10
)

// route picks the worker: KV overlap and load from the router, plus when this request's
// features will be ready and, for remote workers, what sending them costs.
func (r *request) route() (router.Decision, error) {
	s := r.s
	// The decision's slices and the router's token ids come from a pool: they are dead once run
	// returns (the decision log keeps a copy; a retry clones the scores), so they need no
	// allocation of their own.
	r.routeBuf = routeBufs.Get().(*routeBuf)
	toks, rm := r.routeInput(r.routeBuf.toks)
	r.routeBuf.toks = toks
	eta := time.Duration(0)
	for _, it := range r.items {
		if it.job != nil { // with encoder options (joint routing) the chosen one's ready time replaces it
			eta = max(eta, s.pool.ETA(it.model, it.tokens))
		}
	}
	sent := 0.0
	if len(r.items) > 0 { // only media are sent: a text-only request skips the sum (and its cgo call)
		sent = r.transferBytes()
	}
	// Cost terms are in blocks of prefill time (router.Options.PrefillSecondsPerToken).
	req := router.Request{Tokens: toks, Media: rm, Salt: r.p.Ext.CacheSalt, ReadyIn: s.router.BlocksIn(eta.Seconds()), Encoders: r.encoderOptions(eta)}
	if len(r.items) > 0 && sent > 0 {
		req.Transfer = func(w string) float64 {
			if remoteWorker(w) {
				return s.router.BlocksIn(sent / s.opts.TransferBytesPerSecond)
			}
			return 0 // in-process: the merged sequence is handed over in memory
		}
	}
	buf := &r.routeBuf.d
	d := router.Decision{Scores: buf.Scores[:0], Hashes: buf.Hashes[:0]}
	err := s.router.Route(req, &d)
	buf.Scores, buf.Hashes = d.Scores, d.Hashes // as Route grew them
	if err != nil {                             // two steps when the fleet is disaggregated
		e := fail(ErrUnavailable, "", "no LLM worker can take the request: %v", err)
		if _, none := errors.AsType[*router.ErrNoWorker](err); none {
			e.RetryAfter = s.retryAfter() // a probe may bring one back
		}
		return d, e
	}
	if d.Topology != nil && d.Topology.Fallback {
		s.log.Warn("no decode worker in the prefill worker's domain: routed to another (mismatch policy fallback)",
			"request", r.id, "level", d.Topology.Level, "domain", d.Topology.Domain, "prefill", d.Prefill, "decode", d.Decode)
	}
	s.routes.Add(r.id, d)
	return d, nil
}

// await waits for every item's features until the items' deadline (ctx); with text_fallback,
// failed items leave the prompt.
func (r *request) await(ctx context.Context) error {
	var failed []int
	for i, it := range r.items {
		select {
		case <-it.rec.Ready():
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fail(ErrTimeout, it.src.Path, "media not encoded within %v (--item-timeout)", r.s.opts.ItemTimeout)
			}
			return ctx.Err()
		}
		if err := it.rec.Err(); err != nil {
			if retried, rerr := r.retrySmaller(ctx, i, err); retried {
				if rerr == nil {
					continue
				}
				err = rerr
			}
			if !r.p.Ext.TextFallback {
				return fail(nil, it.src.Path, "encoding %v failed: %v", it.modality, err)
			}
			r.s.log.Info("dropping a media item (text_fallback)", "request", r.id, "item", it.src.Path, "err", err)
			failed = append(failed, i)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	if err := r.drop(failed); err != nil {
		return err
	}
	return r.place()
}

// retrySmaller encodes a video again with half its frames when it failed for want of memory
// (the encoder's scratch grows with the frames a batch holds; a ViT's input size is fixed, so
// pictures cannot shrink). It reports whether it tried, and the retry's error.
func (r *request) retrySmaller(ctx context.Context, i int, cause error) (bool, error) {
	it := r.items[i]
	if !errors.Is(cause, native.ErrNoMem) || it.modality != sequence.Video || len(it.inputs) < 2 {
		return false, nil
	}
	mo := r.s.opts.Media
	mo.Video.MaxFrames = len(it.inputs) / 2
	r.s.log.Warn("encoding a video again with half its frames", "request", r.id, "item", it.src.Path, "frames", mo.Video.MaxFrames, "cause", cause)
	src, err := r.s.read(ctx, it.src, r.p.Memory)
	if err != nil {
		return true, err
	}
	small, err := r.s.prepareWith(ctx, it.src, src, r.p.Ext.CacheSalt, mo, fmt.Sprintf("%s/max-frames=%d", r.s.opts.MediaKey, mo.Video.MaxFrames), r.p.Memory)
	src.release()
	if err != nil {
		return true, err
	}
	rec, job, err := r.fr.Admit(ctx, features.Item{Key: small.key, MediaID: small.id,
		Bytes: int64(small.tokens) * int64(r.s.models.Hidden) * int64(r.s.models.DType.Size())})
	if err != nil {
		return true, storeError(err, it.src.Path)
	}
	small.rec, small.job = rec, job
	if job != nil {
		if err := r.encode(small, job, encoderpool.Interactive); err != nil {
			return true, err
		}
	}
	select {
	case <-rec.Ready():
	case <-ctx.Done():
		return true, ctx.Err()
	}
	if err := rec.Err(); err != nil {
		return true, err
	}
	if err := r.fr.Drop(it.rec); err != nil {
		return true, err
	}
	r.items[i] = small
	return true, r.place()
}

// merge writes the merged sequence into feature-store memory.
func (r *request) merge(ctx context.Context) (native.Matrix, error) {
	s := r.s
	if len(r.items) == 0 { // every item dropped: a text-only request after all
		return native.Matrix{}, nil
	}
	dt, width := s.models.DType, s.models.Hidden
	view, err := r.fr.AllocMerged(ctx, false, int64(r.pm.Len*width*dt.Size()))
	if err != nil {
		return native.Matrix{}, storeError(err, "")
	}
	dst, err := view.Matrix(dt, r.pm.Len, width)
	if err != nil {
		return native.Matrix{}, &Error{Err: err}
	}
	feats := make([]native.Matrix, len(r.items))
	for i, it := range r.items {
		v, err := it.rec.Host()
		if err == nil {
			feats[i], err = v.Matrix(dt, it.tokens, width)
		}
		if err != nil {
			return native.Matrix{}, &Error{Param: it.src.Path, Err: err}
		}
	}
	t0 := time.Now()
	if err := sequence.Merge(dst, r.pm, s.models.Table, feats, 0); err != nil {
		return native.Matrix{}, fail(nil, "", "merge: %v", err)
	}
	s.metrics.mergeSeconds.Observe(time.Since(t0).Seconds())
	if err := r.fr.Merged(); err != nil {
		return native.Matrix{}, &Error{Err: err}
	}
	return dst, nil
}

// generate hands the request to the chosen worker and returns once that worker's first event
// arrived (the stream starts with it), so that a worker that fails before any byte reaches the
// client costs the client nothing: if it refused the request, did not answer in time, or ended
// its stream before a token (worker.ErrUnavailable), it leaves routing and the request goes
// once more to the next-best healthy worker of the same decision (nextBest); the decision log
// shows the retry. The merged sequence stays valid until the answering worker's first event.
func (r *request) generate(ctx context.Context, d router.Decision, embeds native.Matrix) (*Generation, error) {
	if d.Prefill != "" {
		return r.generateDisagg(ctx, d, embeds)
	}
	s := r.s
	e := s.entry(d.Worker)
	if e == nil {
		return nil, fail(ErrUnavailable, "", "the LLM worker chosen is gone")
	}
	wreq := r.workerRequest(embeds)
	g, err := r.attempt(ctx, d, e, wreq)
	if err == nil || ctx.Err() != nil {
		return g, err
	}
	msg := e.label + ": " + worker.Public(err)
	next := s.nextBest(d, e)
	if !unavailable(err) || next == nil {
		return nil, &Error{Kind: ErrUpstream, Err: &upstreamError{msg: msg, cause: err}}
	}
	s.log.Warn("LLM worker failed before its first token: retrying on the next-best worker", "request", r.id,
		"worker", e.name, "err", err, "retry", next.name)
	s.routes.Add(r.id, retried(d, e.name, next.name, worker.Public(err)))
	g, err2 := r.attempt(ctx, d, next, wreq)
	if err2 == nil || ctx.Err() != nil {
		return g, err2
	}
	msg += "; retried on " + next.label + ": " + worker.Public(err2)
	return nil, &Error{Kind: ErrUpstream, Err: &upstreamError{msg: msg, cause: errors.Join(err, err2)}}
}

// attempt starts the request on worker e and waits for its first event. On failure nothing of
// the attempt is left counted (router Start undone): its error is the worker's, or ctx's.
func (r *request) attempt(ctx context.Context, d router.Decision, e *workerEntry, wreq *worker.Request) (*Generation, error) {
	s := r.s
	if !r.routed.Load() { // a disaggregated request is counted from its prefill step on
		if err := s.router.Start(r.key, d, e.name, time.Now()); err == nil {
			r.routed.Store(true)
		}
	}
	events, err := e.w.Generate(ctx, wreq)
	var first worker.Event
	if err == nil {
		select {
		case ev, ok := <-events:
			switch {
			case !ok:
				err = fmt.Errorf("%w: the stream ended without an event", worker.ErrUnavailable)
			case ev.Done && ev.Err != nil && ev.Tokens == 0 && ev.Text == "":
				err = ev.Err
			default:
				first = ev
			}
		case <-ctx.Done(): // the worker ends the generation with ctx
			err = ctx.Err()
		}
	}
	if err != nil {
		if r.stepFailed(ctx, e, err) {
			return nil, ctx.Err()
		}
		return nil, err
	}
	s.metrics.ttft.Observe(time.Since(r.start).Seconds())
	s.router.FirstToken(r.key)
	if r.fr != nil {
		r.fr.Prefilled() //nolint:errcheck // a cancelled request has nothing left to mark
	}
	return &Generation{ID: r.id, Model: s.models.Name, Worker: e.name, PromptTokens: r.pm.Len,
		r: r, e: e, ctx: ctx, in: events, first: first, held: true}, nil
}

// workerRequest is what a worker is handed: the expanded sequence, its media, the merged
// sequence (embeds) and the request's messages and parameters.
func (r *request) workerRequest(embeds native.Matrix) *worker.Request {
	ids, spans := r.expanded()
	return &worker.Request{ID: r.id, TokenIDs: ids, Media: r.workerSpans(spans), Embeds: embeds, Messages: r.p.Messages,
		Sampling: r.p.Sampling, CacheSalt: r.p.Ext.CacheSalt}
}

// stepFailed ends the router's tracking of a request whose worker failed it, and takes the
// worker out of routing if it was unavailable; true when ctx had ended instead (the failure is
// the client's going, not the worker's).
func (r *request) stepFailed(ctx context.Context, e *workerEntry, err error) bool {
	if r.routed.Swap(false) {
		r.s.router.Finish(r.key)
	}
	if ctx.Err() != nil {
		return true
	}
	if unavailable(err) {
		r.s.markDown(e, err)
	}
	return false
}

// nextBest is the healthy worker of d, other than failed, that d's scores rank first (nil if
// none is left).
func (s *Service) nextBest(d router.Decision, failed *workerEntry) *workerEntry {
	scores := slices.Clone(d.Scores)
	for i := range scores {
		sc := &scores[i]
		if !sc.Eligible {
			continue
		}
		if e := s.entry(sc.Worker); sc.Worker == failed.name || e == nil || !s.isHealthy(e) {
			sc.Eligible = false
		}
	}
	pick := router.Choose(scores, 0, 0)
	if pick < 0 {
		return nil
	}
	return s.entry(scores[pick].Worker)
}

// retried is d as the decision log shows a retry: sent to next after failed failed (why).
func retried(d router.Decision, failed, next, why string) router.Decision {
	d.Worker = next
	d.Scores = slices.Clone(d.Scores)
	for i := range d.Scores {
		if sc := &d.Scores[i]; sc.Worker == failed {
			sc.Eligible, sc.Excluded = false, "failed: "+why
		}
	}
	return d
}

// upstreamError is an LLM worker's failure as a client reads it: the worker's label and the
// class of failure (worker.Public), never its address; the whole cause stays in the chain and
// goes to the log.
type upstreamError struct {
	msg   string
	cause error
}

func (e *upstreamError) Error() string { return e.msg }
func (e *upstreamError) Unwrap() error { return e.cause }

// errDone marks a generation that ended well.
var errDone = errors.New("done")

// release gives back everything the request holds, once: its features (per the cache policy
// when it finished, all of it when not), its place in the router's load, its slot in the drain.
func (r *request) release(err error) {
	r.once.Do(func() {
		ok := errors.Is(err, errDone)
		if r.fr != nil {
			if ok {
				r.fr.Done() //nolint:errcheck
			} else {
				r.fr.Cancel()
			}
		}
		if r.routed.Load() {
			r.s.router.Finish(r.key)
		}
		r.p.Memory.Close()
		r.s.active.Done()
	})
}
