//go:build long

package main

// The fleet as separate processes on loopback (`make test-long`, not `make test`): a real
// nats-server with JetStream, two router replicas, two mock fleets announcing themselves and
// publishing KV events, `bench load --router` driving a trace through both replicas. Then: a
// replica killed (-9) mid-stream and restarted replays the stream and answers /v1/route as the
// other does for 1,000 sampled prompts; a mock fleet killed (-9) leaves both replicas within
// the lease; NATS restarted loses nothing from the stream and both replicas carry on.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"dataplane/bench/synth"
	"dataplane/router/kvevents"
)

// proc is a child process whose output goes to a file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(t *testing.T, name string, bin string, args ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	p := &proc{name: name, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.Create(p.log)
	require.NoError(t, err)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	require.NoError(t, p.cmd.Start(), "%s %v", bin, args)
	go func() { _ = p.cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() { p.kill() })
	return p
}

// waitLog waits for a line of the log matching re and returns its submatches.
func (p *proc) waitLog(t *testing.T, re string, within time.Duration) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if m := p.grep(rx); m != nil {
			return m
		}
		select {
		case <-p.done:
			if m := p.grep(rx); m != nil {
				return m
			}
			raw, _ := os.ReadFile(p.log)
			t.Fatalf("%s exited before logging %s:\n%s", p.name, re, raw)
		case <-time.After(20 * time.Millisecond):
		}
	}
	raw, _ := os.ReadFile(p.log)
	t.Fatalf("%s logged no %s in %v:\n%s", p.name, re, within, raw)
	return nil
}

func (p *proc) grep(rx *regexp.Regexp) []string {
	f, err := os.Open(p.log)
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if m := rx.FindStringSubmatch(sc.Text()); m != nil {
			return m
		}
	}
	return nil
}

