package index

import (
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/router/internal/testrand"
)

// Keys by the definition in keys.go, written out plainly: block i of a sequence belongs to
// group i/keyGroup, whose home is the low 32 bits of its first block's sequence hash with the
// low bits of a position cleared; the key is the high 32 bits of the block's own hash and home +
// i%keyGroup.
func TestChainKeysByDefinition(t *testing.T) {
	r := testrand.New(t)
	seqs := testrand.Hashes(r, 300)
	keys := ChainKeys(nil, seqs)
	require.Len(t, keys, len(seqs))
	for i, k := range keys {
		home := uint32(seqs[i/keyGroup*keyGroup]) &^ (keyGroup - 1)
		want := seqs[i]&0xffff_ffff_0000_0000 | uint64(home+uint32(i%keyGroup))
		if i%keyGroup != 0 {
			want &^= 1 << 63 // a child key's mark (branch keys have it set)
		}
		require.Equalf(t, want, k, "block %d", i)
		require.Equal(t, i%keyGroup != 0, continues(k))
	}
	// A writer that knows only the parent's key agrees, from any point of the chain.
	for i := 1; i < len(seqs); i++ {
		require.Equal(t, keys[i], ChildKey(keys[i-1], seqs[i]))
	}
	require.Equal(t, keys[0], ChildKey(0, seqs[0]), "no parent: a new group")
	require.Equal(t, keys[keyGroup], OwnKey(seqs[keyGroup]), "a full group: a new one")
	// Keys of a prefix are a prefix of the keys.
	require.Equal(t, keys[:37], ChainKeys(nil, seqs[:37]))
	// Home arithmetic stays in the low 32 bits: the last home does not carry upward.
	seqs[0] = 0x1234_5678_ffff_fffa
	keys = ChainKeys(keys[:0], seqs[:keyGroup])
	require.Equal(t, uint64(0x1234_5678_0000_0000|(1<<32-keyGroup)), keys[0])
	require.Equal(t, seqs[keyGroup-1]&0x7fff_ffff_0000_0000|0xffff_ffff, keys[keyGroup-1])
}

// The point of the keys: a group of keyGroup blocks sits in one shard, in adjacent slots (the
// slots of a one-word index are 16 bytes: 16 of them are four cache lines on one page), so a
// lookup misses the cache once per group rather than once per block.
func TestGroupsShareShardAndRun(t *testing.T) {
	r := testrand.New(t)
	ix, err := New(DefaultOptions())
	require.NoError(t, err)
	w, _ := ix.AddWorker(0)
	for range 2000 { // fill the tables to a realistic size and load
		require.Positive(t, ix.Store(w, 0, 0, testrand.Hashes(r, 64), nil))
	}
	seqs := testrand.Hashes(r, 256)
	keys := make([]uint64, len(seqs))
	ix.Store(w, 0, 0, seqs, keys)
	same := 0
	for i, k := range ChainKeys(nil, seqs) {
		if k == keys[i] {
			same++
		}
	}
	require.Greater(t, same, len(seqs)-keyGroup, "keys other than ChainKeys' need a 32-bit collision")
	far := 0
	for g := 0; g < len(keys); {
		s := ix.shardOf(keys[g])
		tab := s.tab.Load()
		first := tab.find(keys[g])
		require.GreaterOrEqual(t, first, 0)
		j := g + 1
		for ; j < len(keys) && continues(keys[j]); j++ {
			require.Truef(t, s == ix.shardOf(keys[j]), "block %d is not in its group's shard", j)
			slot := tab.find(keys[j])
			require.GreaterOrEqual(t, slot, 0)
			if d := (uint64(slot) - uint64(first)) & tab.mask; d > 2*keyGroup {
				far++ // pushed along by another group's run: possible, rare
			}
		}
		g = j
	}
	require.Less(t, far, len(keys)/8, "blocks far from their group's first block")
	var m Match
	ix.Match(seqs, &m)
	require.Equal(t, len(keys), m.Blocks(w, 0))
}

// twoWorkerIndex is a default index for maxWorkers workers with two of them registered.
func twoWorkerIndex(t *testing.T, maxWorkers int) (*Index, Worker, Worker) {
	opts := DefaultOptions()
	opts.MaxWorkers = maxWorkers
	ix, err := New(opts)
	require.NoError(t, err)
	a, _ := ix.AddWorker(0)
	b, _ := ix.AddWorker(0)
	return ix, a, b
}

