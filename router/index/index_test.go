package index

import (
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/router/internal/testrand"
)

// The reference model: plain maps, one goroutine, no cleverness.
type model struct {
	tiers int
	held  map[uint64]map[[2]int]bool // hash -> {worker, tier}
}

func newModel(tiers int) *model { return &model{tiers: tiers, held: map[uint64]map[[2]int]bool{}} }

func (m *model) store(w, tier int, hs []uint64) {
	for _, h := range hs {
		if m.held[h] == nil {
			m.held[h] = map[[2]int]bool{}
		}
		m.held[h][[2]int{w, tier}] = true
	}
}

func (m *model) remove(w, tier int, hs []uint64) {
	for _, h := range hs {
		delete(m.held[h], [2]int{w, tier})
		if len(m.held[h]) == 0 {
			delete(m.held, h)
		}
	}
}

func (m *model) clearWorker(w int) {
	for h, ws := range m.held {
		for t := range m.tiers {
			delete(ws, [2]int{w, t})
		}
		if len(ws) == 0 {
			delete(m.held, h)
		}
	}
}

// blocks: leading blocks of hs that w holds on tier or a faster one.
func (m *model) blocks(w, tier int, hs []uint64) int {
	for i, h := range hs {
		ok := false
		for t := 0; t <= tier; t++ {
			ok = ok || m.held[h][[2]int{w, t}]
		}
		if !ok {
			return i
		}
	}
	return len(hs)
}

func (m *model) entries() int64 {
	var n int64
	for _, ws := range m.held {
		n += int64(len(ws))
	}
	return n
}

// A universe of block chains (sequence hashes): prompts that share prefixes, as real traffic
// does.
type universe struct{ chains [][]uint64 }

func newUniverse(r *rand.Rand, chains, length int) *universe {
	u := &universe{}
	shared := make([]uint64, length)
	for i := range shared {
		shared[i] = r.Uint64()
	}
	for range chains {
		c := make([]uint64, length)
		cut := r.IntN(length / 2) // a shared "system prompt" prefix, then private blocks
		copy(c, shared[:cut])
		for i := cut; i < length; i++ {
			c[i] = r.Uint64()
		}
		u.chains = append(u.chains, c)
	}
	return u
}

// pick draws a chain and a run [a, b) of its blocks, often from its start.
func (u *universe) pick(r *rand.Rand) (c []uint64, a, b int) {
	c = u.chains[r.IntN(len(u.chains))]
	a = r.IntN(len(c))
	b = a + 1 + r.IntN(len(c)-a)
	if r.IntN(3) == 0 {
		a = 0
	}
	return c, a, b
}

// prefix draws a query: the start of a chain.
func (u *universe) prefix(r *rand.Rand) []uint64 {
	c := u.chains[r.IntN(len(u.chains))]
	return c[:1+r.IntN(len(c))]
}

// engineSim writes to the index as an engine (kvevents.Engine) does and mirrors every write in
// a model: a worker's blocks are stored parent first (a store reaches back to the last block
// before it that the worker holds on that tier), with the parent's key as the index returned
// it, and removed as whole subtrees (a block and everything after it that the worker holds on
// that tier, in any chain through it), as vLLM evicts.
type engineSim struct {
	ix   *Index
	u    *universe
	mod  *model
	keys map[Worker]map[uint64]uint64 // what Store returned, for blocks the worker holds
	buf  []uint64

	// capped: the workers have caps, so the index may drop a block the model says they hold,
	// and a block's key may change under them.
	capped bool
}

func newEngineSim(ix *Index, u *universe) *engineSim {
	return &engineSim{ix: ix, u: u, mod: newModel(ix.Options().Tiers), keys: map[Worker]map[uint64]uint64{}}
}

func (e *engineSim) holds(w Worker, tier int, h uint64) bool {
	return e.mod.held[h][[2]int{int(w), tier}]
}

func (e *engineSim) store(w Worker, tier int, c []uint64, a, b int) error {
	for a > 0 && !e.holds(w, tier, c[a-1]) {
		a--
	}
	var parent uint64
	if a > 0 {
		parent = e.keys[w][c[a-1]]
	}
	e.buf = resize(e.buf, b-a)
	e.ix.Store(w, tier, parent, c[a:b], e.buf)
	if e.keys[w] == nil {
		e.keys[w] = map[uint64]uint64{}
	}
	for i, k := range e.buf {
		if old, ok := e.keys[w][c[a+i]]; ok && old != k {
			if !e.capped {
				return fmt.Errorf("worker %d: block %#x changed keys while held: %#x, then %#x", w, c[a+i], old, k)
			}
			// A cap evicted a block before it and the block went elsewhere this time: drop what
			// the worker may still hold under the old key and store its other tiers under the
			// new one, as kvevents.Engine does.
			pk := parent
			if i > 0 {
				pk = e.buf[i-1]
			}
			var held uint8
			for t := range e.mod.tiers {
				if e.holds(w, t, c[a+i]) {
					held |= 1 << t
				}
			}
			e.ix.MoveKey(w, held, old, pk, c[a+i], k, tier)
		}
		e.keys[w][c[a+i]] = k
	}
	e.mod.store(int(w), tier, c[a:b])
	return nil
}

