// Package worker is the daemon's side of the LLM workers: the request it hands over (token ids
// with the media's placeholder spans and content hashes, the merged embeddings, sampling) and
// the token events that come back, behind one interface that the in-process mocker fleet and
// OpenAI-compatible HTTP engines (vLLM) both implement.
package worker

import (
	"context"
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
}

// Request is one generation.
type Request struct {
	ID string
	// TokenIDs is the prompt with every media item's placeholder run expanded to its token
	// count (what the engine's KV cache holds, and what the router hashes).
	TokenIDs []int32
	Media    []MediaSpan
	// Embeds is the merged [len(TokenIDs), hidden] sequence (text rows and media features) in
	// the model's dtype, when the worker takes embeddings (vLLM prompt_embeds); empty for a
	// text-only request to a worker that tokenizes itself. The daemon keeps it valid until the
	// first event arrives (prefill has read it).
	Embeds    native.Matrix
	Prompt    string // the prompt text, for workers that take text
	Sampling  openai.Sampling
	CacheSalt string
}

// Event is one step of a generation. The last event has Done set (and Err on failure).
type Event struct {
	Text         string // new text since the previous event
	Tokens       int    // new tokens since the previous event
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

// ErrUnavailable: the worker could not take the request (down, overloaded).
var ErrUnavailable = errors.New("LLM worker unavailable")
