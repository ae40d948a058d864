package mocker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/zeebo/xxh3"

	"dataplane/dataplane/api"
	"dataplane/dataplane/openai"
	"dataplane/dataplane/worker"
)

// ServerOptions configure the fleet's OpenAI-compatible HTTP API. DefaultServerOptions has the
// defaults.
type ServerOptions struct {
	MaxBodyBytes int64  // larger bodies get 413; 16 MiB
	MaxInFlight  int    // requests served at once; beyond, 429; 4,096
	Model        string // the model name /v1/models lists besides the engines; "mock"
	// Endpoints lists each engine's KV-event endpoints for GET /engines (optional).
	Endpoints func(i int) (events, replay string)
	// Render, when set, serves /v1/chat/completions (ec.go): it renders messages with the
	// model's chat template into token ids, with one placeholder token per media part at the
	// positions it returns. ECDir is the EC connector's shared_storage_path the media come from
	// (none: media parts are refused).
	Render func([]openai.Message) (ids []int32, placeholders []int, err error)
	ECDir  string
	// Labels are engine i's topology labels (nil: none): a prefill step's answer carries them,
	// and a decode step times the KV cache's move from them to its own (Transfer).
	Labels func(i int) map[string]string
	// Transfer models that move (disagg.go); the zero value is instant.
	Transfer KVTransfer
}

// DefaultServerOptions are the defaults above.
func DefaultServerOptions() ServerOptions {
	return ServerOptions{MaxBodyBytes: 16 << 20, MaxInFlight: 4096, Model: "mock"}
}

// Server serves a fleet over HTTP, like vLLM's API server, one engine per path prefix:
//
//	POST /engines/<i>/v1/completions   engine i (its base URL for `dataplane serve --workers`)
//	POST /v1/completions               the engine the "model" field names, else round-robin
//	POST .../v1/chat/completions       with ServerOptions.Render: an EC consumer's chat (ec.go)
//	GET  /v1/models, /engines/<i>/v1/models, /engines, /healthz, /health (vLLM's, which the
//	     daemon's health prober asks; also per engine: /engines/<i>/health)
//	GET  /engines/<i>/metrics: vLLM's vllm:cache_config_info (block_size, num_gpu_blocks), from
//	     which the daemon learns the engine's KV capacity
//
// A completion takes a text prompt (tokenized one word per token, by hash) or token ids,
// max_tokens, seed, stream, stream_options.include_usage, cache_salt, dataplane's extension
// "media": [{"start", "end", "id"}] (placeholder spans and identifiers, hashed into KV events),
// and vLLM's kv_transfer_params of disaggregated serving (disagg.go): a prefill step
// (do_remote_decode, not streamed) is answered with the params of its decode step; a decode
// step (do_remote_prefill with the remote_* keys) waits the KV cache's move (Transfer), then
// starts with the prompt computed;
// a sampling field the engines do not honour (Worker.Check: temperature, stop, logprobs, ...)
// or echo is a 400 naming it.
// Streams are vLLM's SSE chunks; the usage has prompt_tokens_details.cached_tokens.
type Server struct {
	opts     ServerOptions
	fleet    *Fleet
	workers  []*Worker
	inFlight chan struct{}
	rr       atomic.Uint64
	ids      atomic.Uint64
}

// NewServer serves f (which must be running while requests arrive).
func NewServer(f *Fleet, opts ServerOptions) *Server {
	s := &Server{opts: opts, fleet: f, inFlight: make(chan struct{}, max(opts.MaxInFlight, 1))}
	for i := range f.Len() {
		s.workers = append(s.workers, &Worker{fleet: f, i: i})
	}
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	engine := -1
	if rest, ok := strings.CutPrefix(path, "/engines/"); ok {
		num, sub, _ := strings.Cut(rest, "/")
		i, err := strconv.Atoi(num)
		if err != nil || i < 0 || i >= len(s.workers) {
			writeError(w, &api.Error{Status: 404, Type: "not_found_error", Message: fmt.Sprintf("no engine %q (have 0..%d)", num, len(s.workers)-1)})
			return
		}
		engine, path = i, "/"+sub
	}
	switch {
	case path == "/healthz", path == "/health":
		_, _ = io.WriteString(w, "ok\n")
	case path == "/engines" && engine < 0:
		s.listEngines(w)
	case path == "/metrics" && engine >= 0:
		s.metrics(w, r, engine)
	case path == "/v1/models":
		s.models(w, engine)
	case path == "/v1/completions" && r.Method == http.MethodPost:
		s.complete(w, r, engine)
	case path == "/v1/chat/completions" && r.Method == http.MethodPost && s.opts.Render != nil:
		s.chat(w, r, engine)
	default:
		writeError(w, &api.Error{Status: 404, Type: "not_found_error", Message: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)})
	}
}

