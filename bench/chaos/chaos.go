// Package chaos runs a real `dataplane serve` (and, where a scenario needs them, `dataplane
// mock` worker processes) as children on loopback and puts it through hostile scenarios: body
// floods, decompression-size pictures, overload, media sources that never end, workers that
// stop or die, SIGTERM with streams in flight, slow headers. Each scenario gets a fresh serve
// process with its own flags and a time limit; the harness samples the process's resident set
// every 20 ms, reads its metrics afterwards, and writes one row: statuses seen, peak RSS
// against --memory-bytes, whether feature bytes went back to 0, the longest client wait
// against the configured timeout, whether the daemon is alive, and a verdict.
//
// Everything the harness starts is killed on the way out (also when ctx ends: Ctrl-C).
package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configure a run. DefaultOptions has the defaults.
type Options struct {
	Binary      string        // the dataplane executable to run as serve and mock
	MemoryBytes int64         // --memory-bytes for serve: the process budget the RSS is held to; 1 GiB
	RSSSlack    int64         // peak RSS may pass MemoryBytes by this much; 256 MiB
	RSSKill     int64         // the harness kills serve above this RSS, to protect the machine; 8 GiB
	Total       time.Duration // the whole run; scenarios that do not fit are not run (and fail); 5m
	Scenarios   []string      // names to run, in the standard order (nil: all)
	LogDir      string        // each child's output goes to DIR/<scenario>.<child>.log ("": kept in memory only)
	Progress    io.Writer     // a line per scenario as it ends; nil: none
}

// DefaultOptions are the defaults above (no binary).
func DefaultOptions() Options {
	return Options{MemoryBytes: 1 << 30, RSSSlack: 256 << 20, RSSKill: 8 << 30, Total: 5 * time.Minute}
}

// scenario is one hostile situation. run drives it within ctx (the scenario's time limit);
// what it measures goes into the trial's row.
type scenario struct {
	name  string
	what  string // one line: what it does and expects
	limit time.Duration
	run   func(ctx context.Context, t *trial)
	// exits: the scenario ends the daemon on purpose (no alive or features check after it).
	exits bool
}

// scenarios is every scenario, in the order they run (files: memory.go, media.go,
// workers.go, lifecycle.go).
func scenarios() []scenario {
	return []scenario{
		{name: "body-flood", limit: 30 * time.Second, run: bodyFlood,
			what: "100 connections announce 64 MiB bodies and send 1 byte; small requests still answered, RSS within budget"},
		{name: "huge-frames", limit: 60 * time.Second, run: hugeFrames,
			what: "a video of 16 pictures, 15 of them zero-filled 9400x9400 PNGs (~5 MB): 200, 4xx or 503, RSS within budget"},
		{name: "image-overload", limit: 60 * time.Second, run: imageOverload,
			what: "400 clients send 4 MB noise PNGs for 20 s with --feature-bytes 64MiB: 200/429/503, RSS within budget"},
		{name: "fifo", limit: 40 * time.Second, run: fifoMedia,
			what: "two requests read a FIFO under --media-dir: answered within --item-timeout 5s; an unrelated request stays fast"},
		{name: "slow-media", limit: 40 * time.Second, run: slowMedia,
			what: "two requests fetch from a server sending 1 byte/s: an unrelated request's latency stays near the baseline"},
		{name: "worker-stopped", limit: 45 * time.Second, run: workerStopped,
			what: "SIGSTOP one of two mock workers for 10 s: no client waits much past --worker-first-byte-timeout 2s"},
		{name: "workers-killed", limit: 30 * time.Second, run: workersKilled,
			what: "kill both mock workers: /readyz 503, requests 503 with Retry-After"},
		{name: "one-worker-killed", limit: 40 * time.Second, run: oneWorkerKilled,
			what: "kill one of two mock workers, send 200 requests: all answered by the other (no 502)"},
		{name: "sigterm-drain", limit: 60 * time.Second, run: sigtermDrain, exits: true,
			what: "SIGTERM with 80 streams in flight, --shutdown-timeout 10s: exit 0 within 10 s, cut streams end with an error event"},
		{name: "never-fits", limit: 30 * time.Second, run: neverFits,
			what: "with --feature-bytes 8MiB, images whose features can never fit: 413"},
		{name: "client-leaves", limit: 30 * time.Second, run: clientLeaves,
			what: "clients close the socket right after sending large pictures: counted as 499 / cancelled, never 500"},
		{name: "slow-headers", limit: 30 * time.Second, run: slowHeaders,
			what: "--max-conns 20 held by 20 connections sending headers at 1 byte/s: /healthz and /metrics on --admin-listen answer 200"},
	}
}

