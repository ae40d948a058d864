// Package worker is the daemon's side of the LLM workers: the request it hands over (token ids
// with the media's placeholder spans and content hashes, the merged embeddings, sampling) and
// the token events that come back, behind one interface that the in-process mocker fleet and
// OpenAI-compatible HTTP engines (vLLM) both implement.
//
// Beside Worker, three optional interfaces: Prober (Health, the daemon's out-of-band probe; a
// worker that is not one is always healthy), Labeled (Label, the name clients read) and
// Checker (Check, the sampling fields a worker cannot honour: refused before any work). Files:
// worker.go (the interfaces, Request, Event, ErrUnavailable, Label), http.go (HTTP: vLLM's
// streamed /v1/completions and /v1/chat/completions, GET /health), handoff.go (Handoff: how a
// request with media reaches an HTTP engine; the chat body with the media's identifiers as
// uuids), sampling.go (the sampling and output fields of the engine's request), errors.go
// (Error and its classes, Public), disagg.go (Prefiller: the prefill step of a disaggregated
// request, vLLM's kv_transfer_params; the decode step is Generate with Request.KVTransfer).
//
// HTTP bounds everything: a request's first byte (headers and the first SSE data event) by
// HTTPOptions.FirstByteTimeout (30s), the whole generation by Timeout (10m), the connection by
// ConnectTimeout (5s), an error body read to 4 KiB, an SSE line to 16 MiB, response headers to
// 64 KiB. Its failures are *Error: Class says what happened without an address ("connection
// refused", "no first byte within 30s", "answered 500 Internal Server Error", "stream broke
// off"), Err is the whole cause for the logs, and those that say the worker cannot take
// requests now (unreachable, silent, 429 or 5xx, gone mid-stream) wrap ErrUnavailable: the
// daemon then takes the worker out of routing until a probe succeeds and retries a request
// that had no token yet on another worker. An engine's 400 (or 422) is the client's error: its
// message and param reach the client as an *openai.RequestError in the chain (a 400), and the
// worker stays in routing. HTTP sends the request's sampling and output fields with vLLM's
// names, its id as X-Request-Id, and passes the engine's logprobs back in its events.
package worker

import (
	"context"
	"encoding/json"
	"errors"

	"dataplane/dataplane/openai"
	"dataplane/native"
)

// MediaSpan is a media item's place in the prompt: token rows [Start, End) and its
// identifier (the content key in hex, or the client's uuid), which engines list in their KV
// events' extra_keys and the router hashes with router.MediaHash into the blocks it overlaps.
type MediaSpan struct {
	Start, End int
	ID         string
	// Src is the request's part the item came from (the chat hand-offs send it, with ID as its
	// uuid); nil when the worker needs no more than the span.
	Src *openai.Media
}

// Request is one generation.
type Request struct {
	// ID is the request's id (the client's X-Request-Id when it gave one); HTTP workers send
	// it as X-Request-Id, which vLLM takes as its request id. Not unique: a client may reuse one.
	ID string
	// TokenIDs is the prompt with every media item's placeholder run expanded to its token
	// count (what the engine's KV cache holds, and what the router hashes).
	TokenIDs []int32
	Media    []MediaSpan
	// Embeds is the merged [len(TokenIDs), hidden] sequence (text rows and media features) in
	// the model's dtype, when the worker takes embeddings (vLLM prompt_embeds); empty for a
	// text-only request to a worker that tokenizes itself. The daemon keeps it valid until the
	// first event arrives (prefill has read it).
	Embeds native.Matrix
	Prompt string // the prompt text, for workers that take text
	// Messages is the client's chat when the request came as one: HTTP workers in the EC and
	// tokens hand-offs send it, with its media, to the engine's chat endpoint.
	Messages  []openai.Message
	Sampling  openai.Sampling
	CacheSalt string
	// KVTransfer is a disaggregated decode step's handle on its KV cache: the kv_transfer_params
	// a prefill worker returned (Prefiller), sent on as they came (vLLM's disaggregated proxies
	// do so: tests/v1/kv_connector/nixl_integration/toy_proxy_server.py). nil: none.
	KVTransfer json.RawMessage
}

// Event is one step of a generation. The last event has Done set (and Err on failure).
type Event struct {
	Text   string // new text since the previous event
	Tokens int    // new tokens since the previous event
	// Logprobs are the new tokens' logprobs when the request asked for them
	// (Sampling.Logprobs), in the completions layout.
	Logprobs     *openai.CompletionLogprobs
	FinishReason string // on Done: "stop", "length", ...
	Done         bool
	Err          error
	PromptTokens int // on Done
	// CachedTokens is how many prompt tokens the engine found in its KV cache (when it says).
	CachedTokens int
}

// Worker is an LLM engine the router can pick.
type Worker interface {
	// Name identifies the worker to the router (its KV events say the same name).
	Name() string
	// Generate starts a generation. Events arrive on the channel, which is closed after the
	// Done event; cancelling ctx ends the generation early (a Done event with ctx's error).
	Generate(ctx context.Context, req *Request) (<-chan Event, error)
	// Close releases the worker's connections.
	Close() error
}

// Prober is a worker that can say whether it is healthy, out of band (the daemon's prober asks
// every worker that implements it every health interval; a worker that does not is always
// healthy). Health returns nil when the worker takes requests; ctx bounds the probe.
type Prober interface {
	Health(ctx context.Context) error
}

// Checker is a worker that honours only some of the sampling and output fields a request may
// give (openai.Sampling.Given): Check returns an *openai.RequestError naming the first it
// cannot honour, so that the request is refused (400) before any work is done for it rather
// than answered as if it had been honoured. A worker that is not a Checker takes them all
// (vLLM: it checks them itself, and its 400 reaches the client as one).
type Checker interface {
	Check(s *openai.Sampling) error
}

// Labeled is a worker with a public label, the name client-facing messages give it (an HTTP
// worker's name is its address, which clients must not see). Label gives it.
type Labeled interface {
	Label() string
}

// Label is the name of w that client-facing messages use: its Label when it has one, else its
// Name.
func Label(w Worker) string {
	if l, ok := w.(Labeled); ok && l.Label() != "" {
		return l.Label()
	}
	return w.Name()
}

// ErrUnavailable: the worker could not take the request (down, overloaded).
var ErrUnavailable = errors.New("LLM worker unavailable")
