package mocker

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"dataplane/dataplane/api"
	"dataplane/dataplane/openai"
	"dataplane/dataplane/worker"
	"dataplane/transfer"
	"dataplane/transfer/safetensors"
)

// A mock engine as a vLLM EC consumer (vLLM's shared-storage EC connector, ec_role
// ec_consumer; transfer/NOTES.md §2): /v1/chat/completions renders the messages with the
// model's template (ServerOptions.Render), and every media part must carry a uuid naming
// <ECDir>/<uuid>/encoder_cache.safetensors with an ec_cache tensor [n, hidden], which it opens
// the way the connector loads it; the part's placeholder becomes n tokens and the item's
// blocks carry the uuid in their KV events, as vLLM's do. The mock has no encoder, so a
// missing or unreadable file fails the request (a real engine would encode the item itself):
// tests see every item the daemon did not hand over.

// ReadECItem opens the EC file for identifier in dir and returns its number of embeddings.
func ReadECItem(dir, identifier string) (int, error) {
	if identifier == "" || strings.ContainsAny(identifier, `/\`) || identifier == "." || identifier == ".." {
		return 0, fmt.Errorf("EC item %q: not a folder name", identifier)
	}
	f, err := safetensors.Open(transfer.ECCacheFile(dir, identifier))
	if err != nil {
		return 0, fmt.Errorf("EC item %s: %w", identifier, err)
	}
	defer f.Close()
	t, ok := f.Tensor("ec_cache")
	switch {
	case !ok:
		return 0, fmt.Errorf("EC item %s: no ec_cache tensor", identifier)
	case len(t.Shape) != 2 || t.Shape[0] <= 0 || t.Shape[1] <= 0:
		return 0, fmt.Errorf("EC item %s: ec_cache of shape %v, want [embeddings, hidden]", identifier, t.Shape)
	case t.DType != "F32" && t.DType != "F16" && t.DType != "BF16":
		return 0, fmt.Errorf("EC item %s: ec_cache of dtype %s", identifier, t.DType)
	}
	return t.Shape[0], nil
}

// chat serves /v1/chat/completions for an EC consumer.
func (s *Server) chat(w http.ResponseWriter, r *http.Request, engine int) {
	body, release, ok := s.admit(w, r)
	if !ok {
		return
	}
	defer release()
	req, err := openai.ParseChat(body, openai.DefaultLimits())
	if err != nil {
		writeError(w, err)
		return
	}
	var extra completionExtras
	_ = json.Unmarshal(body, &extra) // ParseChat checked the body; only stream_options is read
	ids, at, err := s.opts.Render(req.Messages)
	if err == nil && len(at) != len(req.Media) {
		err = fmt.Errorf("the template placed %d media placeholders for %d media parts", len(at), len(req.Media))
	}
	if err != nil {
		writeError(w, api.BadRequest("messages", "%v", err))
		return
	}
	wreq := &worker.Request{ID: fmt.Sprintf("chatcmpl-%d", s.ids.Add(1)), Sampling: req.Sampling, CacheSalt: req.Ext.CacheSalt}
	prev := 0
	for k, pos := range at {
		m := req.Media[k]
		if m.UUID == "" || s.opts.ECDir == "" {
			writeError(w, api.BadRequest(m.Path, "this engine has no encoder: it takes media only as EC items named by uuid (--ec-dir)"))
			return
		}
		n, err := ReadECItem(s.opts.ECDir, m.UUID)
		if err != nil {
			writeError(w, &api.Error{Status: 500, Type: "server_error", Message: err.Error()})
			return
		}
		wreq.TokenIDs = append(wreq.TokenIDs, ids[prev:pos]...)
		wreq.Media = append(wreq.Media, worker.MediaSpan{Start: len(wreq.TokenIDs), End: len(wreq.TokenIDs) + n, ID: m.UUID})
		for range n {
			wreq.TokenIDs = append(wreq.TokenIDs, ids[pos])
		}
		prev = pos + 1
	}
	wreq.TokenIDs = append(wreq.TokenIDs, ids[prev:]...)
	if engine < 0 {
		engine = s.pick(req.Model)
	}
	wk := s.workers[engine]
	events, err := wk.Generate(r.Context(), wreq)
	if err != nil {
		var bad *ErrBadRequest
		switch {
		case errors.As(err, &bad):
			writeError(w, api.BadRequest("messages", "%s", bad.Problem))
		case errors.Is(err, worker.ErrUnavailable):
			writeError(w, &api.Error{Status: 503, Type: "server_error", Message: err.Error(), RetryAfter: time.Second})
		default:
			writeError(w, &api.Error{Status: 500, Type: "server_error", Message: err.Error()})
		}
		return
	}
	s.respondChat(r.Context(), w, wreq.ID, wk.Name(), req.Stream, extra.StreamOptions.IncludeUsage, events)
}

// respondChat writes the generation as a chat completion, streamed as vLLM streams it (one
// delta a token) or whole.
func (s *Server) respondChat(ctx context.Context, w http.ResponseWriter, id, model string, stream, usage bool, events <-chan worker.Event) {
	n := 0
	var text strings.Builder
	if !stream {
		for ev := range events {
			text.WriteString(ev.Text)
			n += ev.Tokens
			if ev.Done && ev.Err != nil {
				writeError(w, &api.Error{Status: 500, Type: "server_error", Message: ev.Err.Error()})
				return
			}
			if ev.Done {
				u := usageOf(ev, n)
				writeJSON(w, map[string]any{"id": id, "object": "chat.completion", "created": openai.Now(), "model": model,
					"choices": []openai.ChatChoice{{Message: openai.ChatMessage{Role: "assistant", Content: text.String()}, FinishReason: ev.FinishReason}},
					"usage":   u})
			}
		}
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	bw := bufio.NewWriter(w)
	sse := api.NewSSE(bw)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	chunk := map[string]any{"id": id, "object": "chat.completion.chunk", "created": openai.Now(), "model": model}
	for ev := range events {
		if ev.Done {
			if ev.Err != nil {
				if !errors.Is(ev.Err, context.Canceled) && ctx.Err() == nil {
					_ = sse.Error(&api.Error{Status: 500, Type: "server_error", Message: ev.Err.Error()})
				}
				flush()
				return
			}
			reason := ev.FinishReason
			chunk["choices"] = []openai.ChatChunkChoice{{FinishReason: &reason}}
			_ = sse.Event(chunk)
			if usage {
				chunk["choices"], chunk["usage"] = []openai.ChatChunkChoice{}, usageOf(ev, n)
				_ = sse.Event(chunk)
			}
			_ = sse.Done()
			flush()
			return
		}
		n += ev.Tokens
		chunk["choices"] = []openai.ChatChunkChoice{{Delta: openai.ChatDelta{Content: ev.Text}}}
		if sse.Event(chunk) != nil {
			return // the client left: ctx cancels the request
		}
		flush()
	}
}
