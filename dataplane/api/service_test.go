package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane"
	"dataplane/dataplane/encoder"
	"dataplane/dataplane/encoderpool"
	"dataplane/dataplane/worker"
	"dataplane/native"
	"dataplane/native/fixtures"
)

// echoWorker is an LLM engine stand-in for this package's tests (the engine mocker lives in
// bench/ and drives the daemon end to end in cmd/dataplane's tests): it answers "tok0 tok1 ..."
// and keeps every request it got.
type echoWorker struct {
	name   string
	delay  time.Duration
	cached int // prompt tokens it says it found in its cache
	mu     sync.Mutex
	got    []*worker.Request
	// embeds keeps a copy of each request's merged sequence (the original is released after
	// the first token).
	embeds [][]byte
}

func (w *echoWorker) Name() string { return w.name }
func (w *echoWorker) Close() error { return nil }

func (w *echoWorker) Generate(ctx context.Context, r *worker.Request) (<-chan worker.Event, error) {
	w.mu.Lock()
	w.got = append(w.got, r)
	w.embeds = append(w.embeds, bytes.Clone(r.Embeds.Data))
	cached := w.cached
	w.mu.Unlock()
	ch := make(chan worker.Event, r.Sampling.MaxTokens+1)
	go func() {
		defer close(ch)
		for i := range r.Sampling.MaxTokens {
			select {
			case <-time.After(w.delay):
			case <-ctx.Done():
				ch <- worker.Event{Done: true, Err: ctx.Err()}
				return
			}
			ch <- worker.Event{Text: fmt.Sprintf("tok%d ", i), Tokens: 1}
		}
		ch <- worker.Event{Done: true, FinishReason: "length", PromptTokens: len(r.TokenIDs), CachedTokens: cached}
	}()
	return ch, nil
}

func (w *echoWorker) requests() []*worker.Request {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*worker.Request(nil), w.got...)
}

type testDaemon struct {
	svc  *dataplane.Service
	w    *echoWorker
	base string
	wrap atomic.Pointer[func(encoderpool.Model) encoderpool.Model] // see wrapEncoders
}

// wrapEncoders makes every later encode job run on wrap(model): fault injection.
func (d *testDaemon) wrapEncoders(wrap func(encoderpool.Model) encoderpool.Model) {
	d.wrap.Store(&wrap)
}

func startDaemon(t testing.TB, mutate func(*dataplane.ServiceOptions)) *testDaemon {
	t.Helper()
	return startDaemonWith(t, mutate, nil)
}

// startDaemonWith is startDaemon with the HTTP server's options changed too (pprof, limits).
func startDaemonWith(t testing.TB, mutate func(*dataplane.ServiceOptions), mutateServer func(*Options)) *testDaemon {
	t.Helper()
	d := &testDaemon{w: &echoWorker{name: "echo-0"}}
	opts := dataplane.DefaultServiceOptions()
	opts.Features.Host.Capacity = 64 << 20
	opts.Log = slog.New(slog.DiscardHandler)
	opts.WrapEncoder = func(m encoderpool.Model) encoderpool.Model {
		if wrap := d.wrap.Load(); wrap != nil {
			return (*wrap)(m)
		}
		return m
	}
	if mutate != nil {
		mutate(&opts)
	}
	svc, err := dataplane.NewService(opts)
	require.NoError(t, err)
	d.svc = svc
	_, err = svc.AddWorker(d.w)
	require.NoError(t, err)
	srvOpts := DefaultOptions()
	if mutateServer != nil {
		mutateServer(&srvOpts)
	}
	d.base = serveService(t, svc, srvOpts)
	return d
}

// serveService serves svc's API on a loopback port until the test ends (then drains and
// closes it, checking both went cleanly) and returns its base URL.
func serveService(t testing.TB, svc *dataplane.Service, opts Options) string {
	t.Helper()
	srv := NewServer(opts, slog.New(slog.DiscardHandler))
	srv.Attach(svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		require.NoError(t, svc.Close(cctx))
	})
	return "http://" + ln.Addr().String()
}

func (d *testDaemon) post(t *testing.T, path string, body any) (int, map[string]any) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(d.base+path, "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	return resp.StatusCode, out
}