func (e *engineSim) removeSubtree(w Worker, tier int, c []uint64, a int) {
	seen := map[uint64]bool{}
	var gone, keys []uint64
	for _, d := range e.u.chains {
		if d[a] != c[a] { // shares no prefix through c[a] (universe hashes are unique per prefix)
			continue
		}
		for _, h := range d[a:] {
			if !seen[h] && e.holds(w, tier, h) {
				seen[h] = true
				gone = append(gone, h)
				keys = append(keys, e.keys[w][h])
			}
		}
	}
	// Children first, as vLLM evicts (the index's contract): gone lists each chain's blocks
	// parent first.
	slices.Reverse(keys)
	e.ix.Remove(w, tier, keys)
	e.mod.remove(int(w), tier, gone)
	for _, h := range gone {
		if e.mod.held[h] == nil || !e.heldOnAnyTier(w, h) {
			delete(e.keys[w], h)
		}
	}
}

func (e *engineSim) heldOnAnyTier(w Worker, h uint64) bool {
	for t := range e.mod.tiers {
		if e.holds(w, t, h) {
			return true
		}
	}
	return false
}

func (e *engineSim) clear(w Worker) {
	e.ix.ClearWorker(w)
	e.mod.clearWorker(int(w))
	delete(e.keys, w)
}

// checkAgainstModel applies a random stream of stores, removes, clears and worker removals to
// the index and the model and compares every worker's overlap for random queries after each
// step, plus the entry and block counts. It returns the first disagreement.
func checkAgainstModel(r *rand.Rand, ix *Index, u *universe, steps int) error {
	workers := 5
	if ix.ids != nil { // more holders than fit inline: blocks overflow and shrink back
		workers = 2 * inlineEntries
	}
	return checkAgainstModelWith(r, ix, u, steps, workers)
}

// checkAgainstModelWith is checkAgainstModel with that many workers.
func checkAgainstModelWith(r *rand.Rand, ix *Index, u *universe, steps, workers int) error {
	opts := ix.Options()
	sim := newEngineSim(ix, u)
	mod := sim.mod
	var live []Worker
	spreadWorkers(r, ix, workers)
	for range workers {
		w, err := ix.AddWorker(0)
		if err != nil {
			return err
		}
		live = append(live, w)
	}
	var m Match
	overflowed := 0 // the most blocks in overflow bitmaps at once
	for step := range steps {
		w := live[r.IntN(len(live))]
		tier := r.IntN(opts.Tiers)
		switch op := r.IntN(100); {
		case op < 60:
			c, a, b := u.pick(r)
			if err := sim.store(w, tier, c, a, b); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
		case op < 93:
			c, a, _ := u.pick(r)
			sim.removeSubtree(w, tier, c, a)
		case op < 97:
			sim.clear(w)
		default:
			ix.RemoveWorker(w)
			mod.clearWorker(int(w))
			delete(sim.keys, w)
			nw, err := ix.AddWorker(0)
			if err != nil {
				return err
			}
			for i := range live {
				if live[i] == w {
					live[i] = nw
				}
			}
		}
		for range 3 {
			q := u.prefix(r)
			ix.Match(q, &m)
			for _, w := range live {
				for t := range opts.Tiers {
					if got, want := m.Blocks(w, t), mod.blocks(int(w), t, q); got != want {
						return fmt.Errorf("step %d: worker %d tier %d: index says %d leading blocks, model %d", step, w, t, got, want)
					}
				}
			}
			if err := checkHolders(&m, live); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
		}
		if got, want := ix.Entries(), mod.entries(); got != want {
			return fmt.Errorf("step %d: %d entries, model %d", step, got, want)
		}
		if err := ix.checkSummaries(); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		if err := ix.checkIDSets(); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		overflowed = max(overflowed, ix.bitmapsInUse())
		if got, want := ix.Blocks(), int64(len(mod.held)); got != want {
			return fmt.Errorf("step %d: %d blocks, model %d", step, got, want)
		}
	}
	if ix.ids != nil && overflowed == 0 {
		return errors.New("no block ever overflowed its inline holders: the check tests no bitmap")
	}
	return checkBlocksExactly(ix, u, mod, nil)
}

// checkBlocksExactly compares, block by block, who holds what in the index (quiescent) with the
// model: exactly, or for the workers in capped a subset of the model. Every held block must be
// reachable through its chain, as a lookup walks it.
func checkBlocksExactly(ix *Index, u *universe, mod *model, capped map[Worker]bool) error {
	opts := ix.Options()
	for _, ch := range u.chains {
		for i, hs := range ix.chainHolders(ch) {
			ws := map[int]bool{} // the workers either side says hold the block
			for w := range hs {
				ws[w] = true
			}
			for wt := range mod.held[ch[i]] {
				ws[wt[0]] = true
			}
			for w := range ws {
				for t := range opts.Tiers {
					got := hs[w]>>t&1 != 0
					want := mod.held[ch[i]][[2]int{w, t}]
					if got != want && (!capped[Worker(w)] || got) {
						return fmt.Errorf("block %d of a chain: worker %d tier %d holds it: index %v, model %v", i, w, t, got, want)
					}
				}
			}
		}
	}
	return nil
}

