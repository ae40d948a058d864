package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startFleetRouter runs `dataplane router` with NATS (embedded when url is "", in dir) and
// returns its API address and NATS URL.
func startFleetRouter(t *testing.T, url, dir string, extra ...string) (addr, natsURL string, stop func()) {
	t.Helper()
	args := []string{"router", "--listen", "127.0.0.1:0", "--lease", "3s"}
	var res []*regexp.Regexp
	if url == "" {
		args = append(args, "--nats", "embedded", "--nats-listen", "127.0.0.1:0", "--state-dir", dir)
		res = append(res, regexp.MustCompile(`msg="embedded nats" url=(nats://127\.0\.0\.1:\d+)`))
	} else {
		args = append(args, "--nats", url)
	}
	res = append(res, regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`), regexp.MustCompile(`msg=fleet `))
	m, stop := startCommand(t, append(args, extra...), res...)
	if url == "" {
		return m[1][1], m[0][1], stop
	}
	return m[0][1], url, stop
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if v != nil && resp.StatusCode == 200 {
		require.NoError(t, json.Unmarshal(raw, v), string(raw))
	}
	return resp.StatusCode
}

// overlaps asks a router where a prompt is cached: worker → cached blocks.
func overlaps(t *testing.T, addr string, prompt []int) map[string]int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"token_ids": prompt})
	resp, err := http.Post("http://"+addr+"/v1/route", "application/json", strings.NewReader(string(body)))
	require.NoError(t, err)
	defer resp.Body.Close()
	var d struct {
		Scores []struct {
			Worker  string `json:"worker"`
			Overlap int    `json:"overlap_blocks"`
		} `json:"scores"`
	}
	if resp.StatusCode != 200 {
		return nil
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&d))
	out := map[string]int{}
	for _, s := range d.Scores {
		out[s.Worker] = s.Overlap
	}
	return out
}

// A router with an embedded NATS server finds a mock fleet that announces itself there, with
// no worker list; the engines' KV events reach it through the stream; a second replica that
// starts later replays the stream to the same view; when the fleet stops, its engines leave
// both replicas.
func TestRouterFleet(t *testing.T) {
	addr, url, stopRouter := startFleetRouter(t, "", t.TempDir())
	defer stopRouter()
	m, stopMock := startCommand(t, []string{"mock", "--engines", "2", "--listen", "127.0.0.1:0", "--kv-events", "nats",
		"--nats", url, "--speedup", "10", "--labels", "zone=a"}, regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`))
	mockAddr := m[0][1]

	var workers []struct {
		Name     string            `json:"name"`
		Endpoint string            `json:"endpoint"`
		Labels   map[string]string `json:"labels"`
		KVBlocks int               `json:"kv_blocks"`
	}
	require.Eventually(t, func() bool { return getJSON(t, "http://"+addr+"/v1/fleet", &workers) == 200 && len(workers) == 2 },
		5*time.Second, 10*time.Millisecond)
	require.Equal(t, "mock-1", workers[1].Name)
	require.Equal(t, "http://"+mockAddr+"/engines/1", workers[1].Endpoint)
	require.Equal(t, "a", workers[1].Labels["zone"])
	require.Positive(t, workers[1].KVBlocks)
	require.Equal(t, 200, getJSON(t, "http://"+addr+"/readyz", nil))

	prompt := make([]int, 64)
	for i := range prompt {
		prompt[i] = 1000 + i
	}
	raw, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 2})
	resp, err := http.Post(workers[1].Endpoint+"/v1/completions", "application/json", strings.NewReader(string(raw)))
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	require.Eventually(t, func() bool { return overlaps(t, addr, prompt)["mock-1"] == 4 }, 5*time.Second, 10*time.Millisecond,
		"the 4 full blocks of the prompt, from mock-1's events in the stream")

	// A replica that starts now replays the stream to the same answer.
	addr2, _, stopRouter2 := startFleetRouter(t, url, "")
	defer stopRouter2()
	require.Eventually(t, func() bool { return getJSON(t, "http://"+addr2+"/readyz", nil) == 200 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, overlaps(t, addr, prompt), overlaps(t, addr2, prompt))

	stopMock() // withdraws its engines: both replicas drop them at once
	for _, a := range []string{addr, addr2} {
		require.Eventually(t, func() bool { return getJSON(t, "http://"+a+"/v1/fleet", &workers) == 200 && len(workers) == 0 },
			2*time.Second, 10*time.Millisecond)
		var snap []map[string]any
		require.Equal(t, 200, getJSON(t, "http://"+a+"/v1/workers", &snap))
		require.Empty(t, snap, fmt.Sprint(snap))
	}
}

