package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/openai"
)

// The two steps' requests have the shapes of vLLM's disaggregated proxy
// (toy_proxy_server.py): the prefill step not streamed, max_tokens 1, no min_tokens,
// kv_transfer_params with do_remote_decode and the remote_* keys null, the request id as
// X-Request-Id; its answer's kv_transfer_params go, as they came, with the decode step, which
// keeps the client's sampling and streams.
func TestPrefillThenDecode(t *testing.T) {
	handle := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[3,4],"remote_engine_id":"e0","remote_request_id":"cmpl-q","remote_host":"10.0.0.5","remote_port":5600,"tp_size":1}`
	var bodies []map[string]json.RawMessage
	var ids []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var b map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(raw, &b))
		bodies, ids = append(bodies, b), append(ids, r.Header.Get("X-Request-Id"))
		if string(b["stream"]) == "false" {
			fmt.Fprintf(w, `{"id":"cmpl-q","choices":[{"text":" t1","finish_reason":"length"}],"kv_transfer_params":%s}`, handle)
			return
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\" a\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	h, err := NewHTTP(HTTPOptions{BaseURL: srv.URL})
	require.NoError(t, err)
	req := &Request{ID: "q", TokenIDs: []int32{1, 2, 3}, Sampling: openai.Sampling{MaxTokens: 9, MinTokens: 2}}
	got, err := h.Prefill(context.Background(), req)
	require.NoError(t, err)
	require.JSONEq(t, handle, string(got))
	p := bodies[0]
	require.Equal(t, "1", string(p["max_tokens"]))
	require.Nil(t, p["min_tokens"], "min_tokens is the decode step's")
	require.Equal(t, "false", string(p["stream"]))
	require.JSONEq(t, `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`,
		string(p["kv_transfer_params"]))
	require.Equal(t, "[1,2,3]", string(p["prompt"]))

	req.KVTransfer = got
	events, err := h.Generate(context.Background(), req)
	require.NoError(t, err)
	text, done := drain(t, events)
	require.NoError(t, done.Err)
	require.Equal(t, " a", text)
	d := bodies[1]
	require.JSONEq(t, handle, string(d["kv_transfer_params"]))
	require.Equal(t, "9", string(d["max_tokens"]))
	require.Equal(t, "2", string(d["min_tokens"]))
	require.Equal(t, "true", string(d["stream"]))
	require.Equal(t, []string{"q", "q"}, ids)
}

// A prefill engine without a KV connector answers without kv_transfer_params: an error that
// says so (not one that takes it out of routing); a 503 is unavailable; a silent one times out
// within the first-byte timeout.
func TestPrefillFailures(t *testing.T) {
	answer := `{"choices":[{"text":" t1"}]}`
	status := 200
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status == 0 {
			select {
			case <-hang:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(status)
		fmt.Fprint(w, answer)
	}))
	defer srv.Close()
	defer close(hang)
	h, err := NewHTTP(HTTPOptions{BaseURL: srv.URL, FirstByteTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	req := &Request{ID: "q", TokenIDs: []int32{1}}
	_, err = h.Prefill(context.Background(), req)
	require.ErrorContains(t, err, "no kv_transfer_params")
	require.False(t, errors.Is(err, ErrUnavailable))

	status = 503
	_, err = h.Prefill(context.Background(), req)
	require.ErrorIs(t, err, ErrUnavailable)

	status = 0
	_, err = h.Prefill(context.Background(), req)
	require.ErrorIs(t, err, ErrUnavailable)
	require.Contains(t, Public(err), "no prefill answer within 200ms")
}
