package dataplane

import (
	"context"
	"time"

	"dataplane/dataplane/worker"
	"dataplane/native"
	"dataplane/router"
)

// generateDisagg runs a disaggregated decision (router.Router.DecideDisagg): the prefill worker
// computes the prompt's KV cache (worker.Prefiller: max_tokens 1, vLLM's kv_transfer_params
// do_remote_decode), then the decode worker generates with the handle it returned, as vLLM's
// disaggregated proxies do (worker/disagg.go). The router counts the prefill step on the
// prefill worker until it answered, the decode step on the decode worker until the end. A
// failure of either step fails the request: the prefill's work cannot be moved to another pair.
func (r *request) generateDisagg(ctx context.Context, d router.Decision, embeds native.Matrix) (*Generation, error) {
	s := r.s
	pe, de := s.entry(d.Prefill), s.entry(d.Decode)
	if pe == nil || de == nil {
		return nil, fail(ErrUnavailable, "", "the LLM worker chosen is gone")
	}
	pf, ok := pe.w.(worker.Prefiller)
	if !ok {
		return nil, fail(ErrUnavailable, "", "%s cannot take a prefill step", pe.label)
	}
	wreq := r.workerRequest(embeds)
	if err := s.router.Start(r.key, d, d.Decode, time.Now()); err == nil {
		r.routed.Store(true)
	}
	handle, err := pf.Prefill(ctx, wreq)
	s.router.PrefillDone(r.key)
	if err != nil {
		if r.stepFailed(ctx, pe, err) {
			return nil, ctx.Err()
		}
		return nil, &Error{Kind: ErrUpstream, Err: &upstreamError{msg: pe.label + " (prefill): " + worker.Public(err), cause: err}}
	}
	wreq.KVTransfer = handle
	g, err := r.attempt(ctx, d, de, wreq)
	if err == nil || ctx.Err() != nil {
		return g, err
	}
	return nil, &Error{Kind: ErrUpstream, Err: &upstreamError{msg: de.label + " (decode): " + worker.Public(err), cause: err}}
}
