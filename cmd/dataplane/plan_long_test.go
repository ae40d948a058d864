//go:build long

package main

// The planner with the local backend against mock engines as processes (`make test-long`):
// nats-server, a router, and `dataplane plan --backend local` starting mock engines from a
// statefile; `bench load --router` drives a ramp (heavy, then a trickle). The pool grows by
// one worker per interval under load and shrinks when it is gone, as the rules say, and every
// request is answered 200.

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/bench/synth"
)

// plannerRamp runs the ramp against a pool of mock engines announced with role and
// scaled as pool, and returns the planner's decisions, its log and the requests' rows.
func plannerRamp(t *testing.T, role, pool, mockFlags string, removals int) ([]string, string, [][]string) {
	bin := dataplaneBin(t)
	natsBin := "nats-server"
	work := t.TempDir()
	natsPort := freePort(t)
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	ns := startProc(t, "nats-server", natsBin, "-a", "127.0.0.1", "-p", strconv.Itoa(natsPort), "-js", "-sd", filepath.Join(work, "js"))
	ns.waitLog(t, `Server is ready`, 10*time.Second)
	roles := role
	if role == "prefill" { // a disaggregated fleet: the planner's prefill pool beside two decode engines
		roles = "prefill,decode"
	}
	router := startProc(t, "router", bin, "router", "--nats", natsURL, "--listen", "127.0.0.1:0", "--lease", "2s", "--roles", roles)
	routerAddr := router.waitLog(t, `listen=(127\.0\.0\.1:\d+)`, 10*time.Second)[1]
	router.waitLog(t, `msg=fleet `, 10*time.Second)
	if role == "prefill" {
		startProc(t, "decode", bin, "mock", "--engines", "2", "--name-prefix", "d-", "--role", "decode", "--kv-events", "nats",
			"--nats", natsURL, "--listen", "127.0.0.1:0", "--stats-every", "0", "--speedup", "5").waitLog(t, `msg=announcing`, 10*time.Second)
	}

	// 1024 blocks of 16 tokens an engine: ~7 requests of 2,000 + 300 tokens fill one.
	mockCmd := fmt.Sprintf("%s mock --engines 1 --name-prefix {name}- --kv-events nats --nats %s --listen 127.0.0.1:0 --stats-every 0 --role %s --drain-timeout 30s %s", bin, natsURL, role, mockFlags)
	state := map[string]any{"namespace": "t", "environment": map[string]any{"SYSTEM_RESOURCES": map[string]any{"gpu_info": []string{"0", "1", "2"}}},
		"components": map[string]any{"t_" + pool: map[string]any{"pool": pool, "cmd": mockCmd, "resources": map[string]any{"allocated_gpus": []string{"0"}}}}}
	b, _ := json.Marshal(state)
	statefile := filepath.Join(work, "state.json")
	require.NoError(t, os.WriteFile(statefile, b, 0o600))
	planner := startProc(t, "planner", bin, "plan", "--backend", "local", "--statefile", statefile, "--nats", natsURL,
		"--adjustment-interval", "2", "--metric-pulling-interval", "0.25", "--max-gpu-budget", "3", "--listen", "127.0.0.1:0",
		"--worker-output", filepath.Join(work, "workers.log"), "--stop-workers-on-exit", "--stop-timeout", "40s",
		"--record", filepath.Join(work, "observations.jsonl"))
	planner.waitLog(t, `planner: running`, 30*time.Second)

	// A prefill engine sees only prefill steps (max_tokens 1): its heavy phase has longer prompts.
	heavyISL := 2000
	if role == "prefill" {
		heavyISL = 8000
	}
	// The ramp: 8 requests/s of 2,000 + 300 tokens for 10 s, then 1/s of 200 + 20 for 24 s (the
	// engines run 5 times faster than real ones).
	var recs []synth.Record
	id := int64(0)
	add := func(at float64, isl, osl int) {
		r := synth.Record{Timestamp: at, InputLength: isl, OutputLength: osl}
		for range (isl + 511) / 512 {
			id++
			r.HashIDs = append(r.HashIDs, id)
		}
		recs = append(recs, r)
	}
	for ms := 0.0; ms < 10000; ms += 125 {
		add(ms, heavyISL, 300)
	}
	for ms := 10000.0; ms < 34000; ms += 1000 {
		add(ms, 200, 20)
	}
	trace := filepath.Join(work, "trace.jsonl")
	f, err := os.Create(trace)
	require.NoError(t, err)
	enc := json.NewEncoder(f)
	for _, r := range recs {
		require.NoError(t, enc.Encode(r))
	}
	require.NoError(t, f.Close())
	out := filepath.Join(work, "load")
	load := startProc(t, "bench-load", bin, "bench", "load", "--router", "http://"+routerAddr, "--trace", trace, "--timeout", "60s", "--out", out)
	select {
	case <-load.done:
	case <-time.After(3 * time.Minute):
		t.Fatal("bench load did not finish")
	}
	// Let the pool shrink back to one.
	decisions := regexp.MustCompile(`msg="planner: decision" action=(\S+)`)
	require.Eventually(t, func() bool {
		raw, _ := os.ReadFile(planner.log)
		return strings.Count(string(raw), "msg=\"planner: change complete\" pool="+pool+" change=remove") >= removals
	}, 60*time.Second, 200*time.Millisecond, "the planner's decisions: %s", func() string {
		raw, _ := os.ReadFile(planner.log)
		return strings.Join(regexp.MustCompile(`msg="planner: decision".*`).FindAllString(string(raw), -1), "\n")
	}())
	planner.stop(t)

	raw, err := os.ReadFile(planner.log)
	require.NoError(t, err)
	var actions []string
	for _, m := range decisions.FindAllStringSubmatch(string(raw), -1) {
		actions = append(actions, m[1])
	}
	t.Logf("decisions: %v", actions)
	// The record replays (its boundaries differ from the live run's by the changes' durations).
	var replayed bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"plan", "replay", "--observations", filepath.Join(work, "observations.jsonl"),
		"--adjustment-interval", "2", "--metric-pulling-interval", "0.25", "--max-gpu-budget", "3", "--initial-prefill", "0", "--initial-decode", "1"},
		&replayed, os.Stderr))
	require.GreaterOrEqual(t, strings.Count(replayed.String(), "\n"), len(actions)-2)
	fh, err := os.Open(filepath.Join(out, "requests.csv"))
	require.NoError(t, err)
	defer fh.Close()
	rows, err := csv.NewReader(fh).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, len(recs)+1)
	return actions, string(raw), rows[1:]
}