// requireNoFeatureBytes checks, from /metrics as an operator would, that the feature store holds
// nothing: no bytes used, reserved or cached.
func (d *testDaemon) requireNoFeatureBytes(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		_, metrics := get(t, d.base+"/metrics")
		for _, use := range []string{"used", "reserved", "idle"} {
			if !strings.Contains(metrics, `dataplane_features_pool_bytes{pool="host",use="`+use+`"} 0`+"\n") {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "the metrics show feature bytes still held")
}

func dataURL(t *testing.T, mime, fixture string) string {
	b, err := os.ReadFile(fixtures.Path(t, fixture))
	require.NoError(t, err)
	return "data:" + mime + ";base64," + base64.StdEncoding.EncodeToString(b)
}

func TestChatWithImageAndAudio(t *testing.T) {
	d := startDaemon(t, nil)
	wav, err := os.ReadFile(fixtures.Path(t, "audio_7s3.wav"))
	require.NoError(t, err)
	msg := map[string]any{
		"messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "What is in this picture and this sound?"},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(t, "image/png", "image_200x150.png")}},
			map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": base64.StdEncoding.EncodeToString(wav), "format": "wav"}},
		}}},
		"max_tokens": 3,
	}
	code, out := d.post(t, "/v1/chat/completions", msg)
	require.Equal(t, 200, code, "%v", out)
	choice := out["choices"].([]any)[0].(map[string]any)
	require.Equal(t, "tok0 tok1 tok2 ", choice["message"].(map[string]any)["content"])
	require.Equal(t, "length", choice["finish_reason"])
	usage := out["usage"].(map[string]any)
	require.Equal(t, float64(3), usage["completion_tokens"], "tokens, not bytes of text")

	reqs := d.w.requests()
	require.Len(t, reqs, 1)
	r := reqs[0]
	require.Len(t, r.Media, 2)
	require.Equal(t, 256, r.Media[0].End-r.Media[0].Start, "clip-224 without CLS")
	require.Equal(t, 1500, r.Media[1].End-r.Media[1].Start, "one 30 s Whisper window")
	require.Equal(t, float64(len(r.TokenIDs)), usage["prompt_tokens"])
	require.Equal(t, len(r.TokenIDs), r.Embeds.Rows, "the merged sequence covers the prompt")
	require.Equal(t, d.svc.Models().Hidden, r.Embeds.Cols)

	// The same request again: both items come from the reuse cache (the default policy keeps
	// nothing, so use keep).
	msg["cache_policy"] = "keep:1m"
	code, _ = d.post(t, "/v1/chat/completions", msg)
	require.Equal(t, 200, code)
	code, _ = d.post(t, "/v1/chat/completions", msg)
	require.Equal(t, 200, code)
	_, metrics := get(t, d.base+"/metrics")
	require.Contains(t, metrics, `dataplane_media_items_total{cache="hit",modality="image"} 1`)
	require.Contains(t, metrics, `dataplane_media_items_total{cache="hit",modality="audio"} 1`)
	require.Contains(t, metrics, `dataplane_encode_batch_items_sum{modality="image"} 2`, "the hit skipped the encoder (one image in each of the first two requests)")
	require.Contains(t, metrics, `dataplane_encode_batch_items_sum{modality="audio"} 2`)
	reqs = d.w.requests()
	require.Equal(t, d.w.embeds[1], d.w.embeds[2], "a cache hit merges the same features")
}

