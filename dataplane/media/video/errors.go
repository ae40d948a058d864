package video

import (
	"errors"
	"fmt"
)

// The kinds of failure; every error from this package unwraps to one of them.
var (
	ErrEmpty    = errors.New("no video frames")        // nothing to sample
	ErrCorrupt  = errors.New("corrupt video")          // ffmpeg/ffprobe could not read it
	ErrTooLarge = errors.New("video frames too large") // over the pixel limit (from the header)
	ErrTooLong  = errors.New("video too long")         // over the duration or frame limits
	ErrBudget   = errors.New("video over the token budget")
	ErrFrame    = errors.New("bad frame")          // a picture in a list failed to decode
	ErrFFmpeg   = errors.New("ffmpeg unavailable") // ffmpeg/ffprobe missing
	ErrSampling = errors.New("bad sampling options")
)

// Error says what went wrong: the operation and why.
type Error struct {
	Op  string // "probe", "decode", "sample", "images", "preprocess"
	Msg string
	Err error
}

func (e *Error) Error() string { return fmt.Sprintf("video: %s: %s: %v", e.Op, e.Msg, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

func errorf(kind error, op, format string, args ...any) error {
	return &Error{Op: op, Msg: fmt.Sprintf(format, args...), Err: kind}
}
