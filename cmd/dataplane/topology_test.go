package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/router/fleet"
)

// topoWorker is a worker of a topology test fleet: its name, role and zone ("": no label).
type topoWorker struct{ name, role, zone string }

// topoWant is what a row expects under one policy: the two workers, or an error naming text.
type topoWant struct {
	prefill, decode string
	fallback        bool
	err             string
}

// topologyRows are seed 004's runtime table, a row each, with what each policy gives. Workers
// are named so that an unaware choice (ties go to the smaller name; no load) differs from the
// topology-aware one.
var topologyRows = []struct {
	name  string
	level string
	fleet []topoWorker
	fail  topoWant
	fb    topoWant // fallback
}{
	{"level unset: no filtering", "", []topoWorker{{"p0", "prefill", "z0"}, {"da", "decode", "z1"}, {"dz", "decode", "z0"}},
		topoWant{prefill: "p0", decode: "da"}, topoWant{prefill: "p0", decode: "da"}},
	{"decode filtered to the prefill worker's zone", "zone", []topoWorker{{"p0", "prefill", "z0"}, {"da", "decode", "z1"}, {"dz", "decode", "z0"}},
		topoWant{prefill: "p0", decode: "dz"}, topoWant{prefill: "p0", decode: "dz"}},
	{"no decode worker in the zone", "zone", []topoWorker{{"p0", "prefill", "z0"}, {"d1", "decode", "z1"}},
		topoWant{err: `no decode worker in zone \"z0\"`}, topoWant{prefill: "p0", decode: "d1", fallback: true}},
	{"unlabelled decode worker, one in the zone", "zone", []topoWorker{{"p0", "prefill", "z0"}, {"da", "decode", ""}, {"dz", "decode", "z0"}},
		topoWant{prefill: "p0", decode: "dz"}, topoWant{prefill: "p0", decode: "dz"}},
	{"unlabelled decode worker, none in the zone", "zone", []topoWorker{{"p0", "prefill", "z0"}, {"da", "decode", ""}, {"dz", "decode", "z1"}},
		topoWant{err: `no decode worker in zone \"z0\"`}, topoWant{prefill: "p0", decode: "da", fallback: true}},
	{"prefill workers with a decode worker in their zone first", "zone", []topoWorker{{"pa", "prefill", "z1"}, {"pz", "prefill", "z0"}, {"d0", "decode", "z0"}},
		topoWant{prefill: "pz", decode: "d0"}, topoWant{prefill: "pz", decode: "d0"}},
}

// writeWorkerLabels writes a --worker-labels file of fleet, endpoint(i) for worker i.
func writeWorkerLabels(t *testing.T, fleet []topoWorker, endpoint func(i int) string) string {
	t.Helper()
	var entries []map[string]any
	for i, w := range fleet {
		e := map[string]any{"name": w.name, "role": w.role, "endpoint": endpoint(i)}
		if w.zone != "" {
			e["topology"] = map[string]string{"zone": w.zone, "rack": w.zone + "-r0"}
		}
		entries = append(entries, e)
	}
	raw, err := json.Marshal(entries)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "workers.json")
	require.NoError(t, os.WriteFile(path, raw, 0o644))
	return path
}

