package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The local backend starts and stops worker processes on this machine, one GPU set each, and
// keeps them in a JSON statefile as Dynamo's LocalConnector does
// (components/planner/src/dynamo/planner/local_connector.py): one entry per process, named
// <namespace>_<pool> for the first (which keeps the command to clone, even when stopped) and
// <namespace>_<pool>_<n> for the ones added; adding takes the next suffix and the first free
// GPUs, removing stops the highest suffix.

// State is the statefile.
type State struct {
	Namespace   string               `json:"namespace"`
	Environment StateEnvironment     `json:"environment"`
	Components  map[string]Component `json:"components"`
}

// StateEnvironment is what the processes share: the GPUs to hand out (none: workers get no
// GPUs, as mock engines need none).
type StateEnvironment struct {
	SystemResources struct {
		GPUInfo []string `json:"gpu_info"`
	} `json:"SYSTEM_RESOURCES"`
}

// Component is one process. Cmd is a shell command line (run as `exec CMD` by /bin/sh) in
// which {name} becomes the entry's name and {gpus} its GPUs, comma-separated; the process gets
// CUDA_VISIBLE_DEVICES too. A restarted planner adopts a recorded pid only if its command line
// names the entry (so the template should use {name}). It must announce its workers in the fleet under the entry's name,
// or names that start with it and a hyphen (dataplane mock --name-prefix {name}-).
type Component struct {
	Pool      Pool   `json:"pool"`
	Cmd       string `json:"cmd"`
	Resources struct {
		AllocatedGPUs []string `json:"allocated_gpus,omitempty"`
	} `json:"resources"`
	PID     int  `json:"pid,omitempty"`
	Stopped bool `json:"stopped,omitempty"` // the first entry, scaled away: kept for its command
}

// Fleet is what the local backend needs to see of the fleet: how many workers a process has
// announced, and removing one's announcement (revoking its lease).
type Fleet interface {
	Count(pool Pool, prefix string) int
	Names(prefix string) []string
	Revoke(ctx context.Context, name string) error
}

// LocalOptions configure the local backend.
type LocalOptions struct {
	StateFile    string
	Fleet        Fleet
	PrefillGPUs  int           // GPUs per prefill worker (with gpu_info)
	DecodeGPUs   int           // and per decode worker
	StartTimeout time.Duration // a new worker must be announced within this; 5 min
	StopTimeout  time.Duration // a stopped one must exit within this, then it is killed; 2 min
	Output       io.Writer     // the workers' stdout and stderr (nil: discarded)
	Log          *slog.Logger
}

// Local is the local backend.
type Local struct {
	o    LocalOptions
	mu   sync.Mutex // one change at a time, and procs
	proc map[string]*localProc
}

type localProc struct {
	pid  int
	done chan struct{} // closed when it exited (nil: adopted, polled)
}

// NewLocal opens the statefile (it must exist and name the first entry of each pool used).
func NewLocal(o LocalOptions) (*Local, error) {
	if o.StartTimeout <= 0 {
		o.StartTimeout = 5 * time.Minute
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = 2 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	o.PrefillGPUs, o.DecodeGPUs = max(o.PrefillGPUs, 1), max(o.DecodeGPUs, 1)
	l := &Local{o: o, proc: map[string]*localProc{}}
	if _, err := l.load(); err != nil {
		return nil, err
	}
	return l, nil
}

// maxStateBytes bounds the statefile.
const maxStateBytes = 4 << 20

// ParseState reads and checks a statefile.
func ParseState(b []byte) (*State, error) {
	if len(b) > maxStateBytes {
		return nil, fmt.Errorf("statefile: %d bytes, at most %d", len(b), maxStateBytes)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("statefile: %w", err)
	}
	if s.Namespace == "" || strings.ContainsAny(s.Namespace, " \t\n/") {
		return nil, fmt.Errorf("statefile: namespace %q: want a non-empty name", s.Namespace)
	}
	if len(s.Components) == 0 {
		return nil, errors.New("statefile: no components")
	}
	for name, c := range s.Components {
		pool, n, ok := s.parseName(name)
		switch {
		case !ok:
			return nil, fmt.Errorf("statefile: component %q: want %s_prefill, %s_decode or those with _<n>", name, s.Namespace, s.Namespace)
		case c.Pool != pool:
			return nil, fmt.Errorf("statefile: component %q: pool %q, its name says %q", name, c.Pool, pool)
		case n == 0 && strings.TrimSpace(c.Cmd) == "":
			return nil, fmt.Errorf("statefile: component %q: no cmd", name)
		case n > 0 && c.Stopped:
			return nil, fmt.Errorf("statefile: component %q: only the first entry of a pool can be kept stopped", name)
		}
		if _, ok := s.Components[s.Namespace+"_"+string(pool)]; !ok {
			return nil, fmt.Errorf("statefile: component %q: no first entry %s_%s to clone", name, s.Namespace, pool)
		}
	}
	return &s, nil
}

// parseName splits <namespace>_<pool>[_<n>].
func (s *State) parseName(name string) (Pool, int, bool) {
	rest, ok := strings.CutPrefix(name, s.Namespace+"_")
	if !ok {
		return "", 0, false
	}
	pool, suffix, has := strings.Cut(rest, "_")
	if poolCheck(Pool(pool)) != nil {
		return "", 0, false
	}
	if !has {
		return Pool(pool), 0, true
	}
	n, err := strconv.Atoi(suffix)
	if err != nil || n < 1 || strconv.Itoa(n) != suffix {
		return "", 0, false
	}
	return Pool(pool), n, true
}

// running lists a pool's running entries, by suffix.
func (s *State) running(pool Pool) []string {
	type entry struct {
		name string
		n    int
	}
	var es []entry
	for name, c := range s.Components {
		if p, n, _ := s.parseName(name); p == pool && !c.Stopped {
			es = append(es, entry{name, n})
		}
	}
	slices.SortFunc(es, func(a, b entry) int { return a.n - b.n })
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.name
	}
	return out
}

