package mocker

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/openai"
	"dataplane/dataplane/worker"
)

// startFleet runs a real-time fleet (fast) and its HTTP server on loopback until the test ends.
func startFleet(t *testing.T, engines int) (*Fleet, *httptest.Server) {
	t.Helper()
	fo := DefaultFleetOptions()
	fo.Engines = engines
	fo.Clock = Clock{Speedup: 20}
	f, err := NewFleet(fo)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = f.Run(ctx) }()
	srv := httptest.NewServer(NewServer(f, DefaultServerOptions()))
	t.Cleanup(func() { srv.Close(); cancel(); wg.Wait() })
	return f, srv
}

func collect(t *testing.T, ch <-chan worker.Event) (text string, tokens int, done worker.Event) {
	t.Helper()
	for ev := range ch {
		if ev.Done {
			done = ev
			continue
		}
		text += ev.Text
		tokens += ev.Tokens
	}
	return text, tokens, done
}

// The daemon's own HTTP engine client (dataplane/worker.HTTP) drives a mock engine like a
// vLLM: streamed tokens, usage with cached tokens on a repeated prompt.
func TestHTTPWithWorkerClient(t *testing.T) {
	_, srv := startFleet(t, 2)
	hw, err := worker.NewHTTP(worker.HTTPOptions{BaseURL: srv.URL + "/engines/1"})
	require.NoError(t, err)
	defer hw.Close()
	prompt := make([]int32, 100)
	for i := range prompt {
		prompt[i] = int32(i * 7)
	}
	req := &worker.Request{TokenIDs: prompt, Sampling: openai.Sampling{MaxTokens: 5}}
	ch, err := hw.Generate(context.Background(), req)
	require.NoError(t, err)
	text, n, done := collect(t, ch)
	require.NoError(t, done.Err)
	require.Equal(t, 5, n)
	require.Equal(t, 5, strings.Count(text, " t"))
	require.Equal(t, "length", done.FinishReason)
	require.Equal(t, 100, done.PromptTokens)
	require.Equal(t, 0, done.CachedTokens)

	ch, err = hw.Generate(context.Background(), req)
	require.NoError(t, err)
	_, _, done = collect(t, ch)
	require.Equal(t, 96, done.CachedTokens)
}

// In-process workers (what `dataplane serve --workers mock:N` gets) stream the same way, and
// cancelling the context aborts the generation.
func TestWorkerInProcess(t *testing.T) {
	f, _ := startFleet(t, 1)
	w := f.Workers()[0]
	require.Equal(t, "mock-0", w.Name())
	ch, err := w.Generate(context.Background(), &worker.Request{TokenIDs: []int32{1, 2, 3}, Sampling: openai.Sampling{MaxTokens: 3},
		Media: []worker.MediaSpan{{Start: 1, End: 3, ID: "img"}}})
	require.NoError(t, err)
	_, n, done := collect(t, ch)
	require.Equal(t, 3, n)
	require.NoError(t, done.Err)

	ctx, cancel := context.WithCancel(context.Background())
	ch, err = w.Generate(ctx, &worker.Request{TokenIDs: []int32{1, 2, 3}, Sampling: openai.Sampling{MaxTokens: 100000}})
	require.NoError(t, err)
	<-ch // the first token
	cancel()
	_, _, done = collect(t, ch)
	require.ErrorIs(t, done.Err, context.Canceled)
	require.Eventually(t, func() bool {
		active := -1
		_ = f.Inspect(context.Background(), 0, func(e *Engine) { active = e.KV().Active() })
		return active == 0
	}, 5*time.Second, 10*time.Millisecond, "the aborted request gave its blocks back")

	_, err = w.Generate(context.Background(), &worker.Request{TokenIDs: []int32{1}, Media: []worker.MediaSpan{{Start: 0, End: 5, ID: "x"}}})
	var bad *ErrBadRequest
	require.ErrorAs(t, err, &bad)
}

