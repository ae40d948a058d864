package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startServe runs `dataplane serve` in-process with args added to its embedded defaults
// (demo models, the mock:4 fleet); it returns the base URL and the curl line it printed.
func startServe(t testing.TB, args ...string) (base, curl string) {
	t.Helper()
	m, _ := startCommand(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--log-level", "warn"}, args...),
		regexp.MustCompile(`^curl -s (http://[0-9.:]+)/v1/chat/completions -H 'Content-Type: application/json' -d '(.*)'$`))
	return m[0][1], m[0][0]
}

func postJSON(t testing.TB, url string, body []byte) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	return resp.StatusCode, out
}

// `make run`'s daemon: the curl line it prints (a picture and a question) is answered by the
// mock fleet; the fleet's KV events reach the router, so the same prompt again is routed to
// the engine that holds it, with its blocks counted as cached.
func TestServeDefaultsWithMockFleet(t *testing.T) {
	base, curl := startServe(t, "--mock-speedup", "20")
	body := []byte(curl[strings.Index(curl, "-d '")+4 : len(curl)-1])
	code, out := postJSON(t, base+"/v1/chat/completions", body)
	require.Equal(t, 200, code, "%v", out)
	msg := out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
	require.Len(t, strings.Fields(msg), 16, "max_tokens words from the mock engine: %q", msg)
	usage := out["usage"].(map[string]any)
	require.Equal(t, float64(16), usage["completion_tokens"])
	require.Greater(t, usage["prompt_tokens"].(float64), float64(256), "the picture's placeholder tokens are in the prompt")

	first := route(t, base)
	require.Regexp(t, `^mock-[0-3]$`, first.Worker)
	require.Eventually(t, func() bool {
		code, _ := postJSON(t, base+"/v1/chat/completions", body)
		require.Equal(t, 200, code)
		again := route(t, base)
		for _, s := range again.Scores {
			if s.Worker == first.Worker && s.Overlap > 0 && again.Worker == first.Worker {
				return true
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond, "the engine's KV events reached the router")
	code, out = postJSON(t, base+"/v1/chat/completions", body)
	require.Equal(t, 200, code)
	details, _ := out["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any)
	require.NotNil(t, details, "usage says what the engine had cached: %v", out["usage"])
	require.Greater(t, details["cached_tokens"].(float64), float64(256), "the engine found the prompt, picture included, in its cache")

	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(metrics), `dataplane_requests_total{endpoint="chat",outcome="ok"}`)
	require.Regexp(t, `dataplane_router_kv_blocks_total\{op="stored"\} [1-9]`, string(metrics))
}

// The in-process mock engines honour max_tokens and seed; a field they cannot honour is a 400
// naming it, before any work is done; the client's X-Request-Id is echoed and names the
// routing decision.
func TestServeMockFleetHonoursOrRefuses(t *testing.T) {
	base, _ := startServe(t, "--mock-speedup", "20")
	chat := func(fields, id string) (int, http.Header, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"messages":[{"role":"user","content":"hello there"}],"max_tokens":5`+fields+`}`))
		require.NoError(t, err)
		if id != "" {
			req.Header.Set("X-Request-Id", id)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, resp.Header, out
	}
	for _, c := range []struct{ fields, param string }{
		{`,"temperature":0.5`, "temperature"},
		{`,"logprobs":true`, "logprobs"},
		{`,"stop":["\n"]`, "stop"},
		{`,"response_format":{"type":"json_object"}`, "response_format"},
		{`,"presence_penalty":1`, "presence_penalty"},
	} {
		code, _, out := chat(c.fields, "")
		require.Equal(t, 400, code, "%s: %v", c.fields, out)
		e := out["error"].(map[string]any)
		require.Equal(t, c.param, e["param"])
		require.Contains(t, e["message"], "generates placeholder tokens and cannot honour "+c.param)
	}
	text := func(out map[string]any) string {
		return out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
	}
	code, hdr, a := chat(`,"seed":7,"temperature":1,"ignore_eos":true`, "seeded-1")
	require.Equal(t, 200, code, "%v", a)
	require.Equal(t, "seeded-1", hdr.Get("X-Request-Id"))
	resp, err := http.Get(base + "/debug/route?request_id=seeded-1")
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	resp.Body.Close()
	code, _, b := chat(`,"seed":7`, "seeded-1")
	require.Equal(t, 200, code, "%v", b)
	require.Equal(t, text(a), text(b), "the same seed, the same tokens, whichever engine")
}

type routed struct {
	Worker string `json:"worker"`
	Scores []struct {
		Worker  string `json:"worker"`
		Overlap int    `json:"overlap_blocks"`
	} `json:"scores"`
}

func route(t testing.TB, base string) routed {
	t.Helper()
	resp, err := http.Get(base + "/debug/route")
	require.NoError(t, err)
	defer resp.Body.Close()
	var d struct {
		Decision routed `json:"decision"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&d))
	return d.Decision
}

// Bad worker specifications stop serve with a usage error naming the flag.
func TestServeWorkerFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--workers", "mock:0"},
		{"--workers", "mock:x"},
		{"--workers", "mock:2,http://127.0.0.1:1"},
		{"--workers", "ftp://x"},
		{"--mock-speedup", "0"},
		{"--kv-events", "tcp://127.0.0.1:5557"},
		{"--workers", "http://127.0.0.1:1,http://127.0.0.1:2", "--kv-events", "tcp://127.0.0.1:5557"},
		{"--handoff", "ec", "--ec-dir", "/tmp/ec"}, // mock engines take requests in-process
		{"--workers", "http://127.0.0.1:1", "--handoff", "ec"},
		{"--workers", "http://127.0.0.1:1", "--handoff", "kv"},
		{"--workers", "http://127.0.0.1:1", "--ec-dir", "/tmp/ec"},
		{"--workers", "fleet", "--nats", "none"},
		{"--workers", "fleet,http://127.0.0.1:1"},
		{"--workers", "fleet", "--kv-events", "tcp://127.0.0.1:5557"},
		{"--fleet-model", "m"}, // only with --workers fleet
	} {
		var stderr bytes.Buffer
		code := run(context.Background(), append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), io.Discard, &stderr)
		require.NotEqual(t, 0, code, "%v", args)
		require.Regexp(t, `--(workers|mock-speedup|kv-events|handoff|ec-dir|fleet-model)`, stderr.String(), "%v", args)
	}
}

