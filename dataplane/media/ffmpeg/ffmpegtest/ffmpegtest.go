// Package ffmpegtest runs the ffmpeg CLI for tests that build their media with it (test
// patterns, re-encodings, reference decodes). It fails, never skips, when ffmpeg is missing:
// `make test` installs it (Debian package ffmpeg, `make deps-test`).
package ffmpegtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// Need fails t when ffmpeg is not on PATH.
func Need(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("ffmpeg"); err != nil {
		t.Fatal("ffmpeg not found: `make deps-test` installs it (Debian package ffmpeg)")
	}
}

// Run runs ffmpeg quietly, overwriting outputs, and returns its stdout; a failure fails t with
// ffmpeg's own message.
func Run(t testing.TB, args ...string) []byte {
	t.Helper()
	Need(t)
	cmd := exec.Command("ffmpeg", append([]string{"-nostdin", "-hide_banner", "-loglevel", "error", "-y"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Run(), "ffmpeg %v: %s", args, errb.String())
	return out.Bytes()
}

// PNGFrames decodes every frame of the video file at path to a PNG, in order.
func PNGFrames(t testing.TB, path string) [][]byte {
	t.Helper()
	dir := t.TempDir()
	Run(t, "-i", path, filepath.Join(dir, "f%06d.png"))
	files, err := filepath.Glob(filepath.Join(dir, "f*.png"))
	require.NoError(t, err)
	slices.Sort(files)
	var out [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		out = append(out, b)
	}
	return out
}
