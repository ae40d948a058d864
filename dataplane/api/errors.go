package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"dataplane/dataplane"
	"dataplane/dataplane/encoderpool"
	"dataplane/dataplane/media"
	"dataplane/dataplane/media/fetch"
	"dataplane/dataplane/memory"
	"dataplane/dataplane/openai"
	"dataplane/dataplane/sequence"
	"dataplane/features"
)

// Error is an API error: an HTTP status and the OpenAI error object clients parse,
// {"error": {"message", "type", "param", "code"}}.
type Error struct {
	Status  int
	Type    string // invalid_request_error, not_found_error, ...
	Message string
	Param   string // the offending part of the request, when there is one
	// RetryAfter, when set, goes to the Retry-After header (429, 503).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Param != "" {
		return e.Param + ": " + e.Message
	}
	return e.Message
}

// errorBody is the JSON shape OpenAI clients parse.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

// Body is the JSON error body.
func (e *Error) Body() []byte {
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code = e.Error(), e.Type, e.Status
	if e.Param != "" {
		b.Error.Param = &e.Param
	}
	out, _ := json.Marshal(b)
	return out
}

// BadRequest is a 400 about param.
func BadRequest(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

// statusCancelled is nginx's "client closed request": nobody reads it, metrics count it.
const statusCancelled = 499

// queueFullRetry is the Retry-After of a request the encoders' queue refused: batches drain in
// milliseconds to seconds.
const queueFullRetry = time.Second

// ErrorOf is where an error of the request path becomes a status: the deeper packages' typed
// errors and the request path's kinds (dataplane.Err*), first match wins, anything else a 500.
// The param is the one the outermost *dataplane.Error or *openai.RequestError names, and so is
// a 503's Retry-After (*dataplane.Error.RetryAfter).
func ErrorOf(err error) *Error {
	var (
		ae  *Error
		re  *openai.RequestError
		de  *dataplane.Error
		be  *features.BudgetError
		me  *memory.Error
		pe  *sequence.PositionError
		out = &Error{Status: http.StatusInternalServerError, Type: "server_error", Message: err.Error()}
	)
	if errors.As(err, &ae) {
		return ae
	}
	if errors.As(err, &re) {
		return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: re.Param, Message: re.Message}
	}
	if errors.As(err, &de) {
		out.Param, out.Message = de.Param, de.Err.Error()
	}
	switch {
	case errors.Is(err, context.Canceled):
		out.Status, out.Type = statusCancelled, "cancelled"
	case errors.Is(err, dataplane.ErrTimeout): // before the fetch errors: a fetch the deadline cut
		out.Status, out.Type = http.StatusGatewayTimeout, "timeout_error"
	case errors.Is(err, fetch.ErrForbidden):
		out.Status, out.Type = http.StatusForbidden, "invalid_request_error"
	case errors.Is(err, fetch.ErrTooLarge), errors.Is(err, media.ErrTooLarge):
		out.Status, out.Type = http.StatusRequestEntityTooLarge, "invalid_request_error"
	case errors.Is(err, fetch.ErrUpstream):
		out.Status, out.Type = http.StatusBadGateway, "upstream_error"
	case errors.As(err, &be):
		out.Status, out.Type, out.Message, out.RetryAfter = budgetStatus(be.Reason), "overloaded_error", be.Error(), be.RetryAfter
	case errors.As(err, &me):
		out.Status, out.Type, out.RetryAfter = http.StatusServiceUnavailable, "overloaded_error", me.RetryAfter
		if me.Reason == memory.TooLarge {
			out.Status, out.Type = http.StatusRequestEntityTooLarge, "invalid_request_error"
		}
	case errors.Is(err, dataplane.ErrTooLarge):
		out.Status, out.Type = http.StatusRequestEntityTooLarge, "invalid_request_error"
	case errors.Is(err, encoderpool.ErrQueueFull):
		out.Status, out.Type, out.RetryAfter = http.StatusTooManyRequests, "overloaded_error", queueFullRetry
	case errors.Is(err, dataplane.ErrInvalid), errors.As(err, &pe):
		out.Status, out.Type = http.StatusBadRequest, "invalid_request_error"
	case errors.Is(err, dataplane.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		out.Status, out.Type = http.StatusServiceUnavailable, "overloaded_error"
		if de != nil {
			out.RetryAfter = de.RetryAfter // no LLM worker can take it now: about one probe round
		}
	case errors.Is(err, dataplane.ErrUpstream):
		out.Status, out.Type = http.StatusBadGateway, "upstream_error"
	}
	return out
}

// budgetStatus answers a feature-budget refusal: 429 when the admission queue is full (slow
// down), 413 when the item alone is larger than the pool (it can never fit), 503 when memory
// stayed full until the deadline (the node is saturated).
func budgetStatus(r features.Rejection) int {
	switch r {
	case features.RejectQueueFull:
		return http.StatusTooManyRequests
	case features.RejectTooLarge:
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusServiceUnavailable
}

// outcomeOf names how a request that failed with status ended, for dataplane_requests_total.
func outcomeOf(status int) string {
	switch {
	case status == statusCancelled:
		return "cancelled"
	case status == http.StatusTooManyRequests:
		return "rejected"
	case status < 500:
		return "bad_request"
	}
	return "error"
}
