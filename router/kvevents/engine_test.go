package kvevents

import (
	"encoding/hex"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/index"
	"dataplane/router/internal/testrand"
)

type engineRig struct {
	ix    *index.Index
	w     index.Worker
	eng   *Engine
	stats *Stats
	opts  Options
}

func newEngineRig(t *testing.T, tiers int, media map[string]int) *engineRig {
	o := index.DefaultOptions()
	o.Tiers = tiers
	ix, err := index.New(o)
	require.NoError(t, err)
	rig := &engineRig{ix: ix, stats: &Stats{}, opts: DefaultOptions()}
	if media != nil {
		rig.opts.Media = media
	}
	rig.w, _ = ix.AddWorker(0)
	rig.eng, err = NewEngine(ix, rig.w, 16, &rig.opts, rig.stats)
	require.NoError(t, err)
	return rig
}

func (g *engineRig) overlap(hs []uint64, tier int) int {
	var m index.Match
	g.ix.Match(hs, &m)
	return m.Blocks(g.w, tier)
}

// Hashes recomputed from an event's tokens and extra keys (LoRA name, [media id, offset] pairs,
// the cache salt) equal the hashes of the same prompt sent to the router with the same LoRA,
// salt and media: the two sides meet in the index.
func TestEngineHashesMeetRequestHashes(t *testing.T) {
	r := testrand.New(t)
	g := newEngineRig(t, 1, nil)
	c := newConvo(r, 4)
	const lora, salt, img = "adapter-7", "tenant-a", "img-uuid-1"
	e := &msgpackEncoder{}
	e.array(2).float(1).array(1)
	e.array(9).str("BlockStored").array(4)
	for _, h := range c.engine {
		e.uint(h)
	}
	e.nil().array(64)
	for _, tok := range c.tokens {
		e.uint(uint64(tok))
	}
	e.uint(16).nil().str("GPU").str(lora)
	// extra_keys: the image covers tokens 20..40 (blocks 1 and 2); the salt rides on block 0.
	e.array(4)
	e.array(2).str(lora).str(salt)
	e.array(2).str(lora).array(2).str(img).uint(20)
	e.array(2).str(lora).array(2).str(img).uint(20)
	e.array(1).str(lora)
	g.eng.Live(0, e.b, nil)
	require.Zero(t, g.stats.BadEvents.Load()+g.stats.BadPayloads.Load())

	h, _ := router.NewHasher(16)
	want, err := h.Sequence(nil, c.tokens, router.SeedFor(lora, salt), []router.Media{{Hash: router.MediaHash(img), Offset: 20, Length: 20}})
	require.NoError(t, err)
	require.Equal(t, 4, g.overlap(want, 0))
	plain, _ := h.Sequence(nil, c.tokens, router.SeedFor(lora, ""), nil)
	require.Equal(t, 0, g.overlap(plain, 0), "without the salt nothing matches")

	// A continuation event names its parent by engine hash; the salt and LoRA carry over.
	more := newConvo(r, 1)
	e = &msgpackEncoder{}
	e.array(2).float(1).array(1)
	e.array(8).str("BlockStored").array(1).uint(more.engine[0]).uint(c.engine[3]).array(16)
	for _, tok := range more.tokens {
		e.uint(uint64(tok))
	}
	e.uint(16).nil().str("GPU").str(lora)
	g.eng.Live(1, e.b, nil)
	want, _ = h.Sequence(nil, append(append([]uint32(nil), c.tokens...), more.tokens...), router.SeedFor(lora, salt),
		[]router.Media{{Hash: router.MediaHash(img), Offset: 20, Length: 20}})
	require.Equal(t, 5, g.overlap(want, 0))
}

