package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Disaggregated prefill/decode, the way vLLM's proxies drive it
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py at 030ea52e): the prefill
// worker gets the request whole (not streamed) with max_tokens 1, no min_tokens, and
// kv_transfer_params {"do_remote_decode": true, "do_remote_prefill": false, "remote_*": null};
// its answer's kv_transfer_params (NixlConnectorScheduler.request_finished in
// vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py at 002a1057:
// do_remote_prefill, remote_engine_id, remote_block_ids, remote_request_id, remote_host,
// remote_port, tp_size) go unchanged with the same request, streamed, to the decode worker
// (Request.KVTransfer); both steps carry the same X-Request-Id.

// Prefiller is a worker that takes the prefill step of a disaggregated request: it computes
// the prompt's KV cache and returns the handle (kv_transfer_params) a decode worker reads it by.
type Prefiller interface {
	Prefill(ctx context.Context, req *Request) (json.RawMessage, error)
}

// PrefillParams are the prefill step's kv_transfer_params, as the toy proxy sends them (read
// only: shared by every request).
var PrefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// maxPrefillAnswer bounds the prefill step's answer (one token, the usage, the handle: the
// prompt's block ids).
const maxPrefillAnswer = 8 << 20

// Prefill sends the prefill step and returns the handle its answer carries. The whole step (the
// engine queues and prefills, then answers) is bounded by FirstByteTimeout: it is the
// request's first byte. Failures are *Error as Generate's; an answer without
// kv_transfer_params (an engine started without a KV connector) is one too, not unavailable.
func (h *HTTP) Prefill(ctx context.Context, req *Request) (json.RawMessage, error) {
	body := completionBody{sampling: samplingOf(&req.Sampling), Model: h.opts.Model, CacheSalt: req.CacheSalt,
		KVTransferParams: PrefillParams}
	body.MaxTokens, body.MinTokens = 1, 0
	path, raw, err := h.encode(body, req)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, h.opts.FirstByteTimeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(pctx, http.MethodPost, h.opts.BaseURL+path, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	if req.ID != "" {
		hreq.Header.Set("X-Request-Id", req.ID)
	}
	resp, err := h.client.Do(hreq)
	if err != nil {
		return nil, h.prefillFailure(ctx, pctx, fmt.Errorf("%s: %w", h.opts.BaseURL, err), transportClass(err))
	}
	if resp.StatusCode != http.StatusOK {
		return nil, h.answerError(resp)
	}
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer+1))
	resp.Body.Close()
	switch {
	case err != nil:
		return nil, h.prefillFailure(ctx, pctx, fmt.Errorf("%s: %w", h.opts.BaseURL, err), "answer broke off")
	case len(answer) > maxPrefillAnswer:
		return nil, &Error{Class: "sent a prefill answer too large", Err: fmt.Errorf("%s: over %d bytes", h.opts.BaseURL, maxPrefillAnswer)}
	}
	var a struct {
		KVTransfer json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(answer, &a); err != nil {
		return nil, &Error{Class: "sent a malformed prefill answer", Err: fmt.Errorf("%s: %v", h.opts.BaseURL, err)}
	}
	if len(a.KVTransfer) == 0 || string(a.KVTransfer) == "null" || a.KVTransfer[0] != '{' {
		return nil, &Error{Class: "returned no kv_transfer_params from the prefill step",
			Err: errors.New(h.opts.BaseURL + ": no kv_transfer_params in the answer (is the engine a KV producer: --kv-transfer-config with kv_role kv_producer or kv_both?)")}
	}
	return a.KVTransfer, nil
}

// prefillFailure is failure's for the prefill step: the caller's context, the step's timeout
// (FirstByteTimeout), or a transport failure of class.
func (h *HTTP) prefillFailure(ctx, pctx context.Context, cause error, class string) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case pctx.Err() != nil:
		return unavailable(fmt.Errorf("no prefill answer within %v: %w", h.opts.FirstByteTimeout, cause),
			"no prefill answer within %v", h.opts.FirstByteTimeout)
	}
	return unavailable(cause, "%s", class)
}
