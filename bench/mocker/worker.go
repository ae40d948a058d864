package mocker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"dataplane/dataplane/openai"
	"dataplane/dataplane/worker"
	"dataplane/router"
)

// DefaultMaxTokens is what a request without max_tokens generates (OpenAI's completions
// default).
const DefaultMaxTokens = 16

// Worker is engine i of a running fleet as a dataplane/worker.Worker: what the daemon routes
// to (`dataplane serve --workers mock:N`).
type Worker struct {
	fleet *Fleet
	i     int
	ids   atomic.Uint64
}

// Workers returns every engine of f as a worker.Worker.
func (f *Fleet) Workers() []worker.Worker {
	out := make([]worker.Worker, len(f.engines))
	for i := range f.engines {
		out[i] = &Worker{fleet: f, i: i}
	}
	return out
}

func (w *Worker) Name() string { return w.fleet.engines[w.i].opts.Name }

// Close does nothing: the fleet's owner stops it.
func (w *Worker) Close() error { return nil }

// Health is worker.Prober's: an in-process engine is always reachable (its fleet lives as long
// as the daemon), so every probe succeeds.
func (w *Worker) Health(context.Context) error { return nil }

// honoured are the sampling fields (openai.Sampling.Given) a mock engine honours: seed (the
// request draws its tokens from its own generator, seeded with it) and those that cannot
// change what it draws: it never draws an end-of-sequence token (ignore_eos), always generates
// max_tokens (min_tokens), and its tokens' text has no special tokens. max_tokens it honours
// too. Anything else (temperature, stop, logprobs, ...) would change a real engine's answer in
// a way placeholder tokens cannot: refused.
var honoured = map[string]bool{"seed": true, "ignore_eos": true, "min_tokens": true,
	"skip_special_tokens": true, "spaces_between_special_tokens": true}

// Check is worker.Checker's: an *openai.RequestError naming the first field of s the engine
// does not honour.
func (w *Worker) Check(s *openai.Sampling) error {
	for _, name := range s.Given() {
		if !honoured[name] {
			return openai.Invalid(name, "the mock engine %s generates placeholder tokens and cannot honour %s (it honours max_tokens, seed, min_tokens, ignore_eos)", w.Name(), name)
		}
	}
	if limit := cmp.Or(s.MaxTokens, DefaultMaxTokens); s.MinTokens > limit {
		return openai.Invalid("min_tokens", "%d is more than max_tokens %d", s.MinTokens, limit)
	}
	return nil
}

// Generate submits the request to the engine. Events carry one word of text per token
// (" t<token id>"), coalesced when the reader falls behind; the first event is the first
// token; the last is Done with the prompt and cached token counts. Cancelling ctx aborts the
// request in the engine and ends the stream with ctx's error. A full engine queue is
// worker.ErrUnavailable; a sampling field it does not honour (Check) an *openai.RequestError.
func (w *Worker) Generate(ctx context.Context, req *worker.Request) (<-chan worker.Event, error) {
	if err := w.Check(&req.Sampling); err != nil {
		return nil, err
	}
	r, err := RequestFromWorker(req)
	if err != nil {
		return nil, err
	}
	// The engine's id is the worker's own: a client may reuse its request id (X-Request-Id).
	r.ID = w.Name() + "-" + strconv.FormatUint(w.ids.Add(1), 10)
	mb := newMailbox()
	r.Sink = mb.put
	if err := w.fleet.Submit(ctx, w.i, r); err != nil {
		if errors.Is(err, ErrQueueFull) {
			return nil, fmt.Errorf("%w: %s: %v", worker.ErrUnavailable, w.Name(), err)
		}
		return nil, err
	}
	out := make(chan worker.Event, 16)
	go mb.forward(ctx, out, func() { w.fleet.Abort(w.i, r.ID) })
	return out, nil
}

