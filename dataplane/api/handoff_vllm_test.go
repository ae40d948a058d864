package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane"
	"dataplane/dataplane/openai"
	"dataplane/dataplane/worker"
	"dataplane/router/kvevents"
	"dataplane/transfer"
)

// The hand-offs against what a vLLM engine publishes: an engine stand-in records what the daemon
// sends it; transfer/testdata/vllm/vllm_ref.py (vLLM's side, written from its source) works out
// the blocks vLLM would cache for that request and publishes them over ZMQ as vLLM does; the
// daemon's router subscribes. The next request with the same prefix must then overlap exactly
// the blocks the two share.

const vllmRef = "../../transfer/testdata/vllm/vllm_ref.py"

// requirePython skips unless Debian's python3 has the modules (make test-deps installs them).
func requirePython(t *testing.T, modules ...string) {
	t.Helper()
	for _, m := range modules {
		// Found, not imported: torch takes seconds to import.
		probe := "import importlib.util, sys; sys.exit(importlib.util.find_spec('" + m + "') is None)"
		if err := exec.Command("/usr/bin/python3", "-c", probe).Run(); err != nil {
			t.Skipf("needs /usr/bin/python3 with %s (Debian python3-%s; make deps-test installs it): %v", m, m, err)
		}
	}
}

// publishLikeVLLM runs vllm_ref.py publish with spec and returns its PUB endpoint and how many
// blocks it stores; it stops with the test.
func publishLikeVLLM(t *testing.T, spec map[string]any) (string, int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "spec.json")
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, raw, 0o600))
	cmd := exec.Command("/usr/bin/python3", vllmRef, "publish", path)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		stdin.Close() // the publisher stops when its stdin closes
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }() //nolint:errcheck // its output was read
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill() //nolint:errcheck
			<-done
		}
	})
	// Its first line says where it publishes; a publisher that never says (python stuck
	// importing torch on a loaded machine) fails the test instead of hanging it.
	type said struct {
		line string
		err  error
	}
	first := make(chan said, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		first <- said{line, err}
	}()
	var line string
	select {
	case s := <-first:
		require.NoError(t, s.err, "the publisher said nothing")
		line = s.line
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill() //nolint:errcheck // the cleanup waits for it
		t.Fatal("the publisher said nothing in 2 minutes")
	}
	var hello struct {
		Pub    string `json:"pub"`
		Blocks int    `json:"blocks"`
	}
	require.NoError(t, json.Unmarshal([]byte(line), &hello), line)
	require.Positive(t, hello.Blocks)
	return hello.Pub, hello.Blocks
}

// vllmEngine stands in for vLLM's API server: /health, streamed /v1/completions (it keeps the
// prompt_embeds) and /v1/chat/completions (it keeps the body, and checks that the EC connector
// would find every item's file, as the scheduler asks it).
type vllmEngine struct {
	ecDir        string
	mu           sync.Mutex
	embeds, chat []json.RawMessage
	missing      []string // EC files a chat request named that were not there
}

func startVLLMEngine(t *testing.T, ecDir string) (*vllmEngine, string) {
	e := &vllmEngine{ecDir: ecDir}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return e, srv.URL
}

func (e *vllmEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body map[string]json.RawMessage
	switch r.URL.Path {
	case "/health":
		return
	case "/v1/completions", "/v1/chat/completions":
		if err := json.NewDecoder(io.LimitReader(r.Body, 256<<20)).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	default:
		http.NotFound(w, r)
		return
	}
	e.mu.Lock()
	if r.URL.Path == "/v1/chat/completions" {
		raw, _ := json.Marshal(body)
		e.chat = append(e.chat, raw)
		var msgs []struct {
			Content json.RawMessage `json:"content"`
		}
		_ = json.Unmarshal(body["messages"], &msgs)
		for _, m := range msgs {
			var parts []struct {
				UUID string `json:"uuid"`
			}
			_ = json.Unmarshal(m.Content, &parts)
			for _, p := range parts {
				if p.UUID == "" {
					continue
				}
				if _, err := os.Stat(transfer.ECCacheFile(e.ecDir, p.UUID)); err != nil {
					e.missing = append(e.missing, p.UUID)
				}
			}
		}
	} else if pe, ok := body["prompt_embeds"]; ok {
		e.embeds = append(e.embeds, pe)
	}
	e.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	text := `"text":"ok"`
	if r.URL.Path == "/v1/chat/completions" {
		text = `"delta":{"content":"ok"}`
	}
	fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,%s,\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n", text)
}

