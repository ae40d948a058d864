package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"dataplane/transfer"
)

// HTTPOptions configure an OpenAI-compatible engine (vLLM's API server).
type HTTPOptions struct {
	BaseURL string // http://host:port
	Model   string // the engine's model name ("" : the first of its /v1/models)
	// Embeds sends the merged sequence as prompt_embeds (vLLM --enable-prompt-embeds) when a
	// request has one; otherwise the engine gets the token ids (text-only requests).
	Embeds bool
	// Timeout bounds a whole generation; ConnectTimeout the connection.
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
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Minute
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 5 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	tr.ResponseHeaderTimeout = opts.Timeout
	return &HTTP{opts: opts, client: &http.Client{Transport: tr, Timeout: opts.Timeout}}, nil
}

func (h *HTTP) Name() string { return h.opts.BaseURL }

func (h *HTTP) Close() error {
	h.client.CloseIdleConnections()
	return nil
}

// completionBody is the engine's /v1/completions request.
type completionBody struct {
	Model         string         `json:"model,omitempty"`
	Prompt        any            `json:"prompt,omitempty"`
	PromptEmbeds  string         `json:"prompt_embeds,omitempty"`
	MaxTokens     int            `json:"max_tokens,omitempty"`
	Temperature   *float64       `json:"temperature,omitempty"`
	TopP          *float64       `json:"top_p,omitempty"`
	Seed          *int64         `json:"seed,omitempty"`
	Stop          []string       `json:"stop,omitempty"`
	Stream        bool           `json:"stream"`
	StreamOptions map[string]any `json:"stream_options,omitempty"`
	CacheSalt     string         `json:"cache_salt,omitempty"`
}

// Generate sends one streamed completion and turns its chunks into events.
func (h *HTTP) Generate(ctx context.Context, req *Request) (<-chan Event, error) {
	body := completionBody{Model: h.opts.Model, MaxTokens: req.Sampling.MaxTokens, Temperature: req.Sampling.Temperature,
		TopP: req.Sampling.TopP, Seed: req.Sampling.Seed, Stop: req.Sampling.Stop, Stream: true,
		StreamOptions: map[string]any{"include_usage": true}, CacheSalt: req.CacheSalt}
	switch {
	case h.opts.Embeds && req.Embeds.Rows > 0:
		b64, err := transfer.PromptEmbedsBase64(req.Embeds)
		if err != nil {
			return nil, err
		}
		body.PromptEmbeds = b64
	case len(req.TokenIDs) > 0:
		body.Prompt = req.TokenIDs
	default:
		body.Prompt = req.Prompt
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, h.opts.BaseURL+"/v1/completions", bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	resp, err := h.client.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnavailable, h.opts.BaseURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		err := fmt.Errorf("worker %s answered %s: %s", h.opts.BaseURL, resp.Status, bytes.TrimSpace(msg))
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
			err = fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		return nil, err
	}
	events := make(chan Event, 16)
	go func() { // owned by the request: it ends with the stream or with ctx
		defer close(events)
		defer resp.Body.Close()
		done := forward(ctx, resp.Body, events)
		if ctx.Err() != nil {
			done = Event{Done: true, Err: ctx.Err()}
		}
		select {
		case events <- done:
		case <-ctx.Done():
		}
	}()
	return events, nil
}

// chunk is one streamed completion chunk.
type chunk struct {
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// forward sends every text chunk of an SSE stream as an event (until ctx ends) and returns
// the final Done event.
func forward(ctx context.Context, r io.Reader, out chan<- Event) Event {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	done := Event{Done: true}
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue // comments, event names, blank separators
		}
		data := bytes.TrimSpace(line[len("data:"):])
		if string(data) == "[DONE]" {
			return done
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			done.Err = fmt.Errorf("worker stream: bad chunk: %v", err)
			return done
		}
		if c.Usage != nil {
			done.PromptTokens = c.Usage.PromptTokens
			if c.Usage.PromptTokensDetails != nil {
				done.CachedTokens = c.Usage.PromptTokensDetails.CachedTokens
			}
		}
		for _, ch := range c.Choices {
			if ch.Text != "" {
				select {
				case out <- Event{Text: ch.Text, Tokens: 1}:
				case <-ctx.Done():
					return done
				}
			}
			if ch.FinishReason != nil {
				done.FinishReason = *ch.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		done.Err = fmt.Errorf("worker stream: %w", err)
	} else {
		done.Err = fmt.Errorf("worker stream ended without [DONE]")
	}
	return done
}
