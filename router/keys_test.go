package router

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Keys by the definition in keys.go, written out plainly: block i of a sequence belongs to
// group i/8, whose home is the low 32 bits of its first block's sequence hash with the low 3
// bits cleared; the key is the high 32 bits of the block's own hash and home + i%8.
func TestChainKeysByDefinition(t *testing.T) {
	r := newRand(t)
	seqs := randomHashes(r, 300)
	keys := ChainKeys(nil, seqs)
	require.Len(t, keys, len(seqs))
	for i, k := range keys {
		home := uint32(seqs[i/8*8]) &^ 7
		want := seqs[i]&0xffff_ffff_0000_0000 | uint64(home+uint32(i%8))
		require.Equalf(t, want, k, "block %d", i)
	}
	// A writer that knows only the parent's key agrees, from any point of the chain.
	for i := 1; i < len(seqs); i++ {
		require.Equal(t, keys[i], ChildKey(keys[i-1], true, seqs[i]))
	}
	require.Equal(t, keys[0], ChildKey(12345, false, seqs[0]), "no parent: a new group")
	// Keys of a prefix are a prefix of the keys.
	require.Equal(t, keys[:37], ChainKeys(nil, seqs[:37]))
	// Home arithmetic stays in the low 32 bits: a home of 0xffff_fff8 does not carry upward.
	seqs[0] = 0x1234_5678_ffff_fffa
	keys = ChainKeys(keys[:0], seqs[:8])
	require.Equal(t, uint64(0x1234_5678_ffff_fff8), keys[0])
	require.Equal(t, seqs[7]&0xffff_ffff_0000_0000|0xffff_ffff, keys[7])
}

// The point of the keys: a group of 8 blocks sits in one shard, in adjacent slots (the slots
// of a one-word index are 16 bytes: 8 of them are two cache lines), so a lookup misses the cache
// once per group rather than once per block.
func TestGroupsShareShardAndRun(t *testing.T) {
	r := newRand(t)
	ix, err := NewIndex(DefaultIndexOptions())
	require.NoError(t, err)
	w, _ := ix.AddWorker(0)
	for range 2000 { // fill the tables to a realistic size and load
		require.Positive(t, ix.Store(w, 0, ChainKeys(nil, randomHashes(r, 64))))
	}
	keys := ChainKeys(nil, randomHashes(r, 256))
	ix.Store(w, 0, keys)
	far := 0
	for g := 0; g < len(keys); g += keyGroup {
		s := ix.shardOf(keyOf(keys[g]))
		tab := s.tab.Load()
		first := tab.find(keyOf(keys[g]))
		require.GreaterOrEqual(t, first, 0)
		for j := g + 1; j < g+keyGroup; j++ {
			require.Truef(t, s == ix.shardOf(keyOf(keys[j])), "block %d is not in its group's shard", j)
			slot := tab.find(keyOf(keys[j]))
			require.GreaterOrEqual(t, slot, 0)
			if d := (uint64(slot) - uint64(first)) & tab.mask; d > 2*keyGroup {
				far++ // pushed along by another group's run: possible, rare
			}
		}
	}
	require.Less(t, far, len(keys)/8, "blocks far from their group's first block")
	var m Match
	ix.Match(keys, &m)
	require.Equal(t, len(keys), m.Blocks(w, 0))
}

// Two groups with the same home: one lands in the slots after the other, so each of its blocks
// is found beside the block before it (slotHint), and when the first group goes, b is home; lookups are right throughout, on one-word and multi-word indexes.
func TestGroupPushedFromHome(t *testing.T) {
	for _, workers := range []int{64, 128} {
		r := newRand(t)
		opts := DefaultIndexOptions()
		opts.MaxWorkers = workers
		ix, err := NewIndex(opts)
		require.NoError(t, err)
		wa, _ := ix.AddWorker(0)
		wb, _ := ix.AddWorker(0)
		a, b := randomHashes(r, 2*keyGroup), randomHashes(r, 2*keyGroup)
		b[0] = b[0]&^keyHomeMask | a[0]&keyHomeMask // same home, different block
		ka, kb := ChainKeys(nil, a), ChainKeys(nil, b)
		require.Equal(t, ka[0]&keyHomeMask, kb[0]&keyHomeMask)
		require.NotEqual(t, ka[0], kb[0])
		ix.Store(wa, 0, ka)
		ix.Store(wb, 0, kb)
		tab := ix.shardOf(keyOf(kb[0])).tab.Load()
		home := int(kb[0] & tab.mask)
		// Usually b's group; a's when b's wrapped around the table's end and a growth
		// reinserted b's first.
		require.True(t, tab.find(keyOf(ka[0])) != home || tab.find(keyOf(kb[0])) != home, "a group is pushed from home")
		var m Match
		for _, c := range []struct {
			keys   []uint64
			w      Worker
			blocks int
		}{{ka, wa, len(ka)}, {kb, wb, len(kb)}, {kb, wa, 0}, {ka, wb, 0}} {
			ix.Match(c.keys, &m)
			require.Equal(t, c.blocks, m.Blocks(c.w, 0))
		}
		ix.Remove(wa, 0, ka)
		tab = ix.shardOf(keyOf(kb[0])).tab.Load()
		require.Equal(t, int(kb[0]&tab.mask), tab.find(keyOf(kb[0])), "b is home")
		ix.Match(kb, &m)
		require.Equal(t, len(kb), m.Blocks(wb, 0))
		ix.Match(ka, &m)
		require.Zero(t, m.Blocks(wa, 0))
	}
}
