package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// serve --warmup-min-tokens in front of mock engines (EC consumers, as vLLM with its
// shared-storage connector): a chat whose picture must encode sends its worker the text before
// the picture as a 1-token completion while the picture encodes, so the chat itself, on a
// fresh engine, finds that prefix's full blocks cached (the engine's usage says so). A chat
// whose text before the picture is under the minimum gets none, and finds nothing cached.
func TestServeWarmsPrefixWhileEncoding(t *testing.T) {
	ecDir := filepath.Join(t.TempDir(), "ec")
	require.NoError(t, os.MkdirAll(ecDir, 0o755))
	addr, engines, _ := startMockEngines(t, 1, 50, "--ec-dir", ecDir)
	url := fmt.Sprintf("http://%s/engines/0", addr)
	sm, _ := startCommand(t, []string{"serve", "--listen", "127.0.0.1:0", "--log-level", "info", "--no-audio",
		"--workers", url, "--handoff", "ec", "--ec-dir", ecDir, "--warmup-min-tokens", "40",
		"--kv-events", engines[0].Events, "--kv-replay", engines[0].Replay},
		regexp.MustCompile(`^curl -s (http://[0-9.:]+)/v1/chat/completions`))
	base := sm[0][1]
	chat := func(system string, step int) (int, map[string]any) {
		b, err := json.Marshal(map[string]any{"max_tokens": 1, "cache_policy": "keep", "messages": []any{
			map[string]any{"role": "system", "content": system},
			map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "image_url", "image_url": map[string]any{"url": ecTestPNG(t, step)}},
				map[string]any{"type": "text", "text": "What is in this picture?"}}}}})
		require.NoError(t, err)
		return postJSON(t, base+"/v1/chat/completions", b)
	}
	cached := func(out map[string]any) int {
		usage, _ := out["usage"].(map[string]any)
		details, _ := usage["prompt_tokens_details"].(map[string]any)
		v, _ := details["cached_tokens"].(float64)
		return int(v)
	}
	long := "You describe pictures for people who cannot see them: say what is there, where it is, " +
		"its colours and its size, briefly and plainly, in short sentences, and say only what you are sure of."
	code, out := chat(long, 13)
	require.Equal(t, 200, code, "%v", out)
	t.Logf("prompt tokens cached on a fresh engine: %d", cached(out))
	require.GreaterOrEqual(t, cached(out), 32, "the warm-up's blocks (16 tokens each) were there before the chat")
	require.Less(t, cached(out), 120, "only the text before the picture")
	require.Equal(t, "1", metricValue(t, base+"/metrics", "dataplane_warmup_sent_total"))

	code, out = chat("Be brief.", 17)
	require.Equal(t, 200, code, "%v", out)
	require.Equal(t, "1", metricValue(t, base+"/metrics", `dataplane_warmup_skipped_total{reason="short"}`))
	require.Equal(t, "1", metricValue(t, base+"/metrics", "dataplane_warmup_sent_total"))
	require.Zero(t, cached(out), "no warm-up, nothing cached")
	require.Equal(t, "0", metricValue(t, base+"/metrics", "dataplane_warmup_failed_total"))

	// The same picture again: nothing encodes, nothing to overlap. The long text with a new
	// picture, once the engine's events have told the router: the prefix is there already.
	code, out = chat(long, 13)
	require.Equal(t, 200, code, "%v", out)
	require.Equal(t, "1", metricValue(t, base+"/metrics", `dataplane_warmup_skipped_total{reason="reused"}`))
	step := 19
	require.Eventually(t, func() bool {
		step += 2
		code, out := chat(long, step)
		require.Equal(t, 200, code, "%v", out)
		return metricValue(t, base+"/metrics", `dataplane_warmup_skipped_total{reason="cached"}`) == "1"
	}, 10*time.Second, 20*time.Millisecond)
}
