package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/index"
	"dataplane/router/internal/testrand"
)

// fakeVLLM publishes like vllm's ZmqEventPublisher: PUB frames [topic, seq, payload], a replay
// buffer served on a ROUTER socket ([id, "", seq, payload] per buffered batch, then the end
// marker). Tests choose what goes out live and what only into the buffer.
type fakeVLLM struct {
	t      *testing.T
	pub    zmq4.Socket
	router zmq4.Socket

	mu     sync.Mutex
	seq    uint64
	buffer [][2][]byte // seq, payload
	topic  bool        // newer vLLM: replies carry the topic frame too

	// With asked set, each replay request's start seq is sent there; with hold set, the answer
	// waits until hold is closed and then serves the buffer as it is by then.
	asked chan uint64
	hold  chan struct{}
}

func newFakeVLLM(t *testing.T, ctx context.Context) *fakeVLLM {
	f := &fakeVLLM{t: t, pub: zmq4.NewPub(ctx), router: zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("vllm")))}
	require.NoError(t, f.pub.Listen("tcp://127.0.0.1:0"))
	require.NoError(t, f.router.Listen("tcp://127.0.0.1:0"))
	t.Cleanup(func() { f.pub.Close(); f.router.Close() })
	go f.serveReplay()
	return f
}

func (f *fakeVLLM) endpoints() (string, string) {
	return "tcp://" + f.pub.Addr().String(), "tcp://" + f.router.Addr().String()
}

func (f *fakeVLLM) serveReplay() {
	for {
		m, err := f.router.Recv()
		if err != nil {
			return
		}
		if len(m.Frames) != 3 {
			continue
		}
		id, start := m.Frames[0], binary.BigEndian.Uint64(m.Frames[2])
		f.mu.Lock()
		asked, hold := f.asked, f.hold
		f.mu.Unlock()
		if asked != nil {
			asked <- start
		}
		if hold != nil {
			<-hold
		}
		f.mu.Lock()
		buf := append([][2][]byte(nil), f.buffer...)
		topic := f.topic
		f.mu.Unlock()
		for _, b := range buf {
			if binary.BigEndian.Uint64(b[0]) >= start {
				frames := [][]byte{id, {}, b[0], b[1]}
				if topic {
					frames = [][]byte{id, {}, []byte("kv"), b[0], b[1]}
				}
				_ = f.router.Send(zmq4.NewMsgFrom(frames...))
			}
		}
		end := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		_ = f.router.Send(zmq4.NewMsgFrom(id, []byte{}, end, []byte{}))
	}
}

// publish sends the next batch; live=false keeps it out of the live stream (a drop), so only a
// replay can deliver it.
func (f *fakeVLLM) publish(payload []byte, live bool) uint64 {
	f.mu.Lock()
	seq := f.seq
	f.seq++
	s := binary.BigEndian.AppendUint64(nil, seq)
	f.buffer = append(f.buffer, [2][]byte{s, payload})
	f.mu.Unlock()
	if live {
		require.NoError(f.t, f.pub.Send(zmq4.NewMsgFrom([]byte{}, s, payload)))
	}
	return seq
}

// resend repeats a buffered batch on the live stream (a duplicate).
func (f *fakeVLLM) resend(seq uint64) {
	f.mu.Lock()
	b := f.buffer[seq]
	f.mu.Unlock()
	require.NoError(f.t, f.pub.Send(zmq4.NewMsgFrom([]byte{}, b[0], b[1])))
}

// restart is a new vLLM process: sequence numbers and the replay buffer start over.
func (f *fakeVLLM) restart() {
	f.mu.Lock()
	f.seq, f.buffer = 0, nil
	f.mu.Unlock()
}

// A vLLM conversation: tokens, the engine's own block hashes, and ours.
type convo struct {
	tokens []uint32
	engine []uint64
	ours   []uint64
}

func newConvo(r *rand.Rand, blocks int) *convo {
	c := &convo{tokens: make([]uint32, blocks*16), engine: make([]uint64, blocks)}
	for i := range c.tokens {
		c.tokens[i] = r.Uint32N(150_000)
	}
	for i := range c.engine {
		c.engine[i] = r.Uint64() | 1<<63 // > 2^63: exercises uint64 msgpack
	}
	h, _ := router.NewHasher(16)
	c.ours, _ = h.Sequence(nil, c.tokens, router.HashSeed, nil)
	return c
}

// stored writes a BlockStored event for blocks [a, b) of c, in the array or the map layout.
func (c *convo) stored(e *msgpackEncoder, a, b int, asMap bool) {
	if asMap {
		e.map_(7).str("type").str("BlockStored")
		e.str("block_hashes")
	} else {
		e.array(7).str("BlockStored")
	}
	e.array(b - a)
	for _, h := range c.engine[a:b] {
		e.uint(h)
	}
	if asMap {
		e.str("parent_block_hash")
	}
	if a == 0 {
		e.nil()
	} else {
		e.uint(c.engine[a-1])
	}
	if asMap {
		e.str("token_ids")
	}
	e.array((b - a) * 16)
	for _, t := range c.tokens[a*16 : b*16] {
		e.uint(uint64(t))
	}
	if asMap {
		e.str("block_size").uint(16).str("medium").str("GPU").str("future_field").array(1).nil()
	} else {
		e.uint(16).nil().str("GPU")
	}
}

