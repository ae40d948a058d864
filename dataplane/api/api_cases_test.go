package api

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane"
	"dataplane/dataplane/encoder"
	"dataplane/dataplane/encoderpool"
	"dataplane/dataplane/media/ffmpeg/ffmpegtest"
	"dataplane/dataplane/worker"
	"dataplane/features"
	"dataplane/native"
	"dataplane/native/fixtures"
)

// The daemon's API over real HTTP on loopback, beyond the cases service_test.go covers: bad
// requests that name the item, the positive paths of every endpoint, the per-item timeout,
// the feature budget, streaming with media read by a spec-conformant SSE client, and text
// that never waits behind media.

// ---- helpers ----

// postResp posts JSON and returns the status, the headers and the decoded body.
func (d *testDaemon) postResp(t *testing.T, path string, body any) (int, http.Header, map[string]any) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(d.base+path, "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	return resp.StatusCode, resp.Header, out
}

// metric reads one sample from /metrics by its exact name and labels (0 when absent).
func (d *testDaemon) metric(t *testing.T, series string) float64 {
	t.Helper()
	_, metrics := get(t, d.base+"/metrics")
	for line := range strings.SplitSeq(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, line)
			return f
		}
	}
	return 0
}

// apiError is the error object of an answer, with its message and param.
func apiError(t *testing.T, out map[string]any) (msg, param string) {
	t.Helper()
	e, ok := out["error"].(map[string]any)
	require.True(t, ok, "not an error answer: %v", out)
	msg, _ = e["message"].(string)
	param, _ = e["param"].(string)
	return msg, param
}

// randomPNG is a picture no other test sends (so its features are never in the cache).
func randomPNG(t *testing.T, seed uint64) string {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	img := image.NewRGBA(image.Rect(0, 0, 64, 48))
	for k := range img.Pix {
		img.Pix[k] = byte(r.Uint32())
	}
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(buf.Bytes())
}

func chatBody(maxTokens int, parts ...any) map[string]any {
	return map[string]any{"max_tokens": maxTokens, "messages": []any{map[string]any{"role": "user", "content": parts}}}
}

func textPart(s string) any { return map[string]any{"type": "text", "text": s} }

func imagePart(url string) any {
	return map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}
}

func repeat(v, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// imageBytes is one 224-px picture's features: 256 rows of the model's width.
func (d *testDaemon) imageBytes() int64 {
	return int64(256 * d.svc.Models().Hidden * d.svc.Models().DType.Size())
}

// gateModel holds every batch until release is closed; entered is closed when the first batch
// arrives. It stands for an encoder that is slow or stuck.
type gateModel struct {
	encoderpool.Model
	g *gate
}

type gate struct {
	entered, release chan struct{}
	once             atomic.Bool
	opened           sync.Once
}

// newGate is a closed gate; it opens by itself after a minute, so a test whose assertion
// fails (a request that waits when it should not) fails instead of hanging.
func newGate(t *testing.T) *gate {
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	stop := time.AfterFunc(time.Minute, g.open)
	t.Cleanup(func() { stop.Stop(); g.open() })
	return g
}

func (g *gate) open() { g.opened.Do(func() { close(g.release) }) }

func (m gateModel) Run(inputs []encoder.Input, outs []native.Matrix) error {
	if m.g.once.CompareAndSwap(false, true) {
		close(m.g.entered)
	}
	<-m.g.release
	return m.Model.Run(inputs, outs)
}

// ---- 1. bad requests ----

// More media than placeholders (and the reverse) is a 400 naming the item or the position,
// in both placeholder styles; everything admitted for it is released.
func TestBadRequestsPlaceholderCount(t *testing.T) {
	d := startDaemon(t, nil)
	ph := int(d.svc.Tokenizer().Placeholders().Image)
	png := dataURL(t, "image/png", "image_200x150.png")
	two := []any{map[string]any{"modality": "image", "url": png}, map[string]any{"modality": "image", "data": strings.TrimPrefix(randomPNG(t, 1), "data:image/png;base64,")}}
	cases := []struct {
		name, path string
		body       map[string]any
		param, msg string
	}{
		{"single: 2 images, 1 placeholder", "/v1/pretokenized",
			map[string]any{"token_ids": []int{1, ph, 2}, "media": two}, "media[1]", "1 placeholders for 2 media items"},
		{"expanded: 2 images, 1 run of one image", "/v1/pretokenized",
			map[string]any{"placeholder_style": "expanded", "token_ids": append(append([]int{1}, repeat(ph, 256)...), 2), "media": two},
			"media[1]", "1 placeholders for 2 media items"},
		{"expanded: a run shorter than its items", "/v1/pretokenized",
			map[string]any{"placeholder_style": "expanded", "token_ids": append(append([]int{1}, repeat(ph, 300)...), 2), "media": two},
			"media[1]", "44 image placeholders, item has 256 tokens"},
		{"single: 1 image, 2 placeholders", "/v1/pretokenized",
			map[string]any{"token_ids": []int{1, ph, 2, ph}, "media": two[:1]}, "", "placeholder without a media item at token 3"},
		{"completions: token ids with a placeholder, no media", "/v1/completions",
			map[string]any{"prompt": []int{1, ph, 2}}, "", "placeholder without a media item at token 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, out := d.post(t, c.path, c.body)
			require.Equal(t, 400, code, "%v", out)
			msg, param := apiError(t, out)
			require.Contains(t, msg, c.msg)
			if c.param != "" {
				require.Equal(t, c.param, param)
				require.Contains(t, msg, "media item 1", "the message names the item")
			}
			d.requireNoFeatureBytes(t)
		})
	}
	require.Empty(t, d.w.requests(), "no bad request reached the worker")
	code, _ := get(t, d.base+"/readyz")
	require.Equal(t, 200, code)
}

