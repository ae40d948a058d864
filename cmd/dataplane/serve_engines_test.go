package main

import (
	"fmt"
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