func (e *vllmEngine) last(t *testing.T, chat bool) json.RawMessage {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	list := e.embeds
	if chat {
		list = e.chat
	}
	require.NotEmpty(t, list)
	return list[len(list)-1]
}

// startHandoffDaemon serves a Service in a hand-off mode with one HTTP engine, subscribed to
// nothing yet (subscribe does it).
func startHandoffDaemon(t *testing.T, mode, ecDir, url string) (*testDaemon, *kvevents.Engine) {
	t.Helper()
	opts := dataplane.DefaultServiceOptions()
	opts.Features.Host.Capacity = 64 << 20
	opts.Log = slog.New(slog.DiscardHandler)
	opts.Handoff, opts.ECDir = mode, ecDir
	svc, err := dataplane.NewService(opts)
	require.NoError(t, err)
	w, err := worker.NewHTTP(worker.HTTPOptions{BaseURL: url, Label: "worker 0", Handoff: mustHandoff(t, mode)})
	require.NoError(t, err)
	eng, err := svc.AddWorker(w)
	require.NoError(t, err)
	return &testDaemon{svc: svc, base: serveService(t, svc, DefaultOptions())}, eng
}

func mustHandoff(t *testing.T, s string) worker.Handoff {
	h, err := worker.ParseHandoff(s)
	require.NoError(t, err)
	return h
}

// subscribe feeds the router from a publisher and waits until it has stored blocks blocks.
func subscribe(t *testing.T, d *testDaemon, eng *kvevents.Engine, pub string, blocks int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = kvevents.SubscribeZMQ(ctx, kvevents.DefaultZMQOptions(pub, ""), d.svc.Feed().Stats(),
			func(int) (*kvevents.Engine, error) { return eng, nil })
	}()
	t.Cleanup(func() { cancel(); <-done })
	st := d.svc.Feed().Stats()
	require.Eventually(t, func() bool { return st.BlocksStored.Load() >= int64(blocks) }, 20*time.Second, 10*time.Millisecond,
		"the router stored %d of the %d blocks published (bad events %d, unknown parents %d)",
		st.BlocksStored.Load(), blocks, st.BadEvents.Load(), st.UnknownParent.Load())
}

// handoffChat is a chat with a long system prompt, a picture and a question.
func handoffChat(img, question, policy string) map[string]any {
	return map[string]any{"max_tokens": 1, "cache_policy": policy, "messages": []any{
		map[string]any{"role": "system", "content": "You are a careful assistant that describes pictures for people who cannot see them. " +
			"Say what is there, where it is, its colours, and nothing you are not sure of. Keep it short and plain."},
		map[string]any{"role": "user", "content": []any{imagePart(img), textPart(question)}},
	}}
}

// sharedBlocks is how many full blocks two chats' merged sequences share: their rendered
// tokens' common prefix, with the picture's placeholder (inside it) counted as its rows.
func sharedBlocks(t *testing.T, d *testDaemon, a, b map[string]any, promptA int) int {
	t.Helper()
	ids := func(body map[string]any) []int32 {
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := openai.ParseChat(raw, openai.DefaultLimits())
		require.NoError(t, err)
		out, err := d.svc.Tokenizer().Chat(req.Messages)
		require.NoError(t, err)
		return out
	}
	ia, ib := ids(a), ids(b)
	common := 0
	for common < min(len(ia), len(ib)) && ia[common] == ib[common] {
		common++
	}
	imgRows := promptA - (len(ia) - 1)
	require.Less(t, len(ia)-common, len(ia)-1, "the picture is in the shared prefix")
	return (common - 1 + imgRows) / 16
}