func TestTextOnlyAndStreaming(t *testing.T) {
	d := startDaemon(t, nil)
	code, out := d.post(t, "/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 2})
	require.Equal(t, 200, code, "%v", out)
	require.Equal(t, "tok0 tok1 ", out["choices"].([]any)[0].(map[string]any)["text"])
	require.Zero(t, d.w.requests()[0].Embeds.Rows, "text-only: no merge")

	raw, _ := json.Marshal(map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}},
		"stream": true, "stream_options": map[string]any{"include_usage": true}, "max_tokens": 4})
	resp, err := http.Post(d.base+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var text strings.Builder
	var events, doneSeen int
	var lastUsage map[string]any
	created := map[float64]bool{} // one value for every chunk, the request's arrival (as vLLM's and OpenAI's)
	before := time.Now().Unix()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			doneSeen++
			continue
		}
		events++
		var c map[string]any
		require.NoError(t, json.Unmarshal([]byte(data), &c))
		require.Equal(t, "chat.completion.chunk", c["object"])
		created[c["created"].(float64)] = true
		if u, ok := c["usage"].(map[string]any); ok {
			lastUsage = u
		}
		for _, ch := range c["choices"].([]any) {
			if content, ok := ch.(map[string]any)["delta"].(map[string]any)["content"].(string); ok {
				text.WriteString(content)
			}
		}
	}
	require.Equal(t, 1, doneSeen)
	require.Equal(t, "tok0 tok1 tok2 tok3 ", text.String())
	require.Equal(t, float64(4), lastUsage["completion_tokens"])
	require.GreaterOrEqual(t, events, 6) // role, 4 tokens, finish, usage
	require.Len(t, created, 1, "created differs between chunks: %v", created)
	for c := range created {
		require.InDelta(t, float64(before), c, 1)
	}

	// Completions stream their usage too when asked, with what the engine had cached.
	d.w.mu.Lock()
	d.w.cached = 3
	d.w.mu.Unlock()
	raw, _ = json.Marshal(map[string]any{"prompt": "Once upon a time", "max_tokens": 2, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	resp2, err := http.Post(d.base+"/v1/completions", "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp2.Body.Close()
	body, _ := io.ReadAll(resp2.Body)
	require.Contains(t, string(body), `"usage":{"prompt_tokens":`)
	require.Contains(t, string(body), `"completion_tokens":2,`)
	require.Contains(t, string(body), `"prompt_tokens_details":{"cached_tokens":3}`)
}

// Bad requests are 4xx naming the problem; the daemon stays up and holds no feature bytes.
func TestBadRequests(t *testing.T) {
	d := startDaemon(t, func(o *dataplane.ServiceOptions) { o.Limits.MaxMediaItems = 2 })
	user := func(parts ...any) map[string]any {
		return map[string]any{"messages": []any{map[string]any{"role": "user", "content": parts}}}
	}
	img := func(url string) any {
		return map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}
	}
	f := func(path string, body any, status int, param, msg string) {
		t.Helper()
		code, out := d.post(t, path, body)
		require.Equal(t, status, code, "%v", out)
		e := out["error"].(map[string]any)
		require.Contains(t, e["message"], msg)
		if param != "" {
			require.Equal(t, param, e["param"])
		}
	}
	f("/v1/chat/completions", user(img("data:image/png;base64,@@@")), 400, "messages[0].content[0]", "base64")
	f("/v1/chat/completions", user(img("data:image/png;base64,"+base64.StdEncoding.EncodeToString([]byte("not a png")))), 400,
		"messages[0].content[0]", "unsupported image format")
	f("/v1/chat/completions", user(img("http://169.254.169.254/latest/meta-data")), 400, "messages[0].content[0]", "http(s):// URLs are disabled")
	f("/v1/chat/completions", user(img("file:///etc/passwd")), 400, "messages[0].content[0]", "file:// URLs are disabled")
	f("/v1/chat/completions", user(map[string]any{"type": "image_url", "uuid": "never-seen"}), 400, "messages[0].content[0]", `uuid "never-seen"`)
	// A uuid longer than an item id may be: 400 before the picture is decoded (it was a 500 from
	// the feature store, after the daemon had remembered it).
	f("/v1/chat/completions", user(map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(t, "image/png", "image_200x150.png")},
		"uuid": strings.Repeat("u", 4<<20)}), 400, "messages[0].content[0].uuid", "4194304 bytes, at most 1024")
	f("/v1/chat/completions", user(img("data:,a"), img("data:,b"), img("data:,c")), 400, "messages[0].content[2]", "more than 2 media items")
	f("/v1/chat/completions", map[string]any{"model": "gpt-9", "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 404, "model", `"gpt-9"`)
	f("/v1/completions", map[string]any{"prompt": []int{1, 99999999}}, 400, "prompt[1]", "outside")
	f("/v1/pretokenized", map[string]any{"token_ids": []int{1, int(d.svc.Tokenizer().Placeholders().Image), 2}}, 400, "", "placeholder without a media item")
	f("/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}}, "cache_policy": "forever"}, 400, "cache_policy", `"forever"`)

	resp, err := http.Get(d.base + "/v1/chat/completions")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 405, resp.StatusCode)

	// Malformed JSON, a body over the limit, and media of a kind no decoder reads.
	resp, err = http.Post(d.base+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages": [`))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 400, resp.StatusCode)
	require.Contains(t, string(b), "JSON")
	f("/v1/chat/completions", user(img("data:application/pdf;base64,"+base64.StdEncoding.EncodeToString([]byte("%PDF-1.4")))), 400,
		"messages[0].content[0]", "want JPEG or PNG")
	f("/v1/chat/completions", user(map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": base64.StdEncoding.EncodeToString([]byte("RIFFxxxx")), "format": "wav"}}),
		400, "messages[0].content[0]", "audio: decode")

	d.requireNoFeatureBytes(t)
	code, _ := get(t, d.base+"/readyz")
	require.Equal(t, 200, code)
}

// A body over the limit is 413; with http(s) fetching on, a URL to a private or loopback
// address is refused before any connection is made.
func TestBadRequestsBodyLimitAndPrivateURL(t *testing.T) {
	d := startDaemon(t, func(o *dataplane.ServiceOptions) { o.Fetch.HTTP = true })
	// A raw connection: the server answers once it has read the headers.
	conn, err := net.Dial("tcp", strings.TrimPrefix(d.base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", 65<<20)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 413, resp.StatusCode)
	require.Contains(t, string(b), "max-body-bytes")
	for _, url := range []string{"http://127.0.0.1:1/cat.png", "http://[::1]:1/cat.png", "http://localhost:1/cat.png"} {
		code, out := d.post(t, "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}}}}})
		require.Equal(t, 403, code, "%s: %v", url, out)
		e := out["error"].(map[string]any)
		require.Equal(t, "messages[0].content[0]", e["param"], url)
		require.Contains(t, e["message"], "address not allowed", url)
	}
	d.requireNoFeatureBytes(t)
}

// A client that leaves while its media waits to be encoded: the request is cancelled and every
// byte it held is released.
func TestDisconnectMidEncode(t *testing.T) {
	d := startDaemon(t, func(o *dataplane.ServiceOptions) { o.Pool.MaxWait = 2 * time.Second; o.Pool.MaxBatch = 64 })
	raw, _ := json.Marshal(map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(t, "image/png", "image_200x150.png")}}}}}})
	conn, err := net.Dial("tcp", strings.TrimPrefix(d.base, "http://"))
	require.NoError(t, err)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(raw), raw)
	require.Eventually(t, func() bool { st := d.svc.FeatureStats(); return st.Host.Reserved > 0 }, 5*time.Second, 5*time.Millisecond,
		"the image's features are reserved while it waits for the encoder")
	conn.Close()
	d.requireNoFeatureBytes(t) // every byte released after the disconnect
	_, metrics := get(t, d.base+"/metrics")
	require.Contains(t, metrics, `dataplane_requests_total{endpoint="chat",outcome="cancelled"} 1`)
	require.Empty(t, d.w.requests(), "the worker never saw it")
}

