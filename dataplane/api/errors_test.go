package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane"
	"dataplane/dataplane/encoderpool"
	"dataplane/dataplane/media/fetch"
	"dataplane/dataplane/openai"
	"dataplane/dataplane/sequence"
	"dataplane/features"
)

func TestErrorBody(t *testing.T) {
	var got map[string]map[string]any
	require.NoError(t, json.Unmarshal(BadRequest("messages[0].role", "bad role").Body(), &got))
	require.Equal(t, map[string]any{"message": "messages[0].role: bad role", "type": "invalid_request_error",
		"param": "messages[0].role", "code": float64(400)}, got["error"])
	require.NoError(t, json.Unmarshal((&Error{Status: 503, Type: "server_error", Message: "busy"}).Body(), &got))
	require.Nil(t, got["error"]["param"])
}

// Every typed error of the request path gets its status, type, param and Retry-After here, and
// the message the client reads is the error's own.
func TestErrorOf(t *testing.T) {
	f := func(err error, status int, typ, param string, retry time.Duration, msg string) {
		t.Helper()
		e := ErrorOf(err)
		require.Equal(t, status, e.Status, "%v", err)
		require.Equal(t, typ, e.Type, "%v", err)
		require.Equal(t, param, e.Param, "%v", err)
		require.Equal(t, retry, e.RetryAfter, "%v", err)
		require.Equal(t, msg, e.Message, "%v", err)
	}
	item := "messages[0].content[1]"
	f(openai.Invalid("max_tokens", "0 (want 1..8)"), 400, "invalid_request_error", "max_tokens", 0, "0 (want 1..8)")
	f(&dataplane.Error{Param: item, Kind: dataplane.ErrInvalid, Err: fmt.Errorf("picture 0: %w", fetch.ErrForbidden)},
		403, "invalid_request_error", item, 0, "picture 0: address not allowed")
	f(&dataplane.Error{Param: item, Kind: dataplane.ErrInvalid, Err: fmt.Errorf("get: %w", fetch.ErrTooLarge)},
		413, "invalid_request_error", item, 0, "get: media larger than the limit")
	f(&dataplane.Error{Param: item, Kind: dataplane.ErrInvalid, Err: fmt.Errorf("get: %w", fetch.ErrUpstream)},
		502, "upstream_error", item, 0, "get: fetching media failed")
	f(&dataplane.Error{Param: item, Kind: dataplane.ErrInvalid, Err: errors.New("not a picture")},
		400, "invalid_request_error", item, 0, "not a picture")

	budget := func(r features.Rejection, retry time.Duration) error {
		return &dataplane.Error{Param: item, Err: &features.BudgetError{Pool: "host", Reason: r, Need: 10, Free: 1, Capacity: 8, RetryAfter: retry}}
	}
	f(budget(features.RejectQueueFull, time.Second), 429, "overloaded_error", item, time.Second, "features: host pool: queue_full: need 10 bytes, 1 of 8 free")
	f(budget(features.RejectTimeout, 2*time.Second), 503, "overloaded_error", item, 2*time.Second, "features: host pool: timeout: need 10 bytes, 1 of 8 free")
	f(budget(features.RejectTooLarge, 0), 413, "overloaded_error", item, 0, "features: host pool: too_large: need 10 bytes, 1 of 8 free")
	f(&dataplane.Error{Param: item, Kind: encoderpool.ErrQueueFull, Err: errors.New("the encoders' queue is full")},
		429, "overloaded_error", item, time.Second, "the encoders' queue is full")

	pe := &sequence.PositionError{Kind: sequence.ErrExtraPlaceholder, Pos: 3, Item: -1, Detail: "image placeholder"}
	f(&dataplane.Error{Param: "messages", Kind: dataplane.ErrInvalid, Err: pe}, 400, "invalid_request_error", "messages", 0, pe.Error())
	f(&dataplane.Error{Kind: dataplane.ErrUnavailable, Err: errors.New("the server is shutting down")},
		503, "overloaded_error", "", 0, "the server is shutting down")
	// No LLM worker can take it (none healthy): come back in about one health-probe round.
	f(&dataplane.Error{Kind: dataplane.ErrUnavailable, Err: errors.New("no LLM worker can take the request"), RetryAfter: time.Second},
		503, "overloaded_error", "", time.Second, "no LLM worker can take the request")
	f(&dataplane.Error{Param: item, Kind: dataplane.ErrTimeout, Err: errors.New("media not encoded within 1s")},
		504, "timeout_error", item, 0, "media not encoded within 1s")
	f(&dataplane.Error{Kind: dataplane.ErrUpstream, Err: errors.New("worker 0: connection refused")}, 502, "upstream_error", "", 0, "worker 0: connection refused")
	f(&dataplane.Error{Param: item, Err: errors.New("encoding image failed: fault")}, 500, "server_error", item, 0, "encoding image failed: fault")
	// A client that left: nobody reads the answer, but the metrics say so.
	f(context.Canceled, statusCancelled, "cancelled", "", 0, "context canceled")
	f(&dataplane.Error{Param: item, Kind: dataplane.ErrUnavailable, Err: context.Canceled}, statusCancelled, "cancelled", item, 0, "context canceled")
	f(errors.New("anything else"), 500, "server_error", "", 0, "anything else")
	same := &Error{Status: 404, Type: "not_found_error", Message: "no"}
	require.Same(t, same, ErrorOf(fmt.Errorf("wrapped: %w", same)))
}

func TestOutcomeOf(t *testing.T) {
	for status, want := range map[int]string{400: "bad_request", 403: "bad_request", 413: "bad_request", 429: "rejected",
		statusCancelled: "cancelled", 500: "error", 502: "error", 503: "error", 504: "error"} {
		require.Equal(t, want, outcomeOf(status), "%d", status)
	}
}
