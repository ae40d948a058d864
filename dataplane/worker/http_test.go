package worker

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/openai"
	"dataplane/dataplane/sequence"
	"dataplane/native"
)

// fakeEngine answers /v1/completions like vLLM's API server, streaming the words of reply.
type fakeEngine struct {
	t     *testing.T
	reply []string
	got   chan completionBody
	fail  int // status to answer instead, if set
	hang  bool
}

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/completions" {
		http.NotFound(w, r)
		return
	}
	var body completionBody
	require.NoError(e.t, json.NewDecoder(r.Body).Decode(&body))
	e.got <- body
	if e.fail != 0 {
		http.Error(w, `{"error":{"message":"engine says no"}}`, e.fail)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i, word := range e.reply {
		if e.hang && i == 1 {
			<-r.Context().Done()
			return
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":%q,\"finish_reason\":null}]}\n\n", word)
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n")
	fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n")
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func drain(t *testing.T, ch <-chan Event) (text string, done Event) {
	t.Helper()
	for ev := range ch {
		if ev.Done {
			done = ev
			continue
		}
		text += ev.Text
	}
	return text, done
}

func TestHTTPWorkerPromptEmbeds(t *testing.T) {
	eng := &fakeEngine{t: t, reply: []string{"A", " cat", "."}, got: make(chan completionBody, 4)}
	srv := httptest.NewServer(eng)
	defer srv.Close()
	w, err := NewHTTP(HTTPOptions{BaseURL: srv.URL + "/", Model: "llava"})
	require.NoError(t, err)
	defer w.Close()

	embeds := native.Matrix{Data: make([]byte, 7*8*2), DType: native.BF16, Rows: 7, Cols: 8}
	temp := 0.5
	ch, err := w.Generate(context.Background(), &Request{TokenIDs: []int32{1, 2, 3, 4, 5, 6, 7}, Embeds: embeds,
		Sampling: openai.Sampling{MaxTokens: 3, Temperature: &temp, Stop: []string{"\n"}}, CacheSalt: "t1"})
	require.NoError(t, err)
	text, done := drain(t, ch)
	require.Equal(t, "A cat.", text)
	require.NoError(t, done.Err)
	require.Equal(t, "length", done.FinishReason)
	require.Equal(t, 7, done.PromptTokens)
	require.Equal(t, 4, done.CachedTokens)

	body := <-eng.got
	require.Nil(t, body.Prompt, "embeddings replace the prompt")
	require.Equal(t, "llava", body.Model)
	require.Equal(t, 3, body.MaxTokens)
	require.Equal(t, "t1", body.CacheSalt)
	raw, err := base64.StdEncoding.DecodeString(body.PromptEmbeds)
	require.NoError(t, err)
	zr, err := zip.NewReader(bytes.NewReader(raw), int64(len(raw)))
	require.NoError(t, err)
	names := map[string]uint64{}
	for _, f := range zr.File {
		names[f.Name] = f.UncompressedSize64
	}
	require.Equal(t, uint64(7*8*2), names["archive/data/0"], "the merged tensor's bytes")
	require.Contains(t, names, "archive/data.pkl")

	// Text-only: token ids.
	ch, err = w.Generate(context.Background(), &Request{TokenIDs: []int32{5, 6}, Sampling: openai.Sampling{MaxTokens: 2}})
	require.NoError(t, err)
	drain(t, ch)
	body = <-eng.got
	require.Equal(t, []any{float64(5), float64(6)}, body.Prompt)
}

func TestHTTPWorkerFailures(t *testing.T) {
	eng := &fakeEngine{t: t, got: make(chan completionBody, 4), fail: http.StatusServiceUnavailable}
	srv := httptest.NewServer(eng)
	defer srv.Close()
	w, err := NewHTTP(HTTPOptions{BaseURL: srv.URL})
	require.NoError(t, err)
	_, err = w.Generate(context.Background(), &Request{Prompt: "hi"})
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "engine says no")
	eng.fail = http.StatusBadRequest
	_, err = w.Generate(context.Background(), &Request{Prompt: "hi"})
	require.NotErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "400 Bad Request")

	// A client that goes away mid-stream ends the generation and the goroutine.
	eng.fail, eng.hang, eng.reply = 0, true, []string{"a", "b", "c"}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := w.Generate(ctx, &Request{Prompt: "hi"})
	require.NoError(t, err)
	require.Equal(t, "a", (<-ch).Text)
	cancel()
	select {
	case ev, ok := <-ch:
		if ok {
			require.True(t, ev.Done)
			require.ErrorIs(t, ev.Err, context.Canceled)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("generation did not end after cancel")
	}

	down, err := NewHTTP(HTTPOptions{BaseURL: "http://127.0.0.1:1"})
	require.NoError(t, err)
	_, err = down.Generate(context.Background(), &Request{Prompt: "hi"})
	require.ErrorIs(t, err, ErrUnavailable)
	_, err = NewHTTP(HTTPOptions{BaseURL: "ftp://x"})
	require.Error(t, err)
}

// chatEngine answers /v1/chat/completions like vLLM's API server (delta chunks) and hands the
// decoded body over.
type chatEngine struct {
	t   *testing.T
	got chan map[string]any
}

func (e *chatEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	var body map[string]any
	require.NoError(e.t, json.NewDecoder(r.Body).Decode(&body))
	e.got <- body
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	for _, word := range []string{"A", " dog"} {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", word)
	}
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n")
	fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n")
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// In the EC and tokens hand-offs a request with media goes to the chat endpoint: the client's
// messages, each media part that is still in the request with its identifier as the uuid (so
// vLLM names the item by it: the EC file, its KV events), the sampling as for completions;
// the chat stream's deltas come back as text. Without media it stays a token-id completion.
func TestHTTPWorkerChatHandoff(t *testing.T) {
	eng := &chatEngine{t: t, got: make(chan map[string]any, 4)}
	srv := httptest.NewServer(eng)
	defer srv.Close()
	for _, h := range []Handoff{HandoffEC, HandoffTokens} {
		w, err := NewHTTP(HTTPOptions{BaseURL: srv.URL, Model: "qwen", Handoff: h})
		require.NoError(t, err)
		img := &openai.Media{Modality: sequence.Image, URL: "data:image/png;base64,AAAA", Path: "messages[1].content[1]"}
		dropped := &openai.Media{Modality: sequence.Image, URL: "https://x/y.png", Path: "messages[1].content[2]"}
		audio := &openai.Media{Modality: sequence.Audio, Data: []byte{1, 2, 3}, Format: "wav", Path: "messages[1].content[3]"}
		known := &openai.Media{Modality: sequence.Video, UUID: "clip-7", Path: "messages[1].content[4]"}
		msgs := []openai.Message{
			{Role: "system", Parts: []openai.Part{{IsText: true, Text: "Be brief."}}},
			{Role: "user", Parts: []openai.Part{{IsText: true, Text: "What is this?"}, {Media: img}, {Media: dropped}, {Media: audio}, {Media: known}}},
			{Role: "assistant"},
		}
		temp := 0.2
		ch, err := w.Generate(context.Background(), &Request{TokenIDs: []int32{1, 2, 3}, Messages: msgs, CacheSalt: "t1",
			Media: []MediaSpan{{Start: 1, End: 2, ID: "name-img", Src: img}, {Start: 2, End: 3, ID: "name-audio", Src: audio},
				{Start: 3, End: 3, ID: "name-video", Src: known}},
			Sampling: openai.Sampling{MaxTokens: 2, Temperature: &temp}})
		require.NoError(t, err, h)
		text, done := drain(t, ch)
		require.Equal(t, "A dog", text)
		require.NoError(t, done.Err)
		require.Equal(t, "stop", done.FinishReason)
		require.Equal(t, 32, done.CachedTokens)

		body := <-eng.got
		require.Equal(t, "qwen", body["model"])
		require.Equal(t, float64(2), body["max_tokens"])
		require.Equal(t, 0.2, body["temperature"])
		require.Equal(t, "t1", body["cache_salt"])
		require.Equal(t, true, body["stream"])
		require.NotContains(t, body, "prompt")
		require.NotContains(t, body, "prompt_embeds")
		want := `[{"content":"Be brief.","role":"system"},{"content":[{"text":"What is this?","type":"text"},` +
			`{"image_url":{"url":"data:image/png;base64,AAAA"},"type":"image_url","uuid":"name-img"},` +
			`{"input_audio":{"data":"AQID","format":"wav"},"type":"input_audio","uuid":"name-audio"},` +
			`{"type":"video_url","uuid":"name-video","video_url":null}],"role":"user"},{"content":null,"role":"assistant"}]`
		got, err := json.Marshal(body["messages"])
		require.NoError(t, err)
		require.JSONEq(t, want, string(got))

		// A video given as pictures has no chat form vLLM takes.
		frames := &openai.Media{Modality: sequence.Video, Frames: []string{"data:,"}, Path: "messages[0].content[0]"}
		_, err = w.Generate(context.Background(), &Request{Messages: []openai.Message{{Role: "user", Parts: []openai.Part{{Media: frames}}}},
			Media: []MediaSpan{{ID: "v", Src: frames}}})
		require.ErrorContains(t, err, "pictures")
	}
	_, err := ParseHandoff("kv")
	require.Error(t, err)
	for _, h := range []Handoff{HandoffEmbeds, HandoffEC, HandoffTokens} {
		got, err := ParseHandoff(h.String())
		require.NoError(t, err)
		require.Equal(t, h, got)
	}
}
