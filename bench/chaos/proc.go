package chaos

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// proc is a child process the harness started. It runs in its own process group, so a signal
// reaches whatever it starts in turn (serve's GPU probe) and a Ctrl-C at the terminal reaches
// only the harness, which then kills it. Its output is kept (the last lines) and scanned for
// the address it listens on.
type proc struct {
	name string
	cmd  *exec.Cmd
	pid  int

	mu     sync.Mutex
	lines  []string // the last maxLines lines of stdout and stderr
	marker string   // the log line that says where it listens contains this
	addr   string   // the listen=HOST:PORT of the first line with the marker
	got    chan struct{}

	done     chan struct{} // closed when it exited
	code     int           // exit status; -1 when a signal ended it
	signal   string        // the signal that ended it, if one did
	exitedAt time.Time
}

const maxLines = 200

var listenRE = regexp.MustCompile(`\blisten=(\S+:\d+)`)

// startProc runs bin with args, environment variables DATAPLANE_* removed (so the caller's
// settings cannot change what a scenario runs). Its address is the listen= of the first line
// of its output that contains marker. Its output also goes to logFile when not nil.
func startProc(name, bin string, args []string, marker string, logFile io.Writer) (*proc, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.Env = cleanEnv(os.Environ())
	// Its own group; and killed with the harness if the harness dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	w.Close()
	p := &proc{name: name, cmd: cmd, pid: cmd.Process.Pid, marker: marker, got: make(chan struct{}), done: make(chan struct{})}
	go p.read(r, logFile)
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.code, p.exitedAt = cmd.ProcessState.ExitCode(), time.Now()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.signal = ws.Signal().String()
		}
		p.mu.Unlock()
		_ = err // the exit status above says it all
		close(p.done)
	}()
	return p, nil
}

func cleanEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "DATAPLANE_") {
			out = append(out, kv)
		}
	}
	return out
}

// read keeps the last lines of the child's output and notes the first listen address.
func (p *proc) read(r *os.File, logFile io.Writer) {
	defer r.Close()
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			if logFile != nil {
				_, _ = io.WriteString(logFile, line)
			}
			line = strings.TrimRight(line, "\n")
			if len(line) > 2000 {
				line = line[:2000] + "…"
			}
			p.mu.Lock()
			if p.addr == "" && strings.Contains(line, p.marker) {
				if m := listenRE.FindStringSubmatch(line); m != nil {
					p.addr = m[1]
					close(p.got)
				}
			}
			if len(p.lines) == maxLines {
				copy(p.lines, p.lines[1:])
				p.lines = p.lines[:maxLines-1]
			}
			p.lines = append(p.lines, line)
			p.mu.Unlock()
		}
		if err != nil {
			return
		}
	}
}

// waitAddr returns the address the process said it listens on.
func (p *proc) waitAddr(ctx context.Context, timeout time.Duration) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.got:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.addr, nil
	case <-p.done:
		return "", fmt.Errorf("%s exited (%s) before listening: %s", p.name, p.exitText(), p.tail(3))
	case <-t.C:
		return "", fmt.Errorf("%s logged no listen address in %v: %s", p.name, timeout, p.tail(3))
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// tail returns the last n lines of the output, each cut at 200 bytes, joined by " | ".
func (p *proc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, l := range p.lines[max(0, len(p.lines)-n):] {
		if len(l) > 200 {
			l = l[:200] + "…"
		}
		out = append(out, l)
	}
	return strings.Join(out, " | ")
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitText says how it ended: "exit 0", "killed by signal: killed".
func (p *proc) exitText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.signal != "" {
		return "signal: " + p.signal
	}
	return "exit " + strconv.Itoa(p.code)
}

// signalGroup sends sig to the process's group.
func (p *proc) signalGroup(sig syscall.Signal) error {
	if p.exited() {
		return errors.New(p.name + " has exited")
	}
	return syscall.Kill(-p.pid, sig)
}

// kill ends the process group with SIGKILL and waits (briefly) for the exit.
func (p *proc) kill() {
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

// procStatus is what the harness reads from /proc/PID/status: resident set now and its peak.
type procStatus struct {
	RSS, HWM int64 // bytes
}

// parseProcStatus reads VmRSS and VmHWM (in kB) from the text of /proc/PID/status.
func parseProcStatus(b []byte) (procStatus, error) {
	var st procStatus
	var seen int
	for line := range bytes.Lines(b) {
		var dst *int64
		switch {
		case bytes.HasPrefix(line, []byte("VmRSS:")):
			dst = &st.RSS
		case bytes.HasPrefix(line, []byte("VmHWM:")):
			dst = &st.HWM
		default:
			continue
		}
		f := strings.Fields(string(line[6:]))
		if len(f) != 2 || f[1] != "kB" {
			return st, fmt.Errorf("proc status: %q", bytes.TrimSpace(line))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return st, fmt.Errorf("proc status: %q: %w", bytes.TrimSpace(line), err)
		}
		*dst = kb << 10
		seen++
	}
	if seen < 2 {
		return st, errors.New("proc status: no VmRSS and VmHWM (a zombie, or not Linux)")
	}
	return st, nil
}

func readProcStatus(pid int) (procStatus, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return procStatus{}, err
	}
	return parseProcStatus(b)
}

// memWatch samples a process's resident set every interval until it exits or stop is called,
// and kills its group when the resident set passes killAbove (it protects the machine; the
// verdict's bound is lower).
type memWatch struct {
	peak, hwm atomic.Int64
	killedAt  atomic.Int64 // the RSS at which it killed the process; 0: it did not
	stop      chan struct{}
	stopped   chan struct{}
}

func watchMemory(p *proc, every time.Duration, killAbove int64) *memWatch {
	m := &memWatch{stop: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(m.stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			m.sample(p.pid)
			if rss := m.peak.Load(); killAbove > 0 && rss > killAbove && m.killedAt.Load() == 0 {
				m.killedAt.Store(rss)
				_ = p.signalGroup(syscall.SIGKILL)
			}
			select {
			case <-t.C:
			case <-m.stop:
				return
			case <-p.done:
				return
			}
		}
	}()
	return m
}

func (m *memWatch) sample(pid int) {
	st, err := readProcStatus(pid)
	if err != nil {
		return
	}
	if st.RSS > m.peak.Load() {
		m.peak.Store(st.RSS)
	}
	if st.HWM > m.hwm.Load() {
		m.hwm.Store(st.HWM)
	}
}

// finish stops sampling, reads VmHWM one last time (while the process lives) and returns the
// peak: the larger of the sampled VmRSS and VmHWM.
func (m *memWatch) finish(pid int) int64 {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.stopped
	m.sample(pid)
	return max(m.peak.Load(), m.hwm.Load())
}