func TestEngineFiltersAndMistakes(t *testing.T) {
	r := testrand.New(t)
	g := newEngineRig(t, 2, map[string]int{"GPU": 0, "CPU": 1})
	c := newConvo(r, 4)
	batch := func(events ...func(e *msgpackEncoder)) []byte {
		e := &msgpackEncoder{}
		e.array(2).float(1).array(len(events))
		for _, ev := range events {
			ev(e)
		}
		return e.b
	}
	stored := func(a, b int, medium string, group int, kind string, bs int) func(e *msgpackEncoder) {
		return func(e *msgpackEncoder) {
			e.array(11).str("BlockStored").array(b - a)
			for _, h := range c.engine[a:b] {
				e.uint(h)
			}
			if a == 0 {
				e.nil()
			} else {
				e.uint(c.engine[a-1])
			}
			e.array((b - a) * bs)
			for i := range (b - a) * bs {
				e.uint(uint64(c.tokens[(a*16+i)%len(c.tokens)]))
			}
			e.uint(uint64(bs)).nil().str(medium).nil().nil().uint(uint64(group)).str(kind)
		}
	}
	seq := uint64(0)
	live := func(p []byte) { g.eng.Live(seq, p, nil); seq++ }

	live(batch(stored(0, 2, "disk", 0, "full_attention", 16)))
	require.Equal(t, int64(1), g.stats.FilteredMedium.Load(), "unknown medium")
	live(batch(stored(0, 2, "GPU", 1, "sliding_window", 16)))
	require.Equal(t, int64(1), g.stats.FilteredGroup.Load(), "not a full-attention group")
	live(batch(stored(0, 2, "GPU", 0, "full_attention", 32)))
	require.Equal(t, int64(1), g.stats.SizeMismatch.Load())
	live(batch(stored(2, 4, "GPU", 0, "full_attention", 16)))
	require.Equal(t, int64(1), g.stats.UnknownParent.Load())
	live(batch(stored(0, 2, "GPU", 0, "full_attention", 16), stored(2, 4, "CPU", 0, "full_attention", 16)))
	require.Equal(t, 2, g.overlap(c.ours, 0))
	require.Equal(t, 4, g.overlap(c.ours, 1), "device blocks then host blocks")
	live(batch(stored(0, 2, "GPU", 1, "full_attention", 16)))
	require.Equal(t, int64(2), g.stats.FilteredGroup.Load(), "group 0 is the routed one now")

	// Removing from one tier keeps the other; a removal of an unknown block is counted.
	e := &msgpackEncoder{}
	e.array(2).float(1).array(2)
	e.array(3).str("BlockRemoved").array(2).uint(c.engine[0]).uint(12345).str("GPU")
	e.array(3).str("BlockRemoved").array(1).uint(c.engine[3]).str("CPU")
	live(e.b)
	require.Equal(t, int64(1), g.stats.UnknownBlocks.Load())
	require.Equal(t, 0, g.overlap(c.ours, 0))
	require.Equal(t, int64(1), g.ix.Held(g.w, 0), "GPU keeps block 1")
	require.Equal(t, int64(1), g.ix.Held(g.w, 1), "CPU keeps block 2")

	// A gap without a replayer: the state is dropped, the new batch applied.
	seq += 5
	live(batch(stored(0, 1, "GPU", 0, "full_attention", 16)))
	require.Equal(t, int64(1), g.stats.Unrecoverable.Load())
	require.Equal(t, int64(1), g.ix.Entries())
	// AllBlocksCleared.
	e = &msgpackEncoder{}
	e.array(2).float(1).array(1).array(1).str("AllBlocksCleared")
	live(e.b)
	require.Zero(t, g.ix.Entries())
	require.Equal(t, int64(1), g.stats.Clears.Load())
}

// The engine-hash map is bounded: past MaxEngineBlocks the oldest generation is forgotten.
func TestEngineHashMapBounded(t *testing.T) {
	r := testrand.New(t)
	g := newEngineRig(t, 1, nil)
	g.opts.MaxEngineBlocks = 8
	for i := range 20 {
		c := newConvo(r, 1)
		e := &msgpackEncoder{}
		e.array(2).float(1).array(1)
		c.stored(e, 0, 1, false)
		g.eng.Live(uint64(i), e.b, nil)
	}
	require.LessOrEqual(t, len(g.eng.blocks)+len(g.eng.older), 8)
	require.Equal(t, int64(20), g.ix.Entries(), "the index keeps them: its cap is the guard")
}

// Whatever arrives, the engine counts and skips what it cannot use and never panics; the index
// stays consistent with what the engine says it applied.
func FuzzEngineLive(f *testing.F) {
	for _, c := range batchCases(f) {
		p, _ := hex.DecodeString(c.Payload)
		f.Add(uint64(0), p)
	}
	for _, p := range scenarioPayloads(f) {
		f.Add(uint64(0), p)
	}
	e := &msgpackEncoder{}
	e.array(2).float(1).array(2)
	e.array(7).str("BlockStored").array(1).uint(9).nil().array(16)
	for i := range 16 {
		e.uint(uint64(i))
	}
	e.uint(16).nil().str("GPU")
	e.array(3).str("BlockRemoved").array(1).uint(9).str("GPU")
	f.Add(uint64(3), e.b)
	f.Fuzz(func(t *testing.T, seq uint64, payload []byte) {
		ix, _ := index.New(index.Options{MaxWorkers: 64, Tiers: 2, Shards: 2})
		w, _ := ix.AddWorker(0)
		opts := DefaultOptions()
		opts.Media = map[string]int{"GPU": 0, "CPU": 1}
		var stats Stats
		eng, err := NewEngine(ix, w, 16, &opts, &stats)
		if err != nil {
			t.Fatal(err)
		}
		eng.Live(seq, payload, nil)
		eng.Live(seq+1, payload, nil)
		var b Batch
		if DecodeBatch(payload, &b) != nil && stats.BadPayloads.Load() != 2 {
			t.Fatalf("an undecodable payload was not counted twice: %d", stats.BadPayloads.Load())
		}
		if got := ix.Held(w, 0) + ix.Held(w, 1); got != ix.Entries() || got > 2*int64(len(payload)) {
			t.Fatalf("index holds %d entries, worker %d", ix.Entries(), got)
		}
	})
}

