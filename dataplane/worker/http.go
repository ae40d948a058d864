package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"dataplane/dataplane/openai"
	"dataplane/transfer"
)

// HTTPOptions configure an OpenAI-compatible engine (vLLM's API server).
type HTTPOptions struct {
	BaseURL string // http://host:port
	// Name is the router's name for the worker (its KV events and announcements use it).
	// Default: BaseURL.
	Name  string
	Model string // the engine's model name ("" : the first of its /v1/models)
	// Label names the worker in what clients read (502 messages): "worker 2", never its address.
	// Default "worker".
	Label string
	// Handoff is how a request with media goes (HandoffEmbeds: prompt_embeds of the merged
	// sequence; HandoffEC, HandoffTokens: the chat request with the media and their
	// identifiers, to /v1/chat/completions); text-only requests go as token ids.
	Handoff Handoff
	// FirstByteTimeout bounds the time from sending a request until the response headers and
	// the first SSE data event have arrived (the engine queued and prefilled it): an engine that
	// is stopped or wedged fails within it (ErrUnavailable), not after Timeout. Default 30s.
	FirstByteTimeout time.Duration
	// Timeout bounds a whole generation (default 10m); ConnectTimeout the TCP connection (5s).
	Timeout, ConnectTimeout time.Duration
}

// HTTP is a worker reached over HTTP.
type HTTP struct {
	opts   HTTPOptions
	client *http.Client
}

// NewHTTP checks the options. It does not connect: the first request does.
func NewHTTP(opts HTTPOptions) (*HTTP, error) {
	if !strings.HasPrefix(opts.BaseURL, "http://") && !strings.HasPrefix(opts.BaseURL, "https://") {
		return nil, fmt.Errorf("worker: base URL %q (want http://host:port)", opts.BaseURL)
	}
	opts.BaseURL = strings.TrimRight(opts.BaseURL, "/")
	if opts.Name == "" {
		opts.Name = opts.BaseURL
	}
	if opts.Label == "" {
		opts.Label = "worker"
	}
	if opts.FirstByteTimeout <= 0 {
		opts.FirstByteTimeout = 30 * time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Minute
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 5 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: opts.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext
	tr.MaxIdleConnsPerHost = 256
	tr.MaxResponseHeaderBytes = 64 << 10
	// No client-wide timeout: each request's context carries the generation's deadline, and a
	// timer the first-byte one (Generate).
	return &HTTP{opts: opts, client: &http.Client{Transport: tr}}, nil
}

func (h *HTTP) Name() string  { return h.opts.Name }
func (h *HTTP) Label() string { return h.opts.Label }

func (h *HTTP) Close() error {
	h.client.CloseIdleConnections()
	return nil
}

// Health asks the engine's GET /health (vLLM answers 200 while its engine runs, 503 once it is
// dead): nil on 200. ctx bounds the probe.
func (h *HTTP) Health(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.opts.BaseURL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return unavailable(fmt.Errorf("%s: %w", h.opts.BaseURL, err), "%s", transportClass(err))
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096)) //nolint:errcheck // drained to reuse the connection
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return unavailable(fmt.Errorf("%s/health answered %s", h.opts.BaseURL, resp.Status), "health check answered %s", statusText(resp.StatusCode))
	}
	return nil
}

// statusText is a status as a client may read it: the code and its standard text (an engine's
// own reason phrase could say anything).
func statusText(code int) string { return strconv.Itoa(code) + " " + http.StatusText(code) }

// completionBody is the engine's /v1/completions request.
type completionBody struct {
	sampling
	Model         string         `json:"model,omitempty"`
	Prompt        any            `json:"prompt,omitempty"`
	PromptEmbeds  string         `json:"prompt_embeds,omitempty"`
	Stream        bool           `json:"stream"`
	StreamOptions map[string]any `json:"stream_options,omitempty"`
	CacheSalt     string         `json:"cache_salt,omitempty"`
	// KVTransferParams: a disaggregated request's (disagg.go).
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
}

