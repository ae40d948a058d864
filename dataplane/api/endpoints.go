package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"github.com/valyala/fasthttp/pprofhandler"

	"dataplane/dataplane"
	"dataplane/dataplane/openai"
	"dataplane/dataplane/sequence"
	"dataplane/dataplane/tokenizer"
	"dataplane/dataplane/worker"
)

// Attach puts a service behind the server's OpenAI-compatible API and registers its metrics.
func (s *Server) Attach(svc *dataplane.Service) {
	s.svc = svc
	s.registry.MustRegister(svc.Collectors()...)
}

// apiRoute answers the API's paths and returns the route's metrics label; false when path is
// not one of them. Switching on string(path) compares in place: a probe allocates nothing.
func (s *Server) apiRoute(ctx *fasthttp.RequestCtx, path []byte) (string, bool) {
	switch string(path) {
	case "/readyz":
		s.readyz(ctx)
		return "/readyz", true
	case "/v1/models":
		s.models(ctx)
		return "/v1/models", true
	case "/v1/chat/completions":
		s.post(ctx, "chat", s.chat)
		return "/v1/chat/completions", true
	case "/v1/completions":
		s.post(ctx, "completions", s.completions)
		return "/v1/completions", true
	case "/v1/pretokenized":
		s.post(ctx, "pretokenized", s.pretokenized)
		return "/v1/pretokenized", true
	case "/debug/route":
		s.debugRoute(ctx)
		return "/debug/route", true
	}
	if id, ok := bytes.CutPrefix(path, []byte("/v1/models/")); ok {
		s.model(ctx, string(id))
		return "/v1/models/{id}", true
	}
	if !s.opts.Pprof || !bytes.HasPrefix(path, []byte("/debug/pprof")) {
		return "", false
	}
	switch string(path) {
	case "/debug/pprof": // the index's links are relative to the slashed path
		ctx.Redirect("/debug/pprof/", http.StatusMovedPermanently)
	case "/debug/pprof/": // fasthttp's handler answers 404 to any path ending in "/"
		pprofIndex(ctx)
	default:
		if path[len("/debug/pprof")] != '/' {
			return "", false // /debug/pprofx
		}
		pprofhandler.PprofHandler(ctx)
	}
	return "/debug/pprof", true
}

// pprofIndex is net/http/pprof's index page, served at /debug/pprof/ as net/http serves it.
var pprofIndex = fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Index)

// post reads a generation request's body against the memory budget, parses it with parse
// and runs it. The request's memory account goes with the prompt to the service, which gives
// everything back when the request ends; a request that never gets there closes it here.
func (s *Server) post(ctx *fasthttp.RequestCtx, endpoint string, parse func([]byte) (parsed, error)) {
	if !ctx.IsPost() {
		ctx.Response.Header.Set("Allow", "POST")
		writeAPIError(ctx, &Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Message: "use POST"})
		return
	}
	if s.svc == nil {
		ctx.SetConnectionClose() // its body is not read
		writeAPIError(ctx, &Error{Status: http.StatusServiceUnavailable, Type: "overloaded_error", Message: "no models loaded"})
		return
	}
	// The request id: the client's X-Request-Id when it is a good one (openai.RequestIDOK),
	// else vLLM's request_id body field, else one made here; echoed on every answer.
	id := string(ctx.Request.Header.Peek("X-Request-Id"))
	if !openai.RequestIDOK(id) {
		id = ""
	}
	acct := s.svc.Memory().Account()
	body, err := s.readBody(ctx, s.cut, acct)
	var req parsed
	if err == nil {
		// Parsing copies what it keeps (the media's URLs and data) out of the body.
		err = acct.Reserve(s.cut, int64(len(body)), "parsed request")
	}
	if err == nil {
		req, err = parse(body)
	}
	if id == "" && err == nil {
		id = req.p.Ext.RequestID
	}
	if err == nil {
		req.p.ID = id // "": Run makes one
	} else if id == "" {
		id = s.svc.NewRequestID()
	}
	if err != nil {
		ctx.Response.Header.Set("X-Request-Id", id)
		acct.Close()
		writeAPIError(ctx, ErrorOf(err))
		return
	}
	req.p.Memory = acct
	s.generate(ctx, endpoint, req)
}