// A block stored again under another key than the one the engine remembers (a cap evicted its
// parent, and this time no sibling stood in the parent's way: router/index/keys.go) moves: the
// worker's bits at the old key go, nothing leaks there, and the tiers it still holds it on come
// along.
func TestEngineRestoreMovesKey(t *testing.T) {
	r := testrand.New(t)
	g := newEngineRig(t, 2, map[string]int{"GPU": 0, "CPU": 1})
	ix, w, e := g.ix, g.w, g.eng
	x, err := ix.AddWorker(0)
	require.NoError(t, err)
	c := newConvo(r, 3) // blocks a0, p1, b2
	// A sibling of p1 (same first block) is stored first by another worker, so p1 branches.
	sib := append(append([]uint32(nil), c.tokens[:16]...), c.tokens[16:32]...)
	for i := 16; i < 32; i++ {
		sib[i] ^= 1
	}
	h, _ := router.NewHasher(16)
	sibSeqs, _ := h.Sequence(nil, sib, router.HashSeed, nil)
	sibKeys := make([]uint64, 2)
	ix.Store(x, 0, 0, sibSeqs, sibKeys)

	stored := func(a, b int, medium string) {
		ev := &Event{Kind: BlockStored, Hashes: c.engine[a:b], Tokens: c.tokens[a*16 : b*16], Medium: medium, Group: -1}
		if a > 0 {
			ev.Parent, ev.HasParent = c.engine[a-1], true
		}
		e.applyEvent(ev)
	}
	removed := func(a, b int, medium string) {
		e.applyEvent(&Event{Kind: BlockRemoved, Hashes: c.engine[a:b], Medium: medium, Group: -1})
	}
	stored(0, 3, "GPU")
	stored(0, 3, "CPU")
	a0, _ := e.lookup(c.engine[0])
	p1, _ := e.lookup(c.engine[1])
	b2, _ := e.lookup(c.engine[2])
	require.Equal(t, index.BranchKey(index.ChildKey(a0.key, c.ours[1]), c.ours[1]), p1.key, "p1 went to its branch key")
	require.Equal(t, 3, g.overlap(c.ours, 0))

	// A cap evicts p1 on both tiers behind the engine's back; then the sibling goes away.
	ix.Remove(w, 0, []uint64{p1.key})
	ix.Remove(w, 1, []uint64{p1.key})
	ix.Remove(x, 0, sibKeys[1:])
	stored(1, 3, "GPU") // vLLM stores p1 and b2 again: now under their child keys
	p1n, _ := e.lookup(c.engine[1])
	b2n, _ := e.lookup(c.engine[2])
	require.NotEqual(t, p1.key, p1n.key)
	require.NotEqual(t, b2.key, b2n.key)
	require.Equal(t, int64(3), ix.Blocks(), "a0, and p1 and b2 under their new keys only")
	require.Equal(t, int64(3), ix.Held(w, 0))
	require.Equal(t, int64(3), ix.Held(w, 1), "the CPU copies moved with them")

	// The GPU copies go; the CPU ones still count on tier 1.
	removed(1, 3, "GPU")
	require.Equal(t, 1, g.overlap(c.ours, 0))
	require.Equal(t, 3, g.overlap(c.ours, 1))
	removed(0, 3, "CPU")
	removed(0, 1, "GPU")
	require.Zero(t, ix.Held(w, 0))
	require.Zero(t, ix.Held(w, 1))
	require.Equal(t, int64(1), ix.Blocks(), "only the other worker's a0")
}

// conversationBatches is one long conversation as its engine publishes it, per blocks a batch:
// batch k stores blocks [k·per, (k+1)·per), chained to the block before, and removes the
// blocks batch k−1 stored.
func conversationBatches(rnd *rand.Rand, per, batches int) [][]byte {
	c := newConvo(rnd, per*batches)
	payloads := make([][]byte, batches)
	for k := range batches {
		e := &msgpackEncoder{}
		n := 1
		if k > 0 {
			n = 2
		}
		e.array(2).float(1).array(n)
		c.stored(e, k*per, (k+1)*per, false)
		if k > 0 {
			c.removed(e, (k-1)*per, k*per)
		}
		payloads[k] = e.b
	}
	return payloads
}

// Once warm, an engine applies a steady stream (stores of new blocks, removes of old ones)
// without allocating: the decoder reuses its Batch, the hash map and the index tables stay at
// their size. (Averaged over the runs: a table that grows or shrinks now and then is allowed.)
func TestEngineLiveAllocs(t *testing.T) {
	const warm, runs = 100, 200
	payloads := conversationBatches(testrand.New(t), 32, warm+runs+1)
	g := newEngineRig(t, 1, nil)
	seq := uint64(0)
	live := func() {
		g.eng.Live(seq, payloads[seq], nil)
		seq++
	}
	for range warm {
		live()
	}
	require.Zero(t, testing.AllocsPerRun(runs, live))
	require.Zero(t, g.stats.BadPayloads.Load()+g.stats.UnknownParent.Load()+g.stats.UnknownBlocks.Load())
	require.Equal(t, int64(32), g.ix.Held(g.w, 0), "the last batch's blocks: each batch removes the blocks of the one before")
}