// chainSlots resolves a chain's keys as Match does (quiescent): each block's table and slot,
// slot -1 for a block not in the index.
func (ix *Index) chainSlots(seqs []uint64) (tabs []*table, slots []int) {
	var parent uint64
	for _, seq := range seqs {
		key := ChildKey(parent, seq)
		t := ix.shardOf(key).tab.Load()
		slot := t.find(key)
		if slot < 0 && continues(key) {
			bk := BranchKey(key, seq)
			if bt := ix.shardOf(bk).tab.Load(); bt.find(bk) >= 0 {
				key, t, slot = bk, bt, bt.find(bk)
			}
		}
		parent = key
		tabs, slots = append(tabs, t), append(slots, slot)
	}
	return tabs, slots
}

// chainHolders returns each block's holders (chainSlots, slotHolders), nil for a block not in
// the index.
func (ix *Index) chainHolders(seqs []uint64) []map[int]uint64 {
	out := make([]map[int]uint64, len(seqs))
	tabs, slots := ix.chainSlots(seqs)
	var parent uint64
	for i, slot := range slots {
		key := ChildKey(parent, seqs[i])
		if slot >= 0 {
			key = tabs[i].slots[slot*tabs[i].stride].Load()
			out[i] = ix.slotHolders(ix.shardOf(key), tabs[i], slot)
		}
		parent = key
	}
	return out
}

// layout is an index shape the model checks run on: New's options, and which layout (New
// picks the id layout past maskMaxWorkers; the checks also run it below).
type layout struct {
	opts Options
	ids  bool
}

func (l layout) String() string {
	kind := "masks"
	if l.ids {
		kind = "ids"
	}
	return fmt.Sprintf("%s/workers=%d/tiers=%d/shards=%d", kind, l.opts.MaxWorkers, l.opts.Tiers, l.opts.Shards)
}

func (l layout) build() (*Index, error) { return newIndex(l.opts, l.ids) }

func modelLayouts() []layout {
	return []layout{
		{Options{MaxWorkers: 64, Tiers: 1, Shards: 4}, false},  // the one-word fast path
		{Options{MaxWorkers: 130, Tiers: 2, Shards: 2}, false}, // three words, two tiers
		{Options{MaxWorkers: 8, Tiers: 3, Shards: 1}, false},
		{Options{MaxWorkers: 64, Tiers: 1, Shards: 4}, true},     // 16-bit ids
		{Options{MaxWorkers: 200, Tiers: 1, Shards: 2}, true},    // what New picks at 200
		{Options{MaxWorkers: 200, Tiers: 3, Shards: 1}, true},    // 32-bit ids with tier masks
		{Options{MaxWorkers: 10_000, Tiers: 1, Shards: 4}, true}, // a fleet
		{Options{MaxWorkers: 10_000, Tiers: 2, Shards: 2}, true},
	}
}

// More holders than a lookup keeps as a list (sparseMax): a prompt's first blocks overflowed and
// held by so many that the lookup holds them as masks, and ANDs further bitmaps into them.
func TestIndexAgainstModelManyHolders(t *testing.T) {
	r := testrand.New(t)
	for _, l := range []layout{{Options{MaxWorkers: 10_000, Tiers: 1, Shards: 4}, true}, {Options{MaxWorkers: 10_000, Tiers: 2, Shards: 2}, true}} {
		t.Run(l.String(), func(t *testing.T) {
			ix, err := l.build()
			require.NoError(t, err)
			require.NoError(t, checkAgainstModelWith(r, ix, newUniverse(r, 24, 40), 250, 3*sparseMax/2))
		})
	}
}

func TestNewPicksLayout(t *testing.T) {
	for _, c := range []struct {
		workers, tiers int
		ids            bool
		eb             uint
	}{{64, 1, false, 0}, {64, 2, false, 0}, {65, 1, true, 16}, {10_000, 1, true, 16}, {10_000, 2, true, 32}, {65_535, 1, true, 32}, {65_472, 1, true, 16}} {
		ix, err := New(Options{MaxWorkers: c.workers, Tiers: c.tiers, Shards: 1})
		require.NoError(t, err)
		require.Equal(t, c.ids, ix.ids != nil, "%d workers", c.workers)
		if c.ids {
			require.Equal(t, c.eb, ix.ids.eb, "%d workers, %d tiers", c.workers, c.tiers)
			require.Equal(t, 1+inlineEntries*int(c.eb)/64, ix.stride)
		}
	}
}

func TestIndexAgainstModel(t *testing.T) {
	r := testrand.New(t)
	for _, l := range modelLayouts() {
		t.Run(l.String(), func(t *testing.T) {
			ix, err := l.build()
			require.NoError(t, err)
			require.NoError(t, checkAgainstModel(r, ix, newUniverse(r, 24, 40), 1500))
		})
	}
}

// breakDeletes makes the deletes of every index leave a hole in the probe run instead of
// shifting the run back, hiding the keys after it: a deliberate bug. It returns the function
// that mends them, which also runs when the test ends.
func breakDeletes(t *testing.T) (mend func()) {
	brokenDelete = func(tab *table, i int) {
		for w := range tab.stride {
			tab.slots[i*tab.stride+w].Store(0)
		}
		tab.used.Add(-1)
	}
	mend = func() { brokenDelete = nil }
	t.Cleanup(mend)
	return mend
}

