package worker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
)

// Error is a worker's failure as the daemon reports it: Class says what kind of failure it was
// in words a client may read ("connection refused", "no first byte within 30s", "answered 500
// Internal Server Error"), without addresses; Err is the whole cause (dial errors with their
// addresses, the engine's own message) for the logs. A failure that says the worker cannot take
// requests now (unreachable, silent, overloaded, gone mid-stream) wraps ErrUnavailable.
type Error struct {
	Class       string
	Err         error
	Unavailable bool
}

func (e *Error) Error() string { return e.Class + ": " + e.Err.Error() }

// Unwrap gives errors.Is ErrUnavailable (when it applies) and the cause.
func (e *Error) Unwrap() []error {
	if e.Unavailable {
		return []error{ErrUnavailable, e.Err}
	}
	return []error{e.Err}
}

// Public is what a client may read about a worker's failure: the class of a *Error in err's
// chain; any other error's message as it is (in-process workers, whose messages name no
// address).
func Public(err error) string {
	var we *Error
	if errors.As(err, &we) {
		return we.Class
	}
	return err.Error()
}

// transportClass names a failure to reach a worker without its addresses.
func transportClass(err error) string {
	var dns *net.DNSError
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "host unreachable"
	case errors.As(err, &dns):
		return "name not resolved"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	}
	return "unreachable"
}

// unavailable is an *Error of that class wrapping ErrUnavailable.
func unavailable(cause error, format string, args ...any) *Error {
	return &Error{Class: fmt.Sprintf(format, args...), Err: cause, Unavailable: true}
}
