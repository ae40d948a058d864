package kvevents

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/index"
	"dataplane/router/internal/testrand"
)

// capPublisher stores and removes blocks on an engine as vLLM events, directly (no msgpack).
type capPublisher struct {
	r    *rand.Rand
	eng  *Engine
	next uint64 // the next engine hash
	toks map[uint64][]uint32
}

func newCapPublisher(r *rand.Rand, eng *Engine) *capPublisher {
	return &capPublisher{r: r, eng: eng, next: 1, toks: map[uint64][]uint32{}}
}

// fresh is n new engine hashes, each with random tokens.
func (p *capPublisher) fresh(n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = p.next
		p.toks[p.next] = testrand.Tokens(p.r, 16)
		p.next++
	}
	return hs
}

// store stores hs (known to the publisher) as one chain, after parent when it is not 0.
func (p *capPublisher) store(hs []uint64, parent uint64, medium string) {
	ev := &Event{Kind: BlockStored, Hashes: hs, Medium: medium, Group: -1, Parent: parent, HasParent: parent != 0}
	for _, h := range hs {
		ev.Tokens = append(ev.Tokens, p.toks[h]...)
	}
	p.eng.applyEvent(ev)
}

func (p *capPublisher) remove(hs []uint64, medium string) {
	p.eng.applyEvent(&Event{Kind: BlockRemoved, Hashes: hs, Medium: medium, Group: -1})
}

// ours is the router's sequence hashes of a root chain stored by store(hs, 0, ...).
func (p *capPublisher) ours(hs []uint64) []uint64 {
	var toks []uint32
	for _, h := range hs {
		toks = append(toks, p.toks[h]...)
	}
	hr, _ := router.NewHasher(16)
	seqs, _ := hr.Sequence(nil, toks, router.HashSeed, nil)
	return seqs
}

// heldHashes is every engine hash the engine holds on tier t.
func (e *Engine) heldHashes(t int) []uint64 {
	out := []uint64{}
	for _, m := range []map[uint64]engineBlock{e.older, e.blocks} {
		for h, b := range m {
			if b.tiers&(1<<t) != 0 {
				out = append(out, h)
			}
		}
	}
	slices.Sort(out)
	return out
}

// A publisher that stores random blocks and never removes any (as measured: 9 M entries for an
// engine of 16,384 blocks) keeps its worker at the engine's capacity, and what stays is what
// it stored last: the oldest are gone from the index, the newest match. Before capacities, serve
// let the index hold all 200,000, and the index's own cap (dataplane router --capacity) kept
// 16,384 but broke some of the 50 newest chains.
func TestEngineCapacityKeepsNewest(t *testing.T) {
	const capacity, total = 16384, 200_000
	g := newEngineRig(t, 1, nil)
	g.eng.SetCapacity(capacity)
	p := newCapPublisher(testrand.New(t), g.eng)
	var chains [][]uint64 // root chains, in the order stored
	var order []uint64    // every block in the order the engine should evict them: chains tail first
	for stored := 0; stored < total; {
		hs := p.fresh(min(1+p.r.IntN(32), total-stored))
		parent := uint64(0)
		if len(chains) > 0 && p.r.IntN(4) == 0 { // continue the last chain
			last := chains[len(chains)-1]
			parent = last[len(last)-1]
		}
		p.store(hs, parent, "")
		if parent == 0 {
			chains = append(chains, hs)
		}
		for i := len(hs) - 1; i >= 0; i-- {
			order = append(order, hs[i])
		}
		stored += len(hs)
		require.LessOrEqual(t, g.ix.Held(g.w, 0), int64(capacity), "after %d blocks", stored)
	}
	require.Equal(t, int64(capacity), g.ix.Held(g.w, 0))
	require.Equal(t, int64(total-capacity), g.stats.Evicted.Load())
	require.Zero(t, g.stats.UnknownParent.Load())
	want := slices.Clone(order[len(order)-capacity:])
	slices.Sort(want)
	require.Equal(t, want, g.eng.heldHashes(0), "the engine holds the blocks stored last")
	require.LessOrEqual(t, len(g.eng.blocks)+len(g.eng.older), capacity, "its hash map is bounded by the capacity")

	for _, c := range chains[:50] {
		require.Zero(t, g.overlap(p.ours(c), 0), "an old chain is gone")
	}
	for _, c := range chains[len(chains)-50:] { // (the index's own cap, in table order, broke some of these)
		require.Equal(t, len(c), g.overlap(p.ours(c), 0), "a new chain matches whole")
	}
}

// capModel is what an engine under a capacity should hold: the blocks it stored, oldest first
// (a chain's tail before its head), evicted from the front.
type capModel struct {
	capacity int
	order    []uint64 // held blocks, oldest first
	evicted  int64
}

func (m *capModel) held(h uint64) bool { return slices.Contains(m.order, h) }

func (m *capModel) evict(k int) {
	k = min(max(k, 0), len(m.order))
	m.order = m.order[k:]
	m.evicted += int64(k)
}