// The same check against an index with a deliberate bug (breakDeletes) must fail: proof that
// the check can see a broken index.
func TestModelCheckCatchesBrokenIndex(t *testing.T) {
	r := testrand.New(t)
	for _, l := range []layout{{Options{MaxWorkers: 64, Tiers: 1, Shards: 1}, false}, {Options{MaxWorkers: 10_000, Tiers: 2, Shards: 1}, true}} {
		t.Run(l.String(), func(t *testing.T) {
			ix, err := l.build()
			require.NoError(t, err)
			mend := breakDeletes(t)
			err = checkAgainstModel(r, ix, newUniverse(r, 24, 40), 1500)
			mend()
			require.Error(t, err)
			t.Logf("caught: %v", err)
		})
	}
}

// Readers race writers: a pinned worker's chains never change, so every concurrent Match must
// report them exactly, while other workers' stores and removes over the same hashes insert,
// shift, grow and shrink the very tables the readers probe (and in the id layout move blocks
// into overflow bitmaps and back, and the bitmaps in their pools). Run under -race.
func TestIndexConcurrentReadersSeeConsistentState(t *testing.T) {
	for _, l := range []layout{
		{Options{MaxWorkers: 64, Tiers: 1, Shards: 2}, false},
		{Options{MaxWorkers: 64, Tiers: 1, Shards: 2}, true},
		{Options{MaxWorkers: 10_000, Tiers: 1, Shards: 2}, true},
	} {
		t.Run(l.String(), func(t *testing.T) { testConcurrentReaders(t, l) })
	}
}

