package main

import (
	"bytes"
	"context"
	"dataplane/dataplane/planner"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

func TestPlanReplayCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "obs.jsonl")
	lines := []string{}
	for i := range 15 {
		kv := "0.95"
		if i >= 3 {
			kv = "0.2"
		}
		lines = append(lines, `{"t":`+strconv.Itoa(i)+`,"prefill_queue":0.3,"decode_kv":`+kv+`}`)
	}
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"plan", "replay", "--observations", path, "--adjustment-interval", "3",
		"--metric-pulling-interval", "1s", "--initial-prefill", "1", "--initial-decode", "1", "--decode-kv-scale-down-threshold", "0.3"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var s struct {
			T       float64
			Prefill int
			Decode  int
			Action  string
		}
		require.NoError(t, json.Unmarshal([]byte(l), &s))
		got = append(got, s.Action+" "+strconv.Itoa(s.Decode))
	}
	// The add at t=3, 3 intervals of grace, then the cold pool shrinks (the file's last pull,
	// t=14, is the last interval's last).
	require.Equal(t, []string{"decode+1 2", "hold 2", "hold 2", "hold 2", "decode-1 1"}, got)

	for args, want := range map[string]string{
		"plan replay": "--observations FILE is required",
		"plan replay --observations x --initial-decode -1":      "at least 0",
		"plan replay --observations x --max-gpu-budget 0":       "--max-gpu-budget",
		"plan replay --observations x --adjustment-interval 1x": "invalid value",
	} {
		stderr.Reset()
		require.Equal(t, 2, run(context.Background(), strings.Fields(args), &stdout, &stderr), args)
		require.Contains(t, stderr.String(), want, args)
	}
	stderr.Reset()
	require.Equal(t, 1, run(context.Background(), []string{"plan", "replay", "--observations", filepath.Join(t.TempDir(), "none")}, &stdout, &stderr))
}

// startMock runs `dataplane mock` in this process and returns its address.
func startMock(t *testing.T, args ...string) string {
	ctx, stop := context.WithCancel(context.Background())
	var logs lockedBuffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx, append([]string{"mock", "--listen", "127.0.0.1:0", "--stats-every", "0"}, args...), &bytes.Buffer{}, &logs)
	}()
	t.Cleanup(func() { stop(); <-done })
	listen := regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`)
	var addr string
	require.Eventually(t, func() bool {
		if m := listen.FindStringSubmatch(logs.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	}, 10*time.Second, 10*time.Millisecond)
	return addr
}

func TestPlanProfileOnAMock(t *testing.T) {
	addr := startMock(t, "--speedup", "10", "--kv-blocks", "4096")
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"plan", "profile", "--endpoint", "http://" + addr + "/engines/0", "--out", out,
		"--max-context-length", "2048", "--prefill-interpolation-granularity", "4", "--decode-interpolation-granularity", "2",
		"--concurrency", "1,8", "--repeats", "1", "--isl", "1000", "--osl", "16", "--ttft", "1000", "--itl", "100"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	for _, want := range []string{"Suggested prefill parallelism: 1 GPUs (TTFT ", "Suggested planner upper/lower bound for prefill queue size: ",
		"Suggested decode parallelism: 1 GPUs (ITL ", "Suggested planner upper/lower bound for decode kv cache utilization: "} {
		require.Contains(t, stdout.String(), want)
	}
	p, err := planner.LoadProfile(filepath.Join(out, "profile.json"))
	require.NoError(t, err)
	require.Equal(t, 4096*16, p.KVTokens, "from vllm:cache_config_info")
	require.Len(t, p.Prefill, 4)
	require.Len(t, p.Decode, 4)
	require.Greater(t, p.TTFT(2000), p.TTFT(100), "longer prompts take longer")
	for _, name := range []string{"prefill_ttft.png", "decode_itl.png"} {
		b, err := os.ReadFile(filepath.Join(out, name))
		require.NoError(t, err)
		require.Equal(t, "\x89PNG", string(b[:4]), name)
	}
	b, err := os.ReadFile(filepath.Join(out, "decode.csv"))
	require.NoError(t, err)
	require.Len(t, strings.Split(strings.TrimSpace(string(b)), "\n"), 5, "a header and 4 points")

	stderr.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"plan", "profile", "--endpoint", "x", "--concurrency", "0"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "--concurrency")
	stderr.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"plan", "--sla", filepath.Join(out, "none.json")}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "--sla")
}

// The mock engines serve vLLM's scheduler gauges (vllm/v1/metrics/loggers.py names and
// labels): what a planner reading engines' Prometheus pages sees.
func TestMockServesSchedulerGauges(t *testing.T) {
	addr := startMock(t, "--kv-blocks", "512")
	scrape := func() map[string]float64 {
		resp, err := http.Get("http://" + addr + "/engines/0/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		require.NoError(t, err)
		out := map[string]float64{}
		for name, f := range fams {
			m := f.GetMetric()[0]
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			require.Equal(t, "0", labels["engine"], name)
			if name != "vllm:cache_config_info" {
				require.Equal(t, "mock-0", labels["model_name"], name)
			}
			out[name] = m.GetGauge().GetValue()
		}
		return out
	}
	require.Equal(t, map[string]float64{"vllm:cache_config_info": 1, "vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0,
		"vllm:kv_cache_usage_perc": 0}, scrape())
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Post("http://"+addr+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"mock","prompt":"`+strings.Repeat("hello ", 300)+`","max_tokens":400}`))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool {
		g := scrape()
		return g["vllm:num_requests_running"] == 1 && g["vllm:kv_cache_usage_perc"] > 0 && g["vllm:kv_cache_usage_perc"] < 1
	}, 5*time.Second, 5*time.Millisecond)
	<-done
}

