package api

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

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