func (m *capModel) store(hs []uint64) {
	hs = hs[:min(len(hs), m.capacity)] // a chain longer than the capacity: its head
	m.evict(len(m.order) + len(hs) - m.capacity)
	for i := len(hs) - 1; i >= 0; i-- {
		if !m.held(hs[i]) {
			m.order = append(m.order, hs[i])
		}
	}
}

func (m *capModel) remove(hs []uint64) {
	m.order = slices.DeleteFunc(m.order, func(h uint64) bool { return slices.Contains(hs, h) })
}

// checkCapModel drives an engine with the operations ops encodes (stores of new blocks, of
// blocks stored before, of blocks still held; removals; clears; capacity changes) and checks
// after each that it holds what capModel holds, the index the same count, never more than the
// capacity, and that evictions were counted.
func checkCapModel(t *testing.T, ops []byte) {
	g := newEngineRig(t, 1, nil)
	m := &capModel{capacity: 64}
	g.eng.SetCapacity(int64(m.capacity))
	p := newCapPublisher(rand.New(rand.NewPCG(1, 2)), g.eng)
	var known []uint64 // every block ever stored
	pick := func(b byte, from []uint64, n int) []uint64 {
		var out []uint64
		for i := range n {
			if len(from) == 0 {
				break
			}
			h := from[(int(b)*7+i*13)%len(from)]
			if !slices.Contains(out, h) {
				out = append(out, h)
			}
		}
		return out
	}
	for i := 0; i+1 < len(ops); i += 2 {
		op, arg := ops[i]%8, ops[i+1]
		n := 1 + int(arg%40)
		switch op {
		case 0, 1, 2: // new blocks, as a new chain or after a held block
			hs := p.fresh(n)
			parent := uint64(0)
			if op == 2 && len(m.order) > 0 {
				parent = m.order[int(arg)%len(m.order)]
			}
			p.store(hs, parent, "")
			m.store(hs)
			known = append(known, hs...)
		case 3: // blocks stored before, held or not
			hs := pick(arg, known, n)
			p.store(hs, 0, "")
			m.store(hs)
		case 4, 5: // removals, of held blocks and of some that are not
			hs := pick(arg, known, n)
			if op == 4 {
				hs = pick(arg, m.order, n)
			}
			p.remove(hs, "")
			m.remove(hs)
		case 6: // a new capacity, down or up
			m.capacity = 8 + int(arg)%120
			g.eng.SetCapacity(int64(m.capacity))
			hs := p.fresh(1) // taken up at the next store
			p.store(hs, 0, "")
			m.store(hs)
			known = append(known, hs...)
		case 7:
			if arg%4 == 0 {
				g.eng.applyEvent(&Event{Kind: AllBlocksCleared, Group: -1})
				m.order = nil
			}
		}
		want := append([]uint64{}, m.order...)
		slices.Sort(want)
		require.Equal(t, want, g.eng.heldHashes(0), "op %d (%d, %d)", i/2, op, arg)
		require.Equal(t, int64(len(m.order)), g.ix.Held(g.w, 0), "op %d", i/2)
		require.Equal(t, m.evicted, g.stats.Evicted.Load(), "op %d", i/2)
		if g.eng.kvcap.order != nil { // adopted at the first store
			require.Equal(t, int64(len(m.order)), g.eng.kvcap.order[0].held, "op %d", i/2)
			require.LessOrEqual(t, len(g.eng.kvcap.order[0].ring), 2*ringSize(128+40), "the ring stays O(capacity)")
		}
	}
}

// Stores, restores, removals, clears and capacity changes in random order keep the engine's
// blocks, the index's count and the eviction counter where a plain model puts them.
func TestEngineCapacityModel(t *testing.T) {
	r := testrand.New(t)
	for range 20 {
		ops := make([]byte, 2000)
		for i := range ops {
			ops[i] = byte(r.UintN(256))
		}
		checkCapModel(t, ops)
	}
}

func FuzzEngineCapacity(f *testing.F) {
	f.Add([]byte{0, 39, 0, 39, 4, 3, 3, 9, 6, 1, 0, 20, 7, 0, 2, 5})
	f.Fuzz(checkCapModel)
}

// With two tiers each is capped on its own; a block on both keeps its other tier when one
// evicts it, and the counts stay those of the index.
func TestEngineCapacityTiers(t *testing.T) {
	g := newEngineRig(t, 2, map[string]int{"GPU": 0, "CPU": 1})
	const capacity = 100
	g.eng.SetCapacity(capacity)
	p := newCapPublisher(testrand.New(t), g.eng)
	var all []uint64
	for range 300 {
		hs := p.fresh(1 + p.r.IntN(8))
		all = append(all, hs...)
		p.store(hs, 0, "GPU")
		if p.r.IntN(2) == 0 {
			p.store(hs, 0, "CPU")
		}
		if p.r.IntN(3) == 0 {
			h := all[p.r.IntN(len(all))]
			p.remove([]uint64{h}, []string{"GPU", "CPU"}[p.r.IntN(2)])
		}
		for tier := range 2 {
			require.LessOrEqual(t, g.ix.Held(g.w, tier), int64(capacity))
			require.Equal(t, g.ix.Held(g.w, tier), g.eng.kvcap.order[tier].held)
			require.Len(t, g.eng.heldHashes(tier), int(g.eng.kvcap.order[tier].held))
		}
	}
	// The last round may have removed a block; a last store fills the tier to its cap again.
	p.store(p.fresh(1), 0, "GPU")
	require.Equal(t, int64(capacity), g.ix.Held(g.w, 0))
	require.Positive(t, g.stats.Evicted.Load())
}

