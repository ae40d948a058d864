package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// The harness itself runs under `make soak` (minutes, child processes); here only its flags.
func TestBenchChaosUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"bench", "chaos", "--scenarios", "body-flood,nope"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), `no scenario "nope"`)
	stderr.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"bench", "chaos", "extra"}, &stdout, &stderr))
	stderr.Reset()
	require.Equal(t, 0, run(context.Background(), []string{"bench", "chaos", "-h"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "sigterm-drain")
	require.Contains(t, stderr.String(), "-memory-bytes")
}