// A video given as pictures, and many clients at once.
func TestVideoAsPicturesAndConcurrency(t *testing.T) {
	d := startDaemon(t, nil)
	png := dataURL(t, "image/png", "image_200x150.png")
	jpg := dataURL(t, "image/jpeg", "image_200x150.jpg")
	code, out := d.post(t, "/v1/chat/completions", map[string]any{"max_tokens": 1, "messages": []any{map[string]any{"role": "user",
		"content": []any{map[string]any{"type": "video", "video": []string{png, jpg, png, jpg}}, map[string]any{"type": "text", "text": "what happens?"}}}}})
	require.Equal(t, 200, code, "%v", out)
	r := d.w.requests()[0]
	require.Len(t, r.Media, 1)
	frames := (r.Media[0].End - r.Media[0].Start) / 256
	require.GreaterOrEqual(t, frames, 2, "a video of several frames, 256 tokens each")
	require.Zero(t, (r.Media[0].End-r.Media[0].Start)%256)

	// 200 clients, half with the same picture: every request answered, no bytes left held.
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			content := []any{map[string]any{"type": "text", "text": fmt.Sprintf("question %d", i)}}
			if i%2 == 0 {
				content = append(content, map[string]any{"type": "image_url", "image_url": map[string]any{"url": png}})
			}
			raw, _ := json.Marshal(map[string]any{"max_tokens": 2, "messages": []any{map[string]any{"role": "user", "content": content}}})
			resp, err := http.Post(d.base+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			io.Copy(io.Discard, resp.Body) //nolint:errcheck
			if resp.StatusCode != 200 {
				errs <- fmt.Errorf("status %d", resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.Eventually(t, func() bool { st := d.svc.FeatureStats(); return st.Host.Used+st.Host.Reserved == 0 },
		5*time.Second, 10*time.Millisecond, "every byte released")
	_, metrics := get(t, d.base+"/metrics")
	require.Contains(t, metrics, `dataplane_requests_total{endpoint="chat",outcome="ok"} 201`)
}

// oomModel fails as an allocation would: every batch of more than maxFrames inputs, and every
// batch at all until failFrames frames have been tried (the video at full size: its batch, then
// the pool's item-by-item rerun of that batch). The pool's one worker calls it in turn.
type oomModel struct {
	encoderpool.Model
	maxFrames  int
	failFrames int32
	seen       *atomic.Int32
}

func (m oomModel) Run(inputs []encoder.Input, outs []native.Matrix) error {
	if m.seen.Add(int32(len(inputs))) <= m.failFrames || len(inputs) > m.maxFrames {
		return fmt.Errorf("scratch for %d frames: %w", len(inputs), native.ErrNoMem)
	}
	return m.Model.Run(inputs, outs)
}

// A video whose encoding runs out of memory is encoded again with half its frames.
func TestVideoRetriedSmallerOnNoMemory(t *testing.T) {
	d := startDaemon(t, func(o *dataplane.ServiceOptions) { o.Pool.MaxBatch = 64; o.Pool.MaxWait = 20 * time.Millisecond })
	// Eight frames fail in their batch, then one by one; the retry's four fit.
	seen := &atomic.Int32{}
	d.wrapEncoders(func(m encoderpool.Model) encoderpool.Model {
		return oomModel{Model: m, maxFrames: 4, failFrames: 2 * 8, seen: seen}
	})
	png := dataURL(t, "image/png", "image_200x150.png")
	jpg := dataURL(t, "image/jpeg", "image_200x150.jpg")
	pictures := []string{png, jpg, png, jpg, png, jpg, png, jpg}
	code, out := d.post(t, "/v1/chat/completions", map[string]any{"max_tokens": 1, "messages": []any{map[string]any{"role": "user",
		"content": []any{map[string]any{"type": "video", "video": pictures}}}}})
	require.Equal(t, 200, code, "%v", out)
	r := d.w.requests()[0]
	require.Equal(t, 4*256, r.Media[0].End-r.Media[0].Start, "half the frames")
	require.EqualValues(t, 2*8+4, seen.Load(), "eight frames tried twice, then four")
}

// failModel fails every batch.
type failModel struct{ encoderpool.Model }

func (failModel) Run([]encoder.Input, []native.Matrix) error { return errors.New("encoder fault") }

// An item that fails to encode fails its request with a 500 naming it, unless the request
// opted into text-only: then the item leaves the prompt and the rest goes on.
func TestEncodeFailureAndTextFallback(t *testing.T) {
	d := startDaemon(t, nil)
	d.wrapEncoders(func(m encoderpool.Model) encoderpool.Model { return failModel{m} })
	body := map[string]any{"max_tokens": 1, "messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": "describe"},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(t, "image/png", "image_200x150.png")}}}}}}
	code, out := d.post(t, "/v1/chat/completions", body)
	require.Equal(t, 500, code)
	e := out["error"].(map[string]any)
	require.Equal(t, "messages[0].content[1]", e["param"])
	require.Contains(t, e["message"], "encoder fault")

	body["text_fallback"] = true
	code, out = d.post(t, "/v1/chat/completions", body)
	require.Equal(t, 200, code, "%v", out)
	r := d.w.requests()[0]
	require.Empty(t, r.Media, "the image left the prompt")
	for _, id := range r.TokenIDs {
		require.NotEqual(t, d.svc.Tokenizer().Placeholders().Image, id, "its placeholder too")
	}
	require.Eventually(t, func() bool { st := d.svc.FeatureStats(); return st.Host.Used+st.Host.Reserved == 0 },
		5*time.Second, 10*time.Millisecond)
}
