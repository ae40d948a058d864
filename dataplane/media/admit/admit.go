// Package admit is the hook through which media decoding asks the caller's memory budget for
// the bytes a decode will hold, before it allocates them (the design notes' "decoded pictures
// and frames are admitted from their headers").
package admit

import "fmt"

// Func admits bytes of decoded media against the caller's budget. It is called before the
// bytes are allocated, with what the decode will hold at its peak (computed from the header);
// release is called exactly once, when those bytes are no longer referenced. A non-nil error
// refuses: nothing is allocated and the decode returns an *Error wrapping it. A Func may block
// (to wait for room) and must be safe for concurrent use when decodes run concurrently.
type Func func(bytes int64) (release func(), err error)

// Error is a refused admission: what was to be decoded, how many bytes it needed, and the
// hook's own error, which errors.Is and errors.As reach through Unwrap.
type Error struct {
	What  string // "picture 3: png 9400x9400", "frame 2 (source frame 40): 1920x1080 rgb24"
	Bytes int64
	Err   error
}

func (e *Error) Error() string {
	return fmt.Sprintf("admitting %d bytes for %s: %v", e.Bytes, e.What, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Take asks f for n bytes for what. A nil f admits everything (no accounting). The release
// returned is never nil and safe to call more than once (f's own release runs once); on error
// it is a no-op and the error is an *Error.
func (f Func) Take(what string, n int64) (release func(), err error) {
	if f == nil {
		return nop, nil
	}
	rel, err := f(n)
	if err != nil {
		return nop, &Error{What: what, Bytes: n, Err: err}
	}
	if rel == nil {
		return nop, nil
	}
	done := false
	return func() {
		if !done {
			done = true
			rel()
		}
	}, nil
}

func nop() {}