// metricValue reads one sample from a Prometheus page: the line that starts with prefix.
func metricValue(t *testing.T, url, prefix string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, prefix+" "); ok {
			return v
		}
	}
	return ""
}

// `dataplane relay` puts a vLLM-style engine (a mock engine publishing over ZMQ with replay)
// into the fleet: announced with its capacity from the engine's /metrics, its batches in the
// stream; restarted while the engine goes on, it resumes after the stream's last batch and
// fills the rest from the engine's replay, so the router sees no gap and no restart.
func TestRelayCommand(t *testing.T) {
	addr, url, stopRouter := startFleetRouter(t, "", t.TempDir())
	defer stopRouter()
	mockAddr, engines, stopMock := startMockEngines(t, 1, 10)
	defer stopMock()
	vllm := httptestMetrics(t, `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1
`)
	relayArgs := []string{"relay", "--kv-events", engines[0].Events, "--kv-replay", engines[0].Replay, "--worker", "vllm-a",
		"--endpoint", vllm, "--model", "m", "--nats", url, "--metrics-every", "50ms"}
	_, stopRelay := startCommand(t, relayArgs, regexp.MustCompile(`msg="dataplane relay starting"`))

	var workers []struct {
		Name     string `json:"name"`
		KVBlocks int    `json:"kv_blocks"`
		Load     *struct {
			Running      int `json:"running"`
			ActiveBlocks int `json:"active_blocks"`
		} `json:"load"`
	}
	require.Eventually(t, func() bool {
		return getJSON(t, "http://"+addr+"/v1/fleet", &workers) == 200 && len(workers) == 1 && workers[0].KVBlocks == 1000
	}, 5*time.Second, 10*time.Millisecond, "%+v", &workers)
	complete := func(first int) []int {
		prompt := make([]int, 64)
		for i := range prompt {
			prompt[i] = first + i
		}
		raw, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 2})
		resp, err := http.Post("http://"+mockAddr+"/engines/0/v1/completions", "application/json", strings.NewReader(string(raw)))
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		return prompt
	}
	p1 := complete(1000)
	require.Eventually(t, func() bool { return overlaps(t, addr, p1)["vllm-a"] == 4 }, 5*time.Second, 10*time.Millisecond)

	stopRelay()
	p2 := complete(5000) // while no relay runs: the engine keeps it for replay
	_, stopRelay = startCommand(t, relayArgs, regexp.MustCompile(`msg="dataplane relay starting".* resume_after=\d+`))
	defer stopRelay()
	require.Eventually(t, func() bool { return overlaps(t, addr, p2)["vllm-a"] == 4 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 4, overlaps(t, addr, p1)["vllm-a"])
	for _, incident := range []string{"gap", "restart", "duplicate", "unrecoverable_gap"} {
		require.Equal(t, "0", metricValue(t, "http://"+addr+"/metrics", `dataplane_router_kv_stream_total{incident="`+incident+`"}`), incident)
	}
	require.Eventually(t, func() bool {
		return getJSON(t, "http://"+addr+"/v1/fleet", &workers) == 200 && len(workers) == 1 && workers[0].Load != nil &&
			workers[0].Load.Running == 3 && workers[0].Load.ActiveBlocks == 250
	}, 5*time.Second, 10*time.Millisecond, "the load from the engine's /metrics: 3 running, a quarter of 1,000 blocks")
	// The router counts the reported load (no request of its own went there).
	var snap []struct {
		Worker    string `json:"worker"`
		Effective *struct {
			ActiveBlocks  int `json:"active_blocks"`
			PrefillTokens int `json:"prefill_tokens"`
			Requests      int `json:"requests"`
		} `json:"effective"`
	}
	require.Eventually(t, func() bool {
		return getJSON(t, "http://"+addr+"/v1/workers", &snap) == 200 && len(snap) == 1 && snap[0].Effective != nil
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 250, snap[0].Effective.ActiveBlocks)
	require.Equal(t, 4, snap[0].Effective.Requests)
	require.Equal(t, 0, snap[0].Effective.PrefillTokens, "vLLM does not export it: the router's own count")
}

// httptestMetrics serves page as a /metrics endpoint and returns the base URL.
func httptestMetrics(t *testing.T, page string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		io.WriteString(w, page) //nolint:errcheck
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// `bench load --router` drives a trace through two router replicas to the mock engines they
// found: every request is routed, completed on the chosen engine and finished at the router
// that routed it; both replicas then hold the same view of the engines' caches.
func TestBenchLoadThroughRouters(t *testing.T) {
	trace := synthTrace(t, "--requests", "60", "--seed", "5", "--speedup-ratio", "20", "--osl-multiplier", "0.1")
	addr, url, stopRouter := startFleetRouter(t, "", t.TempDir())
	defer stopRouter()
	addr2, _, stopRouter2 := startFleetRouter(t, url, "")
	defer stopRouter2()
	_, stopMock := startCommand(t, []string{"mock", "--engines", "3", "--listen", "127.0.0.1:0", "--kv-events", "nats",
		"--nats", url, "--speedup", "50"}, regexp.MustCompile(`msg=announcing`))
	defer stopMock()
	for _, a := range []string{addr, addr2} {
		var workers []map[string]any
		require.Eventually(t, func() bool { return getJSON(t, "http://"+a+"/v1/fleet", &workers) == 200 && len(workers) == 3 },
			5*time.Second, 10*time.Millisecond)
	}
	out := runBench(t, "load", "--router", "http://"+addr+",http://"+addr2, "--trace", trace, "--speedup", "5")
	require.Contains(t, out, "requests 60: 60 completed, 0 failed")
	for _, a := range []string{addr, addr2} {
		require.Equal(t, "30", metricValue(t, "http://"+a+"/metrics", "dataplane_router_decisions_total"))
		require.Equal(t, "0", metricValue(t, "http://"+a+"/metrics", "dataplane_router_requests_in_flight"), "every request finished")
	}
	// Both replicas applied the same stream: the same cached blocks per engine.
	blocks := func(a string) map[string]string {
		out := map[string]string{}
		for _, w := range []string{"mock-0", "mock-1", "mock-2"} {
			out[w] = metricValue(t, "http://"+a+"/metrics", `dataplane_router_worker_cached_blocks{tier="0",worker="`+w+`"}`)
		}
		return out
	}
	require.Eventually(t, func() bool { return fmt.Sprint(blocks(addr)) == fmt.Sprint(blocks(addr2)) }, 5*time.Second, 20*time.Millisecond,
		"%v %v", blocks(addr), blocks(addr2))
	require.NotEqual(t, "0", blocks(addr)["mock-0"])
}

// serve with its embedded NATS server announces itself as an encoder; a router joining that
// server lists it (and, routing to LLM roles only, does not route to it).
func TestServeAnnouncesItself(t *testing.T) {
	m, stop := startCommand(t, []string{"serve", "--listen", "127.0.0.1:0", "--nats", "embedded", "--nats-listen", "127.0.0.1:0",
		"--state-dir", t.TempDir(), "--fleet-name", "node-1", "--labels", "zone=a"},
		regexp.MustCompile(`msg="dataplane starting".* listen=(127\.0\.0\.1:\d+)`),
		regexp.MustCompile(`msg="embedded nats" url=(nats://127\.0\.0\.1:\d+)`), regexp.MustCompile(`msg=fleet `))
	serveAddr, url := m[0][1], m[1][1]
	addr, _, stopRouter := startFleetRouter(t, url, "")
	defer stopRouter()
	var workers []struct {
		Name     string            `json:"name"`
		Role     string            `json:"role"`
		Endpoint string            `json:"endpoint"`
		Labels   map[string]string `json:"labels"`
	}
	require.Eventually(t, func() bool { return getJSON(t, "http://"+addr+"/v1/fleet", &workers) == 200 && len(workers) == 1 },
		5*time.Second, 10*time.Millisecond)
	require.Equal(t, "node-1", workers[0].Name)
	require.Equal(t, "encoder", workers[0].Role)
	require.Equal(t, "http://"+serveAddr, workers[0].Endpoint)
	require.Equal(t, "a", workers[0].Labels["zone"])
	var snap []map[string]any
	require.Equal(t, 200, getJSON(t, "http://"+addr+"/v1/workers", &snap))
	require.Empty(t, snap, "an encoder is not an LLM worker the router routes to")
	// Withdrawn when serve stops: by its delete, when serve's embedded NATS server delivers it
	// before stopping (about half the stops under -race; then in well under a second), else
	// when its lease runs out by the router's clock (--lease 3s after the last renewal: ~5 s).
	stop()
	require.Eventually(t, func() bool { return getJSON(t, "http://"+addr+"/v1/fleet", &workers) == 200 && len(workers) == 0 },
		10*time.Second, 10*time.Millisecond, "withdrawn when serve stops")
}

// serve --workers fleet routes to the aggregated workers announced on NATS, with their KV
// events from the stream: a prompt a mock engine computed is routed back to it with its blocks
// counted as cached; when the mock fleet stops, its engines leave serve's routing and serve is
// no longer ready.
func TestServeRoutesToTheFleet(t *testing.T) {
	m, stop := startCommand(t, []string{"serve", "--listen", "127.0.0.1:0", "--workers", "fleet", "--nats", "embedded",
		"--nats-listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--lease", "3s"},
		regexp.MustCompile(`msg="dataplane starting".* listen=(127\.0\.0\.1:\d+)`),
		regexp.MustCompile(`msg="embedded nats" url=(nats://127\.0\.0\.1:\d+)`), regexp.MustCompile(`msg=fleet .*bucket=`))
	defer stop()
	base, url := "http://"+m[0][1], m[1][1]
	require.Equal(t, 503, getJSON(t, base+"/readyz", nil), "no worker announced yet")

	_, stopMock := startCommand(t, []string{"mock", "--engines", "2", "--listen", "127.0.0.1:0", "--kv-events", "nats",
		"--nats", url, "--speedup", "20"}, regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`))
	defer stopMock()
	require.Eventually(t, func() bool { return getJSON(t, base+"/readyz", nil) == 200 }, 5*time.Second, 10*time.Millisecond)

	prompt := make([]int, 80)
	for i := range prompt {
		prompt[i] = 2000 + i
	}
	body, _ := json.Marshal(map[string]any{"model": "dataplane-demo", "prompt": prompt, "max_tokens": 2})
	code, out := postJSON(t, base+"/v1/completions", body)
	require.Equal(t, 200, code, "%v", out)
	first := route(t, base)
	require.Regexp(t, `^mock-[01]$`, first.Worker)
	require.Eventually(t, func() bool {
		code, _ := postJSON(t, base+"/v1/completions", body)
		require.Equal(t, 200, code)
		again := route(t, base)
		for _, s := range again.Scores {
			if s.Worker == first.Worker && s.Overlap == 5 {
				return again.Worker == first.Worker
			}
		}
		return false
	}, 5*time.Second, 50*time.Millisecond, "the prompt's 5 blocks, from the engine's events in the stream, route it back")
	require.Equal(t, "2", metricValue(t, base+"/metrics", "dataplane_router_fleet_workers"))

	stopMock() // withdraws its engines
	require.Eventually(t, func() bool { return getJSON(t, base+"/readyz", nil) == 503 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, "0", metricValue(t, base+"/metrics", "dataplane_router_fleet_workers"))
	code, out = postJSON(t, base+"/v1/completions", body)
	require.Equal(t, 503, code, "%v", out)
}
