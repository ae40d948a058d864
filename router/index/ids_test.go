package index

import (
	"fmt"
	"maps"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/router/internal/testrand"
)

// spreadWorkers makes the next n AddWorker calls return worker slots spread over the whole
// index, in increasing order, rather than 0 to n-1: every other free slot is taken by a filler
// that stays registered and never stores (so ids above 255, high mask words and 16-bit ids get
// their turn).
func spreadWorkers(r *rand.Rand, ix *Index, n int) {
	var free []int
	for w := range ix.workers {
		if !ix.workers[w].live.Load() {
			free = append(free, w)
		}
	}
	r.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	for _, w := range free[min(n, len(free)):] {
		ix.workers[w].live.Store(true)
	}
}

// slotHolders returns the holders of slot i of shard s's table t (quiescent): worker → tiers
// (bit t: tier t), in either layout.
func (ix *Index) slotHolders(s *shard, t *table, i int) map[int]uint64 {
	out := map[int]uint64{}
	ws := t.words(i)
	masks := func(words func(j int) uint64, n int) {
		for j := range n {
			tier, word := j/ix.words, j%ix.words
			for m := words(j); m != 0; m &= m - 1 {
				out[word*64+bits.TrailingZeros64(m)] |= 1 << tier
			}
		}
	}
	if ix.ids == nil {
		masks(func(j int) uint64 { return ws[j].Load() }, len(ws))
		return out
	}
	l := ix.ids
	if h0 := ws[0].Load(); overflowed(h0) {
		bm := l.bitmap(s.ids.pool.Load(), h0>>32)
		masks(func(j int) uint64 { return bm[bmHeader+j].Load() }, l.tiers*l.words)
		return out
	}
	for q := range ws {
		for x := ws[q].Load(); x != 0; x >>= l.eb {
			if e := x & l.emask; e != 0 {
				w, tm := l.decode(e)
				out[w] |= tm
			}
		}
	}
	return out
}

// bitmapsInUse is how many blocks are in overflow bitmaps now (0 in the mask layout); it locks
// each shard in turn.
func (ix *Index) bitmapsInUse() int {
	n := 0
	for i := range ix.shards {
		s := &ix.shards[i]
		if s.ids != nil {
			s.mu.Lock()
			n += s.ids.n
			s.mu.Unlock()
		}
	}
	return n
}

// checkHolders checks m.Holders: each worker once, each with a count, and every worker of
// workers with a count on any tier among them.
func checkHolders(m *Match, workers []Worker) error {
	in := map[Worker]bool{}
	for _, w := range m.Holders() {
		if in[w] {
			return fmt.Errorf("worker %d listed twice in Holders", w)
		}
		in[w] = true
		if m.Blocks(w, m.tiers-1) == 0 {
			return fmt.Errorf("worker %d listed in Holders with no blocks", w)
		}
	}
	for _, w := range workers {
		for t := range m.tiers {
			if m.Blocks(w, t) > 0 && !in[w] {
				return fmt.Errorf("worker %d holds %d leading blocks on tier %d but is not in Holders", w, m.Blocks(w, t), t)
			}
		}
	}
	return nil
}

// checkIDSets checks the id layout's invariants (quiescent; nil in the mask layout): every
// overflowed slot points to a bitmap of its own that names its key, with more holders than
// shrinkAt and the count and hash of its bits; bitmaps past those in use are zero; a pool is at
// most four times the bitmaps in use (or minBitmaps); inline slots have someone, each worker
// once, with a tier mask within the index's tiers.
func (ix *Index) checkIDSets() error {
	l := ix.ids
	if l == nil {
		return nil
	}
	for si := range ix.shards {
		s := &ix.shards[si]
		t, p, n := s.tab.Load(), s.ids.pool.Load(), s.ids.n
		if c := len(p.words) / l.size; n > c || c > max(minBitmaps, 4*n) {
			return fmt.Errorf("shard %d: %d bitmaps in use in a pool of %d", si, n, c)
		}
		pointed := make([]bool, n)
		for i := range t.size() {
			key := t.slots[i*t.stride].Load()
			if key == 0 {
				continue
			}
			ws := t.words(i)
			h0 := ws[0].Load()
			if overflowed(h0) {
				idx := int(h0 >> 32)
				if idx >= n || pointed[idx] {
					return fmt.Errorf("shard %d: key %#x points to bitmap %d (%d in use, or another key's)", si, key, idx, n)
				}
				pointed[idx] = true
				for q := 1; q < len(ws); q++ {
					if ws[q].Load() != 0 {
						return fmt.Errorf("shard %d: key %#x is overflowed and has holder word %d set", si, key, q)
					}
				}
				bm := l.bitmap(p, uint64(idx))
				if got := bm[bmKey].Load(); got != key {
					return fmt.Errorf("shard %d: bitmap %d names key %#x, its slot's is %#x", si, idx, got, key)
				}
				hs := ix.slotHolders(s, t, i)
				var hash uint64
				for w, tm := range hs {
					for ; tm != 0; tm &= tm - 1 {
						hash ^= holderHash(w, bits.TrailingZeros64(tm))
					}
				}
				if c := bm[bmCount].Load(); c != uint64(len(hs)) || c <= shrinkAt {
					return fmt.Errorf("shard %d: key %#x: bitmap counts %d workers, holds %d (goes inline at %d)", si, key, c, len(hs), shrinkAt)
				}
				if bm[bmHash].Load() != hash {
					return fmt.Errorf("shard %d: key %#x: bitmap hash %#x, its bits' %#x", si, key, bm[bmHash].Load(), hash)
				}
				continue
			}
			var seen []int
			for q := range ws {
				prev := uint64(0)
				for x := ws[q].Load(); x != 0; x >>= l.eb {
					e := x & l.emask
					if e == 0 {
						continue
					}
					w, tm := l.decode(e)
					if slices.Contains(seen, w) || w >= ix.opts.MaxWorkers || tm == 0 || tm >= 1<<l.tiers {
						return fmt.Errorf("shard %d: key %#x: inline entry %#x (worker %d twice, or out of range)", si, key, e, w)
					}
					if l.eb == 16 && e < prev { // (zeros past the last: x ends there)
						return fmt.Errorf("shard %d: key %#x: inline entries %#x out of order", si, key, ws[q].Load())
					}
					prev = e
					seen = append(seen, w)
				}
			}
			if len(seen) == 0 {
				return fmt.Errorf("shard %d: key %#x has no holder", si, key)
			}
		}
		for idx, ok := range pointed {
			if !ok {
				return fmt.Errorf("shard %d: bitmap %d of %d in use has no slot", si, idx, n)
			}
		}
		for q := n * l.size; q < len(p.words); q++ {
			if p.words[q].Load() != 0 {
				return fmt.Errorf("shard %d: free pool word %d is %#x", si, q, p.words[q].Load())
			}
		}
	}
	return nil
}

