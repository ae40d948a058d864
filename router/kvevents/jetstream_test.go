package kvevents

import (
	"context"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/internal/natstest"
	"dataplane/router/internal/testrand"
)

// testStream is the default stream, small enough for jsServer's store.
func testStream() StreamOptions {
	o := DefaultStreamOptions()
	o.MaxBytes = 32 << 20
	return o
}

func testFeedOptions() StreamFeedOptions {
	o := DefaultStreamFeedOptions()
	o.Stream = testStream()
	return o
}

// streamWorker publishes one engine's batches on the stream's subject: a conversation stored
// in chained batches, with the blocks of a batch now and then removed again.
type streamWorker struct {
	name string
	c    *convo
	seq  uint64
	next int // the next block to store
	per  int
	// removes: a quarter of the batches remove the blocks they store again
	removes bool
}

func (w *streamWorker) batch(rnd *rand.Rand) (uint64, []byte) {
	e := &msgpackEncoder{}
	a := w.next
	if a+w.per > len(w.c.engine) { // the conversation is over: start it again
		a, w.next = 0, 0
	}
	remove := w.removes && a > 0 && rnd.IntN(4) == 0
	e.array(2).float(1).array(map[bool]int{true: 2, false: 1}[remove])
	w.c.stored(e, a, a+w.per, a > 0)
	if remove {
		w.c.removed(e, a, a+w.per)
	} else {
		w.next = a + w.per
	}
	w.seq++
	return w.seq - 1, e.b
}

// publish sends the next batch as core NATS would (no acknowledgement).
func (w *streamWorker) publish(t *testing.T, nc *nats.Conn, rnd *rand.Rand) {
	require.NoError(t, nc.Publish(DefaultNATSPrefix+"."+w.name, NATSMessage(w.batch(rnd))))
}

// replica is a router fed by the stream.
type replica struct {
	r    *router.Router
	sf   *StreamFeed
	stop func()
}

func startReplica(t *testing.T, js jetstream.JetStream, workers []string, opts StreamFeedOptions) *replica {
	ro := router.DefaultOptions()
	ro.Seed = 1
	r, err := router.New(ro)
	require.NoError(t, err)
	f, err := NewFeed(r, DefaultOptions())
	require.NoError(t, err)
	sf := NewStreamFeed(f, js, opts)
	for _, w := range workers {
		_, err := sf.AddWorker(w)
		require.NoError(t, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); require.NoError(t, sf.Run(ctx, nil)) }()
	rep := &replica{r: r, sf: sf, stop: func() { cancel(); wg.Wait() }}
	t.Cleanup(rep.stop)
	return rep
}

// waitFor waits until the stream holds at least want messages and the replica has handled
// them all.
func (rep *replica) waitFor(t *testing.T, js jetstream.JetStream, want uint64) {
	t.Helper()
	st, err := js.Stream(context.Background(), DefaultStreamName)
	require.NoError(t, err)
	var last uint64
	require.Eventually(t, func() bool {
		info, err := st.Info(context.Background())
		if err != nil {
			return false
		}
		last = info.State.LastSeq
		applied, _ := rep.sf.Position()
		return last >= want && applied == last
	}, 10*time.Second, 5*time.Millisecond, "want stream sequence %d, the stream has %d", want, last)
	<-rep.sf.CaughtUp()
}

// overlaps is every worker's cached prefix for each prompt.
func (rep *replica) overlaps(t *testing.T, prompts [][]uint32) []map[string]int {
	var out []map[string]int
	var d router.Decision
	for _, p := range prompts {
		require.NoError(t, rep.r.Decide(router.Request{Tokens: p}, &d))
		m := map[string]int{}
		for _, s := range d.Scores {
			m[s.Worker] = s.Overlap
		}
		out = append(out, m)
	}
	return out
}