// A capacity learned after the engine has stored for a while orders what it holds by when it
// stored it and evicts the oldest; if the engine had already forgotten some of what the index
// holds (its hash map rolled over), it drops the worker's view instead.
func TestEngineCapacityLearnedLate(t *testing.T) {
	g := newEngineRig(t, 1, nil)
	p := newCapPublisher(testrand.New(t), g.eng)
	var chains [][]uint64
	for range 50 {
		hs := p.fresh(10)
		p.store(hs, 0, "")
		chains = append(chains, hs)
	}
	g.eng.SetCapacity(100)
	require.Equal(t, int64(500), g.ix.Held(g.w, 0), "nothing happens until the engine's next store")
	next := p.fresh(10)
	p.store(next, 0, "")
	require.Equal(t, int64(100), g.ix.Held(g.w, 0))
	require.Equal(t, int64(410), g.stats.Evicted.Load())
	for _, c := range append(chains[41:], next) {
		require.Equal(t, 10, g.overlap(p.ours(c), 0))
	}
	require.Zero(t, g.overlap(p.ours(chains[40]), 0))
	require.Equal(t, ringSize(200), len(g.eng.kvcap.order[0].ring), "the ring built from 500 blocks shrank to the capacity's")
	g.eng.SetCapacity(0)
	p.store(p.fresh(200), 0, "")
	require.Equal(t, int64(300), g.ix.Held(g.w, 0), "no cap any more")

	// Forgotten blocks: the view goes.
	g2 := newEngineRig(t, 1, nil)
	g2.opts.MaxEngineBlocks = 64
	p2 := newCapPublisher(testrand.New(t), g2.eng)
	for range 20 {
		p2.store(p2.fresh(10), 0, "")
	}
	require.Equal(t, int64(200), g2.ix.Held(g2.w, 0))
	g2.eng.SetCapacity(100)
	last := p2.fresh(5)
	p2.store(last, 0, "")
	require.Equal(t, int64(5), g2.ix.Held(g2.w, 0), "the view was dropped, the new chain stored")
	require.Equal(t, int64(200), g2.stats.Evicted.Load())
	require.Equal(t, 5, g2.overlap(p2.ours(last), 0))
}

// The feed's SetCapacity reaches a worker's engine from another goroutine while the engine
// applies its stream and readers match: under -race, and the cap holds once the stream goes on.
func TestFeedSetCapacityConcurrent(t *testing.T) {
	ro := router.DefaultOptions()
	ro.Capacity = 1000 // dataplane router --capacity: every worker starts with it
	r, err := router.New(ro)
	require.NoError(t, err)
	f, err := NewFeed(r, DefaultOptions())
	require.NoError(t, err)
	eng, err := f.AddWorker("a")
	require.NoError(t, err)
	require.Error(t, f.SetCapacity("b", 10))
	require.Error(t, f.SetCapacity("a", -1))

	rnd := testrand.New(t)
	convos := make([]*convo, 400)
	payloads := make([][]byte, len(convos))
	for i := range convos {
		convos[i] = newConvo(rnd, 8)
		payloads[i] = batchOf(false, func(e *msgpackEncoder) { convos[i].stored(e, 0, 8, false) }, 1)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(2)
	go func() { // the engine's one writer
		defer wg.Done()
		for i, p := range payloads {
			eng.Live(uint64(i), p, nil)
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := f.SetCapacity("a", int64(100+i%900)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var m index.Match
	for i := range 200 {
		r.Index().Match(convos[i%len(convos)].ours, &m)
	}
	close(stop)
	wg.Wait()

	require.NoError(t, f.SetCapacity("a", 80))
	eng.Live(uint64(len(payloads)), batchOf(false, func(e *msgpackEncoder) { convos[0].removed(e, 0, 8) }, 1), nil)
	require.LessOrEqual(t, r.Index().Held(eng.Worker(), 0), int64(1000), "a removal applies no cap")
	eng.Live(uint64(len(payloads)+1), payloads[0], nil)
	require.Equal(t, int64(80), r.Index().Held(eng.Worker(), 0))
	var d router.Decision
	require.NoError(t, r.Decide(router.Request{Tokens: convos[0].tokens}, &d))
	require.Equal(t, 8, d.Score("a").Overlap, "the newest conversation is whole")
	require.NoError(t, r.Decide(router.Request{Tokens: convos[len(convos)-11].tokens}, &d))
	require.Zero(t, d.Score("a").Overlap, "older ones are gone")
}