// Names lists the scenarios with what each does, in run order.
func Names() [][2]string {
	var out [][2]string
	for _, s := range scenarios() {
		out = append(out, [2]string{s.name, s.what})
	}
	return out
}

// Run runs the scenarios one after another and returns their rows. It returns early (with the
// rows so far) when ctx ends; everything it started is killed before it returns.
func Run(ctx context.Context, o Options) ([]Row, error) {
	if o.Binary == "" {
		return nil, errors.New("chaos: no binary")
	}
	if o.MemoryBytes <= 0 || o.Total <= 0 {
		return nil, errors.New("chaos: MemoryBytes and Total must be positive")
	}
	var run []scenario
	for _, s := range scenarios() {
		if len(o.Scenarios) == 0 || slices.Contains(o.Scenarios, s.name) {
			run = append(run, s)
		}
	}
	for _, name := range o.Scenarios {
		if !slices.ContainsFunc(run, func(s scenario) bool { return s.name == name }) {
			return nil, fmt.Errorf("chaos: no scenario %q", name)
		}
	}
	help, err := serveHelp(ctx, o.Binary)
	if err != nil {
		return nil, err
	}
	if o.LogDir != "" {
		if err := os.MkdirAll(o.LogDir, 0o755); err != nil {
			return nil, err
		}
	}
	work, err := os.MkdirTemp("", "dataplane-chaos-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	h := &harness{o: o, help: help, work: work}
	end := time.Now().Add(o.Total)
	var rows []Row
	for _, s := range run {
		if ctx.Err() != nil {
			break
		}
		var row Row
		if left := time.Until(end); left < 10*time.Second {
			row = Row{Scenario: s.name, MemoryBytes: o.MemoryBytes, Failures: []string{fmt.Sprintf("not run: the run's %v were spent", o.Total)}}
		} else {
			row = h.runOne(ctx, s, min(s.limit, left))
		}
		rows = append(rows, row)
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "chaos: %-18s %s (%.1fs)\n", s.name, row.Verdict(), row.Took.Seconds())
		}
	}
	return rows, ctx.Err()
}

// harness is what every trial shares.
type harness struct {
	o    Options
	help string // `serve -h`
	work string // temporary files
	pics pictures
}

// serveHelp is the text `serve -h` prints: which flags this binary has.
func serveHelp(ctx context.Context, bin string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := execOutput(ctx, bin, "serve", "-h")
	if !strings.Contains(out, "-listen") {
		return "", fmt.Errorf("chaos: %s serve -h printed no flags (%v): %.300s", bin, err, out)
	}
	return out, nil
}

// hasFlag reports whether serve's help lists --name.
func (h *harness) hasFlag(name string) bool {
	return regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(name) + `(\s|$)`).MatchString(h.help)
}

// trial is one scenario's run: its row, the processes it started, what to close at its end.
type trial struct {
	h      *harness
	s      scenario
	dir    string // the scenario's own temporary directory
	client *http.Client

	mu       sync.Mutex
	row      Row
	procs    []*proc
	serve    *daemon // the serve process under test (the first started)
	cleanups []func()
	firstErr map[string]string // kind ("error", "timeout") → the first such error a client saw
}

// daemon is a running serve process.
type daemon struct {
	*proc
	addr  string // HOST:PORT of the API
	base  string // http://addr
	admin string // base URL of --admin-listen; "" when there is none
	mem   *memWatch
	args  []string
}

// probeBase is where /healthz and /metrics are asked: the admin listener when there is one.
func (d *daemon) probeBase() string {
	if d.admin != "" {
		return d.admin
	}
	return d.base
}

// runOne runs one scenario in a fresh trial and measures the daemon after it.
func (h *harness) runOne(parent context.Context, s scenario, limit time.Duration) Row {
	start := time.Now()
	t := &trial{h: h, s: s, dir: filepath.Join(h.work, s.name), client: newClient(512)}
	t.row = Row{Scenario: s.name, MemoryBytes: h.o.MemoryBytes, RSSBound: h.o.MemoryBytes + h.o.RSSSlack, Statuses: map[string]int{}}
	_ = os.MkdirAll(t.dir, 0o755)
	ctx, cancel := context.WithTimeout(parent, limit)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if p := recover(); p != nil {
				t.fail("harness panic: %v", p)
			}
		}()
		s.run(ctx, t)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		// Give the scenario a moment to notice; then kill what it started, which ends any
		// I/O it is stuck in.
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			if parent.Err() == nil {
				t.fail("ran past its %v limit", limit)
			}
			t.killAll()
			select {
			case <-done:
			case <-time.After(5 * time.Second): // a goroutine stuck past kill: leave it
			}
		}
	}
	cancel()
	if parent.Err() != nil {
		t.mu.Lock()
		t.row.Failures = append([]string{"interrupted: what follows is partial"}, t.row.Failures...)
		t.mu.Unlock()
	}
	t.runCleanups()
	t.measure(parent)
	t.killAll()
	t.client.CloseIdleConnections()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, kind := range slices.Sorted(maps.Keys(t.firstErr)) {
		t.row.Notes = append(t.row.Notes, fmt.Sprintf("first %s: %.220s", kind, t.firstErr[kind]))
	}
	t.row.Took = time.Since(start)
	return t.row
}