// Generate sends one streamed completion and turns its chunks into events. It returns once the
// engine answered with its headers; the first-byte timer (HTTPOptions.FirstByteTimeout) runs
// on until the first SSE data event, so a silent engine fails either here or with a Done event
// carrying an ErrUnavailable *Error before any token.
func (h *HTTP) Generate(ctx context.Context, req *Request) (<-chan Event, error) {
	body := completionBody{sampling: samplingOf(&req.Sampling), Model: h.opts.Model, Stream: true,
		StreamOptions: map[string]any{"include_usage": true}, CacheSalt: req.CacheSalt, KVTransferParams: req.KVTransfer}
	path, raw, err := h.encode(body, req)
	if err != nil {
		return nil, err
	}
	// gctx is the generation: it ends with the caller's ctx, after Timeout, or when the
	// first-byte timer fires before the first data event (late says which).
	gctx, cancel := context.WithTimeout(ctx, h.opts.Timeout)
	var late atomic.Bool
	firstByte := time.AfterFunc(h.opts.FirstByteTimeout, func() { late.Store(true); cancel() })
	hreq, err := http.NewRequestWithContext(gctx, http.MethodPost, h.opts.BaseURL+path, bytes.NewReader(raw))
	if err != nil {
		firstByte.Stop()
		cancel()
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	if req.ID != "" {
		hreq.Header.Set("X-Request-Id", req.ID) // vLLM's request id (its _base_request_id)
	}
	resp, err := h.client.Do(hreq)
	if err != nil {
		firstByte.Stop()
		err = h.failure(ctx, gctx, &late, fmt.Errorf("%s: %w", h.opts.BaseURL, err), transportClass(err))
		cancel()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		firstByte.Stop()
		err := h.answerError(resp)
		cancel()
		return nil, err
	}
	events := make(chan Event, 16)
	go func() { // owned by the request: it ends with the stream or with ctx
		defer close(events)
		defer cancel()
		defer resp.Body.Close()
		done := forward(gctx, resp.Body, events, func() { firstByte.Stop() })
		firstByte.Stop()
		switch {
		case done.Err != nil && gctx.Err() != nil: // the caller left, or a timer ended it
			done = Event{Done: true, Err: h.failure(ctx, gctx, &late, fmt.Errorf("%s: %w", h.opts.BaseURL, done.Err), "")}
		case done.Err != nil:
			done.Err = fmt.Errorf("%s: %w", h.opts.BaseURL, done.Err)
		}
		select {
		case events <- done:
		case <-ctx.Done():
		}
	}()
	return events, nil
}

// encode writes body for req: the prompt as prompt_embeds, token ids or text to
// /v1/completions, or the chat with its media to /v1/chat/completions (the chat hand-offs).
func (h *HTTP) encode(body completionBody, req *Request) (path string, raw []byte, err error) {
	path = "/v1/completions"
	switch {
	case h.opts.Handoff.SendsChat() && len(req.Media) > 0:
		path = "/v1/chat/completions" // the messages are added below
	case h.opts.Handoff == HandoffEmbeds && req.Embeds.Rows > 0:
		b64, err := transfer.PromptEmbedsBase64(req.Embeds)
		if err != nil {
			return "", nil, err
		}
		body.PromptEmbeds = b64
	case len(req.TokenIDs) > 0:
		body.Prompt = req.TokenIDs
	default:
		body.Prompt = req.Prompt
	}
	raw, err = json.Marshal(body)
	if err == nil && path == "/v1/chat/completions" {
		raw, err = chatBody(raw, req)
	}
	return path, raw, err
}

// answerError is an engine's answer other than 200 as an *Error (its body read to 4 KiB and
// closed): unavailable on 429 and 5xx, the client's error (refused) on 400 and 422.
func (h *HTTP) answerError(resp *http.Response) error {
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	err := &Error{Class: "answered " + statusText(resp.StatusCode),
		Err: fmt.Errorf("%s answered %s: %s", h.opts.BaseURL, resp.Status, bytes.TrimSpace(msg))}
	err.Unavailable = resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
	if resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnprocessableEntity {
		err = refused(err, msg)
	}
	return err
}

// failure says why a generation's context or request ended (cause, naming the engine): the
// caller's context (its error as it is), the first-byte timer, the generation's timeout, or
// else a transport failure of class. Call it before cancelling gctx.
func (h *HTTP) failure(ctx, gctx context.Context, late *atomic.Bool, cause error, class string) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case late.Load():
		return unavailable(fmt.Errorf("no first byte within %v: %w", h.opts.FirstByteTimeout, cause),
			"no first byte within %v", h.opts.FirstByteTimeout)
	case gctx.Err() != nil:
		return &Error{Class: fmt.Sprintf("generation took longer than %v", h.opts.Timeout), Err: cause}
	}
	return unavailable(cause, "%s", class)
}

// refused is the engine's refusal of the request (its 400: a field it does not take, a value
// out of its range, a prompt too long): a client's error, so the client reads the engine's
// message and param (*openai.RequestError in the chain), bounded to 512 bytes.
func refused(err *Error, body []byte) *Error {
	var e engineError
	if json.Unmarshal(body, &e) != nil || e.message() == "" {
		return err
	}
	msg := e.message()
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	err.Class = "refused the request: " + msg
	err.Err = errors.Join(err.Err, &openai.RequestError{Param: e.param(), Message: "the LLM worker refused the request: " + msg})
	return err
}