// ---- 2. positive paths ----

// A uuid sent once with its media may later be sent alone: the second request is served from
// the reuse cache without encoding. A uuid the cache no longer holds is a 400 naming it.
func TestUUIDReusedWithoutMedia(t *testing.T) {
	d := startDaemon(t, nil)
	png := dataURL(t, "image/png", "image_200x150.png")
	first := chatBody(1, textPart("what is this?"),
		map[string]any{"type": "image_url", "uuid": "cat-1", "image_url": map[string]any{"url": png}})
	first["cache_policy"] = "keep:1m"
	code, out := d.post(t, "/v1/chat/completions", first)
	require.Equal(t, 200, code, "%v", out)
	require.Equal(t, 1.0, d.metric(t, `dataplane_encode_batch_items_sum{modality="image"}`))

	second := chatBody(1, textPart("and now?"), map[string]any{"type": "image_url", "uuid": "cat-1"})
	code, out = d.post(t, "/v1/chat/completions", second)
	require.Equal(t, 200, code, "%v", out)
	require.Equal(t, 1.0, d.metric(t, `dataplane_media_items_total{cache="hit",modality="image"}`))
	require.Equal(t, 1.0, d.metric(t, `dataplane_encode_batch_items_sum{modality="image"}`), "the uuid hit skipped the encoder")
	reqs := d.w.requests()
	require.Len(t, reqs, 2)
	require.Equal(t, "cat-1", reqs[1].Media[0].ID, "the engine sees the client's uuid")
	require.Equal(t, 256, reqs[1].Media[0].End-reqs[1].Media[0].Start)
	d.w.mu.Lock()
	first0, second0 := d.w.embeds[0], d.w.embeds[1]
	d.w.mu.Unlock()
	require.Equal(t, rowsOf(first0, reqs[0], d), rowsOf(second0, reqs[1], d), "the same features merged")

	// The pretokenized endpoint takes the uuid alone too.
	code, out = d.post(t, "/v1/pretokenized", map[string]any{"max_tokens": 1,
		"token_ids": []int{1, int(d.svc.Tokenizer().Placeholders().Image), 2}, "media": []any{map[string]any{"modality": "image", "uuid": "cat-1"}}})
	require.Equal(t, 200, code, "%v", out)
	require.Equal(t, 2.0, d.metric(t, `dataplane_media_items_total{cache="hit",modality="image"}`))

	// An audio uuid is not an image, and a uuid never seen is refused.
	code, out = d.post(t, "/v1/chat/completions", chatBody(1, map[string]any{"type": "input_audio", "uuid": "cat-1"}))
	require.Equal(t, 400, code, "%v", out)
	msg, param := apiError(t, out)
	require.Equal(t, "messages[0].content[0]", param)
	require.Contains(t, msg, `uuid "cat-1"`)
	d.requireNoFeatureBytesBut(t, d.imageBytes())
}

