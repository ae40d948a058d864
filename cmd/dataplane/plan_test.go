package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPlanReplayCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "obs.jsonl")
	lines := []string{}
	for i := range 15 {
		kv := "0.95"
		if i >= 3 {
			kv = "0.2"
		}
		lines = append(lines, `{"t":`+strconv.Itoa(i)+`,"prefill_queue":0.3,"decode_kv":`+kv+`}`)
	}
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"plan", "replay", "--observations", path, "--adjustment-interval", "3",
		"--metric-pulling-interval", "1s", "--initial-prefill", "1", "--initial-decode", "1", "--decode-kv-scale-down-threshold", "0.3"}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var s struct {
			T       float64
			Prefill int
			Decode  int
			Action  string
		}
		require.NoError(t, json.Unmarshal([]byte(l), &s))
		got = append(got, s.Action+" "+strconv.Itoa(s.Decode))
	}
	// The add at t=3, 3 intervals of grace, then the cold pool shrinks (the file's last pull,
	// t=14, is the last interval's last).
	require.Equal(t, []string{"decode+1 2", "hold 2", "hold 2", "hold 2", "decode-1 1"}, got)

	for args, want := range map[string]string{
		"plan replay": "--observations FILE is required",
		"plan replay --observations x --initial-decode -1":      "at least 0",
		"plan replay --observations x --max-gpu-budget 0":       "--max-gpu-budget",
		"plan replay --observations x --adjustment-interval 1x": "invalid value",
	} {
		stderr.Reset()
		require.Equal(t, 2, run(context.Background(), strings.Fields(args), &stdout, &stderr), args)
		require.Contains(t, stderr.String(), want, args)
	}
	stderr.Reset()
	require.Equal(t, 1, run(context.Background(), []string{"plan", "replay", "--observations", filepath.Join(t.TempDir(), "none")}, &stdout, &stderr))
}