// parsed is a request an endpoint has read: its prompt and how to answer it.
type parsed struct {
	p                    *dataplane.Prompt
	stream, includeUsage bool
	format               streamFormat
	echo                 string // text before the completion's (completions' echo)
}

func writeAPIError(ctx *fasthttp.RequestCtx, e *Error) {
	if e.RetryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(int((e.RetryAfter+time.Second-1)/time.Second)))
	}
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	ctx.SetBody(e.Body())
}

func writeJSON(ctx *fasthttp.RequestCtx, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeAPIError(ctx, ErrorOf(err))
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

func (s *Server) readyz(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; charset=utf-8")
	if s.svc == nil {
		ctx.SetStatusCode(http.StatusServiceUnavailable)
		ctx.SetBodyString("not ready: no models loaded\n")
		return
	}
	if err := s.svc.Ready(); err != nil {
		ctx.SetStatusCode(http.StatusServiceUnavailable)
		ctx.SetBodyString("not ready: " + err.Error() + "\n")
		return
	}
	ctx.SetBodyString("ready\n")
}

func (s *Server) models(ctx *fasthttp.RequestCtx) {
	list := openai.ModelList{Object: "list", Data: []openai.Model{}}
	if s.svc != nil {
		list.Data = append(list.Data, s.servedModel())
	}
	writeJSON(ctx, list)
}

func (s *Server) servedModel() openai.Model {
	return openai.Model{ID: s.svc.Models().Name, Object: "model", Created: s.started.Unix(), OwnedBy: "dataplane"}
}

// model answers GET /v1/models/{id}: OpenAI's retrieve-model object for the served model (the
// id may hold slashes, as Hugging Face names do), else a 404 with vLLM's words for a model it
// does not serve (vllm/entrypoints/openai/engine/serving.py, _check_model, at 00bd1493; vLLM
// itself has no such route).
func (s *Server) model(ctx *fasthttp.RequestCtx, id string) {
	if s.svc != nil && id == s.svc.Models().Name {
		writeJSON(ctx, s.servedModel())
		return
	}
	writeAPIError(ctx, &Error{Status: http.StatusNotFound, Type: "not_found_error", Param: "model",
		Message: fmt.Sprintf("The model `%s` does not exist.", id)})
}

func (s *Server) debugRoute(ctx *fasthttp.RequestCtx) {
	if s.svc == nil {
		writeAPIError(ctx, &Error{Status: http.StatusNotFound, Type: "not_found_error", Message: "no router"})
		return
	}
	id := string(ctx.QueryArgs().Peek("request_id"))
	d, ok := s.svc.Decisions().Get(id)
	if !ok {
		writeAPIError(ctx, &Error{Status: http.StatusNotFound, Type: "not_found_error", Param: "request_id",
			Message: fmt.Sprintf("no routing decision for %q among the last %d", id, s.svc.Decisions().Len())})
		return
	}
	writeJSON(ctx, d)
}

// checkModel refuses a model this server does not serve ("" is the one it serves).
func (s *Server) checkModel(model string) error {
	name := s.svc.Models().Name
	if model == "" || model == name {
		return nil
	}
	return &Error{Status: http.StatusNotFound, Type: "not_found_error", Param: "model",
		Message: fmt.Sprintf("model %q is not served here (GET /v1/models lists %q)", model, name)}
}

// checkTokenIDs refuses ids the model's embedding table has no row for (param names the list).
func (s *Server) checkTokenIDs(ids []int32, param string) error {
	rows := s.svc.Models().Table.Rows
	for i, id := range ids {
		if int(id) >= rows {
			return BadRequest(fmt.Sprintf("%s[%d]", param, i), "token id %d outside the model's %d", id, rows)
		}
	}
	return nil
}

// Each endpoint reads its request into a dataplane.Prompt; the first error answers it.

func (s *Server) chat(body []byte) (parsed, error) {
	req, err := openai.ParseChat(body, s.svc.Limits())
	var ids []int32
	if err == nil {
		err = s.checkModel(req.Model)
	}
	if err == nil {
		ids, err = s.svc.Tokenizer().Chat(req.Messages)
	}
	if err != nil {
		return parsed{}, err
	}
	p := &dataplane.Prompt{Tokens: ids, Style: sequence.PlaceholderSingle, Media: req.Media, Sampling: req.Sampling, Ext: req.Ext,
		Messages: req.Messages}
	f := chatStream{}
	if req.Sampling.Logprobs != nil {
		f.top = *req.Sampling.Logprobs
	}
	return parsed{p: p, stream: req.Stream, includeUsage: req.IncludeUsage, format: f}, nil
}

func (s *Server) completions(body []byte) (parsed, error) {
	req, err := openai.ParseCompletion(body, s.svc.Limits())
	if err == nil {
		err = s.checkModel(req.Model)
	}
	// echo: the prompt as the client wrote it, token ids as the tokenizer decodes them.
	echo := ""
	if err == nil && req.PromptIDs == nil {
		echo = req.Prompt
		// Room for English at about 4 bytes a token: one allocation, not a doubling per few words.
		ids := make([]int32, 0, len(req.Prompt)/4+8)
		if req.PromptIDs, err = s.svc.Tokenizer().AppendEncode(ids, req.Prompt, tokenizer.EncodeOptions{AddSpecialTokens: req.AddSpecialTokens}); err != nil {
			err = BadRequest("prompt", "%v", err)
		}
	} else if err == nil && req.Echo {
		if echo, err = s.svc.Tokenizer().Decode(req.PromptIDs, tokenizer.DecodeOptions{}); err != nil {
			err = BadRequest("prompt", "%v", err)
		}
	}
	if err == nil {
		err = s.checkTokenIDs(req.PromptIDs, "prompt")
	}
	if err != nil {
		return parsed{}, err
	}
	if !req.Echo {
		echo = ""
	}
	p := &dataplane.Prompt{Tokens: req.PromptIDs, Style: sequence.PlaceholderSingle, Sampling: req.Sampling, Ext: req.Ext}
	return parsed{p: p, stream: req.Stream, includeUsage: req.IncludeUsage, format: completionStream{}, echo: echo}, nil
}

func (s *Server) pretokenized(body []byte) (parsed, error) {
	req, err := openai.ParsePretokenized(body, s.svc.Limits())
	if err == nil {
		err = s.checkModel(req.Model)
	}
	if err == nil {
		err = s.checkTokenIDs(req.TokenIDs, "token_ids")
	}
	if err != nil {
		return parsed{}, err
	}
	style := sequence.PlaceholderSingle
	if req.Style == "expanded" {
		style = sequence.PlaceholderExpanded
	}
	p := &dataplane.Prompt{Tokens: req.TokenIDs, Style: style, Media: req.Media, Sampling: req.Sampling, Ext: req.Ext}
	return parsed{p: p, stream: req.Stream, includeUsage: req.IncludeUsage, format: completionStream{}}, nil
}

// streamFormat writes a generation as one endpoint's responses; lp are the engine's logprobs
// (the completions layout) for the chunk's tokens, or all of them, nil when none came.
type streamFormat interface {
	chunk(g *dataplane.Generation, text string, lp *openai.CompletionLogprobs, finish *string, usage *openai.Usage) any
	// appendWhole appends the whole answer's JSON to b.
	appendWhole(b []byte, g *dataplane.Generation, text string, lp *openai.CompletionLogprobs, finish string, usage openai.Usage) ([]byte, error)
}

// chatStream writes chat answers; logprobs in chat's layout with top alternatives each.
type chatStream struct{ top int }

func (f chatStream) logprobs(lp *openai.CompletionLogprobs) *openai.ChatLogprobs {
	if lp == nil {
		return nil
	}
	return openai.ChatLogprobsOf(lp, f.top)
}

func (f chatStream) chunk(g *dataplane.Generation, text string, lp *openai.CompletionLogprobs, finish *string, usage *openai.Usage) any {
	c := openai.ChatChunk{ID: g.ID, Object: "chat.completion.chunk", Created: g.Started().Unix(), Model: g.Model, Usage: usage,
		Choices: []openai.ChatChunkChoice{{Delta: openai.ChatDelta{Content: text}, Logprobs: f.logprobs(lp), FinishReason: finish}}}
	if usage != nil {
		c.Choices = []openai.ChatChunkChoice{}
	}
	return c
}

func (f chatStream) appendWhole(b []byte, g *dataplane.Generation, text string, lp *openai.CompletionLogprobs, finish string, usage openai.Usage) ([]byte, error) {
	j, err := json.Marshal(openai.ChatCompletion{ID: g.ID, Object: "chat.completion", Created: g.Started().Unix(), Model: g.Model, Usage: &usage,
		Choices: []openai.ChatChoice{{Message: openai.ChatMessage{Role: "assistant", Content: text}, Logprobs: f.logprobs(lp), FinishReason: finish}}})
	return append(b, j...), err
}

type completionStream struct{}

func (completionStream) chunk(g *dataplane.Generation, text string, lp *openai.CompletionLogprobs, finish *string, usage *openai.Usage) any {
	c := openai.Completion{ID: g.ID, Object: "text_completion", Created: g.Started().Unix(), Model: g.Model, Usage: usage,
		Choices: []openai.CompletionChoice{{Text: text, Logprobs: lp, FinishReason: finish}}}
	if usage != nil {
		c.Choices = []openai.CompletionChoice{}
	}
	return c
}

func (completionStream) appendWhole(b []byte, g *dataplane.Generation, text string, lp *openai.CompletionLogprobs, finish string, usage openai.Usage) ([]byte, error) {
	c := openai.Completion{ID: g.ID, Object: "text_completion", Created: g.Started().Unix(), Model: g.Model, Usage: &usage,
		Choices: []openai.CompletionChoice{{Text: text, Logprobs: lp, FinishReason: &finish}}}
	return c.AppendJSON(b)
}

// generate runs a prompt and answers with the whole completion or a stream of chunks, and
// counts how it ended. The request's context ends when the client goes away (watched on the
// connection) or the answer is written.
func (s *Server) generate(ctx *fasthttp.RequestCtx, endpoint string, req parsed) {
	p, stream, includeUsage, f := req.p, req.stream, req.includeUsage, req.format
	start := requestStart(ctx)
	p.Received = start
	if p.ID == "" {
		p.ID, p.IDMade = s.svc.NewRequestIDAt(start), true
	}
	ctx.Response.Header.Set("X-Request-Id", p.ID)
	// A request ends early when its client leaves or a drain runs out of time (s.cut).
	reqCtx, cancelCause := context.WithCancelCause(s.cut)
	watch := s.disconnects.watch(ctx.Conn(), cancelCause)
	g, err := s.svc.Run(reqCtx, p)
	if err != nil {
		watch.stop()
		e := ErrorOf(err)
		switch context.Cause(reqCtx) { // before cancel, which sets a cause of its own
		case errShutdown:
			e = s.cutErr
		case errClientLeft: // whatever the step it was in made of it (a fetch cut short: a 502)
			e = &Error{Status: statusCancelled, Type: "cancelled", Message: errClientLeft.Error()}
		}
		cancelCause(errClientLeft)
		s.finished(endpoint, start, outcomeOf(e.Status))
		writeAPIError(ctx, e)
		return
	}
	if !stream {
		defer cancelCause(errClientLeft)
		defer g.Close()
		defer watch.stop()
		var text strings.Builder
		text.WriteString(req.echo)
		var done worker.Event
		var lp *openai.CompletionLogprobs
		completion := 0
		for ev := range g.Events {
			text.WriteString(ev.Text)
			completion += ev.Tokens
			if ev.Logprobs != nil {
				if lp == nil {
					lp = &openai.CompletionLogprobs{}
				}
				lp.Append(ev.Logprobs)
			}
			if ev.Done {
				done = ev
			}
		}
		if !done.Done || done.Err != nil {
			e := s.generationError(reqCtx, done)
			s.finished(endpoint, start, outcomeOf(e.Status))
			writeAPIError(ctx, e)
			return
		}
		s.finished(endpoint, start, "ok")
		// Written into the response's own (pooled) body buffer: no copy, no buffer of ours.
		body, err := f.appendWhole(ctx.Response.SwapBody(nil)[:0], g, text.String(), lp, done.FinishReason, usage(g, done, completion))
		ctx.Response.SwapBody(body)
		if err != nil {
			writeAPIError(ctx, ErrorOf(err))
			return
		}
		ctx.SetContentType("application/json")
		return
	}
	watch.stop() // the stream's writes notice a client that left
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer cancelCause(errClientLeft)
		defer g.Close()
		outcome := "cancelled" // unless the worker's last event says otherwise
		defer func() { s.finished(endpoint, start, outcome) }()
		sse := NewSSE(w)
		if _, ok := f.(chatStream); ok {
			first := openai.ChatChunk{ID: g.ID, Object: "chat.completion.chunk", Created: g.Started().Unix(), Model: g.Model,
				Choices: []openai.ChatChunkChoice{{Delta: openai.ChatDelta{Role: "assistant"}}}}
			if sse.Event(first) != nil {
				return
			}
		}
		if req.echo != "" && sse.Event(f.chunk(g, req.echo, nil, nil, nil)) != nil {
			return
		}
		completion := 0
		for ev := range g.Events {
			if ev.Done {
				if ev.Err != nil {
					e := s.generationError(reqCtx, ev)
					outcome = outcomeOf(e.Status)
					sse.Error(e) //nolint:errcheck
					return
				}
				outcome = "ok"
				finish := ev.FinishReason
				if sse.Event(f.chunk(g, ev.Text, ev.Logprobs, &finish, nil)) != nil {
					return
				}
				if includeUsage {
					u := usage(g, ev, completion)
					if sse.Event(f.chunk(g, "", nil, nil, &u)) != nil {
						return
					}
				}
				sse.Done() //nolint:errcheck
				return
			}
			completion += ev.Tokens
			if sse.Event(f.chunk(g, ev.Text, ev.Logprobs, nil, nil)) != nil {
				return // the client left: cancel releases everything
			}
		}
		e := s.generationError(reqCtx, worker.Event{}) // the events ended without a last one
		outcome = outcomeOf(e.Status)
		sse.Error(e) //nolint:errcheck // the client may be gone; one still there learns why
	})
}