// A group pushed from its home by another run is found block after block beside the block
// before it (slotHint), and when the run ahead goes, it is home; lookups are right throughout,
// on one-word and multi-word indexes.
func TestGroupPushedFromHome(t *testing.T) {
	for _, workers := range []int{64, 128} {
		r := testrand.New(t)
		ix, wa, wb := twoWorkerIndex(t, workers)
		// a fills the keyGroup slots from its home; x, one block with the same home, lands after them,
		// in b's home, so b's first group sits one slot on.
		a, b := testrand.Hashes(r, keyGroup), testrand.Hashes(r, 2*keyGroup)
		x := []uint64{r.Uint64()&^keyHomeMask | a[0]&keyHomeMask}
		b[0] = b[0]&^keyHomeMask | uint64(uint32(a[0])&^keyPosMask+keyGroup)
		ka, kx, kb := make([]uint64, len(a)), make([]uint64, 1), make([]uint64, len(b))
		ix.Store(wa, 0, 0, a, ka)
		ix.Store(wa, 0, 0, x, kx)
		ix.Store(wb, 0, 0, b, kb)
		require.Equal(t, ChainKeys(nil, a), ka)
		require.Equal(t, ChainKeys(nil, b), kb)
		tab := ix.shardOf(kb[0]).tab.Load()
		home := func(k uint64) int { return int(k & tab.mask) }
		pushed := false // usually x and b; a's first block when a growth reinserted x first
		for _, k := range append(append([]uint64{kx[0]}, ka...), kb[:keyGroup]...) {
			pushed = pushed || tab.find(k) != home(k)
		}
		require.True(t, pushed, "a run is pushed from home")
		var m Match
		for _, c := range []struct {
			seqs   []uint64
			w      Worker
			blocks int
		}{{a, wa, len(a)}, {x, wa, 1}, {b, wb, len(b)}, {b, wa, 0}, {a, wb, 0}} {
			ix.Match(c.seqs, &m)
			require.Equal(t, c.blocks, m.Blocks(c.w, 0))
		}
		ix.Remove(wa, 0, ka)
		ix.Remove(wa, 0, kx)
		tab = ix.shardOf(kb[0]).tab.Load()
		require.Equal(t, home(kb[0]), tab.find(kb[0]), "b is home")
		ix.Match(b, &m)
		require.Equal(t, len(b), m.Blocks(wb, 0))
		ix.Match(a, &m)
		require.Zero(t, m.Blocks(wa, 0))
	}
}

// Conversations that branch from a shared prefix mid-group: the first to arrive continues the
// group; each later one goes to its branch key (a home of its own, the same position) instead of
// queueing behind the others in the same slots, and keeps that key while held, whoever else
// stores it; the groups after the branch keep their keys. Lookups find all of them, before and
// after the first one goes, on one-word and multi-word indexes.
func TestSiblingsBranchToHomesOfTheirOwn(t *testing.T) {
	for _, workers := range []int{64, 128} {
		r := testrand.New(t)
		ix, w, other := twoWorkerIndex(t, workers)
		const branch = 3 // blocks of shared prefix: the branch is at position 3 of the group
		prefix := testrand.Hashes(r, branch)
		var sibs [][]uint64
		var keys [][]uint64
		for range 50 {
			c := append(append([]uint64(nil), prefix...), testrand.Hashes(r, 2*keyGroup)...)
			k := make([]uint64, len(c))
			ix.Store(w, 0, 0, c, k)
			sibs, keys = append(sibs, c), append(keys, k)
		}
		want := ChainKeys(nil, sibs[0])
		require.Equal(t, want, keys[0], "the first continues the group")
		for i := 1; i < len(sibs); i++ {
			require.Equal(t, want[:branch], keys[i][:branch], "the shared prefix has one key")
			chain := ChainKeys(nil, sibs[i])
			bk := BranchKey(chain[branch], sibs[i][branch])
			require.Equal(t, bk, keys[i][branch], "sibling %d goes to its branch key", i)
			require.Equal(t, uint64(branch), bk&keyPosMask, "at the same position")
			require.Equal(t, sibs[i][branch]&^keyPosMask|1<<63, bk&^keyPosMask, "with a home of its own")
			for j := branch + 1; j < keyGroup; j++ {
				require.Equal(t, ChildKey(keys[i][j-1], sibs[i][j]), keys[i][j], "the group follows it")
			}
			require.Equal(t, chain[keyGroup:], keys[i][keyGroup:], "the groups after it keep their keys")
		}
		// No run of siblings: the first sibling's branch block sits near its home.
		tab := ix.shardOf(want[branch]).tab.Load()
		slot := tab.find(want[branch])
		require.GreaterOrEqual(t, slot, 0)
		require.LessOrEqual(t, (uint64(slot)-want[branch])&tab.mask, uint64(2*keyGroup))

		var m Match
		check := func(from int) {
			t.Helper()
			for i := from; i < len(sibs); i++ {
				ix.Match(sibs[i], &m)
				require.Equal(t, len(sibs[i]), m.Blocks(w, 0), "sibling %d", i)
			}
		}
		check(0)
		// Another worker storing a sibling gets the key it has.
		k := make([]uint64, len(sibs[7]))
		ix.Store(other, 0, 0, sibs[7], k)
		require.Equal(t, keys[7], k)
		// The first sibling goes: the others are still found where they are, and the next new
		// sibling takes the free place in the group.
		ix.Remove(w, 0, keys[0][branch:])
		check(1)
		c := append(append([]uint64(nil), prefix...), testrand.Hashes(r, keyGroup)...)
		k = make([]uint64, len(c))
		ix.Store(w, 0, 0, c, k)
		require.Equal(t, ChainKeys(nil, c), k)
		check(1)
		ix.Match(c, &m)
		require.Equal(t, len(c), m.Blocks(w, 0))
		ix.Match(sibs[7], &m)
		require.Equal(t, len(sibs[7]), m.Blocks(other, 0))
	}
}