// SIGTERM drains within --shutdown-timeout in all: streams still running when it runs out end
// with an SSE error event, and the drain, having ended everything, exits 0 (it used to take
// twice the timeout, the HTTP server's and then the service's, and exit 1).
func TestServeDrainEndsStreamsWithinTheTimeout(t *testing.T) {
	m, stop := startCommand(t, []string{"serve", "--listen", "127.0.0.1:0", "--shutdown-timeout", "3s", "--workers", "mock:2"},
		regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`), regexp.MustCompile(`msg=models `))
	base := "http://" + m[0][1]
	const streams = 20
	ends := make(chan string, streams)
	started := make(chan struct{}, streams)
	for range streams {
		go func() {
			body := `{"max_tokens":30000,"stream":true,"messages":[{"role":"user","content":"count to a million"}]}`
			resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				ends <- "post: " + err.Error()
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			last, signalled := "", false
			for sc.Scan() {
				if line := sc.Text(); line != "" {
					last = line
					if !signalled {
						signalled = true
						started <- struct{}{}
					}
				}
			}
			ends <- last
		}()
	}
	for range streams {
		select {
		case <-started:
		case <-time.After(30 * time.Second):
			t.Fatal("the streams did not start")
		}
	}
	t0 := time.Now()
	stop() // exits 0, or the test fails
	took := time.Since(t0)
	require.Less(t, took, 3*time.Second+time.Second, "the drain took %v for --shutdown-timeout 3s", took)
	for range streams {
		last := <-ends
		require.Contains(t, last, `data: {"error":`, "a cut stream's last event")
		require.Contains(t, last, "shutting down")
	}
}

// Connections that send their headers a byte at a time can take every one of --max-conns;
// probes and metrics still answer on --admin-listen (on the API listener the orchestrator
// would see a 503 and kill a healthy daemon).
func TestAdminListenerAnswersWhenConnectionsRunOut(t *testing.T) {
	m, _ := startCommand(t, []string{"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--max-conns", "4",
		"--header-timeout", "30s"}, regexp.MustCompile(`listen=(127\.0\.0\.1:\d+) admin_listen=(127\.0\.0\.1:\d+)`))
	api, admin := m[0][1], m[0][2]
	for range 4 {
		c, err := net.Dial("tcp", api)
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Write([]byte("GET /healthz HTTP/1.1\r\nHo"))
		require.NoError(t, err)
	}
	time.Sleep(200 * time.Millisecond)
	client := &http.Client{Timeout: 5 * time.Second}
	if resp, err := client.Get("http://" + api + "/healthz"); err == nil {
		resp.Body.Close()
		require.NotEqual(t, 200, resp.StatusCode, "the API listener had a connection to spare")
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := client.Get("http://" + admin + path)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, "%s: %s", path, body)
	}
	resp, err := client.Get("http://" + admin + "/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 404, resp.StatusCode, "the admin listener serves no API")
}
