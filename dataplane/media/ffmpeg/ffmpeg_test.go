package ffmpeg

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRun(t *testing.T) {
	ctx := context.Background()
	// An endless source: the reader takes what it needs and the process is killed.
	start := time.Now()
	var got []byte
	err := Run(ctx, "ffmpeg", 30*time.Second, []byte("unused"), func(string) []string {
		return []string{"-nostdin", "-loglevel", "error", "-f", "lavfi", "-i", "sine=f=440", "-f", "s16le", "-"}
	}, func(out io.Reader) error {
		var err error
		got, err = io.ReadAll(io.LimitReader(out, 4000))
		return err
	})
	require.NoError(t, err)
	require.Len(t, got, 4000)
	require.Less(t, time.Since(start), 20*time.Second)

	// The input file is what the command reads.
	err = Run(ctx, "ffmpeg", 30*time.Second, []byte("definitely not media"), func(p string) []string {
		return []string{"-nostdin", "-loglevel", "error", "-i", p, "-f", "null", "-"}
	}, func(out io.Reader) error { _, err := io.Copy(io.Discard, out); return err })
	require.ErrorIs(t, err, ErrFailed)
	require.Contains(t, err.Error(), "Invalid data")

	// A deadline.
	err = Run(ctx, "ffmpeg", 300*time.Millisecond, nil, func(string) []string {
		return []string{"-nostdin", "-loglevel", "error", "-re", "-f", "lavfi", "-i", "sine=f=440", "-f", "s16le", "-"}
	}, func(out io.Reader) error { _, err := io.Copy(io.Discard, out); return err })
	require.ErrorIs(t, err, ErrFailed)
	require.Contains(t, err.Error(), "timed out")

	err = Run(ctx, "/nonexistent/ffmpeg", time.Second, nil, func(string) []string { return nil }, func(io.Reader) error { return nil })
	require.ErrorIs(t, err, ErrMissing)
	require.Contains(t, err.Error(), "not found")

	b, err := ReadAtMost(io.LimitReader(zeros{}, 100), 99, "x")
	require.Error(t, err)
	require.Nil(t, b)
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
