//go:build long

package main

// The planner with the local backend against mock engines as processes (`make test-long`):
// nats-server, a router, and `dataplane plan --backend local` starting aggregated mock engines
// from a statefile; `bench load --router` drives a ramp (heavy, then a trickle). The decode
// pool grows by one worker per interval while the KV caches are full, holds for the grace
// period, then shrinks one by one, each removed worker's lease revoked before its SIGTERM, and
// every request is answered 200.

import (
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

func TestPlannerLong(t *testing.T) {
	bin := dataplaneBin(t)
	natsBin := "nats-server"
	work := t.TempDir()
	natsPort := freePort(t)
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	ns := startProc(t, "nats-server", natsBin, "-a", "127.0.0.1", "-p", strconv.Itoa(natsPort), "-js", "-sd", filepath.Join(work, "js"))
	ns.waitLog(t, `Server is ready`, 10*time.Second)
	router := startProc(t, "router", bin, "router", "--nats", natsURL, "--listen", "127.0.0.1:0", "--lease", "2s", "--roles", "aggregated")
	routerAddr := router.waitLog(t, `listen=(127\.0\.0\.1:\d+)`, 10*time.Second)[1]
	router.waitLog(t, `msg=fleet `, 10*time.Second)

	// 1024 blocks of 16 tokens an engine: ~7 requests of 2,000 + 300 tokens fill one.
	mockCmd := fmt.Sprintf("%s mock --engines 1 --name-prefix {name}- --kv-events nats --nats %s --listen 127.0.0.1:0 --stats-every 0 --kv-blocks 1024 --role aggregated --drain-timeout 30s --speedup 5", bin, natsURL)
	state := map[string]any{"namespace": "t", "environment": map[string]any{"SYSTEM_RESOURCES": map[string]any{"gpu_info": []string{"0", "1", "2"}}},
		"components": map[string]any{"t_decode": map[string]any{"pool": "decode", "cmd": mockCmd, "resources": map[string]any{"allocated_gpus": []string{"0"}}}}}
	b, _ := json.Marshal(state)
	statefile := filepath.Join(work, "state.json")
	require.NoError(t, os.WriteFile(statefile, b, 0o600))
	planner := startProc(t, "planner", bin, "plan", "--backend", "local", "--statefile", statefile, "--nats", natsURL,
		"--adjustment-interval", "2", "--metric-pulling-interval", "0.25", "--max-gpu-budget", "3", "--listen", "127.0.0.1:0",
		"--worker-output", filepath.Join(work, "workers.log"), "--stop-workers-on-exit", "--stop-timeout", "40s")
	planner.waitLog(t, `planner: running`, 30*time.Second)

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
		add(ms, 2000, 300)
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
	// Let the pool shrink back to one (grace 3 intervals, then one a 2 s interval).
	decisions := regexp.MustCompile(`msg="planner: decision" action=(\S+)`)
	require.Eventually(t, func() bool {
		raw, _ := os.ReadFile(planner.log)
		return strings.Count(string(raw), "msg=\"planner: change complete\" pool=decode change=remove") >= 2
	}, 60*time.Second, 200*time.Millisecond)
	planner.stop(t)

	raw, err := os.ReadFile(planner.log)
	require.NoError(t, err)
	var actions []string
	for _, m := range decisions.FindAllStringSubmatch(string(raw), -1) {
		actions = append(actions, m[1])
	}
	t.Logf("decisions: %v", actions)
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
	// Each removal revoked the lease before the SIGTERM.
	require.Regexp(t, `msg="planner: stopped a worker" name=t_decode_2 pid=\d+ revoked_first=true`, string(raw))

	// Every request answered.
	fh, err := os.Open(filepath.Join(out, "requests.csv"))
	require.NoError(t, err)
	rows, err := csv.NewReader(fh).ReadAll()
	require.NoError(t, err)
	require.Len(t, rows, len(recs)+1)
	endpoints := map[string]int{}
	for _, r := range rows[1:] {
		require.Equal(t, "false", r[10], "skipped: %v", r)
		require.Empty(t, r[11], "request %s failed", r[0])
		endpoints[r[1]]++
	}
	require.GreaterOrEqual(t, len(endpoints), 3, "the added workers served: %v", endpoints)
}