// Replicas that start at different times, one of them before a worker is registered, and one
// that restarts, all build the same index from the stream; a worker's restart (seq back to 0)
// drops its state in all of them alike; batches of a worker nobody registered wait and go.
func TestStreamFeedReplicasConverge(t *testing.T) {
	rnd := testrand.New(t)
	s := natstest.JetStream(t, t.TempDir(), 0)
	nc, js := natstest.Connect(t, s.ClientURL())
	_, err := EnsureStream(context.Background(), js, testStream())
	require.NoError(t, err)
	_, err = EnsureStream(context.Background(), js, testStream()) // again: nothing changes
	require.NoError(t, err)

	workers := []*streamWorker{}
	var prompts [][]uint32
	for _, name := range []string{"w0", "w1", "w2"} {
		c := newConvo(rnd, 64)
		workers = append(workers, &streamWorker{name: name, c: c, per: 4, removes: true})
		for _, n := range []int{3, 16, 40, 64} {
			prompts = append(prompts, c.tokens[:n*16])
		}
	}
	names := []string{"w0", "w1", "w2"}
	early := startReplica(t, js, names, testFeedOptions())
	lateJoin := startReplica(t, js, names[:2], testFeedOptions()) // registers w2 later
	for i := range 60 {
		workers[i%3].publish(t, nc, rnd)
		if i == 40 { // w1 restarts: its numbering starts again, its state goes
			workers[1].seq = 0
		}
	}
	require.NoError(t, nc.Publish(DefaultNATSPrefix+".nobody", NATSMessage(0, batchOf(false, func(e *msgpackEncoder) {
		workers[0].c.stored(e, 0, 2, false)
	}, 1))))
	require.NoError(t, nc.Flush())
	early.waitFor(t, js, 61)
	lateJoin.waitFor(t, js, 61)
	_, err = lateJoin.sf.AddWorker("w2") // its batches waited for it
	require.NoError(t, err)
	require.Equal(t, int64(20+1), lateJoin.sf.Stats.Waited.Load())
	late := startReplica(t, js, names, testFeedOptions())
	late.waitFor(t, js, 61)

	want := early.overlaps(t, prompts)
	require.Positive(t, want[3]["w0"], "w0 holds some of its conversation")
	require.Equal(t, want, late.overlaps(t, prompts))
	require.Equal(t, want, lateJoin.overlaps(t, prompts))
	for _, rep := range []*replica{early, late, lateJoin} {
		require.Equal(t, int64(1), rep.sf.Feed().Stats().Restarts.Load())
	}
	n, _ := early.sf.Waiting()
	require.Equal(t, 1, n, "the batch for nobody waits")

	// A replica stopped and started again (from the start of the stream) gets there too, while
	// the workers go on publishing.
	early.stop()
	for i := range 30 {
		workers[i%3].publish(t, nc, rnd)
	}
	require.NoError(t, nc.Flush())
	again := startReplica(t, js, names, testFeedOptions())
	late.waitFor(t, js, 91)
	again.waitFor(t, js, 91)
	require.Equal(t, late.overlaps(t, prompts), again.overlaps(t, prompts))
}

// Batches for unregistered workers wait up to the bounds, the oldest dropped first; a worker
// that joins reads its history from the stream, dropped batches included.
func TestStreamFeedWaitingBounded(t *testing.T) {
	rnd := testrand.New(t)
	s := natstest.JetStream(t, t.TempDir(), 0)
	nc, js := natstest.Connect(t, s.ClientURL())
	_, err := EnsureStream(context.Background(), js, testStream())
	require.NoError(t, err)
	opts := testFeedOptions()
	opts.MaxWaiting = 5
	rep := startReplica(t, js, nil, opts)
	a, b := &streamWorker{name: "a", c: newConvo(rnd, 64), per: 2}, &streamWorker{name: "b", c: newConvo(rnd, 64), per: 2}
	for range 4 {
		a.publish(t, nc, rnd)
	}
	for range 3 {
		b.publish(t, nc, rnd)
	}
	require.NoError(t, nc.Flush())
	rep.waitFor(t, js, 7)
	n, _ := rep.sf.Waiting()
	require.Equal(t, 5, n)
	require.Equal(t, int64(2), rep.sf.Stats.DroppedWaiting.Load())
	_, err = rep.sf.AddWorker("a")
	require.NoError(t, err)
	_, err = rep.sf.AddWorker("b")
	require.NoError(t, err)
	n, bytes := rep.sf.Waiting()
	require.Zero(t, n)
	require.Zero(t, bytes)
	require.Equal(t, int64(7), rep.sf.Stats.CaughtUp.Load())
	var d router.Decision
	require.NoError(t, rep.r.Decide(router.Request{Tokens: b.c.tokens[:6*16]}, &d))
	require.Equal(t, 6, d.Score("b").Overlap)
	require.NoError(t, rep.r.Decide(router.Request{Tokens: a.c.tokens[:8*16]}, &d))
	require.Equal(t, 8, d.Score("a").Overlap, "a's dropped batches came back from the stream")

	// Without the stream (a feed with no JetStream), only what waited is applied.
	ro := router.DefaultOptions()
	r, err := router.New(ro)
	require.NoError(t, err)
	f, err := NewFeed(r, DefaultOptions())
	require.NoError(t, err)
	bare := NewStreamFeed(f, nil, opts)
	_, err = bare.AddWorker("a")
	require.NoError(t, err)
	require.Zero(t, bare.Stats.CaughtUp.Load())
}

