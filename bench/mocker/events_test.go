package mocker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/test"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/index"
	"dataplane/router/kvevents"
)

// multimodalWorkload is workload with media items (shared across requests, so media blocks are
// reused) and cache salts on some requests.
func multimodalWorkload(r *rand.Rand, n int, start time.Duration, got outputs) []arrival {
	arr := workload(r, n, 300, 40, time.Second, got)
	images := []string{"img-a", "img-b", fmt.Sprintf("%064x", r.Uint64())} // a uuid, a user id, a vLLM-style digest
	for i := range arr {
		a := &arr[i]
		a.at += start
		a.r.ID = fmt.Sprintf("%d-%s", start, a.r.ID)
		a.r.Sink = got.sink(a.r.ID)
		if r.IntN(3) == 0 {
			off := r.IntN(len(a.r.Tokens))
			length := min(1+r.IntN(40), len(a.r.Tokens)-off)
			a.r.Media = []router.Media{{Hash: 0, Offset: off, Length: length}}
			a.r.MediaIDs = []string{images[r.IntN(len(images))]}
			a.r.Media[0].Hash = router.MediaHash(a.r.MediaIDs[0])
		}
		if r.IntN(4) == 0 {
			a.r.Salt = []string{"tenant-1", "tenant-2"}[r.IntN(2)]
		}
	}
	return arr
}

// blockChains learns every stored block's chain (its sequence's blocks up to it) from the
// batches the engines publish, independently of the router's feed: the router is then asked
// about whole chains, as a request asks it. The engines name blocks by our sequence hashes.
// Safe for concurrent use (fleet loops publish at once).
type blockChains struct {
	mu     sync.Mutex
	parent map[uint64]parentOf // never shrinks (tests are small)
}

type parentOf struct {
	hash uint64
	ok   bool // false: the block starts a sequence
}