// rowsOf cuts a request's first item's rows out of the merged sequence the echo worker kept.
func rowsOf(embeds []byte, r *worker.Request, d *testDaemon) []byte {
	row := d.svc.Models().Hidden * d.svc.Models().DType.Size()
	return embeds[r.Media[0].Start*row : r.Media[0].End*row]
}

// requireNoFeatureBytesBut checks that the store holds only want bytes, all idle in the cache.
func (d *testDaemon) requireNoFeatureBytesBut(t *testing.T, want int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		st := d.svc.FeatureStats().Host
		return st.Reserved == 0 && st.Requested == want && st.Idle >= want
	}, 10*time.Second, 10*time.Millisecond, "feature bytes beyond the cached item: %+v", d.svc.FeatureStats().Host)
}

// Pre-tokenized requests with media, in both placeholder styles, merge the same features at
// the same rows.
func TestPretokenizedWithMedia(t *testing.T) {
	d := startDaemon(t, nil)
	ph := int(d.svc.Tokenizer().Placeholders().Image)
	png := dataURL(t, "image/png", "image_200x150.png")
	media := []any{map[string]any{"modality": "image", "url": png}}
	code, out := d.post(t, "/v1/pretokenized", map[string]any{"max_tokens": 2, "token_ids": []int{1, 2, ph, 3}, "media": media})
	require.Equal(t, 200, code, "%v", out)
	require.Equal(t, "tok0 tok1 ", out["choices"].([]any)[0].(map[string]any)["text"])
	require.Equal(t, float64(3+256), out["usage"].(map[string]any)["prompt_tokens"])
	code, out = d.post(t, "/v1/pretokenized", map[string]any{"max_tokens": 2, "placeholder_style": "expanded",
		"token_ids": append(append([]int{1, 2}, repeat(ph, 256)...), 3), "media": media})
	require.Equal(t, 200, code, "%v", out)
	reqs := d.w.requests()
	require.Len(t, reqs, 2)
	for _, r := range reqs {
		require.Len(t, r.Media, 1)
		require.Equal(t, 2, r.Media[0].Start)
		require.Equal(t, 2+256, r.Media[0].End)
		require.Len(t, r.TokenIDs, 3+256)
	}
	require.Equal(t, reqs[0].TokenIDs, reqs[1].TokenIDs, "both styles give the engine the expanded prompt")
	d.w.mu.Lock()
	require.Equal(t, d.w.embeds[0], d.w.embeds[1], "both styles merge the same sequence")
	d.w.mu.Unlock()
	d.requireNoFeatureBytes(t)
}

// Audio alone in a chat message.
func TestChatAudioAlone(t *testing.T) {
	d := startDaemon(t, nil)
	wav, err := os.ReadFile(fixtures.Path(t, "audio_7s3.wav"))
	require.NoError(t, err)
	code, out := d.post(t, "/v1/chat/completions", chatBody(2,
		map[string]any{"type": "input_audio", "input_audio": map[string]any{"data": base64.StdEncoding.EncodeToString(wav), "format": "wav"}}))
	require.Equal(t, 200, code, "%v", out)
	r := d.w.requests()[0]
	require.Len(t, r.Media, 1)
	require.Equal(t, 1500, r.Media[0].End-r.Media[0].Start)
	for i := r.Media[0].Start; i < r.Media[0].End; i++ {
		require.Equal(t, d.svc.Tokenizer().Placeholders().Audio, r.TokenIDs[i])
	}
	require.Equal(t, 1.0, d.metric(t, `dataplane_media_items_total{cache="miss",modality="audio"}`))
	require.Zero(t, d.metric(t, `dataplane_media_items_total{cache="miss",modality="image"}`))
	d.requireNoFeatureBytes(t)
}