func (l *Local) lock() (func(), error) {
	f, err := os.OpenFile(l.o.StateFile+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

func (l *Local) load() (*State, error) {
	unlock, err := l.lock()
	if err != nil {
		return nil, fmt.Errorf("statefile lock: %w", err)
	}
	defer unlock()
	b, err := os.ReadFile(l.o.StateFile)
	if err != nil {
		return nil, err
	}
	return ParseState(b)
}

// save writes the statefile atomically.
func (l *Local) save(s *State) error {
	unlock, err := l.lock()
	if err != nil {
		return fmt.Errorf("statefile lock: %w", err)
	}
	defer unlock()
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(l.o.StateFile), ".state-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), l.o.StateFile)
}

// Start starts every running entry that has no live process (a process a previous planner
// started and that still runs is adopted), and waits until each is announced.
func (l *Local) Start(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, err := l.load()
	if err != nil {
		return err
	}
	var started []string
	for _, pool := range []Pool{PoolPrefill, PoolDecode} {
		for _, name := range s.running(pool) {
			c := s.Components[name]
			if c.PID > 0 && ours(c.PID, name) {
				l.proc[name] = &localProc{pid: c.PID}
				l.o.Log.Info("planner: adopted a running worker", "name", name, "pid", c.PID)
				continue
			}
			if err := l.startProc(s, name); err != nil {
				return err
			}
			started = append(started, name)
		}
	}
	if err := l.save(s); err != nil {
		return err
	}
	for _, name := range started {
		if err := l.waitAnnounced(ctx, s.Components[name].Pool, name); err != nil {
			return err
		}
	}
	return nil
}

// startProc starts entry name's process and records its pid in s.
func (l *Local) startProc(s *State, name string) error {
	c := s.Components[name]
	base := s.Components[s.Namespace+"_"+string(c.Pool)]
	gpus := strings.Join(c.Resources.AllocatedGPUs, ",")
	line := strings.NewReplacer("{name}", name, "{gpus}", gpus).Replace(base.Cmd)
	cmd := exec.Command("/bin/sh", "-c", "exec "+line)
	cmd.Env = os.Environ()
	if gpus != "" {
		cmd.Env = append(cmd.Env, "CUDA_VISIBLE_DEVICES="+gpus)
	}
	cmd.Stdout, cmd.Stderr = l.o.Output, l.o.Output
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the planner's Ctrl-C is not theirs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &localProc{pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	l.proc[name] = p
	c.PID, c.Cmd = p.pid, line
	if name == s.Namespace+"_"+string(c.Pool) {
		c.Cmd = base.Cmd // the first entry keeps the template
	}
	s.Components[name] = c
	l.o.Log.Info("planner: started a worker", "name", name, "pid", p.pid, "gpus", gpus, "cmd", line)
	return nil
}

func (l *Local) waitAnnounced(ctx context.Context, pool Pool, name string) error {
	ctx, cancel := context.WithTimeout(ctx, l.o.StartTimeout)
	defer cancel()
	for l.o.Fleet.Count(pool, name) == 0 {
		if p := l.proc[name]; p != nil && p.exited() {
			return fmt.Errorf("worker %s exited before it was announced", name)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("worker %s: not announced as %s within %v", name, pool, l.o.StartTimeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

func (p *localProc) exited() bool {
	if p.done == nil {
		return !alive(p.pid)
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// ours says whether pid is alive and still the worker entry name started: its command line
// names the entry (a pid the system reused for another process does not), so a restarted
// planner never signals a stranger.
func ours(pid int, name string) bool {
	if !alive(pid) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	for _, arg := range strings.Split(string(b), "\x00") {
		if strings.Contains(arg, name) {
			return true
		}
	}
	return false
}

// Add is Backend's: the next suffix, the first free GPUs, and it returns once the worker is
// announced.
// Manages says whether the statefile has the pool's first entry, the command to clone.
func (l *Local) Manages(pool Pool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, err := l.load()
	if err != nil {
		return true // let the change report the error
	}
	_, ok := s.Components[s.Namespace+"_"+string(pool)]
	return ok
}

func (l *Local) Add(ctx context.Context, pool Pool) error {
	if err := poolCheck(pool); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s, err := l.load()
	if err != nil {
		return err
	}
	first := s.Namespace + "_" + string(pool)
	base, ok := s.Components[first]
	if !ok {
		return fmt.Errorf("statefile has no %s entry to clone", first)
	}
	name := first
	if !base.Stopped { // the first runs: a numbered one
		top := 0
		for n := range s.Components {
			if p, k, _ := s.parseName(n); p == pool {
				top = max(top, k)
			}
		}
		name = fmt.Sprintf("%s_%d", first, top+1)
	}
	gpus, err := l.freeGPUs(s, pool)
	if err != nil {
		return err
	}
	c := Component{Pool: pool, Cmd: base.Cmd}
	c.Resources.AllocatedGPUs = gpus
	s.Components[name] = c
	if err := l.startProc(s, name); err != nil {
		return err
	}
	if err := l.save(s); err != nil {
		return err
	}
	if err := l.waitAnnounced(ctx, pool, name); err != nil {
		_ = l.stop(ctx, s, name, false) // a worker that never came is not left behind
		return err
	}
	return nil
}

func (l *Local) freeGPUs(s *State, pool Pool) ([]string, error) {
	all := s.Environment.SystemResources.GPUInfo
	if len(all) == 0 {
		return nil, nil
	}
	want := l.o.DecodeGPUs
	if pool == PoolPrefill {
		want = l.o.PrefillGPUs
	}
	used := map[string]bool{}
	for _, c := range s.Components {
		for _, g := range c.Resources.AllocatedGPUs {
			used[g] = true
		}
	}
	var out []string
	for _, g := range all {
		if !used[g] && len(out) < want {
			out = append(out, g)
		}
	}
	if len(out) < want {
		return nil, fmt.Errorf("%d free GPUs of %d, a %s worker needs %d", len(out), len(all), pool, want)
	}
	return out, nil
}

// Remove is Backend's: the highest suffix goes. A decode worker's lease is revoked first (it
// leaves routing at once), then it is sent SIGTERM and drains; a prefill worker is sent
// SIGTERM and finishes what it computes. It returns once the process exited.
func (l *Local) Remove(ctx context.Context, pool Pool) error {
	if err := poolCheck(pool); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s, err := l.load()
	if err != nil {
		return err
	}
	run := s.running(pool)
	if len(run) == 0 {
		return fmt.Errorf("%s: %w", pool, ErrNoWorker)
	}
	return l.stop(ctx, s, run[len(run)-1], pool == PoolDecode)
}

func (l *Local) stop(ctx context.Context, s *State, name string, revoke bool) error {
	if revoke {
		for _, w := range l.o.Fleet.Names(name) {
			if err := l.o.Fleet.Revoke(ctx, w); err != nil {
				l.o.Log.Warn("planner: revoking a lease failed; the worker leaves when it stops", "worker", w, "err", err)
			}
		}
	}
	p := l.proc[name]
	c := s.Components[name]
	if p == nil && c.PID > 0 && ours(c.PID, name) {
		p = &localProc{pid: c.PID}
	}
	if p != nil {
		_ = syscall.Kill(p.pid, syscall.SIGTERM)
		if err := l.waitExit(ctx, p); err != nil {
			l.o.Log.Warn("planner: a worker did not exit in time: killed", "name", name, "pid", p.pid, "err", err)
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
			_ = l.waitExit(context.Background(), p)
		}
		delete(l.proc, name)
		l.o.Log.Info("planner: stopped a worker", "name", name, "pid", p.pid, "revoked_first", revoke)
	}
	if _, n, _ := s.parseName(name); n == 0 {
		c.Stopped, c.PID = true, 0
		c.Resources.AllocatedGPUs = nil
		s.Components[name] = c
	} else {
		delete(s.Components, name)
	}
	return l.save(s)
}

func (l *Local) waitExit(ctx context.Context, p *localProc) error {
	ctx, cancel := context.WithTimeout(ctx, l.o.StopTimeout)
	defer cancel()
	for !p.exited() {
		var done <-chan struct{} = p.done
		if done == nil {
			done = make(chan struct{}) // adopted: polled
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// StopAll stops every process this backend started or adopted (the planner's shutdown with
// --stop-workers), without touching the statefile's entries.
func (l *Local) StopAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, p := range l.proc {
		_ = syscall.Kill(p.pid, syscall.SIGTERM)
		if err := l.waitExit(context.Background(), p); err != nil {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		delete(l.proc, name)
	}
}