// measure fills the row's daemon columns: peak RSS, feature bytes, alive.
func (t *trial) measure(ctx context.Context) {
	d := t.serve
	if d == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if !t.s.exits && !d.exited() {
		t.readFeatures(ctx, d)
		r := t.get(ctx, d.probeBase()+"/healthz", 3*time.Second)
		t.mu.Lock()
		t.row.Alive = r.status == http.StatusOK
		if !t.row.Alive {
			t.row.AliveNote = "/healthz " + r.key()
		}
		t.mu.Unlock()
	}
	peak := d.mem.finish(d.pid)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.row.PeakRSS = peak
	if killed := d.mem.killedAt.Load(); killed > 0 {
		t.row.Failures = append(t.row.Failures, fmt.Sprintf("killed by the harness at RSS %s (--rss-kill)", formatBytes(killed)))
	}
	if peak > t.row.RSSBound {
		t.row.Failures = append(t.row.Failures, fmt.Sprintf("peak RSS %s > %s + %s", formatBytes(peak),
			formatBytes(t.row.MemoryBytes), formatBytes(t.h.o.RSSSlack)))
	}
	switch {
	case t.s.exits:
		t.row.FeaturesNote = "daemon exited"
	case d.exited() && d.mem.killedAt.Load() > 0:
		t.row.AliveNote, t.row.FeaturesNote = "killed by the harness", "daemon killed"
	case d.exited():
		t.row.AliveNote, t.row.FeaturesNote = d.exitText(), "daemon exited"
		t.row.Failures = append(t.row.Failures, "daemon died ("+d.exitText()+": "+d.tail(1)+")")
	case !t.row.Alive:
		t.row.Failures = append(t.row.Failures, "daemon not healthy ("+t.row.AliveNote+")")
	case t.row.FeaturesRead && (t.row.FeaturesUsed != 0 || t.row.FeaturesReserved != 0):
		t.row.Failures = append(t.row.Failures, "feature bytes not released")
	}
}

// readFeatures waits (up to 5 s) for the host pool's used and reserved bytes to reach 0 and
// records the last values read.
func (t *trial) readFeatures(ctx context.Context, d *daemon) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err := t.scrape(ctx, d)
		t.mu.Lock()
		if err != nil {
			t.row.FeaturesRead, t.row.FeaturesNote = false, "metrics: "+err.Error()
		} else {
			used, okU := m.get("dataplane_features_pool_bytes", "pool", "host", "use", "used")
			res, okR := m.get("dataplane_features_pool_bytes", "pool", "host", "use", "reserved")
			t.row.FeaturesRead, t.row.FeaturesNote = okU && okR, ""
			t.row.FeaturesUsed, t.row.FeaturesReserved = int64(used), int64(res)
			if !t.row.FeaturesRead {
				t.row.FeaturesNote = "no dataplane_features_pool_bytes{pool=\"host\"}"
			}
		}
		zero := t.row.FeaturesRead && t.row.FeaturesUsed == 0 && t.row.FeaturesReserved == 0
		t.mu.Unlock()
		if zero || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// scrape reads the daemon's /metrics.
func (t *trial) scrape(ctx context.Context, d *daemon) (metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.probeBase()+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// fail adds a reason the row fails; note adds a measurement.
func (t *trial) fail(format string, a ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.row.Failures = append(t.row.Failures, fmt.Sprintf(format, a...))
}

func (t *trial) note(format string, a ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.row.Notes = append(t.row.Notes, fmt.Sprintf(format, a...))
}

// count records a client request's answer in the statuses and the longest wait, and the
// first error of each kind a client saw.
func (t *trial) count(r result) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.row.Statuses[r.key()]++
	t.row.LongestWait = max(t.row.LongestWait, r.took)
	if r.status == 0 && r.err != nil {
		if t.firstErr == nil {
			t.firstErr = map[string]string{}
		}
		if _, ok := t.firstErr[r.kind]; !ok {
			t.firstErr[r.kind] = r.err.Error()
		}
	}
}

// timeout names the configured timeout the row's longest wait is compared with.
func (t *trial) timeout(name string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.row.TimeoutName, t.row.Timeout = name, d
}