// overlap is the leading blocks the router found cached on url for the request answered out.
func overlap(t *testing.T, d *testDaemon, out map[string]any, url string) int {
	t.Helper()
	id, _ := out["id"].(string)
	ld, ok := d.svc.Decisions().Get(id)
	require.True(t, ok, "%v", out)
	sc := ld.Decision.Score(url)
	require.NotNil(t, sc)
	return sc.Overlap
}

func promptTokens(t *testing.T, out map[string]any) int {
	t.Helper()
	u, ok := out["usage"].(map[string]any)
	require.True(t, ok, "%v", out)
	return int(u["prompt_tokens"].(float64))
}

// --handoff embeds: vLLM keys the request's blocks by zeros and the SHA-256 of each block's
// slice of the tensor it got; the daemon hashes the next request's blocks the same way before
// routing it (the picture not even encoded yet: its blocks come from what the daemon
// remembered of the first request), so it overlaps every block the two share. A text-only
// request with the same system prompt goes as token ids, which vLLM never matches with
// prompt_embeds blocks: no overlap.
func TestEmbedsHandoffMatchesVLLMEvents(t *testing.T) {
	requirePython(t, "zmq", "msgpack", "torch")
	eng, url := startVLLMEngine(t, "")
	d, kv := startHandoffDaemon(t, "embeds", "", url)
	img := randomPNG(t, 21)
	first := handoffChat(img, "What is in the picture?", "")
	code, outA := d.post(t, "/v1/chat/completions", first)
	require.Equal(t, 200, code, "%v", outA)

	var embeds string
	require.NoError(t, json.Unmarshal(eng.last(t, false), &embeds))
	pub, blocks := publishLikeVLLM(t, map[string]any{"mode": "embeds", "block_size": 16, "prompt_embeds": embeds})
	require.Equal(t, promptTokens(t, outA)/16, blocks)
	subscribe(t, d, kv, pub, blocks)

	next := handoffChat(img, "Which colours are in it?", "")
	code, outB := d.post(t, "/v1/chat/completions", next)
	require.Equal(t, 200, code, "%v", outB)
	want := sharedBlocks(t, d, first, next, promptTokens(t, outA))
	require.GreaterOrEqual(t, want, 3, "a prefix of several blocks, the picture's among them")
	require.Equal(t, want, overlap(t, d, outB, url), "the blocks the two requests share, as vLLM holds them")

	other := handoffChat(randomPNG(t, 22), "What is in the picture?", "")
	code, outC := d.post(t, "/v1/chat/completions", other)
	require.Equal(t, 200, code, "%v", outC)
	require.Less(t, overlap(t, d, outC, url), want, "another picture: only the blocks before it")
	require.Positive(t, overlap(t, d, outC, url))

	code, outT := d.post(t, "/v1/chat/completions", map[string]any{"max_tokens": 1, "messages": first["messages"].([]any)[:1]})
	require.Equal(t, 200, code, "%v", outT)
	require.Zero(t, overlap(t, d, outT, url), "token-id blocks never meet prompt_embeds blocks")
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// --handoff ec: the daemon writes the picture's features where vLLM's EC connector looks (the
// engine finds the file when the request arrives) and sends the chat with the item's name as
// its uuid; vLLM's events for it carry its token ids and that name per block, and the next
// request with the same prefix overlaps the blocks the two share. The file follows the cache
// policy: kept with "keep", removed once a "discard" request is prefilled.
func TestECHandoffMatchesVLLMEvents(t *testing.T) {
	requirePython(t, "zmq", "msgpack")
	dir := filepath.Join(t.TempDir(), "ec")
	eng, url := startVLLMEngine(t, dir)
	d, kv := startHandoffDaemon(t, "ec", dir, url)
	img := randomPNG(t, 31)
	first := handoffChat(img, "What is in the picture?", "keep")
	code, outA := d.post(t, "/v1/chat/completions", first)
	require.Equal(t, 200, code, "%v", outA)
	chat := eng.last(t, true)
	var sent struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal(chat, &sent))
	var parts []map[string]any
	require.NoError(t, json.Unmarshal(sent.Messages[1].Content, &parts))
	name, _ := parts[0]["uuid"].(string)
	require.Regexp(t, hex64, name, "the item's name goes as its uuid: %s", sent.Messages[1].Content)
	require.Equal(t, img, parts[0]["image_url"].(map[string]any)["url"], "the picture as the client sent it")
	eng.mu.Lock()
	require.Empty(t, eng.missing, "the EC file was there when the engine got the request")
	eng.mu.Unlock()

	var spec map[string]any
	raw, err := json.Marshal(first)
	require.NoError(t, err)
	req, err := openai.ParseChat(raw, openai.DefaultLimits())
	require.NoError(t, err)
	ids, err := d.svc.Tokenizer().Chat(req.Messages)
	require.NoError(t, err)
	spec = map[string]any{"mode": "ec", "block_size": 16, "ec_dir": dir, "chat": json.RawMessage(chat), "token_ids": ids,
		"placeholders": []int32{d.svc.Tokenizer().Placeholders().Image}}
	pub, blocks := publishLikeVLLM(t, spec)
	require.Equal(t, promptTokens(t, outA)/16, blocks, "vLLM's expansion from the file's rows is the daemon's")
	subscribe(t, d, kv, pub, blocks)

	next := handoffChat(img, "Which colours are in it?", "discard")
	code, outB := d.post(t, "/v1/chat/completions", next)
	require.Equal(t, 200, code, "%v", outB)
	want := sharedBlocks(t, d, first, next, promptTokens(t, outA))
	require.GreaterOrEqual(t, want, 3)
	require.Equal(t, want, overlap(t, d, outB, url), "the blocks the two requests share, as vLLM holds them")

	// The kept item keeps its file; a discarded one loses it once prefilled.
	_, err = os.Stat(transfer.ECCacheFile(dir, name))
	require.NoError(t, err, "kept for reuse: the file stays")
	code, outC := d.post(t, "/v1/chat/completions", handoffChat(randomPNG(t, 32), "What is it?", "discard"))
	require.Equal(t, 200, code, "%v", outC)
	require.NoError(t, json.Unmarshal(eng.last(t, true), &sent))
	require.NoError(t, json.Unmarshal(sent.Messages[1].Content, &parts))
	nameC, _ := parts[0]["uuid"].(string)
	require.NotEqual(t, name, nameC)
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(dir, nameC))
		return os.IsNotExist(err)
	}, 10*time.Second, 10*time.Millisecond, "a discarded item's file goes after prefill")
	eng.mu.Lock()
	require.Empty(t, eng.missing)
	eng.mu.Unlock()
	st := d.svc.ECDir().Stats()
	require.Equal(t, 1, st.Files, "%+v", st)
	require.GreaterOrEqual(t, st.Writes, int64(2))
	// The metrics say what the directory's stats say (its janitor may still be counting a
	// removal: read both until they are of the same moment).
	require.Eventually(t, func() bool {
		st := d.svc.ECDir().Stats()
		_, metrics := get(t, d.base+"/metrics")
		return st == d.svc.ECDir().Stats() &&
			strings.Contains(metrics, fmt.Sprintf("dataplane_ec_dir_files %d\n", st.Files)) &&
			strings.Contains(metrics, fmt.Sprintf("dataplane_ec_dir_bytes{use=\"used\"} %d\n", st.Bytes)) &&
			strings.Contains(metrics, fmt.Sprintf("dataplane_ec_dir_items_total{outcome=\"removed\"} %d\n", st.Removed)) &&
			strings.Contains(metrics, fmt.Sprintf("dataplane_ec_dir_items_total{outcome=\"written\"} %d\n", st.Writes))
	}, 10*time.Second, 10*time.Millisecond, "the EC metrics disagree with the directory's stats")
}

