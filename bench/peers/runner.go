package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Case is one comparison: our Go benchmark beside its peer (see cases.go).
type Case struct {
	Name    string
	Threads int // handed to the peer (--threads, OPENBLAS_NUM_THREADS); ours says it in Bench
	// Ours: a benchmark of package Pkg (relative to the repository root) selected by Bench,
	// run Benchtime ("3x"), reporting Metric; Higher when more is better (req/s, MB/s).
	Pkg, Bench, Benchtime, Metric string
	Higher                        bool
	// A peer script (relative to the root) run Iters times per round, with PeerArgs after
	// --iters and --threads.
	Peer     string
	Iters    int
	PeerArgs []string
	// A peer measured inside our benchmark: its name, its metric and the ratio metric the
	// benchmark reports (ours over the peer, more is better).
	PeerName, PeerMetric, RatioMetric string
}

// Range is the smallest and largest value over the rounds.
type Range struct{ Min, Max float64 }

func rangeOf(v []float64) Range {
	r := Range{math.Inf(1), math.Inf(-1)}
	for _, x := range v {
		r.Min, r.Max = min(r.Min, x), max(r.Max, x)
	}
	if len(v) == 0 {
		return Range{}
	}
	return r
}

// Result is one case over every round; Note says what is missing or failed.
type Result struct {
	Case       string    `json:"case"`
	Metric     string    `json:"metric"`
	Peer       string    `json:"peer"`
	PeerMetric string    `json:"peer_metric"`
	Ours       []float64 `json:"ours"`
	Peers      []float64 `json:"peers"`
	Ratios     []float64 `json:"ratios"` // ours against the peer, more is better, per round
	Note       string    `json:"note,omitempty"`
}

// Runner runs cases: ours and the peer alternately, Rounds times each.
type Runner struct {
	Root   string // the repository root
	BinDir string // where the compiled test binaries go
	Rounds int
	Python string   // the peers' interpreter
	Env    []string // added to the peers' environment (the BLAS library path)
	Log    io.Writer
	ISA    string // replaces {isa} in a case's Bench
	bins   map[string]string
	// ours and peer run one round's measurement; tests replace them.
	ours func(c Case) (map[string]float64, error)
	peer func(c Case) (float64, error)
}

// Run measures every case, alternating ours and the peer within each case.
func (r *Runner) Run(ctx context.Context, cs []Case) []Result {
	if r.ours == nil {
		r.ours = func(c Case) (map[string]float64, error) { return r.runOurs(ctx, c) }
	}
	if r.peer == nil {
		r.peer = func(c Case) (float64, error) { return r.runPeer(ctx, c) }
	}
	var out []Result
	for _, c := range cs {
		out = append(out, r.runCase(c))
	}
	return out
}

func (r *Runner) runCase(c Case) Result {
	res := Result{Case: c.Name, Metric: c.Metric, Peer: c.PeerName, PeerMetric: c.PeerMetric}
	script := c.Peer != ""
	if script {
		res.Peer, res.PeerMetric = filepath.Base(c.Peer), "ms/item"
		if _, err := os.Stat(filepath.Join(r.Root, c.Peer)); err != nil {
			res.Note = "peer missing: " + c.Peer
			script = false
		}
	}
	oursOK, peerOK := true, script // each side stops at its first failure; the other goes on
	for round := range r.Rounds {
		var ours float64
		var m map[string]float64
		if oursOK {
			var err error
			if m, err = r.ours(c); err != nil {
				res.Note, oursOK = join(res.Note, "ours: "+err.Error()), false
			} else if ours, oursOK = m[c.Metric]; !oursOK {
				res.Note = join(res.Note, fmt.Sprintf("ours: no %s metric", c.Metric))
			} else {
				res.Ours = append(res.Ours, ours)
				r.logf("%s round %d: ours %s %s", c.Name, round+1, num(ours), c.Metric)
			}
		}
		if oursOK && c.PeerMetric != "" { // the peer ran inside our benchmark
			peer, ratio := m[c.PeerMetric], m[c.RatioMetric]
			if peer == 0 || ratio == 0 {
				res.Note = join(res.Note, fmt.Sprintf("ours: no %s or %s metric", c.PeerMetric, c.RatioMetric))
				return res
			}
			res.Peers, res.Ratios = append(res.Peers, peer), append(res.Ratios, ratio)
		}
		if peerOK {
			peer, err := r.peer(c)
			if err != nil {
				res.Note, peerOK = join(res.Note, "peer: "+err.Error()), false
			} else {
				r.logf("%s round %d: peer %s ms/item", c.Name, round+1, num(peer))
				res.Peers = append(res.Peers, peer)
				if oursOK {
					res.Ratios = append(res.Ratios, ratio(c, ours, peer))
				}
			}
		}
		if !oursOK && !peerOK {
			break
		}
	}
	return res
}

