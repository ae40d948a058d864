package audio

import (
	"errors"
	"fmt"
)

// The kinds of failure; every error from this package unwraps to one of them.
var (
	ErrFormat      = errors.New("unsupported audio format")   // not WAV, FLAC or MP3, and no ffmpeg to try
	ErrCorrupt     = errors.New("corrupt audio")              // truncated or malformed data
	ErrUnsupported = errors.New("unsupported audio encoding") // a valid file with an encoding we do not decode
	ErrEmpty       = errors.New("no audio samples")           // zero-length audio
	ErrTooShort    = errors.New("audio too short")            // too short to give the model a token (vLLM refuses it too)
	ErrTooLong     = errors.New("audio too long")             // over the duration limit
	ErrRate        = errors.New("bad sample rate")            // zero or absurd sample rate or channel count
	ErrFFmpeg      = errors.New("ffmpeg failed")              // ffmpeg missing, timed out or refused the input
	ErrPreset      = errors.New("bad audio preset")           // impossible feature parameters
)

// Error says what went wrong: the operation, the format when known, and why.
type Error struct {
	Op     string // "decode", "resample", "log-mel"
	Format string // "wav", "flac", "mp3", "ffmpeg", or ""
	Msg    string
	Err    error // one of the Err* kinds
}

func (e *Error) Error() string {
	where := e.Op
	if e.Format != "" {
		where += " " + e.Format
	}
	return fmt.Sprintf("audio: %s: %s: %v", where, e.Msg, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

func errorf(kind error, op, format, msgFormat string, args ...any) error {
	return &Error{Op: op, Format: format, Msg: fmt.Sprintf(msgFormat, args...), Err: kind}
}
