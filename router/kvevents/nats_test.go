package kvevents

import (
	"context"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/test"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/internal/testrand"
)

// Our engines' events over a real (embedded) NATS server on loopback: in order, a duplicate, a
// gap (no replay on core NATS: the worker's state is dropped), an unknown worker.
func TestNATSEndToEnd(t *testing.T) {
	rnd := testrand.New(t)
	srv := natsserver.RunRandClientPortServer()
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer nc.Close()

	opts := router.DefaultOptions()
	opts.Seed = 1
	r, err := router.New(opts)
	require.NoError(t, err)
	f, err := NewFeed(r, DefaultOptions())
	require.NoError(t, err)
	for _, name := range []string{"gpu-0", "gpu-1"} {
		_, err := f.AddWorker(name)
		require.NoError(t, err)
	}
	var stats NATSStats
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	before := srv.NumSubscriptions() // the server's own
	go func() { done <- SubscribeNATS(ctx, nc, DefaultNATSPrefix, f, &stats) }()
	require.Eventually(t, func() bool { return srv.NumSubscriptions() > before }, 5*time.Second, 5*time.Millisecond)

	c := newConvo(rnd, 6)
	send := func(worker string, seq uint64, events func(e *msgpackEncoder), n int) {
		require.NoError(t, nc.Publish(DefaultNATSPrefix+"."+worker, NATSMessage(seq, batchOf(seq%2 == 0, events, n))))
		require.NoError(t, nc.Flush())
	}
	overlap := func(worker string) int {
		var d router.Decision
		require.NoError(t, r.Decide(router.Request{Tokens: c.tokens}, &d))
		return d.Score(worker).Overlap
	}
	send("gpu-1", 0, func(e *msgpackEncoder) { c.stored(e, 0, 3, false) }, 1)
	send("gpu-1", 1, func(e *msgpackEncoder) { c.stored(e, 3, 6, true) }, 1)
	send("gpu-1", 1, func(e *msgpackEncoder) { c.removed(e, 0, 6) }, 1) // a duplicate seq: ignored
	send("nobody", 0, func(e *msgpackEncoder) { c.stored(e, 0, 3, false) }, 1)
	require.Eventually(t, func() bool { return overlap("gpu-1") == 6 && stats.UnknownWorker.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, 0, overlap("gpu-0"))
	require.Equal(t, int64(1), f.Stats().Duplicates.Load())

	send("gpu-1", 5, func(e *msgpackEncoder) { c.stored(e, 0, 2, false) }, 1) // seq 2-4 lost
	require.Eventually(t, func() bool { return overlap("gpu-1") == 2 }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, int64(1), f.Stats().Unrecoverable.Load())
	require.NoError(t, nc.Publish(DefaultNATSPrefix+".gpu-0", []byte{1, 2}))
	require.Eventually(t, func() bool { return stats.BadMessages.Load() == 1 }, 5*time.Second, 5*time.Millisecond)

	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
}
