package api

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"dataplane/dataplane"
	"dataplane/dataplane/worker"
	"dataplane/router"
)

// maxTextAllocs is the most allocations one text-only completion may take through the
// handler (TestTextRequestAllocs).
const maxTextAllocs = 17 // 17 measured (2026-11-24; 18 before the pooled router token ids, 23 before the reused JSON decoder, 24 before the pooled decision, 26 before the text-only position map, 46 before the relay goroutines and the reflected answer went)

// Probes cost nothing: /readyz and /healthz answer without allocating (a kubelet asks every
// few seconds; a load balancer may ask far more often).
func TestProbesAllocateNothing(t *testing.T) {
	d := startDaemon(t, nil)
	srv := NewServer(DefaultOptions(), slog.New(slog.DiscardHandler))
	srv.Attach(d.svc)
	for _, path := range []string{"/readyz", "/healthz"} {
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI(path)
		allocs := testing.AllocsPerRun(100, func() {
			ctx.Response.Reset()
			srv.handle(&ctx)
		})
		require.Equal(t, 200, ctx.Response.StatusCode(), "%s: %s", path, ctx.Response.Body())
		require.Zero(t, allocs, path)
	}
}

// instantWorker answers every request with one token, at once: no goroutine, one channel, so
// what an allocation count measures is the daemon's own path.
type instantWorker struct{}

func (instantWorker) Name() string { return "instant-0" }
func (instantWorker) Close() error { return nil }
func (instantWorker) Generate(_ context.Context, r *worker.Request) (<-chan worker.Event, error) {
	ch := make(chan worker.Event, 2)
	ch <- worker.Event{Text: "Hi", Tokens: 1}
	ch <- worker.Event{Done: true, FinishReason: "length", PromptTokens: len(r.TokenIDs)}
	close(ch)
	return ch, nil
}

// textRequest is the text-only request the text path's tests and benchmarks send.
const textRequest = `{"prompt":"The quick brown fox jumps over the lazy dog.","max_tokens":1}`

// textServer is a server in front of a service whose one worker answers at once; handle runs
// one text-only completion through srv.handle (no network) and checks its answer.
func textServer(tb testing.TB) (srv *Server, handle func(ctx *fasthttp.RequestCtx)) {
	tb.Helper()
	opts := dataplane.DefaultServiceOptions()
	opts.Features.Host.Capacity = 64 << 20
	opts.Log = slog.New(slog.DiscardHandler)
	svc, err := dataplane.NewService(opts)
	require.NoError(tb, err)
	tb.Cleanup(func() { svc.Close(context.Background()) }) //nolint:errcheck
	_, err = svc.AddWorker(instantWorker{})
	require.NoError(tb, err)
	srv = NewServer(DefaultOptions(), slog.New(slog.DiscardHandler))
	srv.Attach(svc)
	body := []byte(textRequest)
	return srv, func(ctx *fasthttp.RequestCtx) {
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/v1/completions")
		ctx.Request.Header.SetContentType("application/json")
		ctx.Request.SetBody(body)
		srv.handle(ctx)
		if ctx.Response.StatusCode() != 200 {
			tb.Fatalf("%d %s", ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
}

// The text-only path's allocations per request (parse, tokenize, route, the worker's events,
// the answer, metrics) stay under a ceiling, so none creeps back in unnoticed.
func TestTextRequestAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop scratch (the router's), so the path allocates more")
	}
	_, handle := textServer(t)
	var ctx fasthttp.RequestCtx
	// Warm: the tokenizer's and the metrics' first use, and every slot of the decision log
	// (which copies a decision into the slot's own room, grown at its first use).
	for range router.RecentDecisions + 1 {
		handle(&ctx)
	}
	allocs := testing.AllocsPerRun(200, func() { handle(&ctx) })
	t.Logf("%.0f allocations per text-only request", allocs)
	require.LessOrEqual(t, allocs, float64(maxTextAllocs))
}

// BenchmarkTextRequest: one text-only completion through the handler, no network: the
// daemon's own CPU cost per request (BenchmarkTextOnlyPath in cmd/dataplane adds HTTP).
func BenchmarkTextRequest(b *testing.B) {
	_, handle := textServer(b)
	var ctx fasthttp.RequestCtx
	b.ReportAllocs()
	for b.Loop() {
		handle(&ctx)
	}
}
