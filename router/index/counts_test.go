package index

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/router/internal/testrand"
)

// Counts against a map under random increments and decrements of overlapping runs on a few
// workers: Decr reports exactly the blocks whose count reached zero, Len is the map's size
// throughout (the table grows and shrinks), and nothing is left at the end.
func TestCountsAgainstModel(t *testing.T) {
	r := testrand.New(t)
	c := NewCounts()
	type pair struct {
		seq uint64
		w   Worker
	}
	model := map[pair]int{}
	pool := testrand.Hashes(r, 500)
	var live [][]uint64 // runs counted, with their worker in the last element
	var gone []uint64
	for step := range 4000 {
		if len(live) == 0 || r.IntN(5) < 3 {
			a := r.IntN(len(pool))
			run := slices.Clone(pool[a:min(a+1+r.IntN(150), len(pool))])
			w := Worker(r.IntN(3) * 40)
			c.Incr(run, w)
			for _, h := range run {
				model[pair{h, w}]++
			}
			live = append(live, append(run, uint64(w)))
		} else {
			i := r.IntN(len(live))
			run, w := live[i][:len(live[i])-1], Worker(live[i][len(live[i])-1])
			live = slices.Delete(live, i, i+1)
			keys := make([]uint64, len(run))
			for j := range keys {
				keys[j] = uint64(j) // stand-ins the Decr hands back
			}
			gone = c.Decr(run, keys, w, gone[:0])
			var want []uint64
			for j, h := range run {
				if model[pair{h, w}]--; model[pair{h, w}] == 0 {
					delete(model, pair{h, w})
					want = append(want, uint64(j))
				}
			}
			require.True(t, slices.Equal(want, gone), "step %d: gone %v, want %v", step, gone, want)
		}
		require.Equal(t, len(model), c.Len(), "step %d", step)
	}
	for _, run := range live {
		c.Decr(run[:len(run)-1], run, Worker(run[len(run)-1]), nil)
	}
	require.Zero(t, c.Len())
	require.Equal(t, minSlots, c.sh.tab.Load().size(), "an empty table shrinks back")
}
