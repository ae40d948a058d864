// Command peers (`make bench-peers`) runs our benchmarks beside the peers a user would pick
// (PyTorch, Pillow + torchvision, memcpy, a fasthttp hello-world), alternating rounds, and
// prints one table of ranges and ratios with the machine's CPU, our kernels' ISA and the BLAS
// torch loaded. The cases are in cases.go.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"dataplane/native"
)

// openBLAS is Debian's libopenblas0-pthread unpacked under build/ (make deps-peers: the package
// is extracted, not installed, because installing it switches the machine's BLAS alternatives),
// put first on the peers' library path so torch loads it; $DATAPLANE_OPENBLAS_DIR overrides it.
func openBLAS(root string) string {
	if d := os.Getenv("DATAPLANE_OPENBLAS_DIR"); d != "" {
		return d
	}
	return filepath.Join(root, "build/openblas/usr/lib/x86_64-linux-gnu/openblas-pthread")
}

func main() {
	rounds := flag.Int("rounds", 3, "rounds per case (ours, peer, ours, peer, ...)")
	only := flag.String("cases", "", "run only the cases whose name matches this regular expression")
	out := flag.String("out", "build/bench-peers", "write the table to OUT.md and the results to OUT.json")
	python := flag.String("python", "/usr/bin/python3", "the peers' interpreter")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *rounds, *only, *out, *python); err != nil {
		fmt.Fprintln(os.Stderr, "bench-peers:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, rounds int, only, out, python string) error {
	re, err := regexp.Compile(only)
	if err != nil {
		return err
	}
	var cs []Case
	for _, c := range cases {
		if re.MatchString(c.Name) {
			cs = append(cs, c)
		}
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	bins := filepath.Join(filepath.Dir(out), "bench-peers-bin")
	blasEnv := []string{"LD_LIBRARY_PATH=" + strings.Trim(openBLAS(root)+":"+os.Getenv("LD_LIBRARY_PATH"), ":"),
		"DATAPLANE_OPENBLAS_DIR=" + openBLAS(root)}
	env := Env{CPU: cpuModel(), ISA: native.BestISA().String(), BLAS: torchBLAS(ctx, python, blasEnv),
		Go: runtime.Version(), Rounds: rounds}
	r := &Runner{Root: root, BinDir: bins, Rounds: rounds, Python: python, Env: blasEnv, Log: os.Stderr, ISA: env.ISA}
	results := r.Run(ctx, cs)
	var table bytes.Buffer
	Table(&table, env, results)
	os.Stdout.Write(table.Bytes()) //nolint:errcheck
	raw, err := json.MarshalIndent(struct {
		Env
		Results []Result `json:"results"`
	}{env, results}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(out+".json", append(raw, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(out+".md", table.Bytes(), 0o644)
}

// Env is the machine a table was measured on.
type Env struct {
	CPU    string `json:"cpu"`
	ISA    string `json:"isa"`  // native.BestISA: what our kernels ran
	BLAS   string `json:"blas"` // the BLAS library torch had loaded after a matmul
	Go     string `json:"go"`
	Rounds int    `json:"rounds"`
}

// cpuModel is /proc/cpuinfo's model name, with the count of logical CPUs.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return fmt.Sprintf("%s (%d logical CPUs)", strings.TrimSpace(v), runtime.NumCPU())
		}
	}
	return "unknown"
}

// torchBLAS asks torch, under the peers' environment, which BLAS libraries its process mapped
// once a matmul ran: the library actually used, not the one torch was built against.
func torchBLAS(ctx context.Context, python string, env []string) string {
	const probe = `import torch
torch.ones(64, 64) @ torch.ones(64, 64)
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "blas" in l.split()[-1].lower()})
print(" ".join(libs) or "none found")`
	cmd := exec.CommandContext(ctx, python, "-c", probe)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		return "unknown (torch not importable: " + err.Error() + ")"
	}
	return strings.TrimSpace(string(out))
}
