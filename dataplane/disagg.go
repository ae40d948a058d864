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
	ids, spans := r.expanded()
	wreq := &worker.Request{ID: r.id, TokenIDs: ids, Media: r.workerSpans(spans), Embeds: embeds, Messages: r.p.Messages,
		Sampling: r.p.Sampling, CacheSalt: r.p.Ext.CacheSalt}
	if err := s.router.Start(r.key, d, d.Decode, time.Now()); err == nil {
		r.routed.Store(true)
	}
	handle, err := pf.Prefill(ctx, wreq)
	s.router.PrefillDone(r.key)
	if err != nil {
		if r.routed.Swap(false) {
			s.router.Finish(r.key)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if unavailable(err) {
			s.markDown(pe, err)
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
