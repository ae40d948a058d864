package main

import (
	"bytes"
	"context"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/bench/mocker"
)

func runBench(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append([]string{"bench"}, args...), &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	return stdout.String()
}

// runBenchErr runs a bench command that must fail and returns what it said.
func runBenchErr(t *testing.T, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	code := run(context.Background(), append([]string{"bench"}, args...), io.Discard, &stderr)
	require.NotEqual(t, 0, code)
	return stderr.String()
}

// `bench ab` prints one row per policy and the comparison, and writes its CSV and chart.
func TestBenchAB(t *testing.T) {
	trace := synthTrace(t, "--requests", "150", "--seed", "3", "--video-share", "0.2", "--video-frames", "8")
	dir := t.TempDir()
	out := runBench(t, "ab", "--trace", trace, "--seed", "9", "--out", dir, "--encodings", "async", "--without-media")
	require.Regexp(t, `(?m)^\s+round-robin\s+without-media`, out)
	require.Regexp(t, `(?m)^\s+kv\s+async`, out)
	require.Regexp(t, `(?m)^\s+kv\s+async\s+text-only\s+\d+\s+\d+ ms\s+\d+ ms\s+[\d.]+x$`, out)
	require.Regexp(t, `(?m)^\s+kv\s+async\s+video\s+\d+`, out)
	require.Regexp(t, `kv/async vs round-robin/without-media: TTFT p50 [\d.]+x`, out)
	for _, f := range []string{"ab.csv", "ab_ttft.png"} {
		_, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err)
	}
	csv, err := os.ReadFile(filepath.Join(dir, "ab.csv"))
	require.NoError(t, err)
	require.Contains(t, string(csv), "\nkv,async,video,")
	require.Contains(t, string(csv), "\nkv,async,all,150,")
	out = runBench(t, "ab", "--trace", trace, "--seed", "9", "--policies", "kv-modality", "--encodings", "async", "--overlap", "both", "--overlap-min-tokens", "512")
	require.Regexp(t, `(?m)^\s+kv-modality\s+async\+overlap\s+\d+-\d+ tokens\s+\d+\s+\d+ ms\s+\d+ ms\s+\d+ / \d+ / \d+$`, out)
	require.Contains(t, runBenchErr(t, "ab", "--trace", trace, "--overlap", "maybe"), `--overlap "maybe"`)
}

// `bench load` against a mock fleet over HTTP, and `bench fleet` in-process: every request
// completes.
func TestBenchLoadAndFleet(t *testing.T) {
	trace := synthTrace(t, "--requests", "40", "--seed", "4", "--speedup-ratio", "20", "--osl-multiplier", "0.1")
	fo := mocker.DefaultFleetOptions()
	fo.Engines, fo.Clock = 2, mocker.Clock{Speedup: 50}
	f, err := mocker.NewFleet(fo)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = f.Run(ctx) }()
	srv := httptest.NewServer(mocker.NewServer(f, mocker.DefaultServerOptions()))
	defer func() { srv.Close(); cancel(); wg.Wait() }()

	dir := t.TempDir()
	out := runBench(t, "load", "--endpoints", srv.URL+"/engines/0,"+srv.URL+"/engines/1", "--trace", trace, "--speedup", "5", "--out", dir)
	require.Contains(t, out, "requests 40: 40 completed, 0 failed")
	_, err = os.Stat(filepath.Join(dir, "requests.csv"))
	require.NoError(t, err)

	out = runBench(t, "fleet", "--engines", "100", "--trace", trace, "--speedup", "20", "--load-speedup", "5", "--stats-every", "0")
	require.Contains(t, out, "100 engines")
	require.Contains(t, out, "requests 40: 40 completed, 0 failed")
	m := regexp.MustCompile(`lag behind schedule: mean (\S+), worst`).FindStringSubmatch(out)
	require.NotNil(t, m, out)

	// Routed by the router over the engines' KV events from an embedded NATS server.
	out = runBench(t, "fleet", "--engines", "100", "--trace", trace, "--speedup", "20", "--load-speedup", "5", "--stats-every", "0",
		"--kv-events", "nats", "--nats-listen", "127.0.0.1:0", "--route", "kv")
	require.Contains(t, out, "requests 40: 40 completed, 0 failed")
	require.Contains(t, out, "router: 40 decisions over 100 workers")
	m = regexp.MustCompile(`kv events: (\d+) batches, (\d+) blocks stored, \d+ removed, 0 gaps, 0 unknown parents; nats dropped 0`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	require.NotEqual(t, "0", m[2], "the router saw the engines' blocks")
	require.Contains(t, runBenchErr(t, "fleet", "--trace", trace, "--route", "kv"), "--route \"kv\": want round-robin, or kv with --kv-events nats")
}

// `bench sweep` on the tiny CLIP fixture checkpoint, host and through the CPU plugin when
// make test built it.
func TestBenchSweep(t *testing.T) {
	dir := modelDir(t, "clip_vit_tiny_random")
	out := runBench(t, "sweep", "--model", dir, "--batches", "1,2", "--iterations", "1", "--out", t.TempDir())
	require.Regexp(t, `(?m)^\s+\S+\s+2\s+[\d.]+`, out)
	if plugin := os.Getenv("DATAPLANE_TEST_PLUGIN"); plugin != "" {
		out = runBench(t, "sweep", "--model", dir, "--backend", "plugin:"+plugin, "--batches", "1,2", "--iterations", "1")
		require.Contains(t, out, "backend: plugin:")
	}
	var stderr bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"bench", "sweep", "--batches", "0"}, &bytes.Buffer{}, &stderr))
	require.Equal(t, 2, run(context.Background(), []string{"bench", "nope"}, &bytes.Buffer{}, &stderr))
}

// `bench ab --encoder-preset` measures the encoder on this machine and replays sync and async
// encoding with that cost.
func TestBenchABCalibratedEncoder(t *testing.T) {
	trace := synthTrace(t, "--requests", "60", "--seed", "5", "--image-share", "0.5")
	out := runBench(t, "ab", "--trace", trace, "--seed", "9", "--policies", "kv,kv-modality", "--encodings", "sync,async", "--encoder-preset", "vit-tiny")
	require.Regexp(t, `encoder vit-tiny on this machine: [\d.]+ ms per 1k media tokens, [\d.]+ ms per frame, 2 slots`, out)
	require.Regexp(t, `(?m)^\s+kv-modality\s+async`, out)
	require.Contains(t, runBenchErr(t, "ab", "--trace", trace, "--encoder-preset", "vit-huge"), `no preset "vit-huge"`)
}

// `bench load` drives `dataplane serve` itself (its mock fleet behind it): every request
// completes through the daemon's whole path.
func TestBenchLoadAgainstServe(t *testing.T) {
	trace := synthTrace(t, "--requests", "20", "--seed", "6", "--speedup-ratio", "20", "--osl-multiplier", "0.1")
	base, _ := startServe(t, "--mock-speedup", "50", "--max-prompt-tokens", "1000000")
	out := runBench(t, "load", "--endpoints", base, "--trace", trace, "--speedup", "5", "--vocab", "10256")
	require.Contains(t, out, "requests 20: 20 completed, 0 failed")
}