// A block's holders grow past what fits inline into a bitmap and shrink back, on every tier
// combination, and lookups, Holders and the pool follow: blocks overflow in one shard until
// its pool has grown, and leave it until it has shrunk.
func TestIDSetsOverflowAndShrink(t *testing.T) {
	for _, l := range []layout{
		{Options{MaxWorkers: 10_000, Tiers: 1, Shards: 1}, true},
		{Options{MaxWorkers: 10_000, Tiers: 3, Shards: 1}, true},
		{Options{MaxWorkers: 64, Tiers: 1, Shards: 1}, true},
	} {
		t.Run(l.String(), func(t *testing.T) { testOverflowAndShrink(t, l) })
	}
}

func testOverflowAndShrink(t *testing.T, l layout) {
	r := testrand.New(t)
	ix, err := l.build()
	require.NoError(t, err)
	const holders = 3 * inlineEntries
	spreadWorkers(r, ix, holders)
	var ws []Worker
	for range holders {
		w, err := ix.AddWorker(0)
		require.NoError(t, err)
		ws = append(ws, w)
	}
	chains := make([][]uint64, 40) // enough overflowed blocks to grow the pool a few times
	for i := range chains {
		chains[i] = testrand.Hashes(r, 3)
	}
	tiers := ix.opts.Tiers
	var m Match
	pool := func() (n, c int) {
		s := &ix.shards[0]
		return s.ids.n, len(s.ids.pool.Load().words) / ix.ids.size
	}
	// Worker k holds every chain on tier k % tiers.
	for k, w := range ws {
		for _, c := range chains {
			ix.Store(w, k%tiers, 0, c, nil)
		}
		require.NoError(t, ix.checkIDSets())
		n, _ := pool()
		if k < inlineEntries {
			require.Zero(t, n, "%d holders fit inline", k+1)
		} else {
			require.Equal(t, 3*len(chains), n, "every block overflowed")
		}
		for _, c := range chains {
			ix.Match(c, &m)
			require.Len(t, m.Holders(), k+1)
			for j, v := range ws[:k+1] {
				for tier := range tiers {
					want := 0
					if j%tiers <= tier {
						want = len(c)
					}
					require.Equal(t, want, m.Blocks(v, tier), "worker %d tier %d", j, tier)
				}
			}
		}
	}
	_, grown := pool()
	// Workers leave one at a time, from the first block of each chain only: those blocks go back
	// inline, the others stay overflowed, and the lookups end at block 0 for the workers gone.
	keys := make([]uint64, 3)
	for k, w := range ws {
		for _, c := range chains {
			ix.Store(w, k%tiers, 0, c[:1], keys)
			ix.Remove(w, k%tiers, keys[:1])
		}
		require.NoError(t, ix.checkIDSets())
		left := holders - k - 1
		for _, c := range chains {
			ix.Match(c, &m)
			require.Len(t, m.Holders(), left)
		}
		n, _ := pool()
		if left <= shrinkAt {
			require.Equal(t, 2*len(chains), n, "first blocks back inline")
		}
	}
	n, _ := pool()
	require.Equal(t, 2*len(chains), n)
	require.Greater(t, grown, minBitmaps, "the pool grew")
	for _, w := range ws {
		ix.ClearWorker(w)
	}
	require.NoError(t, ix.checkIDSets())
	n, c := pool()
	require.Zero(t, n)
	require.LessOrEqual(t, c, minBitmaps, "the pool shrinks back")
	require.Zero(t, ix.Blocks())
	require.Zero(t, ix.Entries())
}