func testConcurrentReaders(t *testing.T, l layout) {
	r := testrand.New(t)
	ix, err := l.build()
	require.NoError(t, err)
	u := newUniverse(r, 32, 48)
	others := 3
	if ix.ids != nil { // the pinned worker and these: more than fit inline
		others = 2 * inlineEntries
	}
	spreadWorkers(r, ix, others+1)
	pinned, _ := ix.AddWorker(0)
	pinnedChains := u.chains[:4]
	for _, c := range pinnedChains {
		ix.Store(pinned, 0, 0, c, nil)
	}
	sim := newEngineSim(ix, u)
	var writers []Worker
	for range others {
		w, _ := ix.AddWorker(0)
		writers = append(writers, w)
	}

	var stop atomic.Bool
	var lookups atomic.Int64
	errc := make(chan error, 4)
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var m Match
			for i := 0; !stop.Load(); i++ {
				c := pinnedChains[(i+g)%len(pinnedChains)]
				ix.Match(c, &m)
				if got := m.Blocks(pinned, 0); got != len(c) {
					errc <- fmt.Errorf("pinned worker matched %d of %d blocks during concurrent writes", got, len(c))
					return
				}
				lookups.Add(1)
			}
		}()
	}
	for step := range 4000 {
		w := writers[step%len(writers)]
		c, a, b := u.pick(r)
		if r.IntN(2) == 0 {
			require.NoError(t, sim.store(w, 0, c, a, b))
		} else {
			sim.removeSubtree(w, 0, c, a)
		}
		if step%500 == 499 {
			sim.clear(w)
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	t.Logf("%d concurrent lookups", lookups.Load())
	var m Match
	for _, c := range pinnedChains {
		ix.Match(c, &m)
		require.Equal(t, len(c), m.Blocks(pinned, 0))
	}
}

// Caps: a worker past its cap loses its own entries only, down to the cap; others keep theirs.
func TestIndexCapEvictsOwnEntries(t *testing.T) {
	for _, l := range []layout{{Options{MaxWorkers: 64, Tiers: 2, Shards: 8}, false}, {Options{MaxWorkers: 10_000, Tiers: 2, Shards: 8}, true}} {
		t.Run(l.String(), func(t *testing.T) { testCapEvictsOwnEntries(t, l) })
	}
}

func testCapEvictsOwnEntries(t *testing.T, l layout) {
	r := testrand.New(t)
	ix, err := l.build()
	require.NoError(t, err)
	capped, _ := ix.AddWorker(100)
	other, _ := ix.AddWorker(0)
	var all []uint64
	for range 1000 {
		all = append(all, r.Uint64())
	}
	// Each hash is a one-block sequence, so each can be looked up alone.
	storeSingles := func(w Worker, tier int, hs []uint64) {
		for _, h := range hs {
			ix.Store(w, tier, 0, []uint64{h}, nil)
		}
	}
	storeSingles(other, 0, all)
	for i := 0; i < len(all); i += 50 {
		storeSingles(capped, 0, all[i:i+50])
		require.LessOrEqual(t, ix.Held(capped, 0), int64(100))
	}
	storeSingles(capped, 1, all[:30])
	require.Equal(t, int64(100), ix.Held(capped, 0))
	require.Equal(t, int64(30), ix.Held(capped, 1), "tiers are capped separately")
	require.Equal(t, int64(1000), ix.Held(other, 0))
	// What the index says the capped worker holds is exactly 100 of the hashes.
	var m Match
	held := 0
	for _, h := range all {
		ix.Match([]uint64{h}, &m)
		require.Equal(t, 1, m.Blocks(other, 0))
		held += m.Blocks(capped, 0)
	}
	require.Equal(t, 100, held)

	ix.SetCapacity(capped, 10)
	require.Equal(t, int64(10), ix.Held(capped, 0))
	require.Equal(t, int64(10), ix.Held(capped, 1))
	ix.RemoveWorker(other)
	require.Equal(t, int64(20), ix.Entries())
	distinct := 0
	for _, h := range all {
		ix.Match([]uint64{h}, &m)
		distinct += m.Blocks(capped, 1) // held on tier 0 or 1
	}
	require.Equal(t, int64(distinct), ix.Blocks(), "blocks nobody holds are reclaimed at once")
	ix.RemoveWorker(capped)
	require.Zero(t, ix.Blocks())
	for i := range ix.shards {
		require.Equal(t, minSlots, ix.shards[i].tab.Load().size(), "empty tables shrink back")
	}
}

func TestIndexOptionsAndSlots(t *testing.T) {
	for _, o := range []Options{{0, 1, 1}, {64, 0, 1}, {64, 9, 1}, {64, 1, 3}, {64, 1, 0}} {
		_, err := New(o)
		var bad *ErrOptions
		require.True(t, errors.As(err, &bad), "%+v", o)
	}
	ix, err := New(Options{MaxWorkers: 3, Tiers: 1, Shards: 1})
	require.NoError(t, err)
	require.Equal(t, 64, ix.Options().MaxWorkers)
	for i := range 64 {
		w, err := ix.AddWorker(0)
		require.NoError(t, err)
		require.Equal(t, Worker(i), w)
	}
	_, err = ix.AddWorker(0)
	var full *ErrNoWorkerSlot
	require.True(t, errors.As(err, &full))
	ix.RemoveWorker(7)
	w, err := ix.AddWorker(0)
	require.NoError(t, err)
	require.Equal(t, Worker(7), w)

	// A sequence hash of 0 is a valid key, not an empty slot.
	ix.Store(3, 0, 0, []uint64{0, 5}, nil)
	var m Match
	ix.Match([]uint64{0, 5}, &m)
	require.Equal(t, 2, m.Blocks(3, 0))
	ix.Match(nil, &m)
	require.Zero(t, m.Len())
}

// concurrentCheck configures checkConcurrentAgainstModel.
type concurrentCheck struct {
	layout
	writers        int   // one goroutine each, owning its own workers
	slotsPerWriter int   // the workers a writer goes through: RemoveWorker moves it to the next
	capacity       int64 // per-worker cap of the writers' workers (0: none)
	readers        int
	steps          int // per writer

	sabotage func(ix *Index, w Worker) // called for each writer's worker once registered (tests of the check)
}

// checkConcurrentAgainstModel runs the index's contract concurrently: one writer goroutine per
// worker (here: per set of workers, used one after another) applies a random stream of stores,
// removes, clears and worker removals to its own workers and to its own reference model, while
// readers Match random queries. Mid-stream, readers check what must hold whatever the writers
// are doing: an answer never exceeds the query, counts grow with the tier, a worker that
// RemoveWorker has returned for (or was never registered) holds nothing, and a pinned worker no
// writer touches is matched exactly. Each writer checks its own workers after each of its steps
// (nobody else writes them): exactly against its model, or with a cap, no more than the model
// and never more than the cap. When all writers are done, the index is compared against the
// union of the models: exactly without caps; with caps, what the index holds is a subset of
// the model, as many as the index's own per-worker counts, each within the cap. It returns the
// first disagreement.
func checkConcurrentAgainstModel(seed uint64, ix *Index, u *universe, c concurrentCheck) error {
	opts := ix.Options()
	spreadWorkers(rand.New(rand.NewPCG(seed, 98)), ix, c.writers*c.slotsPerWriter+1)
	slots := make([][]Worker, c.writers)
	for i := range slots {
		for range c.slotsPerWriter {
			w, err := ix.AddWorker(c.capacity)
			if err != nil {
				return err
			}
			slots[i] = append(slots[i], w)
			if c.sabotage != nil {
				c.sabotage(ix, w)
			}
		}
	}
	pinned, err := ix.AddWorker(0)
	if err != nil {
		return err
	}
	pinnedChains := u.chains[:3]
	pinnedModel := newModel(opts.Tiers)
	for i, ch := range pinnedChains {
		ix.Store(pinned, i%opts.Tiers, 0, ch, nil)
		pinnedModel.store(int(pinned), i%opts.Tiers, ch)
	}
	registered := int(pinned) + 1
	removed := make([]atomic.Bool, opts.MaxWorkers)
	// The workers readers look at: all of them in a small index; in a large one the writers',
	// the pinned one, those a lookup names as holders and a random few more.
	var watched []int
	for _, ws := range slots {
		for _, w := range ws {
			watched = append(watched, int(w))
		}
	}
	watched = append(watched, int(pinned))
	if opts.MaxWorkers <= 256 {
		watched = watched[:0]
		for w := range opts.MaxWorkers {
			watched = append(watched, w)
		}
	}
	isWatched := make([]bool, opts.MaxWorkers)
	for _, w := range watched {
		isWatched[w] = true
	}

	var (
		errOnce  sync.Once
		firstErr error
		failed   atomic.Bool
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; failed.Store(true) })
	}

	models := make([]*model, c.writers)
	var capsBit atomic.Bool     // an eviction seen by a writer
	var sawOverflow atomic.Bool // a block in an overflow bitmap seen by a writer
	var writers sync.WaitGroup
	for wi := range c.writers {
		writers.Add(1)
		go func() {
			defer writers.Done()
			r := rand.New(rand.NewPCG(seed, uint64(wi)))
			sim := newEngineSim(ix, u)
			sim.capped = c.capacity > 0
			mod := sim.mod
			models[wi] = mod
			mine := slots[wi]
			cur := 0
			var m Match
			for step := 0; step < c.steps && !failed.Load(); step++ {
				w := mine[cur]
				tier := r.IntN(opts.Tiers)
				switch op := r.IntN(100); {
				case op < 60:
					ch, a, b := u.pick(r)
					if err := sim.store(w, tier, ch, a, b); err != nil {
						fail(fmt.Errorf("writer %d step %d: %w", wi, step, err))
						return
					}
					if c.capacity > 0 && !capsBit.Load() && ix.Held(w, tier) < mod.held1(int(w), tier) {
						capsBit.Store(true) // later clears may leave no trace of it by the end
					}
				case op < 94:
					ch, a, _ := u.pick(r)
					sim.removeSubtree(w, tier, ch, a)
				case op < 98 || cur == len(mine)-1:
					sim.clear(w)
				default:
					ix.RemoveWorker(w)
					mod.clearWorker(int(w))
					delete(sim.keys, w)
					removed[w].Store(true)
					cur++
				}
				if step%5 == 0 && !sawOverflow.Load() && ix.bitmapsInUse() > 0 {
					sawOverflow.Store(true)
				}
				// Read your own writes: only this goroutine writes these workers.
				q := u.chains[r.IntN(len(u.chains))]
				q = q[:1+r.IntN(len(q))]
				ix.Match(q, &m)
				for _, w := range mine {
					for t := range opts.Tiers {
						got, want := m.Blocks(w, t), mod.blocks(int(w), t, q)
						if got != want && (c.capacity == 0 || got > want) {
							fail(fmt.Errorf("writer %d step %d: worker %d tier %d: index says %d leading blocks, model %d", wi, step, w, t, got, want))
							return
						}
						if held := ix.Held(w, t); c.capacity > 0 && held > c.capacity {
							fail(fmt.Errorf("writer %d step %d: worker %d tier %d holds %d blocks, cap %d", wi, step, w, t, held, c.capacity))
							return
						}
					}
				}
				if c.capacity == 0 && step%50 == 0 {
					for _, w := range mine {
						for t := range opts.Tiers {
							if got, want := ix.Held(w, t), mod.held1(int(w), t); got != want {
								fail(fmt.Errorf("writer %d step %d: worker %d tier %d: index counts %d blocks, model %d", wi, step, w, t, got, want))
								return
							}
						}
					}
				}
			}
		}()
	}

	var stop atomic.Bool
	var readers sync.WaitGroup
	var lookups atomic.Int64
	for ri := range c.readers {
		readers.Add(1)
		go func() {
			defer readers.Done()
			r := rand.New(rand.NewPCG(seed, 1000+uint64(ri)))
			var m Match
			gone := make([]bool, opts.MaxWorkers)
			var look []int
			for !stop.Load() && !failed.Load() {
				var q []uint64
				pinnedQuery := r.IntN(4) == 0
				if pinnedQuery {
					q = pinnedChains[r.IntN(len(pinnedChains))]
				} else {
					q = u.prefix(r)
				}
				look = append(look[:0], watched...)
				for range 16 {
					look = append(look, r.IntN(opts.MaxWorkers))
				}
				for _, w := range look {
					gone[w] = w >= registered || removed[w].Load()
				}
				ix.Match(q, &m)
				lookups.Add(1)
				if m.Len() != len(q) {
					fail(fmt.Errorf("reader: Len %d for a %d-block query", m.Len(), len(q)))
					return
				}
				if err := checkHolders(&m, nil); err != nil {
					fail(fmt.Errorf("reader: %w", err))
					return
				}
				for _, w := range m.Holders() {
					if !isWatched[w] { // (every worker that ever stores is watched)
						fail(fmt.Errorf("reader: worker %d, never stored to, holds %d leading blocks", w, m.Blocks(w, opts.Tiers-1)))
						return
					}
				}
				for _, w := range look {
					prev := 0
					for t := range opts.Tiers {
						n := m.Blocks(Worker(w), t)
						switch {
						case n < prev || n > len(q):
							fail(fmt.Errorf("reader: worker %d tier %d: %d leading blocks of %d (tier before: %d)", w, t, n, len(q), prev))
							return
						case gone[w] && n != 0:
							fail(fmt.Errorf("reader: worker %d, removed or never registered, holds %d leading blocks on tier %d", w, n, t))
							return
						case Worker(w) == pinned && pinnedQuery && n != pinnedModel.blocks(w, t, q):
							fail(fmt.Errorf("reader: pinned worker tier %d: %d leading blocks, model %d", t, n, pinnedModel.blocks(w, t, q)))
							return
						}
						prev = n
					}
				}
			}
		}()
	}
	writers.Wait()
	stop.Store(true)
	readers.Wait()
	if firstErr != nil {
		return firstErr
	}
	if lookups.Load() == 0 && c.readers > 0 {
		return errors.New("the readers never got to look anything up")
	}

	// Quiescent: compare with the union of the models, block by block and by whole chains.
	all := newModel(opts.Tiers)
	for i, ch := range pinnedChains {
		all.store(int(pinned), i%opts.Tiers, ch)
	}
	for _, mod := range models {
		for h, ws := range mod.held {
			for wt := range ws {
				all.store(wt[0], wt[1], []uint64{h})
			}
		}
	}
	capped := map[Worker]bool{}
	for w := range registered {
		capped[Worker(w)] = c.capacity > 0 && Worker(w) != pinned
	}
	if err := checkBlocksExactly(ix, u, all, capped); err != nil {
		return fmt.Errorf("after the writers: %w", err)
	}
	if err := ix.checkSummaries(); err != nil { // every group's last write recomputed its summary
		return fmt.Errorf("after the writers: %w", err)
	}
	if err := ix.checkIDSets(); err != nil {
		return fmt.Errorf("after the writers: %w", err)
	}
	var m Match
	for _, ch := range u.chains {
		ix.Match(ch, &m)
		for w := range registered {
			for t := range opts.Tiers {
				if got, want := m.Blocks(Worker(w), t), all.blocks(w, t, ch); got != want && (!capped[Worker(w)] || got > want) {
					return fmt.Errorf("after the writers: worker %d tier %d: index says %d leading blocks of %d, model %d", w, t, got, len(ch), want)
				}
			}
		}
	}
	// What the tables hold: every key has a holder, and the counts are the bits.
	bitsOf, blocks, holderless := ix.tableBits()
	if holderless != 0 {
		return fmt.Errorf("after the writers: %d keys in the tables have no holder", holderless)
	}
	var entries int64
	evicted := false
	for w := range registered {
		for t := range opts.Tiers {
			held := ix.Held(Worker(w), t)
			evicted = evicted || held < all.held1(w, t)
			entries += held
			if held != bitsOf[w][t] {
				return fmt.Errorf("after the writers: worker %d tier %d: the index counts %d blocks, its tables hold %d", w, t, held, bitsOf[w][t])
			}
			if capped[Worker(w)] {
				if held > c.capacity {
					return fmt.Errorf("after the writers: worker %d tier %d holds %d blocks, cap %d", w, t, held, c.capacity)
				}
			} else if want := all.held1(w, t); held != want {
				return fmt.Errorf("after the writers: worker %d tier %d: index counts %d blocks, model %d", w, t, held, want)
			}
		}
	}
	if ix.ids != nil && c.writers*c.slotsPerWriter > inlineEntries && !sawOverflow.Load() {
		return errors.New("no block was ever seen overflowed: the check tests no bitmap")
	}
	if c.capacity > 0 && !evicted && !capsBit.Load() {
		return errors.New("no worker was ever below its model: the caps never bit, the test tests nothing")
	}
	if got := ix.Entries(); got != entries {
		return fmt.Errorf("after the writers: %d entries, the workers' counts add up to %d", got, entries)
	}
	if c.capacity == 0 && entries != all.entries() {
		return fmt.Errorf("after the writers: %d entries, model %d", entries, all.entries())
	}
	if got := ix.Blocks(); got != blocks {
		return fmt.Errorf("after the writers: %d blocks, the tables hold %d keys with holders", got, blocks)
	}
	if c.capacity == 0 && blocks != int64(len(all.held)) {
		return fmt.Errorf("after the writers: %d blocks, model %d", blocks, len(all.held))
	}
	return nil
}