// An in-process worker never blocks its engine's loop: a reader that takes nothing until the
// generation ended gets every token, coalesced into at most the channel's events, and then the
// Done event (delivered by a goroutine, the channel having been full). An engine's refusal is
// the stream's only event.
func TestWorkerSlowReaderAndRefusal(t *testing.T) {
	f, _ := startFleet(t, 1)
	w := f.Workers()[0]
	const maxTokens = 40
	ch, err := w.Generate(context.Background(), &worker.Request{TokenIDs: []int32{1, 2, 3}, Sampling: openai.Sampling{MaxTokens: maxTokens}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		finished := int64(0)
		_ = f.Inspect(context.Background(), 0, func(e *Engine) { finished = e.Stats().Finished })
		return finished == 1
	}, 5*time.Second, time.Millisecond, "the engine finished while nobody read")
	events := 0
	var text string
	var n int
	var done worker.Event
	for ev := range ch {
		events++
		text, n = text+ev.Text, n+ev.Tokens
		done = ev
	}
	require.True(t, done.Done)
	require.NoError(t, done.Err)
	require.Equal(t, maxTokens, n)
	require.Len(t, strings.Fields(text), maxTokens, text)
	require.LessOrEqual(t, events, streamBuffer+2, "tokens coalesce while the channel is full")

	ch, err = w.Generate(context.Background(), &worker.Request{Sampling: openai.Sampling{MaxTokens: 2}}) // no prompt
	require.NoError(t, err)
	text, n, done = collect(t, ch)
	var bad *ErrBadRequest
	require.ErrorAs(t, done.Err, &bad)
	require.Contains(t, bad.Problem, "empty prompt")
	require.Zero(t, n)
	require.Empty(t, text)
}

// Non-streamed text completions, /v1/models, /engines and errors that say what was wrong.
func TestHTTPRoutes(t *testing.T) {
	_, srv := startFleet(t, 2)
	post := func(path, body string) (int, string) {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := post("/v1/completions", `{"model": "mock-1", "prompt": "the cat sat on the mat", "max_tokens": 4}`)
	require.Equal(t, 200, code, body)
	var c completionChunk
	require.NoError(t, json.Unmarshal([]byte(body), &c))
	require.Equal(t, "mock-1", c.Model)
	require.Equal(t, 4, c.Usage.CompletionTokens)
	require.Equal(t, 6, c.Usage.PromptTokens)
	require.Equal(t, "length", *c.Choices[0].FinishReason)

	code, body = post("/v1/completions", `{"prompt": [1,2,3], "max_tokens": 0}`)
	require.Equal(t, 400, code)
	require.Contains(t, body, "max_tokens")
	code, body = post("/v1/completions", `{"prompt": "", "max_tokens": 2}`)
	require.Equal(t, 400, code)
	require.Contains(t, body, "empty prompt")
	code, body = post("/v1/completions", `{"prompt": [1,2,3], "media": [{"start": 2, "end": 9, "id": "x"}]}`)
	require.Equal(t, 400, code)
	require.Contains(t, body, "media 0")
	code, _ = post("/engines/7/v1/completions", `{"prompt": [1]}`)
	require.Equal(t, 404, code)

	// vLLM's health route, which the daemon's prober asks (a mock that lacked it was taken out
	// of routing while it ran), for the fleet and per engine.
	for _, path := range []string{"/health", "/engines/1/health", "/healthz"} {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, path)
	}

	resp, err := http.Get(srv.URL + "/engines")
	require.NoError(t, err)
	var engines []map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&engines))
	resp.Body.Close()
	require.Len(t, engines, 2)
	require.Equal(t, "/engines/1", engines[1]["path"])
	resp, err = http.Get(srv.URL + "/engines/0/v1/models")
	require.NoError(t, err)
	var models openai.ModelList
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&models))
	resp.Body.Close()
	require.Equal(t, "mock-0", models.Data[0].ID)
}