func (c *convo) removed(e *msgpackEncoder, a, b int) {
	e.array(3).str("BlockRemoved").array(b - a)
	for _, h := range c.engine[a:b] {
		e.uint(h)
	}
	e.str("GPU")
}

func batchOf(asMap bool, events func(e *msgpackEncoder), n int) []byte {
	e := &msgpackEncoder{}
	if asMap {
		e.map_(3).str("ts").float(1.5).str("data_parallel_rank").uint(0).str("events").array(n)
	} else {
		e.array(2).float(1.5).array(n)
	}
	events(e)
	return e.b
}

// zmqRig is one worker's index fed by SubscribeZMQ (DP rank 0 only) from a fake vLLM on
// loopback, the subscriber connected.
type zmqRig struct {
	vllm   *fakeVLLM
	ix     *index.Index
	w      index.Worker
	stats  Stats
	cancel context.CancelFunc
	done   chan error
}

func newZMQRig(t *testing.T) *zmqRig {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	g := &zmqRig{vllm: newFakeVLLM(t, ctx), cancel: cancel, done: make(chan error, 1)}
	pubEP, replayEP := g.vllm.endpoints()
	var err error
	g.ix, err = index.New(index.DefaultOptions())
	require.NoError(t, err)
	g.w, _ = g.ix.AddWorker(0)
	opts := DefaultOptions()
	eng, err := NewEngine(g.ix, g.w, 16, &opts, &g.stats)
	require.NoError(t, err)
	go func() {
		g.done <- SubscribeZMQ(ctx, DefaultZMQOptions(pubEP, replayEP), &g.stats, func(rank int) (*Engine, error) {
			if rank != 0 {
				return nil, fmt.Errorf("DP rank %d: the fake vLLM has only rank 0", rank)
			}
			return eng, nil
		})
	}()
	require.Eventually(t, func() bool { return len(g.vllm.pub.(interface{ Topics() []string }).Topics()) > 0 },
		10*time.Second, 10*time.Millisecond, "subscriber never connected")
	return g
}

// overlap is how many leading blocks of c the worker holds, by the index.
func (g *zmqRig) overlap(c *convo) int {
	var m index.Match
	g.ix.Match(c.ours, &m)
	return m.Blocks(g.w, 0)
}

// stop cancels the subscriber and checks it ends, with context.Canceled.
func (g *zmqRig) stop() {
	t := g.vllm.t
	t.Helper()
	g.cancel()
	select {
	case err := <-g.done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("subscriber did not stop")
	}
}

// End to end over real ZMQ on loopback: both encodings, a dropped batch that replay recovers, a
// duplicate, a garbage payload, an engine restart; the index answers what vLLM holds.
func TestZMQEndToEnd(t *testing.T) {
	r := testrand.New(t)
	g := newZMQRig(t)
	vllm, ix, w, stats, overlap := g.vllm, g.ix, g.w, &g.stats, g.overlap

	a, b := newConvo(r, 12), newConvo(r, 6)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		require.Eventually(t, cond, 10*time.Second, 5*time.Millisecond, what)
	}

	// seq 0 (arrays), 1 (maps): a's blocks 0-3 and 4-7, chained through the parent hash.
	vllm.publish(batchOf(false, func(e *msgpackEncoder) { a.stored(e, 0, 4, false) }, 1), true)
	vllm.publish(batchOf(true, func(e *msgpackEncoder) { a.stored(e, 4, 8, true) }, 1), true)
	waitFor("a[0:8] stored", func() bool { return overlap(a) == 8 })

	// seq 2 is dropped on the way; seq 3 arrives: the gap is filled from replay, in order.
	vllm.publish(batchOf(true, func(e *msgpackEncoder) { a.stored(e, 8, 12, true) }, 1), false)
	vllm.publish(batchOf(false, func(e *msgpackEncoder) { b.stored(e, 0, 6, false) }, 1), true)
	waitFor("gap replayed", func() bool { return overlap(a) == 12 && overlap(b) == 6 })
	require.Equal(t, int64(1), stats.Gaps.Load())
	require.Equal(t, int64(1), stats.Replayed.Load())

	// A duplicate of seq 3, then a batch storing blocks already held and removing a's tail.
	vllm.resend(3)
	vllm.publish(batchOf(false, func(e *msgpackEncoder) {
		b.stored(e, 0, 6, false)
		a.removed(e, 10, 12)
	}, 2), true)
	waitFor("a's tail removed", func() bool { return overlap(a) == 10 })
	require.Equal(t, int64(1), stats.Duplicates.Load())
	require.Equal(t, int64(6), ix.Held(w, 0)-10)

	// Garbage is counted and skipped; the stream goes on.
	vllm.publish([]byte{0xc1, 0x00}, true)
	vllm.publish(batchOf(true, func(e *msgpackEncoder) { a.removed(e, 9, 10) }, 1), true)
	waitFor("a[9] removed", func() bool { return overlap(a) == 9 })
	require.Equal(t, int64(1), stats.BadPayloads.Load())

	// The engine restarts: its sequence starts over, with newer vLLM's topic frame in replies.
	// Seq 0 is lost, seq 1 arrives: the router drops what it knew and replays the new history.
	vllm.restart()
	vllm.mu.Lock()
	vllm.topic = true
	vllm.mu.Unlock()
	vllm.publish(batchOf(false, func(e *msgpackEncoder) { b.stored(e, 0, 3, false) }, 1), false)
	vllm.publish(batchOf(true, func(e *msgpackEncoder) { b.removed(e, 2, 3) }, 1), true)
	waitFor("restart handled", func() bool { return overlap(a) == 0 && overlap(b) == 2 })
	require.Equal(t, int64(1), stats.Restarts.Load())
	require.Equal(t, int64(2), ix.Held(w, 0), "nothing from before the restart survives")
	require.Equal(t, int64(2), ix.Blocks())
	require.Zero(t, stats.ReplayFailures.Load())

	g.stop()
}