// ratio is ours against a script peer (ms per item): how many times faster ours is.
func ratio(c Case, ours, peer float64) float64 {
	if c.Higher { // ours is a rate: turn the peer's ms per item into items per second
		return ours / (1000 / peer)
	}
	return peer / ours
}

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func (r *Runner) logf(format string, args ...any) {
	if r.Log != nil {
		fmt.Fprintf(r.Log, format+"\n", args...)
	}
}

// binary compiles pkg's tests once (go test -c) and returns the binary's path.
func (r *Runner) binary(ctx context.Context, pkg string) (string, error) {
	if b, ok := r.bins[pkg]; ok {
		return b, nil
	}
	if r.bins == nil {
		r.bins = map[string]string{}
	}
	bin, err := filepath.Abs(filepath.Join(r.BinDir, strings.NewReplacer("/", "_", ".", "").Replace(pkg)+".test"))
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, pkg)
	cmd.Dir = r.Root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go test -c %s: %v: %s", pkg, err, bytes.TrimSpace(out))
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("go test -c %s wrote no binary (no tests?)", pkg)
	}
	r.bins[pkg] = bin
	return bin, nil
}

func (r *Runner) runOurs(ctx context.Context, c Case) (map[string]float64, error) {
	bin, err := r.binary(ctx, c.Pkg)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, bin, "-test.run", "^$", "-test.bench", strings.ReplaceAll(c.Bench, "{isa}", r.ISA),
		"-test.benchtime", c.Benchtime, "-test.count", "1")
	cmd.Dir = filepath.Join(r.Root, c.Pkg) // where go test runs it: testdata paths hold
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s -test.bench %s: %v: %s", c.Pkg, c.Bench, err, tail(out))
	}
	return parseBench(out)
}

func (r *Runner) runPeer(ctx context.Context, c Case) (float64, error) {
	threads := max(c.Threads, 1)
	args := append([]string{filepath.Join(r.Root, c.Peer), "--iters", strconv.Itoa(c.Iters),
		"--threads", strconv.Itoa(threads)}, c.PeerArgs...)
	cmd := exec.CommandContext(ctx, r.Python, args...)
	cmd.Dir = r.Root
	cmd.Env = append(append(os.Environ(), r.Env...), "OPENBLAS_NUM_THREADS="+strconv.Itoa(threads))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("%s: %v: %s", c.Peer, err, tail(stderr.Bytes()))
	}
	return parsePeer(out)
}

// parseBench reads the one benchmark line of a test binary's output: its metrics by unit.
// More than one line means the pattern is too wide; none, that no benchmark matched.
func parseBench(out []byte) (map[string]float64, error) {
	var found map[string]float64
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue // a benchmark's own log line
		}
		if found != nil {
			return nil, errors.New("the pattern matched more than one benchmark")
		}
		found = map[string]float64{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("bad value %q for %s in %q", f[i], f[i+1], strings.TrimSpace(line))
			}
			found[f[i+1]] = v
		}
	}
	if found == nil {
		return nil, errors.New("no benchmark matched")
	}
	return found, nil
}

// parsePeer reads a peer's last stdout line: {"peer": ..., "case": ..., "ms_per_item": x}.
func parsePeer(out []byte) (float64, error) {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	var v struct {
		MsPerItem *float64 `json:"ms_per_item"`
	}
	if err := json.Unmarshal([]byte(last), &v); err != nil {
		return 0, fmt.Errorf("its last line is not JSON: %q", last)
	}
	if v.MsPerItem == nil || !(*v.MsPerItem > 0) || math.IsInf(*v.MsPerItem, 0) {
		return 0, fmt.Errorf("no positive ms_per_item in %q", last)
	}
	return *v.MsPerItem, nil
}

func tail(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return string(b)
}

// num prints a measurement with three significant digits, without exponents.
func num(v float64) string {
	switch a := math.Abs(v); {
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 0.01:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func span(v []float64, unit string) string {
	if len(v) == 0 {
		return ""
	}
	r := rangeOf(v)
	s := num(r.Min) + "–" + num(r.Max)
	if unit != "" {
		s += " " + unit
	}
	return s
}

// Table writes the results as one Markdown table after the machine's description.
func Table(w io.Writer, env Env, rs []Result) {
	fmt.Fprintf(w, "CPU: %s; ISA: %s; torch BLAS: %s; %d rounds, ours and the peer alternating\n\n",
		env.CPU, env.ISA, env.BLAS, env.Rounds)
	fmt.Fprintln(w, "| case | ours | peer | ratio (ours vs peer, > 1: ours faster) | note |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, r := range rs {
		peer := r.Peer
		if p := span(r.Peers, r.PeerMetric); p != "" {
			peer += ": " + p
		}
		ratios := span(r.Ratios, "")
		if ratios != "" {
			ratios += "×"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", r.Case, span(r.Ours, r.Metric), peer, ratios, r.Note)
	}
}
