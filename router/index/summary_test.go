package index

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/router/internal/testrand"
)

// checkSummaries compares each shard's group summaries (summary.go) with summaries computed
// afresh from its slots (quiescent): grouped by home bits, a group has one when its first
// position holds exactly one key, each other position exactly one child key, and some worker
// holds them all.
func (ix *Index) checkSummaries() error {
	for si := range ix.shards {
		s := &ix.shards[si]
		st := s.sum.Load()
		if st == nil {
			continue
		}
		t := s.tab.Load()
		at := map[uint64][][2]uint64{} // home bits → keys there (and masks) a walk could read
		ovf := map[uint64]bool{}       // (the id layout: keys whose "mask" is their bitmap's hash)
		for i := range t.size() {
			k := t.slots[i*2].Load()
			if k != 0 && (keyPos(k) == 0 || continues(k)) {
				h := t.slots[i*2+1].Load()
				if ix.ids != nil && overflowed(h) {
					h, ovf[k] = ix.ids.bitmap(s.ids.pool.Load(), h>>32)[bmHash].Load(), true
				}
				at[k&keyHomeMask] = append(at[k&keyHomeMask], [2]uint64{k, h})
			}
		}
		want := map[uint64]uint64{} // summary key → holders
		for h, first := range at {
			if keyPos(h) != 0 || len(first) != 1 {
				continue
			}
			var ks [keyGroup]uint64
			cum := ^uint64(0)
			for q := range keyGroup {
				e := at[h+uint64(q)]
				if len(e) != 1 {
					cum = 0
					break
				}
				ks[q], cum = e[0][0], cum&e[0][1]
				if ix.ids != nil { // the id layout: the same holders in every block, or none
					if e[0][1] != first[0][1] || ovf[ks[q]] != ovf[first[0][0]] {
						cum = 0
						break
					}
					cum = e[0][1]
				}
			}
			if ix.ids != nil && cum != 0 {
				k := sumKey(ks[0], ks[keyGroup-1])
				if ovf[ks[0]] {
					k |= sumOverflow
				}
				want[k] = cum
				continue
			}
			if cum != 0 {
				k := sumKey(ks[0], ks[keyGroup-1])
				if first[0][1] == cum {
					k |= sumFirst
				}
				want[k] = cum
			}
		}
		got := map[uint64]uint64{}
		for i := range st.size() {
			if k := st.slots[i*2].Load(); k != 0 {
				got[k] = st.slots[i*2+1].Load()
			}
		}
		if int(st.used.Load()) != len(got) {
			return fmt.Errorf("shard %d: summary table counts %d, holds %d", si, st.used.Load(), len(got))
		}
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if got[k] != want[k] {
				return fmt.Errorf("shard %d: group %#x: summary %#x, want %#x", si, k&keyHomeMask, got[k], want[k])
			}
		}
		for _, k := range slices.Sorted(maps.Keys(got)) {
			if _, ok := want[k]; !ok {
				return fmt.Errorf("shard %d: group %#x: summary %#x that should not be there", si, k&keyHomeMask, got[k])
			}
		}
		for k := range got {
			if st.find(k) < 0 {
				return fmt.Errorf("shard %d: summary %#x not found by its key", si, k)
			}
		}
	}
	return nil
}

// Summaries follow a group through stores, a partial remove, a branch and a clear, and a lookup
// reads them: the whole-group fast path gives the walk's answer.
func TestSummaryFollowsGroup(t *testing.T) {
	ix, err := New(Options{MaxWorkers: 64, Tiers: 1, Shards: 2})
	require.NoError(t, err)
	a, _ := ix.AddWorker(0)
	b, _ := ix.AddWorker(0)
	r := testrand.New(t)
	chain := testrand.Hashes(r, 3*keyGroup)
	sums := func() int64 {
		var n int64
		for i := range ix.shards {
			n += ix.shards[i].sum.Load().used.Load()
		}
		return n
	}
	var m Match
	check := func(wantA, wantB int) {
		t.Helper()
		require.NoError(t, ix.checkSummaries())
		ix.Match(chain, &m)
		require.Equal(t, wantA, m.Blocks(a, 0), "worker a")
		require.Equal(t, wantB, m.Blocks(b, 0), "worker b")
	}
	const g, half, quarter = keyGroup, keyGroup / 2, keyGroup / 4
	keys := make([]uint64, len(chain))
	ix.Store(a, 0, 0, chain, keys)
	require.EqualValues(t, 3, sums())
	// A lookup computes each group's summary key from the sequence hashes alone (sumKeyOf) and
	// finds the summary the writer keyed by the stored keys.
	for q := 0; q < len(chain); q += g {
		sk := sumKeyOf((*[keyGroup]uint64)(chain[q:]))
		st := ix.shardOf(sk).sum.Load()
		cum, first := readSum(&st.slots[0], st.mask, sk)
		require.Equal(t, uint64(1)<<a, cum, "group %d", q/g)
		require.True(t, first)
	}
	check(3*g, 0)
	ix.Store(b, 0, 0, chain[:g+half], nil)
	require.EqualValues(t, 3, sums())
	check(3*g, g+half)
	// b drops the tail of its second group: that group's summary keeps a only.
	ix.Remove(b, 0, keys[g+quarter:g+half])
	check(3*g, g+quarter)
	// a drops a block in the middle: the group's summary goes (b no longer holds it either).
	ix.Remove(a, 0, keys[g+half+1:g+half+2])
	require.EqualValues(t, 2, sums())
	check(g+half+1, g+quarter)
	// A sibling branching off block 4 goes to its branch key and leaves the group as it was.
	sib := append(slices.Clone(chain[:5]), testrand.Hashes(r, 2*g-5)...)
	ix.Store(b, 0, keys[4], sib[5:], nil)
	check(g+half+1, g+quarter)
	ix.ClearWorker(a)
	check(0, g+quarter)
	ix.ClearWorker(b)
	require.EqualValues(t, 0, sums())
	require.NoError(t, ix.checkSummaries())
}

// A lookup through summaries allocates nothing once its Match has grown to the index's layout:
// its scratch (summary keys, holders, prefetch addresses) lives on the stack.
func TestMatchWithSummariesAllocatesNothing(t *testing.T) {
	ix, err := New(DefaultOptions())
	require.NoError(t, err)
	r := testrand.New(t)
	chain := testrand.Hashes(r, 600) // more than one window of summaries
	for range 4 {
		w, _ := ix.AddWorker(0)
		ix.Store(w, 0, 0, chain, nil)
	}
	var m Match
	ix.Match(chain, &m)
	require.Equal(t, 600, m.Blocks(0, 0))
	require.Zero(t, testing.AllocsPerRun(100, func() { ix.Match(chain, &m) }))
}

// Prompts longer than one window of summaries (sumWindow groups): the lookup reads the next
// window's summaries while it walks, and must agree with the model across the boundary.
func TestIndexAgainstModelLongPrompts(t *testing.T) {
	r := testrand.New(t)
	for _, l := range []layout{{Options{MaxWorkers: 64, Tiers: 1, Shards: 4}, false}, {Options{MaxWorkers: 10_000, Tiers: 1, Shards: 4}, true}} {
		t.Run(l.String(), func(t *testing.T) {
			ix, err := l.build()
			require.NoError(t, err)
			steps := 300
			if l.ids { // (the same windows and boundaries; under -race the 10,000 worker slots cost)
				steps = 150
			}
			require.NoError(t, checkAgainstModel(r, ix, newUniverse(r, 8, 3*sumWindow*keyGroup+5), steps))
		})
	}
}