func (s *Server) listEngines(w http.ResponseWriter) {
	type entry struct {
		Name    string `json:"name"`
		Path    string `json:"path"`
		Events  string `json:"kv_events,omitempty"`
		Replay  string `json:"kv_replay,omitempty"`
		Blocks  int    `json:"kv_blocks"`
		BlockSz int    `json:"block_size"`
	}
	out := make([]entry, len(s.workers))
	for i, wk := range s.workers {
		o := s.fleet.engines[i].opts
		out[i] = entry{Name: wk.Name(), Path: fmt.Sprintf("/engines/%d", i), Blocks: o.Blocks, BlockSz: o.BlockSize}
		if s.opts.Endpoints != nil {
			out[i].Events, out[i].Replay = s.opts.Endpoints(i)
		}
	}
	writeJSON(w, out)
}

// metrics is the part of vLLM's Prometheus page the daemon and the planner read: the cache
// config's info gauge (vllm/v1/metrics/loggers.py, log_metrics_info), with the engine's own
// block count, and the scheduler gauges vllm:num_requests_running, vllm:num_requests_waiting
// and vllm:kv_cache_usage_perc (same file, PrometheusStatLogger; labels model_name, engine).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request, engine int) {
	o := s.fleet.engines[engine].opts
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	fmt.Fprintf(w, "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n"+
		"vllm:cache_config_info{block_size=\"%d\",engine=\"0\",num_gpu_blocks=\"%d\"} 1.0\n", o.BlockSize, o.Blocks)
	loads, err := s.fleet.Loads(r.Context())
	if err != nil { // the engines are stopping: the info gauge alone
		return
	}
	l := loads[engine]
	usage := 0.0
	if l.Blocks > 0 {
		usage = float64(l.ActiveBlocks) / float64(l.Blocks)
	}
	labels := fmt.Sprintf(`{engine="0",model_name=%q}`, s.workers[engine].Name())
	fmt.Fprintf(w, "# HELP vllm:num_requests_running Number of requests in model execution batches.\n# TYPE vllm:num_requests_running gauge\n"+
		"vllm:num_requests_running%s %d.0\n", labels, l.Running)
	fmt.Fprintf(w, "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n# TYPE vllm:num_requests_waiting gauge\n"+
		"vllm:num_requests_waiting%s %d.0\n", labels, l.Waiting)
	fmt.Fprintf(w, "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n# TYPE vllm:kv_cache_usage_perc gauge\n"+
		"vllm:kv_cache_usage_perc%s %s\n", labels, strconv.FormatFloat(usage, 'g', -1, 64))
}

func (s *Server) models(w http.ResponseWriter, engine int) {
	list := openai.ModelList{Object: "list"}
	add := func(id string) {
		list.Data = append(list.Data, openai.Model{ID: id, Object: "model", Created: openai.Now(), OwnedBy: "dataplane-mocker"})
	}
	if engine >= 0 {
		add(s.workers[engine].Name())
	} else {
		add(s.opts.Model)
		for _, wk := range s.workers {
			add(wk.Name())
		}
	}
	writeJSON(w, list)
}

// completionExtras are the request fields openai.ParseCompletion does not keep.
type completionExtras struct {
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Media []struct {
		Start int    `json:"start"`
		End   int    `json:"end"`
		ID    string `json:"id"`
	} `json:"media"`
}

// usage is OpenAI's usage with vLLM's cached-token detail.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	Details          struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type completionChunk struct {
	ID      string                    `json:"id"`
	Object  string                    `json:"object"`
	Created int64                     `json:"created"`
	Model   string                    `json:"model"`
	Choices []openai.CompletionChoice `json:"choices"`
	Usage   *usage                    `json:"usage,omitempty"`
	// KVTransfer is a prefill step's answer (vLLM's CompletionResponse.kv_transfer_params).
	KVTransfer *KVTransferParams `json:"kv_transfer_params,omitempty"`
}

