package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// serve in front of OpenAI-compatible engines that publish vLLM KV events: `dataplane mock`
// stands in for two vLLM engines (HTTP completions, ZMQ PUB + replay), serve gets them the way
// a user points it at vLLM (--workers, --kv-events, --kv-replay). The engines' events reach
// serve's router over ZMQ, so the same prompt again goes to the engine that holds it, counted
// as cached there, and the engine confirms the hit in its usage.
func TestServeWithHTTPEnginesAndKVEvents(t *testing.T) {
	addr, engines, _ := startMockEngines(t, 2, 20)
	urls := []string{fmt.Sprintf("http://%s/engines/0", addr), fmt.Sprintf("http://%s/engines/1", addr)}

	sm, _ := startCommand(t, []string{"serve", "--listen", "127.0.0.1:0", "--log-level", "info", "--no-audio",
		"--workers", strings.Join(urls, ","),
		"--kv-events", engines[0].Events + "," + engines[1].Events,
		"--kv-replay", engines[0].Replay + "," + engines[1].Replay},
		regexp.MustCompile(`^curl -s (http://[0-9.:]+)/v1/chat/completions`))
	base := sm[0][1]

	ids := make([]string, 160) // 10 blocks of 16 tokens
	for i := range ids {
		ids[i] = fmt.Sprint(100 + i)
	}
	body := []byte(`{"prompt": [` + strings.Join(ids, ",") + `], "max_tokens": 4}`)
	code, out := postJSON(t, base+"/v1/completions", body)
	require.Equal(t, 200, code, "%v", out)
	require.Len(t, strings.Fields(out["choices"].([]any)[0].(map[string]any)["text"].(string)), 4)
	first := route(t, base)
	require.Contains(t, urls, first.Worker)

	require.Eventually(t, func() bool {
		for _, s := range route(t, base).Scores {
			if s.Worker == first.Worker && s.Overlap == 10 {
				return true
			}
		}
		code, _ := postJSON(t, base+"/v1/completions", body) // route again to refresh the explanation
		require.Equal(t, 200, code)
		return false
	}, 15*time.Second, 50*time.Millisecond, "the engine's KV events reached serve's router over ZMQ")
	code, out = postJSON(t, base+"/v1/completions", body)
	require.Equal(t, 200, code, "%v", out)
	again := route(t, base)
	require.Equal(t, first.Worker, again.Worker, "the prompt goes where its blocks are")
	details, _ := out["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any)
	require.NotNil(t, details, "%v", out["usage"])
	// As vLLM does, the engine computes at least the prompt's last token, so its last full block
	// is not taken from the cache: 9 of the 10 blocks are.
	require.Equal(t, float64(144), details["cached_tokens"], "the engine found the prompt cached")

	// serve forwards the sampling fields; an engine that cannot honour one (the mock: temperature)
	// refuses it, and its 400 is the client's, naming the field.
	code, out = postJSON(t, base+"/v1/completions", []byte(`{"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0.5}`))
	require.Equal(t, 400, code, "%v", out)
	e := out["error"].(map[string]any)
	require.Equal(t, "temperature", e["param"])
	require.Contains(t, e["message"], "the LLM worker refused the request: temperature: the mock engine")
	code, out = postJSON(t, base+"/v1/completions", []byte(`{"prompt": [1, 2, 3], "max_tokens": 2, "seed": 5}`))
	require.Equal(t, 200, code, "%v", out)
}

// serve --handoff ec in front of mock engines that are vLLM EC consumers (`dataplane mock
// --ec-dir`): each picture's features are written where vLLM's shared-storage connector looks,
// the chat goes with the item's name as its uuid, and the engines read every file as the
// connector does (a missing or unreadable one fails the request). Their KV events carry the
// chat's token ids and the item's name, so the same conversation's next turn goes where its
// blocks are, and the engine finds them cached. A daemon writing elsewhere leaves the engines
// without their files: every request fails.
func TestServeECHandoffWithMockEngines(t *testing.T) {
	ecDir := filepath.Join(t.TempDir(), "ec")
	require.NoError(t, os.MkdirAll(ecDir, 0o755))
	addr, engines, _ := startMockEngines(t, 2, 20, "--ec-dir", ecDir)
	urls := []string{fmt.Sprintf("http://%s/engines/0", addr), fmt.Sprintf("http://%s/engines/1", addr)}
	sm, _ := startCommand(t, []string{"serve", "--listen", "127.0.0.1:0", "--log-level", "info", "--no-audio",
		"--workers", strings.Join(urls, ","), "--handoff", "ec", "--ec-dir", ecDir,
		"--kv-events", engines[0].Events + "," + engines[1].Events,
		"--kv-replay", engines[0].Replay + "," + engines[1].Replay},
		regexp.MustCompile(`^curl -s (http://[0-9.:]+)/v1/chat/completions`))
	base := sm[0][1]

	img := ecTestPNG(t, 7)
	chat := func(question string) []byte {
		b, err := json.Marshal(map[string]any{"max_tokens": 2, "cache_policy": "keep", "messages": []any{
			map[string]any{"role": "system", "content": "You describe pictures for people who cannot see them, briefly and plainly, and say only what you are sure of."},
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "image_url", "image_url": map[string]any{"url": img}},
				map[string]any{"type": "text", "text": question}}}}})
		require.NoError(t, err)
		return b
	}
	code, out := postJSON(t, base+"/v1/chat/completions", chat("What is in this picture?"))
	require.Equal(t, 200, code, "%v", out)
	first := route(t, base)
	require.Contains(t, urls, first.Worker)
	ents, err := os.ReadDir(ecDir)
	require.NoError(t, err)
	require.Len(t, ents, 1, "one picture, one EC item (kept for reuse)")
	st, err := os.Stat(filepath.Join(ecDir, ents[0].Name(), "encoder_cache.safetensors"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), st.Mode().Perm(), "readable by an engine running as another user")

	next := chat("And which colours are there?")
	require.Eventually(t, func() bool {
		code, out := postJSON(t, base+"/v1/chat/completions", next)
		require.Equal(t, 200, code, "%v", out)
		again := route(t, base)
		for _, s := range again.Scores {
			if s.Worker == first.Worker && s.Overlap >= 4 && again.Worker == first.Worker {
				details, _ := out["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any)
				return details != nil && details["cached_tokens"].(float64) >= 64
			}
		}
		return false
	}, 15*time.Second, 50*time.Millisecond, "the next turn goes where the picture's blocks are, and they are cached there")

	// A daemon that writes its files elsewhere: the engines find nothing and fail.
	other := filepath.Join(t.TempDir(), "elsewhere")
	sm2, _ := startCommand(t, []string{"serve", "--listen", "127.0.0.1:0", "--log-level", "info", "--no-audio",
		"--workers", strings.Join(urls, ","), "--handoff", "ec", "--ec-dir", other},
		regexp.MustCompile(`^curl -s (http://[0-9.:]+)/v1/chat/completions`))
	img = ecTestPNG(t, 11) // a picture the first daemon never wrote
	code, out = postJSON(t, sm2[0][1]+"/v1/chat/completions", chat("What is in this picture?"))
	require.Equal(t, 502, code, "%v", out)
	require.Contains(t, fmt.Sprint(out), "500", "the engine could not read the item")
}

// ecTestPNG is a 64×48 picture of stripes, as a data: URL.
func ecTestPNG(t *testing.T, step int) string {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 64, 48))
	for i := range img.Pix {
		img.Pix[i] = byte(i * step)
	}
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(buf.Bytes())
}
