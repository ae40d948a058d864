package dataplane

import (
	"errors"
	"fmt"
	"time"
)

// The kinds of failure of the request path that no deeper package has a type of its own for.
// Every error Service.Run returns carries one of these or a deeper package's typed error in its
// chain (a *features.BudgetError, encoderpool.ErrQueueFull, the fetch errors, an
// *openai.RequestError, a *memory.Error, a context error); dataplane/api turns them into HTTP statuses.
var (
	// ErrInvalid: the request contradicts itself or the model (placeholders and media, an
	// undecodable item, a prompt too long).
	ErrInvalid = errors.New("invalid request")
	// ErrUnavailable: the daemon cannot take the request now (shutting down, no LLM worker,
	// the encoders refused it); another try later may work.
	ErrUnavailable = errors.New("no capacity for the request")
	// ErrTooLarge: the request can never fit this daemon's memory, however idle it is (its
	// features and merged sequence outgrow the feature store).
	ErrTooLarge = errors.New("request too large for this server")
	// ErrTimeout: the request's media were not encoded within ServiceOptions.ItemTimeout.
	ErrTimeout = errors.New("media not encoded in time")
	// ErrUpstream: the LLM worker refused or failed the request.
	ErrUpstream = errors.New("the LLM worker failed")
)

// Error is one request's failure: which part of the request it concerns, what kind of failure
// it is and what happened. Its message is Err's, after the part.
type Error struct {
	Param string // where: "messages[0].content[1]", "cache_policy"; "" for the request as a whole
	Kind  error  // one of the kinds above or a deeper package's sentinel; nil when Err's chain says
	Err   error
	// RetryAfter, when set, is when another try may work (ErrUnavailable: no LLM worker can take
	// the request now, about one health interval until a probe may bring one back).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Param != "" {
		return e.Param + ": " + e.Err.Error()
	}
	return e.Err.Error()
}

// Unwrap gives errors.Is and errors.As both the kind and the cause.
func (e *Error) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Err}
	}
	return []error{e.Kind, e.Err}
}

// fail is an *Error of kind about param, with a formatted message.
func fail(kind error, param, format string, args ...any) *Error {
	return &Error{Param: param, Kind: kind, Err: fmt.Errorf(format, args...)}
}
