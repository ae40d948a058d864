package worker

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
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

// The sampling and output fields reach the engine with vLLM's names, the request id as
// X-Request-Id; the engine's logprobs come back per chunk; its 400 is the client's error,
// with its message and param.
func TestHTTPWorkerSamplingLogprobsAndRefusals(t *testing.T) {
	type seen struct {
		body map[string]any
		id   string
	}
	got := make(chan seen, 4)
	var answer func(w http.ResponseWriter)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		require.NoError(t, json.NewDecoder(r.Body).Decode(&body))
		got <- seen{body, r.Header.Get("X-Request-Id")}
		answer(w)
	}))
	defer srv.Close()
	w, err := NewHTTP(HTTPOptions{BaseURL: srv.URL, Model: "m"})
	require.NoError(t, err)
	defer w.Close()

	answer = func(w http.ResponseWriter) {
		fmt.Fprint(w, `data: {"choices":[{"index":0,"text":"a b","logprobs":{"text_offset":[0,1],"token_logprobs":[-0.5,null],"tokens":["a"," b"],"top_logprobs":[{"a":-0.5,"z":-1},null]},"finish_reason":null}]}`+"\n\n")
		fmt.Fprint(w, `data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	}
	f := func(v float64) *float64 { return &v }
	i := func(v int) *int { return &v }
	seed, no := int64(11), false
	s := openai.Sampling{MaxTokens: 8, Temperature: f(0.3), TopP: f(0.8), TopK: i(20), MinP: f(0.1), Seed: &seed,
		Stop: []string{"\n"}, StopTokenIDs: []int32{2}, IncludeStopStrInOutput: true, PresencePenalty: f(0.2),
		FrequencyPenalty: f(-0.2), RepetitionPenalty: f(1.05), LogitBias: map[int32]float64{42: -100},
		AllowedTokenIDs: []int32{1, 42}, BadWords: []string{"no"}, MinTokens: 2, IgnoreEOS: true,
		SkipSpecialTokens: &no, SpacesBetweenSpecialTokens: &no, Logprobs: i(1),
		ResponseFormat: json.RawMessage(`{"type":"json_object"}`), StructuredOutputs: json.RawMessage(`{"choice":["a","b"]}`)}
	ch, err := w.Generate(context.Background(), &Request{ID: "req-7", TokenIDs: []int32{1, 2}, Sampling: s, CacheSalt: "salt"})
	require.NoError(t, err)
	var events []Event
	for ev := range ch {
		events = append(events, ev)
	}
	require.Len(t, events, 2)
	require.Equal(t, "a b", events[0].Text)
	require.Equal(t, 2, events[0].Tokens, "tokens counted from the logprobs")
	lp := events[0].Logprobs
	require.NotNil(t, lp)
	require.Equal(t, []string{"a", " b"}, lp.Tokens)
	require.Equal(t, openai.TopLogprobs{{Token: "a", Logprob: -0.5}, {Token: "z", Logprob: -1}}, lp.TopLogprobs[0])
	require.Nil(t, lp.TokenLogprobs[1])
	require.Equal(t, "stop", events[1].FinishReason)
	require.NoError(t, events[1].Err)

	sent := <-got
	require.Equal(t, "req-7", sent.id)
	want := `{"model":"m","prompt":[1,2],"stream":true,"stream_options":{"include_usage":true},"cache_salt":"salt",
		"max_tokens":8,"temperature":0.3,"top_p":0.8,"top_k":20,"min_p":0.1,"seed":11,"stop":["\n"],"stop_token_ids":[2],
		"include_stop_str_in_output":true,"presence_penalty":0.2,"frequency_penalty":-0.2,"repetition_penalty":1.05,
		"logit_bias":{"42":-100},"allowed_token_ids":[1,42],"bad_words":["no"],"min_tokens":2,"ignore_eos":true,
		"skip_special_tokens":false,"spaces_between_special_tokens":false,"logprobs":1,
		"response_format":{"type":"json_object"},"structured_outputs":{"choice":["a","b"]}}`
	b, _ := json.Marshal(sent.body)
	require.JSONEq(t, want, string(b))

	// Nothing given: nothing sent but max_tokens (the engine's defaults apply), no header.
	ch, err = w.Generate(context.Background(), &Request{TokenIDs: []int32{1}, Sampling: openai.Sampling{MaxTokens: 1}})
	require.NoError(t, err)
	drain(t, ch)
	sent = <-got
	require.Empty(t, sent.id)
	b, _ = json.Marshal(sent.body)
	require.JSONEq(t, `{"model":"m","prompt":[1],"stream":true,"stream_options":{"include_usage":true},"max_tokens":1}`, string(b))

	// vLLM's 400 (both of its layouts): the client's error, naming the engine's param.
	for _, body := range []string{
		`{"error":{"message":"logprobs: must be <= 20","type":"BadRequestError","param":"logprobs","code":400}}`,
		`{"object":"error","message":"logprobs: must be <= 20","type":"BadRequestError","param":"logprobs","code":400}`,
	} {
		answer = func(w http.ResponseWriter) { http.Error(w, body, http.StatusBadRequest) }
		_, err = w.Generate(context.Background(), &Request{Sampling: s})
		<-got
		var re *openai.RequestError
		require.True(t, errors.As(err, &re), "%v", err)
		require.Equal(t, "logprobs", re.Param)
		require.Equal(t, "the LLM worker refused the request: logprobs: must be <= 20", re.Message)
		require.Equal(t, "refused the request: logprobs: must be <= 20", Public(err))
		require.NotErrorIs(t, err, ErrUnavailable)
	}
	answer = func(w http.ResponseWriter) { http.Error(w, "not json", http.StatusBadRequest) }
	_, err = w.Generate(context.Background(), &Request{Sampling: s})
	<-got
	require.Equal(t, "answered 400 Bad Request", Public(err), "a body that says nothing: the status")

	// vLLM's error event after the stream began.
	answer = func(w http.ResponseWriter) {
		fmt.Fprint(w, "data: {\"error\":{\"message\":\"Internal server error\",\"type\":\"InternalServerError\",\"code\":500}}\n\ndata: [DONE]\n\n")
	}
	ch, err = w.Generate(context.Background(), &Request{Sampling: s})
	require.NoError(t, err)
	_, done := drain(t, ch)
	<-got
	require.Equal(t, "failed mid-stream", Public(done.Err))
	require.ErrorContains(t, done.Err, "Internal server error")

	// Logprobs whose lists disagree are a malformed stream.
	answer = func(w http.ResponseWriter) {
		fmt.Fprint(w, `data: {"choices":[{"index":0,"text":"a","logprobs":{"text_offset":[0],"token_logprobs":[],"tokens":["a"],"top_logprobs":[null]}}]}`+"\n\n")
	}
	ch, err = w.Generate(context.Background(), &Request{Sampling: s})
	require.NoError(t, err)
	_, done = drain(t, ch)
	<-got
	require.Equal(t, "sent a malformed stream", Public(done.Err))
}

// Any stream an engine may send: events and one last Done event, never a panic.
func FuzzForward(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\",\"logprobs\":{\"text_offset\":[0],\"token_logprobs\":[-1],\"tokens\":[\"a\"],\"top_logprobs\":[{\"a\":-1}]}}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":1}}}\n\ndata: [DONE]\n"))
	f.Add([]byte("data: {\"error\":{\"message\":\"x\"}}\n\n"))
	f.Add([]byte(": comment\nevent: x\ndata: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"stop\"}]}\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		out := make(chan Event, len(stream)+1) // at most one event a byte: forward never blocks
		done := forward(context.Background(), bytes.NewReader(stream), out, nil)
		close(out)
		if !done.Done {
			t.Fatal("the last event is not Done")
		}
		for ev := range out {
			if ev.Done || (ev.Logprobs != nil && ev.Logprobs.Check() != nil) {
				t.Fatalf("bad event %+v", ev)
			}
		}
	})
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

// A chat chunk's logprobs (what vLLM's chat endpoint streams when a hand-off sends the chat)
// come out in the completions layout Event carries: the sampled token first among its
// alternatives, as /v1/completions gives them.
func TestForwardChatLogprobs(t *testing.T) {
	stream := []byte(`data: {"choices":[{"index":0,"delta":{"content":"Hi there"},"logprobs":{"content":[` +
		`{"token":"Hi","logprob":-0.5,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.5},{"token":"Hello","logprob":-1.25}]},` +
		`{"token":" there","logprob":-2,"top_logprobs":[{"token":" you","logprob":-0.75}]}]},"finish_reason":null}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"length"}]}` + "\n\ndata: [DONE]\n\n")
	out := make(chan Event, 8)
	done := forward(context.Background(), bytes.NewReader(stream), out, nil)
	require.NoError(t, done.Err)
	require.Equal(t, "length", done.FinishReason)
	close(out)
	var evs []Event
	for ev := range out {
		evs = append(evs, ev)
	}
	require.Len(t, evs, 1)
	ev := evs[0]
	require.Equal(t, "Hi there", ev.Text)
	require.Equal(t, 2, ev.Tokens)
	require.NoError(t, ev.Logprobs.Check())
	require.Equal(t, []string{"Hi", " there"}, ev.Logprobs.Tokens)
	require.Equal(t, -2.0, *ev.Logprobs.TokenLogprobs[1])
	require.Equal(t, openai.TopLogprobs{{Token: "Hi", Logprob: -0.5}, {Token: "Hello", Logprob: -1.25}}, ev.Logprobs.TopLogprobs[0])
	require.Equal(t, openai.TopLogprobs{{Token: " there", Logprob: -2}, {Token: " you", Logprob: -0.75}}, ev.Logprobs.TopLogprobs[1])
}