// tableBits counts, from the tables themselves (quiescent), each worker's entries per tier, the
// keys, and the keys nobody holds (which must not be there).
func (ix *Index) tableBits() (bitsOf [][]int64, blocks, holderless int64) {
	opts := ix.Options()
	bitsOf = make([][]int64, opts.MaxWorkers)
	for w := range bitsOf {
		bitsOf[w] = make([]int64, opts.Tiers)
	}
	for i := range ix.shards {
		s := &ix.shards[i]
		t := s.tab.Load()
		for slot := range t.size() {
			if t.slots[slot*t.stride].Load() == 0 {
				continue
			}
			hs := ix.slotHolders(s, t, slot)
			for w, tm := range hs {
				for ; tm != 0; tm &= tm - 1 {
					bitsOf[w][bits.TrailingZeros64(tm)]++
				}
			}
			if len(hs) == 0 {
				holderless++
			}
			blocks++
		}
	}
	return bitsOf, blocks, holderless
}

// held1 is how many blocks w holds on exactly tier.
func (m *model) held1(w, tier int) int64 {
	var n int64
	for _, ws := range m.held {
		if ws[[2]int{w, tier}] {
			n++
		}
	}
	return n
}

// The index against the reference model with the index's concurrency contract in play: a
// writer goroutine per worker, readers matching meanwhile; caps in some variants. Run under
// -race.
func TestIndexAgainstModelConcurrently(t *testing.T) {
	seed := testrand.Seed(t)
	for _, c := range []concurrentCheck{
		{layout: layout{Options{MaxWorkers: 64, Tiers: 1, Shards: 4}, false}, writers: 6, slotsPerWriter: 4, readers: 3, steps: 1200},
		{layout: layout{Options{MaxWorkers: 130, Tiers: 2, Shards: 2}, false}, writers: 4, slotsPerWriter: 3, readers: 2, steps: 1200},
		{layout: layout{Options{MaxWorkers: 64, Tiers: 1, Shards: 2}, false}, writers: 5, slotsPerWriter: 2, readers: 2, steps: 1200, capacity: 60},
		{layout: layout{Options{MaxWorkers: 8, Tiers: 2, Shards: 1}, false}, writers: 3, slotsPerWriter: 2, readers: 2, steps: 1200, capacity: 25},
		{layout: layout{Options{MaxWorkers: 64, Tiers: 1, Shards: 4}, true}, writers: 6, slotsPerWriter: 4, readers: 3, steps: 1200},
		{layout: layout{Options{MaxWorkers: 200, Tiers: 2, Shards: 2}, true}, writers: 6, slotsPerWriter: 3, readers: 2, steps: 1200},
		{layout: layout{Options{MaxWorkers: 10_000, Tiers: 1, Shards: 4}, true}, writers: 6, slotsPerWriter: 3, readers: 2, steps: 1200},
		{layout: layout{Options{MaxWorkers: 10_000, Tiers: 2, Shards: 2}, true}, writers: 8, slotsPerWriter: 2, readers: 2, steps: 1200, capacity: 60},
	} {
		name := fmt.Sprintf("%v/writers=%d/cap=%d", c.layout, c.writers, c.capacity)
		t.Run(name, func(t *testing.T) {
			ix, err := c.build()
			require.NoError(t, err)
			u := newUniverse(rand.New(rand.NewPCG(seed, 99)), 24, 40)
			require.NoError(t, checkConcurrentAgainstModel(seed, ix, u, c))
		})
	}
}