// --handoff tokens: the engine encodes the media itself, so the daemon encodes nothing; it
// sends the chat with each item's name as its uuid (what vLLM's events will name, as in the EC
// hand-off). Media that cannot reach vLLM's chat endpoint are refused before any work: in a
// completion (vLLM's /v1/completions takes none) or as a video of pictures.
func TestTokensHandoff(t *testing.T) {
	eng, url := startVLLMEngine(t, "")
	d, _ := startHandoffDaemon(t, "tokens", "", url)
	code, out := d.post(t, "/v1/chat/completions", handoffChat(randomPNG(t, 41), "What is it?", ""))
	require.Equal(t, 200, code, "%v", out)
	var sent struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	require.NoError(t, json.Unmarshal(eng.last(t, true), &sent))
	var parts []map[string]any
	require.NoError(t, json.Unmarshal(sent.Messages[1].Content, &parts))
	require.Regexp(t, hex64, parts[0]["uuid"])
	st := d.svc.FeatureStats()
	require.Zero(t, st.Misses+st.Hits, "nothing encoded")
	require.Greater(t, promptTokens(t, out), 40, "the picture counted in the prompt all the same")

	code, out = d.post(t, "/v1/pretokenized", map[string]any{"token_ids": []int32{d.svc.Tokenizer().Placeholders().Image, 5},
		"media": []any{map[string]any{"modality": "image", "url": randomPNG(t, 42)}}, "max_tokens": 1})
	require.Equal(t, 400, code, "%v", out)
	msg, param := apiError(t, out)
	require.Equal(t, "media[0]", param)
	require.Contains(t, msg, "chat")
	code, out = d.post(t, "/v1/chat/completions", chatBody(1, map[string]any{"type": "video", "video": []string{randomPNG(t, 43)}}))
	require.Equal(t, 400, code, "%v", out)
	msg, param = apiError(t, out)
	require.Equal(t, "messages[0].content[0]", param)
	require.Contains(t, msg, "pictures")
}

