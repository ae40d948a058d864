package mocker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
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
// The engine's refusal of a request (a full queue, a bad request) comes as the stream's only
// event, a Done one with the error and no token: the caller waits once, for the first event,
// not for the submission and then for it.
func (w *Worker) Generate(ctx context.Context, req *worker.Request) (<-chan worker.Event, error) {
	if err := w.Check(&req.Sampling); err != nil {
		return nil, err
	}
	r, err := RequestFromWorker(req)
	if err != nil {
		return nil, err
	}
	// The engine's id is the worker's own: a client may reuse its request id (X-Request-Id).
	var id [48]byte // one allocation for the id, not two
	r.ID = string(strconv.AppendUint(append(append(id[:0], w.Name()...), '-'), w.ids.Add(1), 10))
	st := &stream{ctx: ctx, out: make(chan worker.Event, streamBuffer)}
	r.Sink, r.Ctx = st.put, ctx // the engine aborts r when ctx ends first
	w.fleet.Post(w.i, r, func(err error) {
		if errors.Is(err, ErrQueueFull) {
			err = fmt.Errorf("%w: %s: %v", worker.ErrUnavailable, w.Name(), err)
		}
		st.finish(worker.Event{Done: true, Err: err})
	})
	return st.out, nil
}

// streamBuffer is how many events a reader may fall behind before tokens coalesce.
const streamBuffer = 8

// stream hands an engine's outputs to a request's reader from the engine's loop goroutine
// (put), never blocking it: tokens accumulate as text while the reader is behind (its channel
// full) and go with the next output; a Done output that finds the channel full is delivered by
// a goroutine of its own. A request whose reader keeps up costs no goroutine and no hand-off
// but the channel's (issue 26: a mailbox goroutine per request cost two).
type stream struct {
	ctx    context.Context
	out    chan worker.Event
	text   []byte // loop goroutine only
	tokens int
}

func (s *stream) put(o Output) {
	if o.Err == nil {
		s.text = AppendTokenText(s.text, o.Token)
		s.tokens++
	}
	if s.tokens > 0 {
		select {
		case s.out <- worker.Event{Text: string(s.text), Tokens: s.tokens}:
			s.text, s.tokens = s.text[:0], 0
		default: // the reader is behind: the text goes with the next output
		}
	}
	if o.Done {
		s.finish(worker.Event{Done: true, Err: o.Err, FinishReason: o.FinishReason,
			PromptTokens: o.PromptTokens, CachedTokens: o.CachedTokens})
	}
}

// finish ends the stream with done (ctx's error and "abort" when ctx ended): at once when the
// reader has room, else from a goroutine that waits for it (or for ctx); then closes it.
func (s *stream) finish(done worker.Event) {
	if err := s.ctx.Err(); err != nil {
		done = worker.Event{Done: true, Err: err, FinishReason: "abort"}
	}
	var rest *worker.Event
	if s.tokens > 0 {
		rest = &worker.Event{Text: string(s.text), Tokens: s.tokens}
	} else {
		select {
		case s.out <- done:
			close(s.out)
			return
		default:
		}
	}
	go s.deliver(rest, done)
}

// deliver sends what is left of the stream as the reader takes it; when ctx ends first, the
// Done event with ctx's error is offered instead (dropped if the reader stopped reading).
func (s *stream) deliver(rest *worker.Event, done worker.Event) {
	defer close(s.out)
	evs := []worker.Event{done}
	if rest != nil {
		evs = []worker.Event{*rest, done}
	}
	for _, ev := range evs {
		select {
		case s.out <- ev:
		case <-s.ctx.Done():
			select {
			case s.out <- worker.Event{Done: true, Err: s.ctx.Err(), FinishReason: "abort"}:
			default:
			}
			return
		}
	}
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

// AppendTokenText appends a generated token's text: " t" and its id.
func AppendTokenText(b []byte, tok uint32) []byte {
	return strconv.AppendUint(append(b, " t"...), uint64(tok), 10)
}