// A mock engine tells its KV capacity the way vLLM does, read by the daemon's own reader.
func TestMetricsGiveKVCapacity(t *testing.T) {
	f, srv := startFleet(t, 2)
	got, err := worker.KVCapacity(context.Background(), http.DefaultClient, srv.URL+"/engines/1")
	require.NoError(t, err)
	require.EqualValues(t, f.engines[1].opts.Blocks, got)
}

// A mock engine honours max_tokens, seed (the same seed, the same tokens, whatever runs beside
// it) and the fields that cannot change what it draws; anything else is an
// *openai.RequestError naming the field, in process and over HTTP (a 400). Several requests
// may give the same id (the daemon forwards the client's X-Request-Id, which may repeat).
func TestWorkerHonoursOrRefuses(t *testing.T) {
	f, srv := startFleet(t, 1)
	w := f.Workers()[0]
	seed, other := int64(42), int64(43)
	yes, no := true, false
	gen := func(s openai.Sampling) (string, error) {
		t.Helper()
		ch, err := w.Generate(context.Background(), &worker.Request{ID: "same", TokenIDs: []int32{1, 2, 3}, Sampling: s})
		if err != nil {
			return "", err
		}
		text, _, done := collect(t, ch)
		require.NoError(t, done.Err)
		return text, nil
	}
	a, err := gen(openai.Sampling{MaxTokens: 6, Seed: &seed})
	require.NoError(t, err)
	b, err := gen(openai.Sampling{MaxTokens: 6, Seed: &seed, IgnoreEOS: true, MinTokens: 6, SkipSpecialTokens: &no, SpacesBetweenSpecialTokens: &yes})
	require.NoError(t, err)
	require.Equal(t, a, b, "the same seed draws the same tokens")
	c, err := gen(openai.Sampling{MaxTokens: 6, Seed: &other})
	require.NoError(t, err)
	require.NotEqual(t, a, c)
	one := 1.0
	_, err = gen(openai.Sampling{MaxTokens: 2, Temperature: &one, TopP: &one})
	require.NoError(t, err, "values that ask for nothing")

	temp, k := 0.2, 3
	for name, s := range map[string]openai.Sampling{
		"temperature":     {Temperature: &temp},
		"stop":            {Stop: []string{"\n"}},
		"logprobs":        {Logprobs: &k},
		"top_k":           {TopK: &k},
		"logit_bias":      {LogitBias: map[int32]float64{1: 5}},
		"response_format": {ResponseFormat: json.RawMessage(`{"type":"json_object"}`)},
		"min_tokens":      {MaxTokens: 2, MinTokens: 3},
	} {
		_, err := gen(s)
		var re *openai.RequestError
		require.ErrorAs(t, err, &re, name)
		require.Equal(t, name, re.Param)
		require.Nil(t, w.(worker.Checker).Check(&openai.Sampling{Seed: &seed}))
	}

	post := func(body, id string) (*http.Response, map[string]any) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(body))
		require.NoError(t, err)
		if id != "" {
			req.Header.Set("X-Request-Id", id)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp, out
	}
	resp, out := post(`{"prompt":"a b","max_tokens":2,"temperature":0.5}`, "")
	require.Equal(t, 400, resp.StatusCode)
	require.Equal(t, "temperature", out["error"].(map[string]any)["param"])
	resp, out = post(`{"prompt":"a b","max_tokens":2,"echo":true}`, "")
	require.Equal(t, 400, resp.StatusCode)
	require.Equal(t, "echo", out["error"].(map[string]any)["param"])
	resp, out = post(`{"prompt":"a b","max_tokens":2,"seed":5}`, "client-1")
	require.Equal(t, 200, resp.StatusCode, "%v", out)
	require.Equal(t, "client-1", resp.Header.Get("X-Request-Id"), "echoed as vLLM's --enable-request-id-headers does")
	require.Equal(t, "cmpl-client-1", out["id"])
}