// The live command's wiring, in this process: an embedded NATS, a mock engine announcing itself
// as aggregated, and the planner with --no-operation: its /metrics counts the worker and its
// KV use, its log has the decisions, and nothing is started or stopped.
func TestPlanLiveNoOperation(t *testing.T) {
	for _, mode := range []struct {
		name     string
		args     []string
		decision string
	}{
		{"load", nil, `msg="planner: decision" action=hold operate=false samples=\d+ avg_prefill_queue=<nil> avg_decode_kv=0 `},
		// SLA mode: the idle engine needs one decode worker, which it is.
		{"sla", []string{"--sla", "../../dataplane/planner/testdata/sla_profile.json", "--isl", "3000", "--osl", "300", "--ttft", "200", "--itl", "20"},
			`msg="planner: decision" action=hold operate=false .* why="\[sla: the pools are the size the load needs \(prefill 1, decode 1\)\]"`},
	} {
		t.Run(mode.name, func(t *testing.T) { planLiveNoOperation(t, mode.args, mode.decision) })
	}
}

func planLiveNoOperation(t *testing.T, extra []string, decision string) {
	ctx, stop := context.WithCancel(context.Background())
	var logs lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"plan", "--no-operation", "--nats", "embedded", "--nats-listen", "127.0.0.1:0", "--state-dir", t.TempDir(),
			"--listen", "127.0.0.1:0", "--adjustment-interval", "0.6", "--metric-pulling-interval", "0.2", "--lease", "2s"}, extra...), &bytes.Buffer{}, &logs)
	}()
	defer func() {
		stop()
		require.Equal(t, 0, <-done)
	}()
	wait := func(re string) []string {
		rx := regexp.MustCompile(re)
		var m []string
		require.Eventually(t, func() bool { m = rx.FindStringSubmatch(logs.String()); return m != nil }, 10*time.Second, 10*time.Millisecond, re)
		return m
	}
	natsURL := wait(`msg="embedded nats" url=(nats://\S+)`)[1]
	metricsAddr := wait(`msg="planner: metrics" listen=(\S+)`)[1]
	startMock(t, "--kv-events", "nats", "--nats", natsURL, "--role", "aggregated", "--kv-blocks", "100", "--lease", "2s")
	require.Eventually(t, func() bool {
		return metricValue(t, "http://"+metricsAddr+"/metrics", `dataplane_planner_workers{pool="decode"}`) == "1"
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, "0", metricValue(t, "http://"+metricsAddr+"/metrics", "dataplane_planner_decode_kv_usage_ratio"), "an idle engine")
	wait(decision)
}