// admit takes an in-flight slot (429 when none is free) and reads the body (413 past
// MaxBodyBytes); ok false: the answer is written. release gives the slot back.
func (s *Server) admit(w http.ResponseWriter, r *http.Request) (body []byte, release func(), ok bool) {
	select {
	case s.inFlight <- struct{}{}:
	default:
		writeError(w, &api.Error{Status: 429, Type: "rate_limit_error", Message: fmt.Sprintf("%d requests in flight", cap(s.inFlight)), RetryAfter: time.Second})
		return nil, nil, false
	}
	release = func() { <-s.inFlight }
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		release()
		writeError(w, &api.Error{Status: 413, Type: "invalid_request_error", Message: fmt.Sprintf("body over %d bytes", s.opts.MaxBodyBytes)})
		return nil, nil, false
	}
	return body, release, true
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request, engine int) {
	body, release, ok := s.admit(w, r)
	if !ok {
		return
	}
	defer release()
	body, kvRaw, err := cutKVTransfer(body)
	if err != nil {
		writeError(w, api.BadRequest("kv_transfer_params", "%v", err))
		return
	}
	kv, err := ParseKVTransferParams(kvRaw)
	if err != nil {
		writeError(w, api.BadRequest("kv_transfer_params", "%v", err))
		return
	}
	req, err := openai.ParseCompletion(body, openai.DefaultLimits())
	if err == nil && kv != nil && kv.DoRemoteDecode && req.Stream {
		err = api.BadRequest("stream", "a prefill step (kv_transfer_params.do_remote_decode) is answered whole, as vLLM's disaggregated proxies ask for it")
	}
	if err == nil && req.Echo {
		err = api.BadRequest("echo", "the mock engines do not echo the prompt")
	}
	if err != nil {
		writeError(w, err)
		return
	}
	var extra completionExtras
	if err := json.Unmarshal(body, &extra); err != nil {
		writeError(w, api.BadRequest("media", "want a list of {start, end, id}: %v", err))
		return
	}
	if engine < 0 {
		engine = s.pick(req.Model)
	}
	// The request id, as vLLM makes it: X-Request-Id when the client sends one (echoed).
	id := strconv.FormatUint(s.ids.Add(1), 10)
	if x := r.Header.Get("X-Request-Id"); openai.RequestIDOK(x) {
		id = x
		w.Header().Set("X-Request-Id", x)
	}
	wreq := &worker.Request{ID: "cmpl-" + id, Prompt: req.Prompt, Sampling: req.Sampling, CacheSalt: req.Ext.CacheSalt}
	wreq.TokenIDs = req.PromptIDs
	if wreq.TokenIDs == nil {
		wreq.TokenIDs = TokenizeWords(req.Prompt, s.fleet.engines[engine].opts.Vocab)
	}
	for _, m := range extra.Media {
		wreq.Media = append(wreq.Media, worker.MediaSpan{Start: m.Start, End: m.End, ID: m.ID})
	}
	if kv.Readable() { // a decode step: the KV cache moves from the prefill engine first
		wreq.KVTransfer = kvRaw
		if !s.waitTransfer(r.Context(), kv, engine, len(wreq.TokenIDs)) {
			return // the client left
		}
	}
	wk := s.workers[engine]
	events, err := wk.Generate(r.Context(), wreq)
	var first worker.Event
	started := false
	if err == nil { // the engine's refusal is the stream's only event
		first, started = <-events
		var bad *ErrBadRequest
		if started && first.Done && first.Tokens == 0 && (errors.As(first.Err, &bad) || errors.Is(first.Err, worker.ErrUnavailable)) {
			err = first.Err
		}
	}
	if err != nil {
		var bad *ErrBadRequest
		var invalid *openai.RequestError
		switch {
		case errors.As(err, &invalid): // a sampling field the engine does not honour
			writeError(w, err)
		case errors.As(err, &bad):
			writeError(w, api.BadRequest("prompt", "%s", bad.Problem))
		case errors.Is(err, worker.ErrUnavailable):
			writeError(w, &api.Error{Status: 503, Type: "server_error", Message: err.Error(), RetryAfter: time.Second})
		default:
			writeError(w, &api.Error{Status: 500, Type: "server_error", Message: err.Error()})
		}
		return
	}
	name := wk.Name()
	chunk := completionChunk{ID: wreq.ID, Object: "text_completion", Created: openai.Now(), Model: name}
	if !req.Stream {
		var text strings.Builder
		n := 0
		for ev := range withFirst(first, started, events) {
			text.WriteString(ev.Text)
			n += ev.Tokens
			if ev.Done {
				if ev.Err != nil {
					writeError(w, &api.Error{Status: 500, Type: "server_error", Message: ev.Err.Error()})
					return
				}
				reason := ev.FinishReason
				chunk.Choices = []openai.CompletionChoice{{Text: text.String(), FinishReason: &reason}}
				chunk.Usage = usageOf(ev, n)
				if kv != nil && kv.DoRemoteDecode {
					chunk.KVTransfer = prefilled(name, wreq.ID, hostOf(r), portOf(r), ev.PromptTokens,
						s.fleet.engines[engine].opts.BlockSize, s.labels(engine))
				}
			}
		}
		writeJSON(w, chunk)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	bw := bufio.NewWriter(w)
	sse := api.NewSSE(bw)
	flusher, _ := w.(http.Flusher)
	flush := func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
	n := 0
	for ev := range withFirst(first, started, events) {
		if ev.Done {
			if ev.Err != nil {
				if !errors.Is(ev.Err, context.Canceled) {
					_ = sse.Error(&api.Error{Status: 500, Type: "server_error", Message: ev.Err.Error()})
				}
				flush()
				return
			}
			reason := ev.FinishReason
			chunk.Choices = []openai.CompletionChoice{{Text: "", FinishReason: &reason}}
			_ = sse.Event(chunk)
			if extra.StreamOptions.IncludeUsage {
				chunk.Choices, chunk.Usage = []openai.CompletionChoice{}, usageOf(ev, n)
				_ = sse.Event(chunk)
			}
			_ = sse.Done()
			flush()
			return
		}
		n += ev.Tokens
		// One chunk per token, as vLLM streams (clients count tokens by chunks); the worker
		// coalesces tokens a slow reader has not taken yet.
		for text := ev.Text; text != ""; {
			next := strings.Index(text[1:], " t") + 1
			if next == 0 {
				next = len(text)
			}
			chunk.Choices = []openai.CompletionChoice{{Text: text[:next]}}
			if sse.Event(chunk) != nil {
				return // the client left: ctx cancels the request
			}
			text = text[next:]
		}
		flush()
	}
}

// withFirst yields first (when there is one) and then the rest of events.
func withFirst(first worker.Event, ok bool, events <-chan worker.Event) iter.Seq[worker.Event] {
	return func(yield func(worker.Event) bool) {
		if !ok || !yield(first) {
			return
		}
		for ev := range events {
			if !yield(ev) {
				return
			}
		}
	}
}

// pick chooses the engine for a request to /v1/completions: the one its model names, else the
// next in turn.
func (s *Server) pick(model string) int {
	for i, wk := range s.workers {
		if wk.Name() == model {
			return i
		}
	}
	return int(s.rr.Add(1)-1) % len(s.workers)
}

func usageOf(ev worker.Event, completion int) *usage {
	u := &usage{PromptTokens: ev.PromptTokens, CompletionTokens: completion, TotalTokens: ev.PromptTokens + completion}
	u.Details.CachedTokens = ev.CachedTokens
	return u
}

// TokenizeWords is the mocker's tokenizer: one token per whitespace-separated word, its id the
// word's XXH3 modulo vocab (same text, same tokens: prefix caching works on text prompts).
func TokenizeWords(text string, vocab int) []int32 {
	var out []int32
	for _, w := range strings.Fields(text) {
		out = append(out, int32(xxh3.HashString(w)%uint64(vocab)))
	}
	return out
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	oe := api.ErrorOf(err)
	if oe.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(max(oe.RetryAfter.Seconds(), 1))))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(oe.Status)
	_, _ = w.Write(oe.Body())
}