// Workers that come and go with batches waiting for them each time leave no trace in the
// waiting queue's order (it kept an entry a batch applied on arrival, for the life of the feed).
func TestStreamFeedOrderBounded(t *testing.T) {
	ro := router.DefaultOptions()
	r, err := router.New(ro)
	require.NoError(t, err)
	f, err := NewFeed(r, DefaultOptions())
	require.NoError(t, err)
	sf := NewStreamFeed(f, nil, testFeedOptions())
	seq := uint64(0)
	for range 200 {
		sf.mu.Lock()
		for range 100 {
			seq++
			sf.wait("w", seq, make([]byte, 16))
		}
		sf.mu.Unlock()
		_, err := sf.AddWorker("w")
		require.NoError(t, err)
		require.NoError(t, sf.RemoveWorker("w"))
		sf.mu.Lock()
		require.LessOrEqual(t, len(sf.order), 2*sf.waitingCount+1024)
		sf.mu.Unlock()
	}
	n, bytes := sf.Waiting()
	require.Zero(t, n)
	require.Zero(t, bytes)
	// Entries of batches still waiting all stay, in order: 2000 wait for "x".
	sf.mu.Lock()
	defer sf.mu.Unlock()
	for range 2000 {
		seq++
		sf.wait("x", seq, make([]byte, 16))
	}
	var x []uint64
	for _, ref := range sf.order {
		if ref.name == "x" {
			x = append(x, ref.streamSeq)
		}
	}
	require.Equal(t, 2000, len(x))
	require.True(t, slices.IsSorted(x))
	require.LessOrEqual(t, len(sf.order), 2*sf.waitingCount+1024)
}

// A worker that leaves and comes back (its lease lapsed, its engine did not restart) gets its
// whole history back from the stream, as a replica that starts now has it.
func TestStreamFeedRejoin(t *testing.T) {
	rnd := testrand.New(t)
	s := natstest.JetStream(t, t.TempDir(), 0)
	nc, js := natstest.Connect(t, s.ClientURL())
	_, err := EnsureStream(context.Background(), js, testStream())
	require.NoError(t, err)
	w := &streamWorker{name: "w", c: newConvo(rnd, 64), per: 4, removes: true}
	rep := startReplica(t, js, []string{"w"}, testFeedOptions())
	for range 10 {
		w.publish(t, nc, rnd)
	}
	require.NoError(t, nc.Flush())
	rep.waitFor(t, js, 10)
	prompts := [][]uint32{w.c.tokens[:16*16], w.c.tokens[:40*16]}
	before := rep.overlaps(t, prompts)
	require.Positive(t, before[1]["w"])
	require.NoError(t, rep.sf.RemoveWorker("w"))
	for range 5 {
		w.publish(t, nc, rnd)
	}
	require.NoError(t, nc.Flush())
	rep.waitFor(t, js, 15)
	_, err = rep.sf.AddWorker("w")
	require.NoError(t, err)
	fresh := startReplica(t, js, []string{"w"}, testFeedOptions())
	fresh.waitFor(t, js, 15)
	require.Equal(t, fresh.overlaps(t, prompts), rep.overlaps(t, prompts))
	require.Equal(t, int64(15), rep.sf.Stats.CaughtUp.Load())
}