// everyRequestAnswered checks the load's rows: none skipped or failed; it returns the
// endpoints that served them.
func everyRequestAnswered(t *testing.T, rows [][]string) map[string]int {
	endpoints := map[string]int{}
	for _, r := range rows {
		require.Equal(t, "false", r[11], "skipped: %v", r)
		require.Empty(t, r[12], "request %s failed", r[0])
		endpoints[r[2]]++
	}
	return endpoints
}

// The decode pool (aggregated engines, 1,024 KV blocks each): full KV caches add workers up
// to the budget, the grace period holds them, then they go one by one, leases revoked first.
func TestPlannerDecodeLong(t *testing.T) {
	actions, log, rows := plannerRamp(t, "aggregated", "decode", "--kv-blocks 1024 --speedup 5", 2)
	// The shape the rules give: adds up to the budget (3 GPUs), at least 3 intervals with no
	// removal after the last add, then removals down to one worker, and nothing else.
	lastAdd, firstRemove := -1, -1
	adds, removes := 0, 0
	for i, a := range actions {
		switch a {
		case "decode+1":
			adds++
			lastAdd = i
			require.Equal(t, -1, firstRemove, "no add after the removals began: %v", actions)
		case "decode-1":
			removes++
			if firstRemove < 0 {
				firstRemove = i
			}
		case "hold":
		default:
			t.Fatalf("unexpected action %q in %v", a, actions)
		}
	}
	require.Equal(t, 2, adds, "1 → 3 workers, the budget: %v", actions)
	require.Equal(t, 2, removes, "3 → 1 workers: %v", actions)
	require.GreaterOrEqual(t, firstRemove-lastAdd, 4, "3 intervals of grace after the last add: %v", actions)
	require.Regexp(t, `msg="planner: stopped a worker" name=t_decode_2 pid=\d+ revoked_first=true`, log)
	require.GreaterOrEqual(t, len(everyRequestAnswered(t, rows)), 3, "the added workers served")
}

// The prefill pool of a disaggregated fleet (prefill engines that take one prefill step at a
// time, at real speed, beside two decode engines the planner does not manage): a growing queue
// adds workers, an empty one removes them at once (no grace), with SIGTERM alone, and each
// finishes what it has; the decode pool is held.
func TestPlannerPrefillLong(t *testing.T) {
	actions, log, rows := plannerRamp(t, "prefill", "prefill", "--max-seqs 1 --speedup 1", 1)
	require.Contains(t, log, "decode: -1 held: the backend does not scale this pool")
	// Each decision is what the rules make of its interval's inputs, as logged.
	line := regexp.MustCompile(`msg="planner: decision" action=(\S+) operate=true samples=\d+ avg_prefill_queue=(\S+) avg_decode_kv=\S+ predicted_prefill_queue=(\S+) prefill=(\d+)`)
	adds, removes := 0, 0
	for _, m := range line.FindAllStringSubmatch(log, -1) {
		avg, _ := strconv.ParseFloat(m[2], 64)
		workers, _ := strconv.Atoi(m[4])
		switch m[1] {
		case "prefill+1":
			adds++
			pred, err := strconv.ParseFloat(m[3], 64)
			require.NoError(t, err)
			require.True(t, avg > 0.5 && pred > 0.5 && workers < 3, "%s", m[0])
		case "prefill-1":
			removes++
			require.True(t, avg < 0.2 && workers > 1, "%s", m[0])
		case "hold":
			if m[2] != "<nil>" {
				pred, _ := strconv.ParseFloat(m[3], 64)
				require.False(t, avg < 0.2 && workers > 1, "a removal was due: %s", m[0])
				require.False(t, avg > 0.5 && m[3] != "<nil>" && pred > 0.5 && workers < 3, "an add was due: %s", m[0])
			}
		default:
			t.Fatalf("unexpected action in %s", m[0])
		}
	}
	require.Len(t, actions, adds+removes+strings.Count(strings.Join(actions, " "), "hold"))
	require.GreaterOrEqual(t, adds, 1, "%v", actions)
	require.GreaterOrEqual(t, removes, 1, "%v", actions)
	require.Regexp(t, `msg="planner: stopped a worker" name=t_prefill_\d+ pid=\d+ revoked_first=false`, log)
	// The rows name the decode engines (bench load sends the prefill step first, then the
	// request to the decode engine): every request was answered through both steps.
	require.Len(t, everyRequestAnswered(t, rows), 2, "both decode engines")
}