// cutKVTransfer takes kv_transfer_params out of a completion body (the request parser refuses
// it: a daemon's clients may not set it) and returns both.
func cutKVTransfer(body []byte) ([]byte, json.RawMessage, error) {
	if !bytes.Contains(body, []byte(`"kv_transfer_params"`)) {
		return body, nil, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return body, nil, nil // the parser says what is wrong with it
	}
	raw := fields["kv_transfer_params"]
	delete(fields, "kv_transfer_params")
	out, err := json.Marshal(fields)
	return out, raw, err
}

// waitTransfer waits (in wall time: the engines' speed-up applied) for a decode step's KV cache
// to arrive from the prefill engine; false if ctx ended first.
func (s *Server) waitTransfer(ctx context.Context, kv *KVTransferParams, engine, tokens int) bool {
	d := s.opts.Transfer.Time(kv.RemoteTopology, s.labels(engine), tokens)
	if speed := s.fleet.opts.Clock.Speedup; speed > 0 {
		d = time.Duration(float64(d) / speed)
	}
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *Server) labels(engine int) map[string]string {
	if s.opts.Labels == nil {
		return nil
	}
	return s.opts.Labels(engine)
}

// hostOf and portOf are where the request came in: a prefill step's remote_host and
// remote_port (vLLM's are its NIXL side channel's; the mock has none, so its HTTP address).
func hostOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		return r.Host
	}
	return host
}

func portOf(r *http.Request) int {
	_, port, _ := net.SplitHostPort(r.Host)
	p, _ := strconv.Atoi(port)
	return p
}