// kill sends SIGKILL and waits.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and waits (at most 20 s, then kills).
func (p *proc) stop(t *testing.T) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Errorf("%s did not stop on SIGTERM", p.name)
		p.kill()
	}
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// dataplaneBin is the binary under test: $DATAPLANE_BIN (make test-long builds bin/dataplane),
// else built here.
func dataplaneBin(t *testing.T) string {
	if b := os.Getenv("DATAPLANE_BIN"); b != "" {
		return b
	}
	bin := filepath.Join(t.TempDir(), "dataplane")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

type routeAnswer struct {
	Worker string
	Scores map[string]int // worker → cached blocks
}

func routeOf(t *testing.T, client *http.Client, addr string, toks []int32) routeAnswer {
	body, _ := json.Marshal(map[string]any{"token_ids": toks})
	resp, err := client.Post("http://"+addr+"/v1/route", "application/json", strings.NewReader(string(body)))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	var d struct {
		Worker string `json:"worker"`
		Scores []struct {
			Worker  string `json:"worker"`
			Overlap int    `json:"overlap_blocks"`
		} `json:"scores"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&d))
	a := routeAnswer{Worker: d.Worker, Scores: map[string]int{}}
	for _, s := range d.Scores {
		a.Scores[s.Worker] = s.Overlap
	}
	return a
}

// sameAnswers routes n prompts sampled from recs on every replica and returns how many answers
// differ from the first replica's (worker or any worker's cached blocks), with an example.
func sameAnswers(t *testing.T, recs []synth.Record, n int, seed uint64, addrs ...string) (differ int, example string, cached int) {
	client := &http.Client{Timeout: 10 * time.Second}
	rnd := rand.New(rand.NewPCG(seed, 1))
	for range n {
		rec := &recs[rnd.IntN(len(recs))]
		toks, _ := synth.PromptTokens(rec, 512, 32000)
		first := routeOf(t, client, addrs[0], toks)
		for _, o := range first.Scores {
			cached += o
		}
		for _, a := range addrs[1:] {
			if other := routeOf(t, client, a, toks); fmt.Sprint(other) != fmt.Sprint(first) {
				differ++
				example = fmt.Sprintf("%v vs %v", first, other)
			}
		}
	}
	return differ, example, cached
}

func waitReady(t *testing.T, addr string, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, within, 20*time.Millisecond, "%s /readyz", addr)
}

// fleetNames is the announced workers a router lists.
func fleetNames(addr string) []string {
	resp, err := http.Get("http://" + addr + "/v1/fleet")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var ws []struct {
		Name string `json:"name"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&ws)
	var out []string
	for _, w := range ws {
		out = append(out, w.Name)
	}
	return out
}

func routedNames(addr string) []string {
	resp, err := http.Get("http://" + addr + "/v1/workers")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var ws []struct {
		Worker string `json:"worker"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&ws)
	var out []string
	for _, w := range ws {
		out = append(out, w.Worker)
	}
	return out
}

func TestLongFleet(t *testing.T) {
	natsBin, err := exec.LookPath("nats-server")
	if err != nil {
		t.Skip("no nats-server on PATH (make test-long installs Debian's)")
	}
	if _, err := os.Stat(sourceTrace); err != nil {
		t.Skip("../shared/traces not here")
	}
	bin := dataplaneBin(t)
	const lease = 2 * time.Second
	work := t.TempDir()

	// NATS, a real server with JetStream on file.
	natsPort := freePort(t)
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	startNATS := func() *proc {
		p := startProc(t, "nats-server", natsBin, "-a", "127.0.0.1", "-p", strconv.Itoa(natsPort), "-js", "-sd", filepath.Join(work, "js"))
		p.waitLog(t, `Server is ready`, 10*time.Second)
		return p
	}
	ns := startNATS()

	// Two router replicas (B on a fixed port, so the load generator finds it again after its restart).
	router := func(name string, port int) (*proc, string) {
		p := startProc(t, name, bin, "router", "--nats", natsURL, "--listen", fmt.Sprintf("127.0.0.1:%d", port),
			"--lease", lease.String(), "--max-workers", "64")
		m := p.waitLog(t, `listen=(127\.0\.0\.1:\d+)`, 10*time.Second)
		p.waitLog(t, `msg=fleet `, 10*time.Second)
		return p, m[1]
	}
	_, addrA := router("router-a", 0)
	portB := freePort(t)
	routerB, addrB := router("router-b", portB)

	// Two mock fleets.
	mock := func(prefix string) *proc {
		p := startProc(t, "mock-"+prefix, bin, "mock", "--engines", "3", "--name-prefix", prefix, "--kv-events", "nats",
			"--nats", natsURL, "--listen", "127.0.0.1:0", "--speedup", "20", "--stats-every", "0")
		p.waitLog(t, `msg=announcing`, 10*time.Second)
		return p
	}
	mockX := mock("x-")
	mock("y-")
	for _, a := range []string{addrA, addrB} {
		require.Eventually(t, func() bool { return len(routedNames(a)) == 6 }, 5*time.Second, 20*time.Millisecond, "%s finds the 6 engines", a)
	}
	// A daemon routing to the fleet (serve --workers fleet) follows the same stream and leases.
	daemon := startProc(t, "serve", bin, "serve", "--workers", "fleet", "--nats", natsURL, "--listen", "127.0.0.1:0",
		"--memory-bytes", "2GiB", "--log-level", "info")
	serveAddr := daemon.waitLog(t, `msg="dataplane starting".* listen=(127\.0\.0\.1:\d+)`, 20*time.Second)[1]
	serveMetric := func(name string) string { return metricValue(t, "http://"+serveAddr+"/metrics", name) }
	require.Eventually(t, func() bool { return serveMetric("dataplane_router_fleet_workers") == "6" }, 20*time.Second, 20*time.Millisecond,
		"serve finds the 6 engines")

	// Traffic through both replicas; replica B killed (-9) a third of the way and started again.
	trace := filepath.Join(work, "trace.jsonl")
	out, err := exec.Command(bin, "synth", "--trace", sourceTrace, "--out", trace, "--requests", "600", "--seed", "22",
		"--speedup-ratio", "10", "--osl-multiplier", "0.05").CombinedOutput()
	require.NoError(t, err, string(out))
	recs, err := readTrace(trace, 0, 512)
	require.NoError(t, err)
	out1 := filepath.Join(work, "load1")
	load := startProc(t, "bench-load", bin, "bench", "load", "--router", "http://"+addrA+",http://"+addrB, "--trace", trace,
		"--speedup", "2", "--timeout", "30s", "--out", out1)
	time.Sleep(3 * time.Second)
	routerB.kill()
	t.Logf("router B killed")
	time.Sleep(time.Second)
	routerB, _ = router("router-b2", portB)
	waitReady(t, addrB, 30*time.Second)
	t.Logf("router B back and ready")
	m := load.waitLog(t, `requests (\d+): (\d+) completed, (\d+) failed`, 3*time.Minute)
	t.Logf("bench load: %s", m[0])
	total, _ := strconv.Atoi(m[1])
	completed, _ := strconv.Atoi(m[2])
	require.Equal(t, len(recs), total)
	require.Greater(t, completed, total*2/3, "most requests completed (those routed by B while it was down failed)")
	select { // the summary is printed before requests.csv is written
	case <-load.done:
	case <-time.After(time.Minute):
		t.Fatal("bench load did not exit after its summary")
	}
	csv, err := os.ReadFile(filepath.Join(out1, "requests.csv"))
	require.NoError(t, err)
	for _, line := range strings.Split(strings.TrimSpace(string(csv)), "\n")[1:] {
		if !strings.HasSuffix(line, ",") { // a failed request: only those B could not route
			require.Contains(t, line, "route: Post \"\"http://"+addrB+"/v1/route\"\": dial tcp", line)
		}
	}

	// Both replicas answer 1,000 sampled prompts alike (idle: the loads are all zero).
	time.Sleep(2 * time.Second) // the engines' last events and load reports
	waitReady(t, addrA, 10*time.Second)
	differ, example, cached := sameAnswers(t, recs, 1000, 7, addrA, addrB)
	t.Logf("1,000 prompts: %d answers differ; %d cached blocks in the answers", differ, cached)
	require.Zero(t, differ, example)
	require.Positive(t, cached, "the prompts hit cached blocks")

	// A mock fleet killed: its engines leave both replicas within the lease.
	killed := time.Now()
	mockX.kill()
	for _, a := range []string{addrA, addrB} {
		require.Eventually(t, func() bool {
			for _, n := range append(fleetNames(a), routedNames(a)...) {
				if strings.HasPrefix(n, "x-") {
					return false
				}
			}
			return true
		}, lease+time.Second, 10*time.Millisecond, "%s drops the x- engines within the lease", a)
	}
	require.Eventually(t, func() bool { return serveMetric("dataplane_router_fleet_workers") == "3" }, lease+time.Second, 10*time.Millisecond,
		"serve drops the x- engines within the lease")
	t.Logf("x- engines left both replicas and serve %v after the kill (lease %v)", time.Since(killed), lease)
	blocks := metricValue(t, "http://"+addrA+"/metrics", "dataplane_router_index_blocks")
	require.Equal(t, blocks, metricValue(t, "http://"+addrB+"/metrics", "dataplane_router_index_blocks"))
	require.Equal(t, blocks, serveMetric("dataplane_router_index_blocks"), "serve's index holds what the routers' do")

	// NATS restarted, with traffic going on: the stream keeps what it had and gets what was
	// published meanwhile; both replicas reconnect and agree.
	info := func() *jetstream.StreamInfo {
		nc, err := nats.Connect(natsURL)
		require.NoError(t, err)
		defer nc.Close()
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, kvevents.DefaultStreamName)
		require.NoError(t, err)
		i, err := st.Info(ctx)
		require.NoError(t, err)
		return i
	}
	before := info()
	out2 := filepath.Join(work, "load2")
	load2 := startProc(t, "bench-load-2", bin, "bench", "load", "--router", "http://"+addrA+",http://"+addrB, "--trace", trace,
		"--speedup", "4", "--limit", "200", "--timeout", "30s", "--out", out2)
	time.Sleep(time.Second)
	ns.stop(t)
	t.Logf("nats stopped")
	time.Sleep(time.Second)
	ns = startNATS()
	after := info()
	t.Logf("stream before the restart: %d messages up to %d; after: %d up to %d", before.State.Msgs, before.State.LastSeq,
		after.State.Msgs, after.State.LastSeq)
	require.GreaterOrEqual(t, after.State.LastSeq, before.State.LastSeq)
	require.GreaterOrEqual(t, after.State.Msgs, before.State.Msgs)
	m = load2.waitLog(t, `requests (\d+): (\d+) completed, (\d+) failed`, 3*time.Minute)
	t.Logf("bench load across the NATS restart: %s", m[0])
	if m[3] != "0" {
		csv, _ := os.ReadFile(filepath.Join(out2, "requests.csv"))
		var errs []string
		for _, line := range strings.Split(string(csv), "\n") {
			if strings.Contains(line, "route") || strings.Contains(line, "rror") || strings.Contains(line, "refused") {
				errs = append(errs, line)
			}
		}
		t.Fatalf("routing needs no NATS, yet %s requests failed: %s", m[3], strings.Join(errs, "\n"))
	}
	time.Sleep(2 * time.Second)
	for _, a := range []string{addrA, addrB} {
		waitReady(t, a, 10*time.Second)
		require.Len(t, routedNames(a), 3, "%s keeps the y- engines", a)
		for _, incident := range []string{"gap", "unrecoverable_gap", "restart"} {
			require.Equal(t, "0", metricValue(t, "http://"+a+"/metrics", `dataplane_router_kv_stream_total{incident="`+incident+`"}`), "%s %s", a, incident)
		}
	}
	final := info()
	t.Logf("stream at the end: %d messages up to %d", final.State.Msgs, final.State.LastSeq)
	require.Greater(t, final.State.LastSeq, after.State.LastSeq, "what the engines published across the restart was stored")
	for _, a := range []string{addrA, addrB} {
		require.Eventually(t, func() bool {
			return metricValue(t, "http://"+a+"/metrics", "dataplane_router_kv_jetstream_sequence") == strconv.FormatUint(final.State.LastSeq, 10)
		}, 10*time.Second, 20*time.Millisecond, "%s reads the stream to its end after the restart", a)
	}

	// A replica started now replays to the same answers.
	_, addrC := router("router-c", 0)
	waitReady(t, addrC, 30*time.Second)
	differ, example, _ = sameAnswers(t, recs, 1000, 8, addrA, addrB, addrC)
	require.Zero(t, differ, example)
}
