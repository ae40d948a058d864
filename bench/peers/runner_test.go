package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseBench(t *testing.T) {
	out := []byte(`goos: linux
BenchmarkTextOnlyPath-2   	       2	 439080452 ns/op	       127.0 added-p99-us	     87906 hello-req/s	     38902 req/s	         0.4425 x-hello
PASS
`)
	m, err := parseBench(out)
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"ns/op": 439080452, "added-p99-us": 127, "hello-req/s": 87906, "req/s": 38902, "x-hello": 0.4425}, m)

	_, err = parseBench([]byte("PASS\n"))
	require.ErrorContains(t, err, "no benchmark matched")
	_, err = parseBench(append(out, out...))
	require.ErrorContains(t, err, "more than one")
	m, err = parseBench([]byte("BenchmarkX/threads=1 logs a line\nBenchmarkX/threads=1-2 \t 3\t 1.5 ms/item\n"))
	require.NoError(t, err)
	require.Equal(t, 1.5, m["ms/item"])
}

func TestParsePeer(t *testing.T) {
	v, err := parsePeer([]byte("loading\n{\"peer\": \"torch\", \"case\": \"vit\", \"ms_per_item\": 12.5, \"threads\": 2}\n"))
	require.NoError(t, err)
	require.Equal(t, 12.5, v)
	for _, bad := range []string{"", "12.5", `{"ms_per_item": 0}`, `{"ms": 3}`, `{"ms_per_item": "3"}`} {
		_, err := parsePeer([]byte(bad))
		require.Error(t, err, bad)
	}
}

// The runner alternates ours and the peer round by round, computes ratios per round (the peer's
// time over ours, or ours as a rate over the peer's), reads a real peer command's JSON line,
// says when a peer script is missing and goes on to the next case; one side failing leaves the
// other's range in the table.
func TestRunnerAlternatesAndRatios(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "bench/peers"), 0o755))
	// A peer that takes 2 ms per item and logs its arguments and environment on stderr.
	peer := "#!/bin/sh\necho \"$@ $OPENBLAS_NUM_THREADS\" >&2\necho '{\"peer\":\"fake\",\"case\":\"x\",\"ms_per_item\":2}'\n"
	require.NoError(t, os.WriteFile(filepath.Join(root, "bench/peers/fake.py"), []byte(peer), 0o755))
	var order []string
	oursMs := []float64{1, 4, 2}
	r := &Runner{Root: root, Rounds: 3, Python: "sh", ISA: "avx2"}
	r.ours = func(c Case) (map[string]float64, error) {
		order = append(order, "ours")
		switch c.Name {
		case "inside":
			return map[string]float64{"req/s": 40, "hello-req/s": 50, "x-hello": 0.8}, nil
		case "rate":
			return map[string]float64{"items/s": 1000}, nil
		}
		return map[string]float64{"ms/item": oursMs[len(order)/2%3]}, nil
	}
	r.peer = func(c Case) (float64, error) {
		order = append(order, "peer")
		return r.runPeer(context.Background(), c)
	}
	cs := []Case{
		{Name: "script", Metric: "ms/item", Peer: "bench/peers/fake.py", Iters: 5, Threads: 2},
		{Name: "missing", Metric: "ms/item", Peer: "bench/peers/absent.py", Iters: 5},
		{Name: "inside", Metric: "req/s", Higher: true, PeerName: "hello", PeerMetric: "hello-req/s", RatioMetric: "x-hello"},
		{Name: "rate", Metric: "items/s", Higher: true, Peer: "bench/peers/fake.py", Iters: 1},
		{Name: "wrong metric", Metric: "ms/frame", Peer: "bench/peers/fake.py", Iters: 1},
	}
	rs := r.Run(context.Background(), cs[:1])
	require.Equal(t, []string{"ours", "peer", "ours", "peer", "ours", "peer"}, order)
	require.Equal(t, []float64{1, 4, 2}, rs[0].Ours)
	require.Equal(t, []float64{2, 2, 2}, rs[0].Peers)
	require.Equal(t, []float64{2, 0.5, 1}, rs[0].Ratios)
	require.Empty(t, rs[0].Note)

	order = nil
	rs = r.Run(context.Background(), cs[1:])
	require.Equal(t, "peer missing: bench/peers/absent.py", rs[0].Note)
	require.Len(t, rs[0].Ours, 3, "ours still runs")
	require.Empty(t, rs[0].Peers)
	require.Equal(t, []float64{0.8, 0.8, 0.8}, rs[1].Ratios)
	require.Equal(t, []float64{50, 50, 50}, rs[1].Peers)
	require.Equal(t, []float64{2, 2, 2}, rs[2].Ratios, "1000 items/s against 500")
	require.Equal(t, "ours: no ms/frame metric", rs[3].Note)
	require.Equal(t, []float64{2, 2, 2}, rs[3].Peers, "the peer still runs: its range is in the table")
	require.Empty(t, rs[3].Ratios)

	var table bytes.Buffer
	Table(&table, Env{CPU: "Fake CPU", ISA: "avx2", BLAS: "libopenblas.so.0", Rounds: 3}, rs)
	require.Contains(t, table.String(), "CPU: Fake CPU; ISA: avx2; torch BLAS: libopenblas.so.0; 3 rounds")
	require.Contains(t, table.String(), "| inside | 40.0–40.0 req/s | hello: 50.0–50.0 hello-req/s | 0.80–0.80× |  |")
	require.Contains(t, table.String(), "| missing | 1.00–4.00 ms/item | absent.py |  | peer missing: bench/peers/absent.py |")
}

func TestRunPeerArguments(t *testing.T) {
	root := t.TempDir()
	log := filepath.Join(root, "args")
	script := "#!/bin/sh\necho \"$@ $OPENBLAS_NUM_THREADS $X\" > " + strconv.Quote(log) + "\necho '{\"ms_per_item\":3}'\n"
	require.NoError(t, os.WriteFile(filepath.Join(root, "p.py"), []byte(script), 0o755))
	r := &Runner{Root: root, Python: "sh", Env: []string{"X=blas"}}
	v, err := r.runPeer(context.Background(), Case{Peer: "p.py", Iters: 7, Threads: 2, PeerArgs: []string{"--size", "8"}})
	require.NoError(t, err)
	require.Equal(t, 3.0, v)
	got, err := os.ReadFile(log)
	require.NoError(t, err)
	require.Equal(t, "--iters 7 --threads 2 --size 8 2 blas\n", string(got))

	require.NoError(t, os.WriteFile(filepath.Join(root, "p.py"), []byte("#!/bin/sh\necho boom >&2\nexit 3\n"), 0o755))
	_, err = r.runPeer(context.Background(), Case{Peer: "p.py", Iters: 1})
	require.ErrorContains(t, err, "boom")
}

// The parsers take any output without panicking; what they accept is well formed.
func FuzzParse(f *testing.F) {
	f.Add([]byte("BenchmarkX-2 \t 3\t 1.5 ms/item\t 2 x-hello\n"))
	f.Add([]byte(`{"peer":"torch","case":"vit","ms_per_item":12.5}`))
	f.Fuzz(func(t *testing.T, out []byte) {
		if m, err := parseBench(out); err == nil && m == nil {
			t.Fatal("no error and no metrics")
		}
		if v, err := parsePeer(out); err == nil && !(v > 0) {
			t.Fatalf("accepted ms_per_item %v", v)
		}
	})
}
