package picture

import (
	"errors"
	"fmt"
)

// The kinds of failure; every error from this package unwraps to one of them.
var (
	ErrFormat      = errors.New("unsupported image format")   // not JPEG or PNG (the message names what it is)
	ErrCorrupt     = errors.New("corrupt image")              // truncated or malformed data
	ErrTooLarge    = errors.New("image too large")            // over the pixel limit (checked from the header)
	ErrDimensions  = errors.New("bad image dimensions")       // zero, negative or absurd sizes
	ErrUnsupported = errors.New("unsupported image encoding") // a valid file this package cannot decode (CMYK JPEG)
	ErrPreset      = errors.New("bad preset")                 // a preset with impossible parameters
)

// Error says what went wrong and where: the operation, the format when known, and why.
type Error struct {
	Op     string // "decode", "header", "preprocess"
	Format string // "jpeg", "png", or "" when unknown
	Msg    string
	Err    error // one of the Err* kinds
}

func (e *Error) Error() string {
	where := e.Op
	if e.Format != "" {
		where += " " + e.Format
	}
	return fmt.Sprintf("picture: %s: %s: %v", where, e.Msg, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

func errorf(kind error, op, format, msgFormat string, args ...any) error {
	return &Error{Op: op, Format: format, Msg: fmt.Sprintf(msgFormat, args...), Err: kind}
}