// RequestFromWorker converts the daemon's request (token ids, media spans, salt, sampling).
func RequestFromWorker(req *worker.Request) (*Request, error) {
	r := &Request{ID: req.ID, Salt: req.CacheSalt, MaxTokens: req.Sampling.MaxTokens, Seed: req.Sampling.Seed,
		Tokens: make([]uint32, len(req.TokenIDs))}
	if r.MaxTokens == 0 {
		r.MaxTokens = DefaultMaxTokens
	}
	for i, t := range req.TokenIDs {
		if t < 0 {
			return nil, &ErrBadRequest{req.ID, fmt.Sprintf("token %d is %d", i, t)}
		}
		r.Tokens[i] = uint32(t)
	}
	kv, err := ParseKVTransferParams(req.KVTransfer)
	if err != nil {
		return nil, &ErrBadRequest{req.ID, err.Error()}
	}
	r.RemotePrefill = kv.Readable() // a decode step whose KV cache is read, not computed
	for i, m := range req.Media {
		if m.Start < 0 || m.End <= m.Start || m.End > len(req.TokenIDs) {
			return nil, &ErrBadRequest{req.ID, fmt.Sprintf("media %d: tokens [%d, %d) not inside the %d-token prompt", i, m.Start, m.End, len(req.TokenIDs))}
		}
		r.Media = append(r.Media, router.Media{Hash: router.MediaHash(m.ID), Offset: m.Start, Length: m.End - m.Start})
		r.MediaIDs = append(r.MediaIDs, m.ID)
	}
	return r, nil
}

// mailbox hands an engine's outputs (loop goroutine) to a request's reader without ever
// blocking the loop: tokens accumulate as text until the reader takes them.
type mailbox struct {
	mu     sync.Mutex
	text   []byte
	tokens int
	done   *Output
	notify chan struct{}
}

func newMailbox() *mailbox { return &mailbox{notify: make(chan struct{}, 1)} }

func (m *mailbox) put(o Output) {
	m.mu.Lock()
	if o.Err == nil {
		m.text = AppendTokenText(m.text, o.Token)
		m.tokens++
	}
	if o.Done {
		m.done = &o
	}
	m.mu.Unlock()
	select {
	case m.notify <- struct{}{}:
	default:
	}
}

// take returns what accumulated since the last take.
func (m *mailbox) take() (text string, tokens int, done *Output) {
	m.mu.Lock()
	defer m.mu.Unlock()
	text, tokens, done = string(m.text), m.tokens, m.done
	m.text, m.tokens = m.text[:0], 0
	return text, tokens, done
}

// forward moves outputs to out until the Done output (or ctx ends: abort, then a Done event
// with ctx's error), then closes out.
func (m *mailbox) forward(ctx context.Context, out chan<- worker.Event, abort func()) {
	defer close(out)
	for {
		select {
		case <-m.notify:
		case <-ctx.Done():
			cancelled(ctx, out, abort)
			return
		}
		text, n, done := m.take()
		if n > 0 {
			select {
			case out <- worker.Event{Text: text, Tokens: n}:
			case <-ctx.Done():
				cancelled(ctx, out, abort)
				return
			}
		}
		if done != nil {
			select {
			case out <- worker.Event{Done: true, Err: done.Err, FinishReason: done.FinishReason,
				PromptTokens: done.PromptTokens, CachedTokens: done.CachedTokens}:
			case <-ctx.Done():
			}
			return
		}
	}
}

// cancelled aborts the request in the engine and offers the reader a Done event with ctx's
// error (dropped if the reader stopped reading).
func cancelled(ctx context.Context, out chan<- worker.Event, abort func()) {
	abort()
	select {
	case out <- worker.Event{Done: true, Err: ctx.Err(), FinishReason: "abort"}:
	default:
	}
}

// AppendTokenText appends a generated token's text: " t" and its id.
func AppendTokenText(b []byte, tok uint32) []byte {
	return strconv.AppendUint(append(b, " t"...), uint64(tok), 10)
}