// The NATS server restarts with its store: what the stream held is still there, the consumer
// carries on from where it was, and batches published around the restart through a
// StreamPublisher all arrive, once each, in order.
func TestStreamFeedAcrossRestart(t *testing.T) {
	rnd := testrand.New(t)
	dir := t.TempDir()
	s := natstest.JetStream(t, dir, 0)
	port := s.Addr().(*net.TCPAddr).Port
	nc, js := natstest.Connect(t, s.ClientURL())
	_, err := EnsureStream(context.Background(), js, testStream())
	require.NoError(t, err)
	po := DefaultStreamPublisherOptions()
	po.AckWait = 200 * time.Millisecond
	pub, err := NewStreamPublisher(nc, po)
	require.NoError(t, err)
	defer pub.Close()
	flush := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, pub.Flush(ctx))
	}
	w := &streamWorker{name: "w", c: newConvo(rnd, 256), per: 2}
	v := &streamWorker{name: "v", c: newConvo(rnd, 256), per: 2}
	rep := startReplica(t, js, []string{"w", "v"}, testFeedOptions())
	send := func(n int) {
		for range n {
			for _, x := range []*streamWorker{w, v} {
				seq, b := x.batch(rnd)
				pub.Publish(x.name, seq, b)
			}
		}
	}
	send(20)
	flush()
	rep.waitFor(t, js, 40)

	s.Shutdown()
	s.WaitForShutdown()
	send(10) // queued while the server is away
	natstest.JetStream(t, dir, port)
	send(10)
	flush()
	rep.waitFor(t, js, 80)
	st := rep.sf.Feed().Stats()
	require.Zero(t, st.Gaps.Load()+st.Restarts.Load()+st.Duplicates.Load(), "every batch once, in order")
	require.Equal(t, int64(80), st.Batches.Load())
	require.Zero(t, pub.Stats.Dropped.Load())
	t.Logf("publisher: stored %d, duplicates %d, resent %d, errors %d", pub.Stats.Stored.Load(), pub.Stats.Duplicates.Load(),
		pub.Stats.Resent.Load(), pub.Stats.Errors.Load())
	fresh := startReplica(t, js, []string{"w", "v"}, testFeedOptions())
	fresh.waitFor(t, js, 80)
	prompts := [][]uint32{w.c.tokens[:40*16], w.c.tokens[:100*16], v.c.tokens[:80*16]}
	require.Equal(t, fresh.overlaps(t, prompts), rep.overlaps(t, prompts))
}

// The relay forwards an engine's batches in its own numbering: a gap is filled from replay
// first, a repeat dropped, a restart replays the new history from 0, the first batch brings
// what the engine still buffers, and a relay that resumes after the stream's last batch
// replays only what came after it.
func TestRelaySequence(t *testing.T) {
	var out []uint64
	publish := func(seq uint64, _ []byte) error { out = append(out, seq); return nil }
	buffered := map[uint64]bool{}
	replay := func(from uint64, deliver func(uint64, []byte)) error {
		for s := uint64(0); s < 100; s++ {
			if s >= from && buffered[s] {
				deliver(s, nil)
			}
		}
		return nil
	}
	have := func(seqs ...uint64) {
		clear(buffered)
		for _, s := range seqs {
			buffered[s] = true
		}
	}
	r := NewRelay(publish, 0, false)
	have(3, 4, 5)
	r.Live(6, nil, replay) // the first batch: the engine's buffer first
	r.Live(7, nil, replay)
	r.Live(7, nil, replay)
	have(3, 4, 5, 6, 7, 8, 9)
	r.Live(10, nil, replay) // 8 and 9 were missed
	have(12)
	r.Live(13, nil, replay) // 11 is gone from the engine too: a hole in the stream
	have(0, 1)
	r.Live(2, nil, replay) // the engine restarted
	require.Equal(t, []uint64{3, 4, 5, 6, 7, 8, 9, 10, 13, 0, 1, 2}, out)
	require.Equal(t, int64(1), r.Stats.Duplicates.Load())
	require.Equal(t, int64(2), r.Stats.Gaps.Load())
	require.Equal(t, int64(1), r.Stats.Unrecoverable.Load())
	require.Equal(t, int64(1), r.Stats.Restarts.Load())
	require.Equal(t, int64(12), r.Stats.Forwarded.Load())

	out = nil
	r = NewRelay(publish, 41, true) // the stream has up to 41
	have(40, 41, 42, 43)
	r.Live(44, nil, replay)
	require.Equal(t, []uint64{42, 43, 44}, out)

	// Resumed before any live batch: what the engine buffers after the stream's last.
	out = nil
	r = NewRelay(publish, 41, true)
	r.Resume(replay)
	require.Equal(t, []uint64{42, 43}, out)
	r.Live(44, nil, replay)
	require.Equal(t, []uint64{42, 43, 44}, out)
	out = nil
	r = NewRelay(publish, 0, false)
	r.Resume(replay)
	require.Equal(t, []uint64{40, 41, 42, 43}, out)
}