// --handoff tokens with a checkpoint's processor files the CPU encoders cannot run (Qwen2-VL):
// the daemon only counts, so it starts, and counts each picture as vLLM will (1920x1080: 2,691
// tokens by the released preprocessor_config.json, where the class defaults gave 1,222; the
// value from media/hfproc/testdata/tokens.json, written from transformers' smart_resize).
func TestTokensHandoffCountsWithTheCheckpoint(t *testing.T) {
	_, url := startVLLMEngine(t, "")
	opts := dataplane.DefaultServiceOptions()
	opts.Features.Host.Capacity = 64 << 20
	opts.Log = slog.New(slog.DiscardHandler)
	opts.Handoff = "tokens"
	opts.Models.Processor = filepath.Join("..", "media", "hfproc", "testdata", "configs", "qwen2-vl-7b-instruct")
	svc, err := dataplane.NewService(opts)
	require.NoError(t, err)
	w, err := worker.NewHTTP(worker.HTTPOptions{BaseURL: url, Label: "worker 0", Handoff: mustHandoff(t, "tokens")})
	require.NoError(t, err)
	_, err = svc.AddWorker(w)
	require.NoError(t, err)
	d := &testDaemon{svc: svc, base: serveService(t, svc, DefaultOptions())}
	require.Equal(t, "qwen2-vl", svc.Models().VisionPreset.Picture.Family.String())

	picture := func(w, h int) string {
		var b bytes.Buffer
		require.NoError(t, png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))))
		return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
	}
	count := func(w, h int) int {
		code, out := d.post(t, "/v1/chat/completions", handoffChat(picture(w, h), "What is it?", ""))
		require.Equal(t, 200, code, "%v", out)
		return promptTokens(t, out)
	}
	small, hd := count(28, 28), count(1920, 1080)
	require.Equal(t, 2691-4, hd-small, "1920x1080 is 2,691 tokens, 28x28 is 4")
	require.Zero(t, svc.FeatureStats().Misses, "nothing encoded")

	// Without the tokens hand-off the same files stop the start: the CPU encoders would count
	// other tokens than the engine.
	opts.Handoff = ""
	_, err = dataplane.NewService(opts)
	require.ErrorIs(t, err, dataplane.ErrModels)
}