func (k *blockChains) record(t *testing.T, payload []byte) {
	var b kvevents.Batch
	if err := kvevents.DecodeBatch(payload, &b); err != nil {
		t.Errorf("published batch does not decode: %v", err) // not FailNow: may run off the test goroutine
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.parent == nil {
		k.parent = map[uint64]parentOf{}
	}
	for _, ev := range b.Events {
		if ev.Kind != kvevents.BlockStored {
			continue
		}
		p := parentOf{ev.Parent, ev.HasParent}
		if _, known := k.parent[ev.Parent]; p.ok && !known {
			t.Errorf("BlockStored names parent %#x that was never stored", ev.Parent)
			return
		}
		for _, h := range ev.Hashes {
			k.parent[h] = p
			p = parentOf{h, true}
		}
	}
}

// chain is the sequence of blocks ending with h, first block first; ok false if h was never
// published. Call with k.mu held.
func (k *blockChains) chain(h uint64) (c []uint64, ok bool) {
	for {
		p, known := k.parent[h]
		if !known {
			return nil, false
		}
		c = append(c, h)
		if !p.ok {
			slices.Reverse(c)
			return c, true
		}
		h = p.hash
	}
}

// newFeed is a router with the default options and the feed that keeps its index.
func newFeed(t *testing.T) (*router.Router, *kvevents.Feed) {
	rt, err := router.New(router.DefaultOptions())
	require.NoError(t, err)
	kv, err := kvevents.NewFeed(rt, kvevents.DefaultOptions())
	require.NoError(t, err)
	return rt, kv
}

// cached lists the engine's cached full blocks. Run it on the engine's goroutine.
func cached(e *Engine) []uint64 {
	var hs []uint64
	e.KV().Hashes(func(h uint64, _ int) { hs = append(hs, h) })
	return hs
}

// sameCache asserts that the router holds, for the engine's worker, exactly the blocks the
// engine's KV cache holds (blocks, from cached): the engine holds each cached block's whole
// chain (it evicts a sequence from its tail), the router matches every such chain in full for
// the worker, and the router's count of the worker's blocks is the engine's count.
func sameCache(t *testing.T, r *router.Router, slot index.Worker, blocks []uint64, k *blockChains) {
	t.Helper()
	var m index.Match
	k.mu.Lock()
	defer k.mu.Unlock()
	inCache := map[uint64]bool{}
	for _, h := range blocks {
		inCache[h] = true
	}
	for _, h := range blocks {
		c, ok := k.chain(h)
		require.True(t, ok, "block %#x is in the engine's cache but was never published", h)
		for _, a := range c {
			require.True(t, inCache[a], "the engine holds block %#x but not %#x before it", h, a)
		}
		r.Index().Match(c, &m)
		require.Equal(t, len(c), m.Blocks(slot, 0), "block %#x is in the engine's cache but not the router's", h)
	}
	require.EqualValues(t, len(blocks), r.Index().Held(slot, 0), "router blocks for the worker")
	require.NotEmpty(t, blocks)
}

// Published events decode with the router's decoder and rebuild the engine's cache state
// exactly: random multimodal, salted workloads on a small cache (stores, shared blocks,
// evictions, preemptions), both batch layouts, checked after each burst and at the end.
func TestEventsRebuildCacheInRouter(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, maps := range []bool{false, true} {
		r := rand.New(rand.NewPCG(seed, 7))
		rt, kv := newFeed(t)
		feed, err := kv.AddWorker("e")
		require.NoError(t, err)
		opts := DefaultOptions()
		opts.Name, opts.Blocks, opts.MapEvents, opts.Seed = "e", 120, maps, seed
		var batches int
		var keys blockChains
		e, err := NewEngine(opts, PublisherFunc(func(worker string, seq uint64, payload []byte) {
			keys.record(t, payload)
			require.Equal(t, "e", worker)
			require.EqualValues(t, batches, seq)
			batches++
			feed.Live(seq, payload, nil)
		}))
		require.NoError(t, err)
		got := outputs{}
		for burst := range 4 {
			arr := multimodalWorkload(r, 40, time.Duration(burst)*time.Hour, got)
			drive(t, e, arr, nil)
			checkOutputs(t, arr, got)
			sameCache(t, rt, feed.Worker(), cached(e), &keys)
		}
		st := kv.Stats()
		require.Zero(t, st.BadPayloads.Load()+st.BadEvents.Load()+st.UnknownParent.Load()+st.UnknownBlocks.Load()+st.SizeMismatch.Load())
		require.Positive(t, st.BlocksRemoved.Load(), "the cache was small enough to evict")
		t.Logf("maps %v: %d batches, %d blocks stored, %d removed, %d preemptions", maps, batches,
			st.BlocksStored.Load(), st.BlocksRemoved.Load(), e.Stats().Preemptions)
	}
}

// A request routed by the router's own hashing (router.Request with media and salt) finds the
// blocks the engine stored for the same prompt: the hashes agree end to end.
func TestEventsMatchRouterDecision(t *testing.T) {
	rt, kv := newFeed(t)
	feed, err := kv.AddWorker("e")
	require.NoError(t, err)
	opts := DefaultOptions()
	opts.Name = "e"
	e, err := NewEngine(opts, FeedRouter(map[string]*kvevents.Engine{"e": feed}))
	require.NoError(t, err)
	_, err = kv.AddWorker("other")
	require.NoError(t, err)
	toks := randomTokens(rand.New(rand.NewPCG(8, 8)), 200)
	media := []router.Media{{Hash: router.MediaHash("cat.png"), Offset: 20, Length: 50}}
	got := outputs{}
	req := &Request{ID: "a", Tokens: toks, Media: media, MediaIDs: []string{"cat.png"}, Salt: "t1", MaxTokens: 3, Sink: got.sink("a")}
	drive(t, e, []arrival{{0, req}}, nil)
	var d router.Decision
	require.NoError(t, rt.Decide(router.Request{Tokens: toks, Media: media, Salt: "t1"}, &d))
	require.Equal(t, "e", d.Worker)
	for _, s := range d.Scores {
		if s.Worker == "e" {
			require.Equal(t, 12, s.Overlap, "all 12 full prompt blocks")
		}
	}
	// Another image or salt in the same tokens matches nothing past the blocks before it.
	require.NoError(t, rt.Decide(router.Request{Tokens: toks, Media: []router.Media{{Hash: router.MediaHash("dog.png"), Offset: 20, Length: 50}}, Salt: "t1"}, &d))
	require.Equal(t, 1, d.Scores[0].Overlap, "block 0 is before the image")
	require.NoError(t, rt.Decide(router.Request{Tokens: toks, Media: media}, &d))
	require.Equal(t, 0, d.Scores[0].Overlap)
}

// The same over vLLM's real transport: a ZMQ PUB socket and the ROUTER replay socket on
// loopback, read by kvevents.SubscribeZMQ. Batches the subscriber never received come back
// through replay.
func TestEventsOverZMQ(t *testing.T) {
	pub, err := NewZMQPublisher(DefaultZMQOptions("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"))
	require.NoError(t, err)
	ep, replay := pub.Endpoints()
	opts := DefaultOptions()
	opts.Name, opts.Blocks = "z", 100
	// The first batches are lost on the live path: kept for replay, never sent. (Sending them
	// before anyone subscribes is not enough: zmq4's PUB socket queues messages in a goroutine
	// of its own, and on a loaded machine a subscriber may connect before that queue drains.)
	var lossy atomic.Bool
	lossy.Store(true)
	var keys blockChains
	e, err := NewEngine(opts, PublisherFunc(func(w string, seq uint64, p []byte) {
		keys.record(t, p)
		if lossy.Load() {
			pub.keep(seq, p)
			return
		}
		pub.Publish(w, seq, p)
	}))
	require.NoError(t, err)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 9))
	got := outputs{}
	drive(t, e, multimodalWorkload(r, 20, 0, got), nil)
	lost := int64(e.events.seq)
	require.Positive(t, lost)
	lossy.Store(false)

	rt, kv := newFeed(t)
	feed, err := kv.AddWorker("z")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- kvevents.SubscribeZMQ(ctx, kvevents.DefaultZMQOptions(ep, replay), kv.Stats(), func(int) (*kvevents.Engine, error) { return feed, nil })
	}()
	// Keep publishing until the subscriber is connected (PUB drops what nobody receives; the
	// first batch it does see makes it replay everything before).
	for burst := 1; kv.Stats().Batches.Load() == 0; burst++ {
		require.Less(t, burst, 200, "subscriber never received a batch")
		drive(t, e, multimodalWorkload(r, 3, time.Duration(burst)*time.Hour, got), nil)
		time.Sleep(20 * time.Millisecond)
	}
	drive(t, e, multimodalWorkload(r, 30, 1000*time.Hour, got), nil)
	total := e.events.seq
	require.Eventually(t, func() bool { return uint64(kv.Stats().Batches.Load()) == total }, 10*time.Second, 10*time.Millisecond)
	sameCache(t, rt, feed.Worker(), cached(e), &keys)
	require.GreaterOrEqual(t, kv.Stats().Replayed.Load(), lost, "the lost batches came by replay")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.NoError(t, pub.Close())
}