func usage(g *dataplane.Generation, done worker.Event, completion int) openai.Usage {
	u := openai.Usage{PromptTokens: g.PromptTokens, CompletionTokens: completion, TotalTokens: g.PromptTokens + completion}
	if done.CachedTokens > 0 {
		u.PromptTokensDetails = &openai.PromptTokensDetails{CachedTokens: done.CachedTokens}
	}
	return u
}

// errClientLeft is the cause of a request whose client closed its connection.
var errClientLeft = errors.New("the client went away")

func (s *Server) generationError(ctx context.Context, ev worker.Event) *Error {
	if context.Cause(ctx) == errShutdown {
		return s.cutErr
	}
	if ctx.Err() != nil {
		return &Error{Status: statusCancelled, Type: "cancelled", Message: "the client went away"}
	}
	msg := "the LLM worker ended without a result"
	if ev.Err != nil {
		msg = "the LLM worker failed: " + ev.Err.Error()
	}
	return &Error{Status: http.StatusBadGateway, Type: "upstream_error", Message: msg}
}

// finished counts a generation request that ended with outcome, and its latency.
func (s *Server) finished(endpoint string, start time.Time, outcome string) {
	s.metrics.requestsBy.get(endpoint, outcome).Inc()
	s.metrics.latencyBy.get(endpoint, "").Observe(time.Since(start).Seconds())
}
