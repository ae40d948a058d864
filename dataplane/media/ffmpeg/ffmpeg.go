// Package ffmpeg runs the ffmpeg and ffprobe commands on in-memory media, safely: the input goes
// to a private temporary file (containers such as MP4 need to seek), the command runs under a
// deadline with no stdin, its stdout is handed to the caller as a stream (an OS pipe: bounded)
// and the process is killed as soon as the caller stops reading; stderr is kept (bounded) for
// the error message. A missing command is ErrMissing, named in the message.
package ffmpeg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

var (
	// ErrMissing: the command is not installed (or not on PATH).
	ErrMissing = errors.New("ffmpeg is not installed")
	// ErrFailed: the command ran and failed, timed out, or its output was refused.
	ErrFailed = errors.New("ffmpeg failed")
)

// Error is a failed run: which command, why, and the end of what it printed.
type Error struct {
	Cmd    string
	Msg    string
	Stderr string
	Err    error // ErrMissing or ErrFailed
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s", e.Cmd, e.Msg)
	if e.Stderr != "" {
		s += ": " + e.Stderr
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

const stderrLimit = 4 << 10

// tail keeps the last stderrLimit bytes written to it.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > stderrLimit {
		t.b = t.b[len(t.b)-stderrLimit:]
	}
	return len(p), nil
}

// Run writes input to a temporary file, runs bin with args(path) under timeout, and calls
// consume with the command's stdout. consume may stop early (return nil after reading what it
// needs): the process is then killed and that is not an error. A non-zero exit after consume
// read everything, a timeout, or consume's own error is an *Error.
func Run(ctx context.Context, bin string, timeout time.Duration, input []byte, args func(path string) []string,
	consume func(stdout io.Reader) error) error {
	path, err := exec.LookPath(bin)
	if err != nil {
		return &Error{Cmd: bin, Msg: "not found on PATH (install ffmpeg, e.g. apt-get install ffmpeg)", Err: ErrMissing}
	}
	f, err := os.CreateTemp("", "dataplane-media-*")
	if err != nil {
		return &Error{Cmd: bin, Msg: "temporary input: " + err.Error(), Err: ErrFailed}
	}
	defer os.Remove(f.Name())
	_, werr := f.Write(input)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return &Error{Cmd: bin, Msg: "temporary input: " + werr.Error(), Err: ErrFailed}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args(f.Name())...)
	cmd.Stdin = nil
	var stderr tail
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return &Error{Cmd: bin, Msg: err.Error(), Err: ErrFailed}
	}
	if err := cmd.Start(); err != nil {
		return &Error{Cmd: bin, Msg: "start: " + err.Error(), Err: ErrFailed}
	}
	cerr := consume(out)
	// Whatever consume left unread is not wanted: stop the process, then drain so Wait returns.
	stopped := false
	if cerr != nil || !drained(out) {
		stopped = true
		_ = cmd.Process.Kill()
	}
	_, _ = io.Copy(io.Discard, out)
	werr = cmd.Wait()
	msg := strings.TrimSpace(string(bytes.ToValidUTF8(stderr.b, []byte("?"))))
	switch {
	case ctx.Err() != nil && !stopped:
		return &Error{Cmd: bin, Msg: fmt.Sprintf("timed out after %v", timeout), Stderr: msg, Err: ErrFailed}
	case cerr != nil:
		return &Error{Cmd: bin, Msg: cerr.Error(), Stderr: msg, Err: ErrFailed}
	case werr != nil && !stopped:
		return &Error{Cmd: bin, Msg: werr.Error(), Stderr: msg, Err: ErrFailed}
	}
	return nil
}

// drained reports whether r is at EOF (reading one byte to find out).
func drained(r io.Reader) bool {
	var b [1]byte
	n, err := r.Read(b[:])
	return n == 0 && err != nil
}

// ReadAtMost reads all of r, failing when it holds more than limit bytes.
func ReadAtMost(r io.Reader, limit int64, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: more than %d bytes", what, limit)
	}
	return b, nil
}