// A fleet on real time publishing over an embedded NATS server to kvevents.SubscribeNATS.
func TestEventsOverNATS(t *testing.T) {
	srv := natsserver.RunRandClientPortServer()
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	sub, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer sub.Close()

	fo := DefaultFleetOptions()
	fo.Engines, fo.Engine.Blocks = 3, 200
	fo.Clock = Clock{Speedup: 50}
	pub := NewNATSPublisher(nc, "")
	var published atomic.Int64
	var keys blockChains
	fo.Publisher = PublisherFunc(func(w string, seq uint64, p []byte) {
		keys.record(t, p)
		published.Add(1)
		pub.Publish(w, seq, p)
	})
	f, err := NewFleet(fo)
	require.NoError(t, err)
	rt, kv := newFeed(t)
	slots := map[string]index.Worker{}
	for i := range f.Len() {
		feed, err := kv.AddWorker(f.Engine(i).Name())
		require.NoError(t, err)
		slots[f.Engine(i).Name()] = feed.Worker()
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ns kvevents.NATSStats
	before := srv.NumSubscriptions()
	wg.Add(2)
	go func() { defer wg.Done(); _ = kvevents.SubscribeNATS(ctx, sub, kvevents.DefaultNATSPrefix, kv, &ns) }()
	require.Eventually(t, func() bool { return srv.NumSubscriptions() > before }, 5*time.Second, 5*time.Millisecond)
	go func() { defer wg.Done(); _ = f.Run(ctx) }()

	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 10))
	got := outputs{}
	var mu sync.Mutex
	arr := multimodalWorkload(r, 30, 0, got)
	var reqs sync.WaitGroup
	for i, a := range arr {
		doneCh := make(chan struct{})
		a.r.Sink = func(o Output) {
			mu.Lock()
			got[a.r.ID] = append(got[a.r.ID], o)
			mu.Unlock()
			if o.Done {
				close(doneCh)
			}
		}
		reqs.Add(1)
		go func() {
			defer reqs.Done()
			require.NoError(t, f.Submit(ctx, i%f.Len(), a.r))
			<-doneCh
		}()
	}
	reqs.Wait()
	mu.Lock()
	checkOutputs(t, arr, got)
	mu.Unlock()
	// An engine hands a step's outputs to the sinks before it publishes the step's events: the
	// last Done can arrive before the last batch is published. A call on each engine's loop
	// waits for that step to end, so published counts every batch before the wait below.
	for i := range f.Len() {
		require.NoError(t, f.Inspect(ctx, i, func(*Engine) {}))
	}
	require.NoError(t, nc.Flush())
	require.Eventually(t, func() bool { return kv.Stats().Batches.Load() == published.Load() }, 10*time.Second, 10*time.Millisecond)
	for i := range f.Len() {
		var name string
		var blocks []uint64
		require.NoError(t, f.Inspect(ctx, i, func(e *Engine) { name, blocks = e.Name(), cached(e) }))
		sameCache(t, rt, slots[name], blocks, &keys)
	}
	require.Zero(t, kv.Stats().Gaps.Load())
	cancel()
	wg.Wait()
	require.Zero(t, pub.Errors.Load())
}