// The concurrent check sees a broken index too: deletes that leave holes (hiding later keys of
// a probe run), and, separately, caps that are not enforced.
func TestConcurrentModelCheckCatchesBrokenIndex(t *testing.T) {
	for _, l := range []layout{{Options{MaxWorkers: 64, Tiers: 1, Shards: 2}, false}, {Options{MaxWorkers: 10_000, Tiers: 1, Shards: 2}, true}} {
		t.Run(l.String(), func(t *testing.T) { testConcurrentCheckCatches(t, l) })
	}
}

func testConcurrentCheckCatches(t *testing.T, l layout) {
	seed := testrand.Seed(t)
	c := concurrentCheck{layout: l, writers: 4, slotsPerWriter: 2, readers: 2, steps: 1200}
	ix, err := c.build()
	require.NoError(t, err)
	mend := breakDeletes(t)
	u := newUniverse(rand.New(rand.NewPCG(seed, 99)), 24, 40)
	err = checkConcurrentAgainstModel(seed, ix, u, c)
	mend()
	require.Error(t, err)
	t.Logf("broken deletes caught: %v", err)

	// Caps the check expects but the index does not enforce: counts run past them.
	ix, err = c.build()
	require.NoError(t, err)
	c.capacity = 20
	c.sabotage = func(ix *Index, w Worker) { ix.SetCapacity(w, 0) }
	err = checkConcurrentAgainstModel(seed, ix, u, c)
	require.ErrorContains(t, err, "cap 20")
	t.Logf("unenforced caps caught: %v", err)
}

