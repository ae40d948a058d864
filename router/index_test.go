package router

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
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

// A universe of block chains (index keys): prompts that share prefixes, as real traffic does.
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
		u.chains = append(u.chains, ChainKeys(nil, c)) // placed as the router places them
	}
	return u
}

func (u *universe) pick(r *rand.Rand) []uint64 {
	c := u.chains[r.IntN(len(u.chains))]
	a := r.IntN(len(c))
	b := a + 1 + r.IntN(len(c)-a)
	if r.IntN(3) == 0 {
		a = 0 // often a prefix
	}
	return c[a:b]
}

// checkAgainstModel applies a random stream of stores, removes, clears and worker removals to
// the index and the model and compares every worker's overlap for random queries after each
// step, plus the entry and block counts. It returns the first disagreement.
func checkAgainstModel(r *rand.Rand, ix *Index, u *universe, steps int) error {
	opts := ix.Options()
	mod := newModel(opts.Tiers)
	var live []Worker
	for range 5 {
		w, err := ix.AddWorker(0)
		if err != nil {
			return err
		}
		live = append(live, w)
	}
	var m Match
	for step := range steps {
		w := live[r.IntN(len(live))]
		tier := r.IntN(opts.Tiers)
		switch op := r.IntN(100); {
		case op < 55:
			hs := u.pick(r)
			ix.Store(w, tier, hs)
			mod.store(int(w), tier, hs)
		case op < 93:
			hs := u.pick(r)
			ix.Remove(w, tier, hs)
			mod.remove(int(w), tier, hs)
		case op < 97:
			ix.ClearWorker(w)
			mod.clearWorker(int(w))
		default:
			ix.RemoveWorker(w)
			mod.clearWorker(int(w))
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
			q := u.chains[r.IntN(len(u.chains))]
			q = q[:1+r.IntN(len(q))]
			ix.Match(q, &m)
			for _, w := range live {
				for t := range opts.Tiers {
					if got, want := m.Blocks(w, t), mod.blocks(int(w), t, q); got != want {
						return fmt.Errorf("step %d: worker %d tier %d: index says %d leading blocks, model %d", step, w, t, got, want)
					}
				}
			}
		}
		if got, want := ix.Entries(), mod.entries(); got != want {
			return fmt.Errorf("step %d: %d entries, model %d", step, got, want)
		}
		if got, want := ix.Blocks(), int64(len(mod.held)); got != want {
			return fmt.Errorf("step %d: %d blocks, model %d", step, got, want)
		}
	}
	return nil
}

func modelLayouts() []IndexOptions {
	return []IndexOptions{
		{MaxWorkers: 64, Tiers: 1, Shards: 4},  // the one-word fast path
		{MaxWorkers: 130, Tiers: 2, Shards: 2}, // three words, two tiers
		{MaxWorkers: 8, Tiers: 3, Shards: 1},
	}
}

func TestIndexAgainstModel(t *testing.T) {
	r := newRand(t)
	for _, opts := range modelLayouts() {
		t.Run(fmt.Sprintf("workers=%d/tiers=%d/shards=%d", opts.MaxWorkers, opts.Tiers, opts.Shards), func(t *testing.T) {
			ix, err := NewIndex(opts)
			require.NoError(t, err)
			require.NoError(t, checkAgainstModel(r, ix, newUniverse(r, 24, 40), 1500))
		})
	}
}

// The same check against an index with a deliberate bug (deletes leave a hole in the probe run,
// hiding the keys after it) must fail: proof that the check can see a broken index.
func TestModelCheckCatchesBrokenIndex(t *testing.T) {
	r := newRand(t)
	ix, err := NewIndex(IndexOptions{MaxWorkers: 64, Tiers: 1, Shards: 1})
	require.NoError(t, err)
	ix.shards[0].brokenDelete = true
	err = checkAgainstModel(r, ix, newUniverse(r, 24, 40), 1500)
	require.Error(t, err)
	t.Logf("caught: %v", err)
}

// Readers race writers: a pinned worker's chains never change, so every concurrent Match must
// report them exactly, while other workers' stores and removes over the same hashes insert,
// shift, grow and shrink the very tables the readers probe. Run under -race.
func TestIndexConcurrentReadersSeeConsistentState(t *testing.T) {
	r := newRand(t)
	ix, err := NewIndex(IndexOptions{MaxWorkers: 64, Tiers: 1, Shards: 2})
	require.NoError(t, err)
	u := newUniverse(r, 32, 48)
	pinned, _ := ix.AddWorker(0)
	pinnedChains := u.chains[:4]
	for _, c := range pinnedChains {
		ix.Store(pinned, 0, c)
	}
	var others []Worker
	for range 3 {
		w, _ := ix.AddWorker(0)
		others = append(others, w)
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
		w := others[step%len(others)]
		hs := u.pick(r)
		if r.IntN(2) == 0 {
			ix.Store(w, 0, hs)
		} else {
			ix.Remove(w, 0, hs)
		}
		if step%500 == 499 {
			ix.ClearWorker(w)
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
	r := newRand(t)
	ix, err := NewIndex(IndexOptions{MaxWorkers: 64, Tiers: 2, Shards: 8})
	require.NoError(t, err)
	capped, _ := ix.AddWorker(100)
	other, _ := ix.AddWorker(0)
	var all []uint64
	for range 1000 {
		all = append(all, r.Uint64())
	}
	ix.Store(other, 0, all)
	for i := 0; i < len(all); i += 50 {
		ix.Store(capped, 0, all[i:i+50])
		require.LessOrEqual(t, ix.Held(capped, 0), int64(100))
	}
	ix.Store(capped, 1, all[:30])
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
	for _, o := range []IndexOptions{{0, 1, 1}, {64, 0, 1}, {64, 9, 1}, {64, 1, 3}, {64, 1, 0}} {
		_, err := NewIndex(o)
		var bad *ErrIndexOptions
		require.True(t, errors.As(err, &bad), "%+v", o)
	}
	ix, err := NewIndex(IndexOptions{MaxWorkers: 3, Tiers: 1, Shards: 1})
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
	ix.Store(3, 0, []uint64{0, 5})
	var m Match
	ix.Match([]uint64{0, 5}, &m)
	require.Equal(t, 2, m.Blocks(3, 0))
	ix.Match(nil, &m)
	require.Zero(t, m.Len())
}