// A lookup allocates nothing once its Match has grown to the index's layout and its queries'
// holders, in the id layout too (through overflowed blocks held as masks and as a list).
func TestMatchIDsAllocatesNothing(t *testing.T) {
	ix, err := New(Options{MaxWorkers: 10_000, Tiers: 1, Shards: 16})
	require.NoError(t, err)
	r := testrand.New(t)
	spreadWorkers(r, ix, 2*sparseMax)
	chain := testrand.Hashes(r, 300)
	for i := range 2 * sparseMax {
		w, _ := ix.AddWorker(0)
		n := 20 // a system prompt held by everyone, then a conversation held by few
		if i < 3 {
			n = len(chain)
		}
		ix.Store(w, 0, 0, chain[:n], nil)
	}
	var m Match
	ix.Match(chain, &m)
	require.Len(t, m.Holders(), 2*sparseMax)
	require.Zero(t, testing.AllocsPerRun(100, func() { ix.Match(chain, &m) }))
	require.Zero(t, testing.AllocsPerRun(100, func() { ix.Match(chain[:10], &m) }))
}

// brokenRepoint, when set, makes freeBitmap move the last bitmap into the freed place without
// pointing its slot there: a deliberate bug, for the test that proves the checks see it.
func breakRepoint(t *testing.T) (mend func()) {
	brokenRepoint = true
	mend = func() { brokenRepoint = false }
	t.Cleanup(mend)
	return mend
}

// The model check sees a pool whose bitmaps move without their slots following.
func TestModelCheckCatchesBrokenPool(t *testing.T) {
	r := testrand.New(t)
	l := layout{Options{MaxWorkers: 10_000, Tiers: 1, Shards: 1}, true}
	ix, err := l.build()
	require.NoError(t, err)
	mend := breakRepoint(t)
	err = func() (err error) {
		defer func() { // a broken pool may also crash the index: that is caught too
			if p := recover(); p != nil {
				err = fmt.Errorf("panic: %v", p)
			}
		}()
		return checkAgainstModel(r, ix, newUniverse(r, 24, 40), 1500)
	}()
	mend()
	require.Error(t, err)
	t.Logf("caught: %v", err)
}

// Holders in the mask layout: the workers with a count, once each, over tiers.
func TestMatchHoldersMasks(t *testing.T) {
	ix, err := New(Options{MaxWorkers: 64, Tiers: 2, Shards: 1})
	require.NoError(t, err)
	r := testrand.New(t)
	chain := testrand.Hashes(r, 8)
	var ws []Worker
	for i := range 4 {
		w, _ := ix.AddWorker(0)
		ws = append(ws, w)
		ix.Store(w, i%2, 0, chain[:2*i+1], nil)
	}
	var m Match
	ix.Match(chain, &m)
	require.NoError(t, checkHolders(&m, ws))
	got := slices.Clone(m.Holders())
	slices.Sort(got)
	require.Equal(t, ws, got)
	ix.Match(testrand.Hashes(r, 3), &m)
	require.Empty(t, m.Holders())
	for _, w := range ws {
		require.Zero(t, m.Blocks(w, 1), "counts of the last query are cleared")
	}
}

// A prompt whose first blocks more workers hold than a lookup lists (sparseMax): the lookup
// holds them as masks, ANDs the next overflowed bitmap into them where fewer hold on, and
// lists the few that hold the rest; on two tiers, the slower counting the faster.
func TestMatchIDsManyHolders(t *testing.T) {
	for _, tiers := range []int{1, 2} {
		t.Run(fmt.Sprint(tiers), func(t *testing.T) {
			ix, err := New(Options{MaxWorkers: 10_000, Tiers: tiers, Shards: 4})
			require.NoError(t, err)
			r := testrand.New(t)
			const many = 2 * sparseMax
			spreadWorkers(r, ix, many)
			chain := testrand.Hashes(r, 60)
			want := map[Worker][]int{} // per tier
			for i := range many {
				w, _ := ix.AddWorker(0)
				n := 20 // everyone: a system prompt
				if i < many-10 {
					n = 30 // most of them, on: the bitmaps differ at block 20
				}
				if i < 3 {
					n = 60 // the conversation's few
				}
				tier := i % tiers
				ix.Store(w, tier, 0, chain[:n], nil)
				want[w] = []int{n}
				if tiers == 2 {
					want[w] = []int{n * (1 - tier), n}
				}
				if i == 1 && tiers == 2 { // on tier 1, and a faster copy of its first 25 blocks
					ix.Store(w, 0, 0, chain[:25], nil)
					want[w][0] = 25
				}
			}
			var m Match
			ix.Match(chain, &m)
			require.Len(t, m.Holders(), many)
			for w, n := range want {
				for tier := range tiers {
					require.Equal(t, n[tier], m.Blocks(w, tier), "worker %d tier %d", w, tier)
				}
			}
			require.NoError(t, checkHolders(&m, slices.Collect(maps.Keys(want))))
		})
	}
}