func (t *trial) statuses() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.row.Statuses)
}

// onCleanup registers f to run when the scenario ends (before the daemon is measured).
func (t *trial) onCleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *trial) runCleanups() {
	t.mu.Lock()
	c := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

func (t *trial) killAll() {
	t.mu.Lock()
	procs := slices.Clone(t.procs)
	t.mu.Unlock()
	for _, p := range procs {
		p.kill()
	}
}

// start runs one child process of the trial; marker picks its log line with listen=.
func (t *trial) start(name string, args []string, marker string) (*proc, error) {
	var logFile io.Writer
	if t.h.o.LogDir != "" {
		f, err := os.Create(filepath.Join(t.h.o.LogDir, t.s.name+"."+name+".log"))
		if err != nil {
			return nil, err
		}
		t.onCleanup(func() { f.Close() })
		logFile = syncWriter{f: f}
	}
	p, err := startProc(name, t.h.o.Binary, args, marker, logFile)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.procs = append(t.procs, p)
	t.mu.Unlock()
	return p, nil
}

type syncWriter struct{ f *os.File }

func (w syncWriter) Write(b []byte) (int, error) { return w.f.Write(b) }

// startServe runs `serve` on 127.0.0.1:0 with --memory-bytes and the scenario's flags
// ("--name=value"), and waits until /readyz says 200. A flag this binary does not have is
// left out and fails the row ("serve has no --flag"): the scenario still runs.
func (t *trial) startServe(ctx context.Context, flags ...string) (*daemon, error) {
	// No NATS: the scenarios are about one daemon, and an embedded server on the default port
	// and store would tie the trials together.
	base := []string{"--listen=127.0.0.1:0", "--log-level=info", fmt.Sprintf("--memory-bytes=%d", t.h.o.MemoryBytes), "--nats=none"}
	args := []string{"serve"}
	admin := ""
	for _, f := range append(base, flags...) {
		name, value, _ := strings.Cut(strings.TrimLeft(f, "-"), "=")
		if !t.h.hasFlag(name) {
			t.fail("serve has no --%s", name)
			continue
		}
		if name == "admin-listen" {
			admin = "http://" + value
		}
		args = append(args, f)
	}
	p, err := t.start("serve", args, `msg="dataplane starting"`)
	if err != nil {
		return nil, err
	}
	d := &daemon{proc: p, admin: admin, args: args}
	d.mem = watchMemory(p, 20*time.Millisecond, t.h.o.RSSKill)
	t.mu.Lock()
	if t.serve == nil {
		t.serve = d
	}
	t.mu.Unlock()
	if d.addr, err = p.waitAddr(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	d.base = "http://" + d.addr
	if err := t.waitOK(ctx, p, d.base+"/readyz", 60*time.Second); err != nil {
		return nil, err
	}
	return d, nil
}

// startMock runs `dataplane mock` with one engine on 127.0.0.1:0 (extra flags appended) and
// returns it with its base URL once /healthz answers.
func (t *trial) startMock(ctx context.Context, name string, flags ...string) (*proc, string, error) {
	args := append([]string{"mock", "--engines=1", "--listen=127.0.0.1:0", "--stats-every=0", "--kv-events=none"}, flags...)
	p, err := t.start(name, args, "msg=serving")
	if err != nil {
		return nil, "", err
	}
	addr, err := p.waitAddr(ctx, 30*time.Second)
	if err != nil {
		return nil, "", err
	}
	base := "http://" + addr
	if err := t.waitOK(ctx, p, base+"/healthz", 30*time.Second); err != nil {
		return nil, "", err
	}
	return p, base, nil
}

// waitOK polls url until it answers 200.
func (t *trial) waitOK(ctx context.Context, p *proc, url string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	last := result{}
	for time.Now().Before(deadline) {
		if last = t.get(ctx, url, 2*time.Second); last.status == http.StatusOK {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%s exited (%s): %s", p.name, p.exitText(), p.tail(3))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: %s not 200 in %v (last: %s)", p.name, url, limit, last.key())
}

// setup reports a failure to set the scenario up (the row fails; the scenario stops).
func (t *trial) setup(err error) {
	t.fail("setup: %v", err)
}

// stopGroup signals a process group, recording a failure if it cannot.
func (t *trial) stopGroup(p *proc, sig syscall.Signal) bool {
	if err := p.signalGroup(sig); err != nil {
		t.fail("%s %s: %v", sig, p.name, err)
		return false
	}
	return true
}

// execOutput runs bin with args (DATAPLANE_* removed from the environment) and returns what
// it printed on stdout and stderr.
func execOutput(ctx context.Context, bin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = cleanEnv(os.Environ())
	out, err := cmd.CombinedOutput()
	return string(out), err
}
