package api

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The watcher cancels the request whose client closed its end within about one poll, leaves
// the others alone (one whose watch stopped is never cancelled, even after its client left),
// and its goroutine ends once no request is watched.
func TestDisconnectWatcher(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	pair := func() (client, server net.Conn) {
		client, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		server, err = ln.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { client.Close(); server.Close() })
		return client, server
	}
	var d disconnectWatcher
	type req struct {
		client net.Conn
		ctx    context.Context
		w      *disconnectWatch
	}
	reqs := make([]req, 5)
	for i := range reqs {
		c, s := pair()
		ctx, cancel := context.WithCancelCause(context.Background())
		t.Cleanup(func() { cancel(nil) })
		reqs[i] = req{c, ctx, d.watch(s, cancel)}
	}
	reqs[4].w.stop() // finished before its client left
	reqs[4].client.Close()
	reqs[1].client.Write([]byte("POST / HTTP/1.1\r\n")) // a pipelined next request: still there
	start := time.Now()
	reqs[2].client.Close()
	select {
	case <-reqs[2].ctx.Done():
	case <-time.After(10 * disconnectPoll):
		t.Fatal("the request whose client left was not cancelled")
	}
	require.Less(t, time.Since(start), 3*disconnectPoll, "noticed within a poll (and scheduling slack)")
	require.ErrorIs(t, context.Cause(reqs[2].ctx), errClientLeft)
	time.Sleep(2 * disconnectPoll)
	for _, i := range []int{0, 1, 3, 4} {
		require.NoError(t, reqs[i].ctx.Err(), "request %d", i)
	}
	reqs[2].w.stop() // after its cancellation: harmless
	for _, i := range []int{0, 1, 3} {
		reqs[i].w.stop()
	}
	require.Eventually(t, func() bool { d.mu.Lock(); defer d.mu.Unlock(); return !d.running && len(d.active) == 0 },
		5*disconnectPoll, disconnectPoll/5, "the poller stops with nothing to watch")
	require.Nil(t, d.watch(nil, func(error) {}), "no socket, no watch")
}
