package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/bench/synth"
)

const sourceTrace = "../../../shared/traces/mooncake_synthetic_trace.jsonl"

// synthTrace runs `dataplane synth` and returns the file it wrote.
func synthTrace(t *testing.T, args ...string) string {
	t.Helper()
	if _, err := os.Stat(sourceTrace); err != nil {
		t.Skip("../shared/traces not here")
	}
	out := filepath.Join(t.TempDir(), "trace.jsonl")
	var stderr bytes.Buffer
	code := run(context.Background(), append([]string{"synth", "--trace", sourceTrace, "--out", out}, args...), &bytes.Buffer{}, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stderr.String(), "synthesized")
	return out
}

// The synthesized trace is valid, has the requested size, and the knobs reach it.
func TestSynthCommand(t *testing.T) {
	path := synthTrace(t, "--requests", "300", "--seed", "5", "--osl-multiplier", "2", "--image-share", "0.5")
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	recs, err := synth.ReadTrace(f, synth.DefaultLimits())
	require.NoError(t, err)
	require.Len(t, recs, 300)
	images := 0
	for _, r := range recs {
		images += len(r.Media)
		require.Zero(t, r.OutputLength%2, "osl doubled")
	}
	require.InDelta(t, 150, images, 40)

	var stderr bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"synth"}, &bytes.Buffer{}, &stderr))
	require.Contains(t, stderr.String(), "--trace is required")
	require.Equal(t, 1, run(context.Background(), []string{"synth", "--trace", sourceTrace, "--speedup-ratio", "0"}, &bytes.Buffer{}, &stderr))
	require.Contains(t, stderr.String(), "speedup_ratio")
}