// engineError is an engine's error body: vLLM's {"error": {"message", "type", "param", "code"}}
// (older: the fields at the top level, with "object": "error").
type engineError struct {
	Error *struct {
		Message string `json:"message"`
		Param   any    `json:"param"`
	} `json:"error"`
	Message string `json:"message"`
	Param   any    `json:"param"`
}

func (e *engineError) message() string {
	if e.Error != nil {
		return e.Error.Message
	}
	return e.Message
}

func (e *engineError) param() string {
	p := e.Param
	if e.Error != nil {
		p = e.Error.Param
	}
	s, _ := p.(string)
	return s
}

// chunk is one streamed completion chunk (or an error event).
type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta *struct {
			Content string `json:"content"`
		} `json:"delta"` // a chat chunk's
		// Logprobs in the completions layout, or a chat chunk's (chatLogprobs), converted.
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// choiceLogprobs reads a chunk choice's logprobs: the completions layout, or a chat chunk's
// ({"content": [{"token", "logprob", "top_logprobs": [{"token", "logprob"}]}]}, what vLLM's
// chat endpoint streams in the chat-sending hand-offs) turned into it, the one form Event
// carries (the API writes the client's layout from it). nil when there are none.
func choiceLogprobs(raw json.RawMessage, chat bool) (*openai.CompletionLogprobs, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if !chat {
		var lp openai.CompletionLogprobs
		if err := json.Unmarshal(raw, &lp); err != nil {
			return nil, fmt.Errorf("bad logprobs: %v", err)
		}
		return &lp, lp.Check()
	}
	var c struct {
		Content []struct {
			Token       string  `json:"token"`
			Logprob     float64 `json:"logprob"`
			TopLogprobs []struct {
				Token   string  `json:"token"`
				Logprob float64 `json:"logprob"`
			} `json:"top_logprobs"`
		} `json:"content"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("bad chat logprobs: %v", err)
	}
	lp := &openai.CompletionLogprobs{}
	offset := 0
	for _, t := range c.Content {
		top := openai.TopLogprobs{{Token: t.Token, Logprob: t.Logprob}} // the sampled token first, as the completions layout has it
		for _, a := range t.TopLogprobs {
			if a.Token != t.Token {
				top = append(top, openai.TokenLogprob{Token: a.Token, Logprob: a.Logprob})
			}
		}
		logprob := t.Logprob
		lp.Tokens = append(lp.Tokens, t.Token)
		lp.TokenLogprobs = append(lp.TokenLogprobs, &logprob)
		lp.TopLogprobs = append(lp.TopLogprobs, top)
		lp.TextOffset = append(lp.TextOffset, offset) // within the chunk: the chat layout has no offsets
		offset += len(t.Token)
	}
	return lp, nil
}

// forward sends every text chunk of an SSE stream as an event (until ctx ends) and returns
// the final Done event; first is called at the first data event. A stream that breaks off is
// the worker going away (ErrUnavailable); a chunk that does not decode is not.
func forward(ctx context.Context, r io.Reader, out chan<- Event, first func()) Event {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	done := Event{Done: true}
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue // comments, event names, blank separators
		}
		if first != nil {
			first()
			first = nil
		}
		data := bytes.TrimSpace(line[len("data:"):])
		if string(data) == "[DONE]" {
			return done
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			done.Err = &Error{Class: "sent a malformed stream", Err: fmt.Errorf("bad chunk: %v", err)}
			return done
		}
		if c.Error != nil { // vLLM's error event: the generation failed after the stream began
			done.Err = &Error{Class: "failed mid-stream", Err: fmt.Errorf("error event: %s", c.Error.Message)}
			return done
		}
		if c.Usage != nil {
			done.PromptTokens = c.Usage.PromptTokens
			if c.Usage.PromptTokensDetails != nil {
				done.CachedTokens = c.Usage.PromptTokensDetails.CachedTokens
			}
		}
		for _, ch := range c.Choices {
			if ch.Delta != nil && ch.Text == "" {
				ch.Text = ch.Delta.Content
			}
			lp, err := choiceLogprobs(ch.Logprobs, ch.Delta != nil)
			if err != nil {
				done.Err = &Error{Class: "sent a malformed stream", Err: err}
				return done
			}
			ev := Event{Text: ch.Text, Logprobs: lp}
			switch {
			case lp != nil:
				ev.Tokens = len(lp.Tokens)
			case ch.Text != "":
				ev.Tokens = 1
			}
			if ev.Tokens > 0 || ev.Text != "" {
				select {
				case out <- ev:
				case <-ctx.Done():
					done.Err = ctx.Err()
					return done
				}
			}
			if ch.FinishReason != nil {
				done.FinishReason = *ch.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		done.Err = unavailable(fmt.Errorf("stream: %w", err), "stream broke off")
	} else {
		done.Err = unavailable(errors.New("stream ended without [DONE]"), "stream ended early")
	}
	return done
}