// A replay in progress holds up its engine, not the stream: live batches that arrive while the
// replay responder sits on its answer are buffered, then applied after the replayed batch, in
// order (batches that only apply on top of the one before), each once, although the replay's
// answer repeats them too.
func TestZMQLiveBatchesDuringReplay(t *testing.T) {
	r := testrand.New(t)
	g := newZMQRig(t)
	vllm, ix, w, stats, overlap := g.vllm, g.ix, g.w, &g.stats, g.overlap

	c, d := newConvo(r, 32), newConvo(r, 8)
	vllm.publish(batchOf(false, func(e *msgpackEncoder) { c.stored(e, 0, 2, false) }, 1), true)
	vllm.publish(batchOf(true, func(e *msgpackEncoder) { c.stored(e, 2, 4, true) }, 1), true)
	require.Eventually(t, func() bool { return overlap(c) == 4 }, 10*time.Second, 5*time.Millisecond)

	// seq 2 is lost; seq 3 (which needs it: its parent is there) asks for a replay, which the
	// responder holds.
	asked, hold := make(chan uint64, 1), make(chan struct{})
	vllm.mu.Lock()
	vllm.asked, vllm.hold = asked, hold
	vllm.mu.Unlock()
	released := false
	release := func() {
		if !released {
			released = true
			close(hold)
		}
	}
	defer release()
	vllm.publish(batchOf(true, func(e *msgpackEncoder) { c.stored(e, 4, 6, true) }, 1), false)
	vllm.publish(batchOf(false, func(e *msgpackEncoder) { c.stored(e, 6, 8, false) }, 1), true)
	select {
	case from := <-asked:
		require.Equal(t, uint64(2), from)
	case <-time.After(10 * time.Second):
		t.Fatal("no replay request")
	}

	// While the replay is held: seq 4..15, each continuing c from the batch before, and d
	// stored, cut and stored again (the order decides what is left).
	const live = 12
	for i := range live {
		asMap := i%2 == 1
		n := 1
		if i%4 != 0 {
			n = 2
		}
		vllm.publish(batchOf(asMap, func(e *msgpackEncoder) {
			c.stored(e, 8+2*i, 10+2*i, asMap)
			switch i % 4 {
			case 1:
				d.stored(e, 0, 8, asMap)
			case 2:
				d.removed(e, 4, 8)
			case 3:
				d.stored(e, 4, 8, asMap)
			}
		}, n), true)
	}
	time.Sleep(300 * time.Millisecond) // the live batches reach the subscriber and pile up
	require.Equal(t, 4, overlap(c), "nothing past the gap may apply before the replay")
	require.Zero(t, overlap(d))
	require.Equal(t, int64(2), stats.Batches.Load())

	release()
	total := int64(4 + live)
	require.Eventually(t, func() bool { return stats.Batches.Load() == total && overlap(c) == 32 },
		10*time.Second, 5*time.Millisecond, "applied %d of %d batches, c overlap %d", stats.Batches.Load(), total, overlap(c))
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, total, stats.Batches.Load(), "a batch was applied twice")
	require.Equal(t, 8, overlap(d))
	require.Equal(t, int64(1), stats.Gaps.Load())
	require.Equal(t, int64(1), stats.Replayed.Load(), "only seq 2 comes from the replay")
	for name, v := range map[string]int64{"duplicates": stats.Duplicates.Load(), "restarts": stats.Restarts.Load(),
		"unknown parents": stats.UnknownParent.Load(), "unknown blocks": stats.UnknownBlocks.Load(),
		"bad payloads": stats.BadPayloads.Load(), "replay failures": stats.ReplayFailures.Load(),
		"unrecoverable": stats.Unrecoverable.Load()} {
		require.Zero(t, v, name)
	}
	require.Equal(t, int64(32+20), stats.BlocksStored.Load())
	require.Equal(t, int64(12), stats.BlocksRemoved.Load())
	require.Equal(t, int64(32+8), ix.Held(w, 0))

	g.stop()
}