// Bytes counts the arrays that grow with what the index holds: at least a slot per block (16
// bytes in both one-tier layouts), at most the tables' growth slack over it, and back near the
// empty figure once everything is removed (the tables shrink).
func TestBytesFollowsTheTables(t *testing.T) {
	for _, workers := range []int{64, 10_000} {
		ix, err := New(Options{MaxWorkers: workers, Tiers: 1, Shards: 16})
		require.NoError(t, err)
		empty := ix.Bytes()
		require.Positive(t, empty)
		rnd := rand.New(rand.NewPCG(uint64(workers), 9))
		var held [][]uint64
		for range 2_000 {
			seqs := make([]uint64, 64)
			for i := range seqs {
				seqs[i] = rnd.Uint64() | 1
			}
			keys := make([]uint64, len(seqs))
			w := Worker(0)
			ix.Store(w, 0, 0, seqs, keys)
			held = append(held, keys)
		}
		blocks := ix.Blocks()
		require.Equal(t, int64(128_000), blocks)
		full := ix.Bytes()
		require.GreaterOrEqual(t, full, blocks*16, "%d workers", workers)
		require.LessOrEqual(t, full, blocks*16*5+empty, "%d workers: the tables' slack and summaries", workers)
		for _, keys := range held {
			ix.Remove(0, 0, keys)
		}
		require.Zero(t, ix.Blocks())
		require.LessOrEqual(t, ix.Bytes(), 2*empty, "%d workers: shrunk back", workers)
	}
}