// The standalone router's /v1/route, each row of the runtime table under both policies: the
// answer names the prefill and the decode worker, a fail mismatch is a 503 naming the zone. The
// level comes from the flag, or (last row) from Dynamo's environment variable.
func TestRouterTopologyRows(t *testing.T) {
	for i, row := range topologyRows {
		for _, policy := range []string{"fail", "fallback"} {
			t.Run(fmt.Sprintf("%s/%s", row.name, policy), func(t *testing.T) {
				labels := writeWorkerLabels(t, row.fleet, func(i int) string { return fmt.Sprintf("http://127.0.0.1:1/w%d", i) })
				args := []string{"router", "--listen", "127.0.0.1:0", "--nats", "none", "--worker-labels", labels}
				if i == len(topologyRows)-1 {
					t.Setenv("DYN_ROUTER_KV_TRANSFER_TOPOLOGY_LEVEL", row.level)
					t.Setenv("DYN_ROUTER_KV_TRANSFER_MISMATCH_POLICY", policy)
				} else {
					args = append(args, "--kv-transfer-topology-level", row.level, "--kv-transfer-mismatch-policy", policy)
				}
				m, stop := startCommand(t, args, regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`))
				defer stop()
				want := row.fail
				if policy == "fallback" {
					want = row.fb
				}
				code, body := postRoute(t, "http://"+m[0][1], `{"token_ids": [1, 2, 3, 4, 5], "request_id": "r"}`)
				checkTopologyAnswer(t, want, code, body)
			})
		}
	}
}

func postRoute(t *testing.T, base, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/route", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// checkTopologyAnswer checks a decision (a 200 with its JSON) or an error against want.
func checkTopologyAnswer(t *testing.T, want topoWant, code int, body string) {
	t.Helper()
	if want.err != "" {
		require.Equal(t, 503, code, body)
		require.Contains(t, body, want.err)
		return
	}
	require.Equal(t, 200, code, body)
	var d struct {
		Worker, Prefill, Decode string
		Topology                *struct{ Fallback bool }
	}
	require.NoError(t, json.Unmarshal([]byte(body), &d), body)
	require.Equal(t, [3]string{want.prefill, want.decode, want.decode}, [3]string{d.Prefill, d.Decode, d.Worker}, body)
	require.Equal(t, want.fallback, d.Topology != nil && d.Topology.Fallback, body)
}

// Bad topology settings stop the router with a usage error naming the flag.
func TestRouterTopologyFlagErrors(t *testing.T) {
	for _, c := range []struct{ args, want string }{
		{"--kv-transfer-mismatch-policy prefer", "--kv-transfer-mismatch-policy"},
		{"--kv-transfer-qos zone=1ms", "--kv-transfer-qos"},
		{"--kv-transfer-qos @/nonexistent.json", "--kv-transfer-qos"},
		{"--worker-labels /nonexistent.json", "--worker-labels"},
	} {
		var stderr strings.Builder
		code := run(context.Background(), append([]string{"router", "--nats", "none", "--kv-events", "tcp://127.0.0.1:1"}, strings.Fields(c.args)...), io.Discard, &stderr)
		require.Equal(t, 2, code, c.args)
		require.Contains(t, stderr.String(), c.want, c.args)
	}
}

// The worker side: with --topology the domains are read from the files and announced as
// labels; a level whose file never appears stops the command after the wait; a label given
// both ways with different values is an error.
func TestWorkerTopologyLabels(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "zone"), []byte("us-east-1a\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rack"), []byte("r12"), 0o644))
	log := slog.New(slog.DiscardHandler)
	wt := workerTopology{enabled: true, dir: dir, level: "zone", wait: time.Second, flagsLabels: "pool=a"}
	labels, err := wt.labels(context.Background(), log)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"zone": "us-east-1a", "rack": "r12", "pool": "a"}, labels)

	wt.flagsLabels = "zone=us-west-2b"
	_, err = wt.labels(context.Background(), log)
	require.ErrorContains(t, err, "--labels says zone=us-west-2b")

	wt = workerTopology{enabled: false, dir: "/nonexistent", level: "zone", flagsLabels: "zone=z9"}
	labels, err = wt.labels(context.Background(), log)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"zone": "z9"}, labels, "without --topology the files are not read")

	// A mock fleet whose level's file is missing exits with an error after the wait, set by
	// Dynamo's environment variables.
	t.Setenv("DYN_TOPOLOGY_ENABLED", "true")
	t.Setenv("DYN_TOPOLOGY_MOUNT_PATH", dir)
	t.Setenv("DYN_TOPOLOGY_DOMAIN", "node")
	var stderr strings.Builder
	start := time.Now()
	code := run(context.Background(), []string{"mock", "--listen", "127.0.0.1:0", "--topology-wait", "300ms"}, io.Discard, &stderr)
	require.Equal(t, 1, code, stderr.String())
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	require.Contains(t, stderr.String(), `no "node" file`)
}

// serve with a static disaggregated fleet (--worker-labels over mock engines that answer both
// steps), each row of the runtime table under both policies: a completion goes to the prefill
// worker, then to the decode worker with the handle it returned; the decision names both; a
// fail mismatch is a 503 naming the zone.
func TestServeTopologyRows(t *testing.T) {
	m, _ := startCommand(t, []string{"mock", "--engines", "3", "--listen", "127.0.0.1:0", "--speedup", "20"},
		regexp.MustCompile(`listen=(127\.0\.0\.1:\d+)`)) // stopped by its cleanup, after the parallel subtests
	mock := "http://" + m[0][1]
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = 3000 + i
	}
	body, _ := json.Marshal(map[string]any{"model": "dataplane-demo", "prompt": prompt, "max_tokens": 3})
	for _, row := range topologyRows {
		for _, policy := range []string{"fail", "fallback"} {
			t.Run(fmt.Sprintf("%s/%s", row.name, policy), func(t *testing.T) {
				t.Parallel() // each its own serve; they overlap their start-up (the GPU probe's child)
				labels := writeWorkerLabels(t, row.fleet, func(i int) string { return fmt.Sprintf("%s/engines/%d", mock, i) })
				m, stop := startCommand(t, []string{"serve", "--listen", "127.0.0.1:0", "--worker-labels", labels,
					"--kv-transfer-topology-level", row.level, "--kv-transfer-mismatch-policy", policy, "--no-audio", "--demo-hidden", "32"},
					regexp.MustCompile(`msg="dataplane starting".* listen=(127\.0\.0\.1:\d+)`))
				defer stop()
				base := "http://" + m[0][1]
				want := row.fail
				if policy == "fallback" {
					want = row.fb
				}
				resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(body)))
				require.NoError(t, err)
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want.err != "" {
					checkTopologyAnswer(t, want, resp.StatusCode, string(raw))
					return
				}
				require.Equal(t, 200, resp.StatusCode, string(raw))
				var out struct {
					Choices []struct{ Text string }
					Usage   struct {
						CompletionTokens int `json:"completion_tokens"`
					}
				}
				require.NoError(t, json.Unmarshal(raw, &out), string(raw))
				require.Equal(t, 3, out.Usage.CompletionTokens, "the decode worker generated")
				var logged struct{ Decision json.RawMessage }
				require.Equal(t, 200, getJSON(t, base+"/debug/route", &logged))
				checkTopologyAnswer(t, want, 200, string(logged.Decision))
			})
		}
	}
}

// `synth fleet` writes a --worker-labels file over zones and racks that the router reads (and
// lays workers as mock --zones and bench ab do); `bench ab` on such a fleet prints its KV moves.
func TestSynthFleetAndBenchABDisagg(t *testing.T) {
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"synth", "fleet", "--prefill", "3", "--decode", "2", "--zones", "2", "--racks", "2",
		"--decode-endpoint", "http://d:8000/e{i}"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	ws, err := fleet.ParseStatic([]byte(stdout.String()))
	require.NoError(t, err)
	require.Len(t, ws, 5)
	require.Equal(t, "prefill-2", ws[2].Name)
	require.Equal(t, map[string]string{"zone": "zone-0", "rack": "zone-0-rack-1"}, ws[2].Labels)
	require.Equal(t, fleet.Decode, ws[4].Role)
	require.Equal(t, "http://d:8000/e1", ws[4].Endpoint)
	require.Equal(t, "zone-1", ws[4].Labels["zone"])
	require.Equal(t, 2, run(context.Background(), []string{"synth", "fleet"}, io.Discard, io.Discard))

	trace := synthTrace(t, "--requests", "60", "--seed", "3")
	out := runBench(t, "ab", "--trace", trace, "--seed", "9", "--prefill", "2", "--decode", "2", "--zones", "2",
		"--kv-transfer-qos", "zone=1ms@5GB/s,local=100us@50GB/s", "--policies", "disagg,disagg-topology")
	require.Regexp(t, `(?m)^\s+disagg-topology\s+[\d.]+ ms\s+[\d.]+ ms\s+0\.00$`, out)
	require.Contains(t, out, "KV move p50")
	require.Contains(t, runBenchErr(t, "ab", "--trace", trace, "--kv-transfer-qos", "zone=1ms"), "--kv-transfer-qos")
}

// Roles and topology from the fleet: prefill engines announced over two zones (--zones), a
// decode engine whose zone comes from its topology files; the router with a zone level picks
// the prefill engine in the decode engine's zone, and says why not the other.
func TestRouterFleetDisaggregated(t *testing.T) {
	addr, url, stopRouter := startFleetRouter(t, "", t.TempDir(), "--kv-transfer-topology-level", "zone")
	defer stopRouter()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "zone"), []byte("zone-1\n"), 0o644))
	_, stopP := startCommand(t, []string{"mock", "--engines", "2", "--listen", "127.0.0.1:0", "--kv-events", "nats", "--nats", url,
		"--role", "prefill", "--name-prefix", "p-", "--zones", "2"}, regexp.MustCompile(`msg=announcing`))
	defer stopP()
	_, stopD := startCommand(t, []string{"mock", "--engines", "1", "--listen", "127.0.0.1:0", "--kv-events", "nats", "--nats", url,
		"--role", "decode", "--name-prefix", "d-", "--topology", "--topology-dir", dir}, regexp.MustCompile(`msg=announcing`))
	defer stopD()
	var body string
	require.Eventually(t, func() bool {
		code, out := postRoute(t, "http://"+addr, `{"token_ids": [1, 2, 3]}`)
		body = out
		return code == 200 && strings.Contains(out, `"prefill":"p-1"`) && strings.Contains(out, `"decode":"d-0"`)
	}, 5*time.Second, 20*time.Millisecond, "last answer: %s", body)
	require.Contains(t, body, `no decode worker in its zone \"zone-0\"`)
	require.Contains(t, body, `"domain":"zone-1"`)
}

// bench load --router sends a disaggregated fleet's requests in two steps, as vLLM's proxies
// do: the prefill step to the prefill engine the router chose (its prompt's blocks land there),
// then the decode step with the kv_transfer_params it returned; every request completes and the
// router ends with nothing in flight on either side.
func TestBenchLoadDisaggregated(t *testing.T) {
	trace := synthTrace(t, "--requests", "40", "--seed", "5", "--speedup-ratio", "20", "--osl-multiplier", "0.1")
	addr, url, stopRouter := startFleetRouter(t, "", t.TempDir())
	defer stopRouter()
	_, stopP := startCommand(t, []string{"mock", "--engines", "2", "--listen", "127.0.0.1:0", "--kv-events", "nats", "--nats", url,
		"--role", "prefill", "--name-prefix", "p-", "--speedup", "50"}, regexp.MustCompile(`msg=announcing`))
	defer stopP()
	_, stopD := startCommand(t, []string{"mock", "--engines", "2", "--listen", "127.0.0.1:0", "--kv-events", "nats", "--nats", url,
		"--role", "decode", "--name-prefix", "d-", "--speedup", "50"}, regexp.MustCompile(`msg=announcing`))
	defer stopD()
	var workers []map[string]any
	require.Eventually(t, func() bool { return getJSON(t, "http://"+addr+"/v1/fleet", &workers) == 200 && len(workers) == 4 },
		5*time.Second, 10*time.Millisecond)
	out := runBench(t, "load", "--router", "http://"+addr, "--trace", trace, "--speedup", "5")
	require.Contains(t, out, "requests 40: 40 completed, 0 failed")
	m := "http://" + addr + "/metrics"
	require.Equal(t, "40", metricValue(t, m, "dataplane_router_decisions_total"))
	require.Equal(t, "0", metricValue(t, m, "dataplane_router_requests_in_flight"), "every request finished")
	cached := func(w string) string {
		return metricValue(t, m, `dataplane_router_worker_cached_blocks{tier="0",worker="`+w+`"}`)
	}
	require.Eventually(t, func() bool { return cached("p-0") != "0" || cached("p-1") != "0" }, 5*time.Second, 20*time.Millisecond,
		"the prompts were prefilled on the prefill engines")
}