// GET /v1/models, and /debug/route for a given request id, the latest, and unknown ids.
func TestModelsAndDebugRoute(t *testing.T) {
	d := startDaemon(t, nil)
	code, body := get(t, d.base+"/v1/models")
	require.Equal(t, 200, code)
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object, OwnedBy string
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &list))
	require.Equal(t, "list", list.Object)
	require.Len(t, list.Data, 1)
	require.Equal(t, d.svc.Models().Name, list.Data[0].ID)
	require.Equal(t, "model", list.Data[0].Object)

	code, body = get(t, d.base+"/debug/route")
	require.Equal(t, 404, code, "no decision yet: %s", body)

	var ids []string
	for i := range 2 {
		code, out := d.post(t, "/v1/completions", map[string]any{"prompt": fmt.Sprintf("request %d", i), "max_tokens": 1})
		require.Equal(t, 200, code, "%v", out)
		ids = append(ids, out["id"].(string))
	}
	require.NotEqual(t, ids[0], ids[1])
	for _, id := range ids {
		code, body = get(t, d.base+"/debug/route?request_id="+id)
		require.Equal(t, 200, code, body)
		var dec struct {
			ID       string `json:"request_id"`
			Decision struct {
				Worker string           `json:"worker"`
				Tokens int              `json:"tokens"`
				Scores []map[string]any `json:"scores"`
			} `json:"decision"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &dec), body)
		require.Equal(t, id, dec.ID)
		require.Equal(t, "echo-0", dec.Decision.Worker)
		require.Positive(t, dec.Decision.Tokens)
		require.Len(t, dec.Decision.Scores, 1, "one score per worker explains the choice")
	}
	code, body = get(t, d.base+"/debug/route")
	require.Equal(t, 200, code)
	require.Contains(t, body, `"request_id":"`+ids[1]+`"`, "no id: the latest decision")

	code, body = get(t, d.base+"/debug/route?request_id=dp-0-nope")
	require.Equal(t, 404, code)
	require.Contains(t, body, `"param":"request_id"`)
	require.Contains(t, body, `dp-0-nope`)
}

// pprof is served only when the server's Pprof option is on.
func TestPprofBehindOption(t *testing.T) {
	off := startDaemon(t, nil)
	code, _ := get(t, off.base+"/debug/pprof/")
	require.Equal(t, 404, code)
	code, _ = get(t, off.base+"/debug/pprof/goroutine?debug=1")
	require.Equal(t, 404, code)

	on := startDaemonWith(t, nil, func(o *Options) { o.Pprof = true })
	code, body := get(t, on.base+"/debug/pprof/")
	require.Equal(t, 200, code)
	require.Contains(t, body, "goroutine")
	code, body = get(t, on.base+"/debug/pprof/goroutine?debug=1")
	require.Equal(t, 200, code)
	require.Contains(t, body, "goroutine profile")
	code, _ = get(t, on.base+"/debug/pprof") // redirected to the index
	require.Equal(t, 200, code)
	code, _ = get(t, on.base+"/debug/pprofile")
	require.Equal(t, 404, code, "only /debug/pprof and below")
	_, metrics := get(t, on.base+"/metrics")
	require.Contains(t, metrics, `dataplane_http_requests_total{code="200",route="/debug/pprof"} 3`)
	require.Contains(t, metrics, `dataplane_http_requests_total{code="301",route="/debug/pprof"} 1`)
}

// A video container as a video_url: a file:// URL under the allowed directory and a data:
// URL; outside the directory it is refused.
func TestVideoURLContainer(t *testing.T) {
	if _, err := exec.LookPath("ffmpeg"); err != nil {
		t.Fatal("ffmpeg not found: `make deps-test` installs it (Debian package ffmpeg)")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "clip.mp4")
	ffmpegtest.Run(t, "-f", "lavfi", "-i", "testsrc2=size=96x64:rate=10:duration=2", "-c:v", "mpeg4", "-q:v", "5", path)
	data, err := os.ReadFile(path)
	require.NoError(t, err)

	d := startDaemon(t, func(o *dataplane.ServiceOptions) { o.Fetch.FileDir = dir })
	video := func(url string) any {
		return map[string]any{"type": "video_url", "video_url": map[string]any{"url": url}}
	}
	code, out := d.post(t, "/v1/chat/completions", chatBody(1, textPart("what happens?"), video("file://"+path)))
	require.Equal(t, 200, code, "%v", out)
	code, out = d.post(t, "/v1/chat/completions", chatBody(1, video("data:video/mp4;base64,"+base64.StdEncoding.EncodeToString(data)), textPart("and here?")))
	require.Equal(t, 200, code, "%v", out)
	reqs := d.w.requests()
	require.Len(t, reqs, 2)
	for _, r := range reqs {
		require.Len(t, r.Media, 1)
		n := r.Media[0].End - r.Media[0].Start
		require.Positive(t, n)
		require.Equal(t, d.svc.Tokenizer().Placeholders().Video, r.TokenIDs[r.Media[0].Start])
	}
	require.Equal(t, reqs[0].Media[0].End-reqs[0].Media[0].Start, reqs[1].Media[0].End-reqs[1].Media[0].Start,
		"the same video by file and by data: URL")
	require.Equal(t, 2.0, d.metric(t, `dataplane_media_items_total{cache="miss",modality="video"}`))

	code, out = d.post(t, "/v1/chat/completions", chatBody(1, video("file:///etc/hostname")))
	require.Equal(t, 403, code, "%v", out)
	_, param := apiError(t, out)
	require.Equal(t, "messages[0].content[0]", param)
	d.requireNoFeatureBytes(t)
}

// ---- 3. per-item timeout ----

// Media that cannot be encoded within the item timeout fails its request with a 504 naming
// the item; every byte is released once the encoder lets go, and the daemon serves on.
func TestItemTimeout(t *testing.T) {
	// Long enough, on a loaded machine, to reach the encoder and to encode the next request.
	d := startDaemon(t, func(o *dataplane.ServiceOptions) { o.ItemTimeout = 2 * time.Second })
	g := newGate(t)
	d.wrapEncoders(func(m encoderpool.Model) encoderpool.Model { return gateModel{m, g} })
	code, out := d.post(t, "/v1/chat/completions", chatBody(1, textPart("describe"), imagePart(randomPNG(t, 2))))
	require.Equal(t, 504, code, "%v", out)
	msg, param := apiError(t, out)
	require.Equal(t, "messages[0].content[1]", param)
	require.Contains(t, msg, "media not encoded within 2s")
	select {
	case <-g.entered:
	default:
		t.Fatal("the request timed out before its item reached the encoder")
	}
	require.Empty(t, d.w.requests())
	g.open() // the encoder finishes the abandoned item: its bytes go back
	d.requireNoFeatureBytes(t)
	require.Equal(t, 1.0, d.metric(t, `dataplane_requests_total{endpoint="chat",outcome="error"}`))

	code, out = d.post(t, "/v1/chat/completions", chatBody(1, imagePart(randomPNG(t, 3))))
	require.Equal(t, 200, code, "%v", out)
	d.requireNoFeatureBytes(t)
}

// ---- 4. feature budget ----

// A request whose features cannot fit in the budget now is refused with 503 and Retry-After
// once the wait runs out, or 429 and Retry-After when the wait queue is full; an item larger
// than the whole budget, or a request whose features and merged sequence together are, is 413
// without Retry-After. Each message says why; every byte comes back.
func TestFeatureBudgetExhausted(t *testing.T) {
	small := func(capacity func(img int64) int64, maxWait time.Duration, waiters int) func(*dataplane.ServiceOptions) {
		return func(o *dataplane.ServiceOptions) {
			img := int64(256 * dataplane.DefaultModelOptions().DemoHidden * dataplane.DefaultModelOptions().DType.Size())
			o.Features.Host.Capacity = capacity(img)
			o.Features.Host.BlockBytes = 4096
			o.Features.MaxWait = maxWait
			o.Features.MaxWaiters = waiters
			o.Features.RetryAfter = 2 * time.Second
		}
	}
	// occupy sends two one-picture requests whose encoding a gate holds: each holds a
	// picture's features (a picture and its merged sequence fit the budget of 2.1 pictures, two
	// pictures' features too, a third does not).
	occupy := func(t *testing.T, d *testDaemon, seed uint64) {
		g := newGate(t)
		d.wrapEncoders(func(m encoderpool.Model) encoderpool.Model { return gateModel{m, g} })
		for i := range uint64(2) {
			raw, _ := json.Marshal(chatBody(1, imagePart(randomPNG(t, seed+i))))
			conn, err := net.Dial("tcp", strings.TrimPrefix(d.base, "http://"))
			require.NoError(t, err)
			t.Cleanup(func() { conn.Close() })
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(raw), raw)
		}
		require.Eventually(t, func() bool { h := d.svc.FeatureStats().Host; return h.Used+h.Reserved >= 2*d.imageBytes() },
			10*time.Second, 5*time.Millisecond)
		t.Cleanup(g.open)
	}
	t.Run("503 after the wait", func(t *testing.T) {
		d := startDaemon(t, small(func(img int64) int64 { return 2*img + img/10 }, 50*time.Millisecond, 0))
		occupy(t, d, 10)
		code, h, out := d.postResp(t, "/v1/chat/completions", chatBody(1, imagePart(randomPNG(t, 12))))
		require.Equal(t, 503, code, "%v", out)
		require.Equal(t, "2", h.Get("Retry-After"))
		msg, param := apiError(t, out)
		require.Equal(t, "messages[0].content[0]", param, "the item that did not fit")
		require.Contains(t, msg, "host pool: timeout")
		require.Contains(t, msg, fmt.Sprintf("need %d bytes", d.imageBytes()))
		require.Equal(t, 1.0, d.metric(t, `dataplane_features_pool_rejections_total{pool="host",reason="timeout"}`))
	})
	t.Run("429 when the wait queue is full", func(t *testing.T) {
		d := startDaemon(t, small(func(img int64) int64 { return 2*img + img/10 }, time.Minute, 1))
		occupy(t, d, 20)
		// The third picture waits for memory (the only waiter allowed)...
		raw, _ := json.Marshal(chatBody(1, imagePart(randomPNG(t, 22))))
		conn, err := net.Dial("tcp", strings.TrimPrefix(d.base, "http://"))
		require.NoError(t, err)
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(raw), raw)
		require.Eventually(t, func() bool { return d.svc.FeatureStats().Host.Waiting == 1 }, 10*time.Second, 5*time.Millisecond)
		// ...so the next one is refused at once.
		code, h, out := d.postResp(t, "/v1/chat/completions", chatBody(1, imagePart(randomPNG(t, 23))))
		require.Equal(t, 429, code, "%v", out)
		require.Equal(t, "2", h.Get("Retry-After"))
		msg, param := apiError(t, out)
		require.Equal(t, "messages[0].content[0]", param)
		require.Contains(t, msg, "host pool: queue_full")
		// The waiting client leaves: its wait ends.
		conn.Close()
		require.Eventually(t, func() bool { return d.svc.FeatureStats().Host.Waiting == 0 }, 10*time.Second, 5*time.Millisecond)
		require.Equal(t, 1.0, d.metric(t, `dataplane_requests_total{endpoint="chat",outcome="rejected"}`))
	})
	t.Run("413 when the request's features and merged sequence can never fit", func(t *testing.T) {
		d := startDaemon(t, small(func(img int64) int64 { return 2*img + img/2 }, 50*time.Millisecond, 0))
		code, h, out := d.postResp(t, "/v1/chat/completions", chatBody(1,
			imagePart(randomPNG(t, 15)), imagePart(randomPNG(t, 16))))
		require.Equal(t, 413, code, "%v", out)
		require.Empty(t, h.Get("Retry-After"), "retrying cannot help")
		msg, _ := apiError(t, out)
		require.Contains(t, msg, "--feature-bytes")
		d.requireNoFeatureBytes(t)
		// One picture and its merged sequence fit: the daemon serves on.
		code, out = d.post(t, "/v1/chat/completions", chatBody(1, imagePart(randomPNG(t, 13))))
		require.Equal(t, 200, code, "%v", out)
		d.requireNoFeatureBytes(t)
	})
	t.Run("413 when one item can never fit", func(t *testing.T) {
		d := startDaemon(t, small(func(img int64) int64 { return img / 2 }, 50*time.Millisecond, 0))
		code, h, out := d.postResp(t, "/v1/chat/completions", chatBody(1, textPart("look"), imagePart(randomPNG(t, 30))))
		require.Equal(t, 413, code, "%v", out)
		require.Empty(t, h.Get("Retry-After"), "retrying cannot help")
		msg, param := apiError(t, out)
		require.Equal(t, "messages[0].content[1]", param)
		require.Contains(t, msg, "--feature-bytes")
		d.requireNoFeatureBytes(t)
		// Text still fits (it needs no features).
		code, out = d.post(t, "/v1/chat/completions", chatBody(1, textPart("just text")))
		require.Equal(t, 200, code, "%v", out)
	})
}

// ---- 5. streaming with media, read by a spec-conformant SSE client ----

// sseEvent is one dispatched server-sent event.
type sseEvent struct {
	Type, Data, ID string
}

// sseReader parses text/event-stream as the WHATWG HTML standard says (9.2.6): lines end in
// CRLF, LF or CR; a blank line dispatches the event; ":" starts a comment; "field: value"
// with one leading space dropped; data lines join with "\n"; id sticks across events; an
// event with no data is not dispatched; an event cut off by the end of the stream is dropped.
type sseReader struct {
	r                *bufio.Reader
	lastID           string
	started, pending bool
	Retry            int
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{r: bufio.NewReader(r)} }

// line reads one line without its terminator; io.EOF when the stream ends mid-line or at once.
func (s *sseReader) line() (string, error) {
	var b strings.Builder
	for {
		c, err := s.r.ReadByte()
		if err != nil {
			return "", err // a line without its end is not complete
		}
		switch c {
		case '\n':
			return b.String(), nil
		case '\r':
			if next, err := s.r.Peek(1); err == nil && next[0] == '\n' {
				s.r.ReadByte() //nolint:errcheck
			}
			return b.String(), nil
		}
		b.WriteByte(c)
	}
}

// Next returns the next event, or io.EOF at the end of the stream.
func (s *sseReader) Next() (sseEvent, error) {
	var data strings.Builder
	typ := ""
	hasData := false
	for {
		l, err := s.line()
		if err != nil {
			if err == io.EOF {
				return sseEvent{}, io.EOF
			}
			return sseEvent{}, err
		}
		if !s.started {
			s.started = true
			l = strings.TrimPrefix(l, "\uFEFF")
		}
		if l == "" {
			if !hasData {
				typ = ""
				continue
			}
			if typ == "" {
				typ = "message"
			}
			return sseEvent{Type: typ, Data: strings.TrimSuffix(data.String(), "\n"), ID: s.lastID}, nil
		}
		if l[0] == ':' {
			continue
		}
		field, value, found := strings.Cut(l, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		switch field {
		case "event":
			typ = value
		case "data":
			data.WriteString(value)
			data.WriteByte('\n')
			hasData = true
		case "id":
			if !strings.ContainsRune(value, 0) {
				s.lastID = value
			}
		case "retry":
			if n, err := strconv.Atoi(value); err == nil && n >= 0 && strings.Trim(value, "0123456789") == "" {
				s.Retry = n
			}
		}
	}
}

// all reads events until the stream ends.
func (s *sseReader) all(t *testing.T) []sseEvent {
	t.Helper()
	var out []sseEvent
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, ev)
	}
}

func TestSSEReaderFollowsTheStandard(t *testing.T) {
	stream := "\uFEFF: a comment\r\nevent: add\r\ndata: a\r\ndata:b\r\nid: 7\r\n\r\n" +
		"data: x\r\r" + // CR alone ends lines
		"data\n\n" + // a field with no colon: empty data, still an event
		"event: ignored\n\n" + // no data: not dispatched, its type forgotten
		"retry: 1500\ndata:  two spaces\nunknown: field\n\n" +
		"data: cut off"
	r := newSSEReader(strings.NewReader(stream))
	got := r.all(t)
	require.Equal(t, []sseEvent{
		{Type: "add", Data: "a\nb", ID: "7"},
		{Type: "message", Data: "x", ID: "7"},
		{Type: "message", Data: "", ID: "7"},
		{Type: "message", Data: " two spaces", ID: "7"},
	}, got)
	require.Equal(t, 1500, r.Retry)
}

// A streamed chat completion with a picture and text: chunks arrive as SSE events, the role
// first, the text, a finish_reason, the usage (the picture's rows counted in the prompt), and
// [DONE] last; nothing is held afterwards.
func TestStreamingWithMedia(t *testing.T) {
	d := startDaemon(t, nil)
	body := chatBody(3, textPart("what is in this picture?"), imagePart(dataURL(t, "image/png", "image_200x150.png")))
	body["stream"] = true
	body["stream_options"] = map[string]any{"include_usage": true}
	raw, _ := json.Marshal(body)
	resp, err := http.Post(d.base+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))

	events := newSSEReader(resp.Body).all(t)
	require.NotEmpty(t, events)
	require.Equal(t, "[DONE]", events[len(events)-1].Data, "the stream ends with [DONE]")
	var text strings.Builder
	var role, finish string
	var usage map[string]any
	var ids = map[string]bool{}
	for i, ev := range events[:len(events)-1] {
		require.Equal(t, "message", ev.Type)
		require.NotEqual(t, "[DONE]", ev.Data, "[DONE] only once, at the end")
		var c struct {
			ID      string         `json:"id"`
			Object  string         `json:"object"`
			Usage   map[string]any `json:"usage"`
			Choices []struct {
				Delta struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(ev.Data), &c), ev.Data)
		require.Equal(t, "chat.completion.chunk", c.Object)
		ids[c.ID] = true
		if i == 0 {
			require.Len(t, c.Choices, 1)
			role = c.Choices[0].Delta.Role
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != nil {
				require.Empty(t, finish, "one finish_reason")
				finish = *ch.FinishReason
			}
		}
		if c.Usage != nil {
			require.Nil(t, usage, "one usage chunk")
			require.NotEmpty(t, finish, "usage comes after the finish_reason")
			usage = c.Usage
		}
	}
	require.Len(t, ids, 1, "every chunk carries the request's id")
	require.Equal(t, "assistant", role)
	require.Equal(t, "tok0 tok1 tok2 ", text.String())
	require.Equal(t, "length", finish)
	require.NotNil(t, usage)
	w := d.w.requests()[0]
	require.Len(t, w.Media, 1)
	require.Equal(t, float64(len(w.TokenIDs)), usage["prompt_tokens"])
	require.Greater(t, usage["prompt_tokens"], float64(256), "the picture's rows count as prompt tokens")
	require.Equal(t, float64(3), usage["completion_tokens"])
	require.Equal(t, usage["prompt_tokens"].(float64)+3, usage["total_tokens"])
	d.requireNoFeatureBytes(t)
	require.Equal(t, 1.0, d.metric(t, `dataplane_requests_total{endpoint="chat",outcome="ok"}`))
}

// ---- 6. text never waits behind media ----

// While the encoder is held on a picture, a text-only request is answered; the picture's
// request completes only after the encoder lets go.
func TestTextOnlyNeverWaitsBehindMedia(t *testing.T) {
	d := startDaemon(t, nil)
	g := newGate(t)
	d.wrapEncoders(func(m encoderpool.Model) encoderpool.Model { return gateModel{m, g} })
	type result struct {
		code int
		out  map[string]any
		err  error
	}
	mediaDone := make(chan result, 1)
	go func() {
		raw, _ := json.Marshal(chatBody(1, textPart("describe"), imagePart(randomPNG(t, 40))))
		resp, err := http.Post(d.base+"/v1/chat/completions", "application/json", bytes.NewReader(raw))
		if err != nil {
			mediaDone <- result{err: err}
			return
		}
		defer resp.Body.Close()
		var out map[string]any
		err = json.NewDecoder(resp.Body).Decode(&out)
		mediaDone <- result{code: resp.StatusCode, out: out, err: err}
	}()
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the picture never reached the encoder")
	}

	// The encoder is busy with the picture and cannot finish: text goes through all the same.
	for i := range 3 {
		code, out := d.post(t, "/v1/completions", map[string]any{"prompt": fmt.Sprintf("text %d", i), "max_tokens": 2})
		require.Equal(t, 200, code, "%v", out)
		code, out = d.post(t, "/v1/chat/completions", chatBody(1, textPart(fmt.Sprintf("chat %d", i))))
		require.Equal(t, 200, code, "%v", out)
	}
	select {
	case r := <-mediaDone:
		t.Fatalf("the media request finished while its encoder was held: %+v", r)
	default:
	}
	require.Len(t, d.w.requests(), 6, "only the text requests reached the worker")
	require.Equal(t, 1, d.svc.FeatureStats().Records[features.StateEncoding], "the picture is still encoding")

	g.open()
	r := <-mediaDone
	require.NoError(t, r.err)
	require.Equal(t, 200, r.code, "%v", r.out)
	reqs := d.w.requests()
	require.Len(t, reqs, 7)
	require.Len(t, reqs[6].Media, 1, "the media request reached the worker last")
	d.requireNoFeatureBytes(t)
}
