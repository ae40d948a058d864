package features

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// newRand returns a generator with a fresh seed, or the one in FEATURES_SEED (as logged by a
// failing run) to reproduce it.
func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	if v := os.Getenv("FEATURES_SEED"); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 0, 64)
		require.NoError(t, err, "FEATURES_SEED")
	}
	t.Logf("random seed %#x", seed)
	return rand.New(rand.NewPCG(seed, 4))
}

// carverRef is the reference: one bool per unit.
type carverRef struct {
	taken []bool
	live  map[int]int // allocation start → units
}

func (r *carverRef) take(t *testing.T, off, n int) {
	t.Helper()
	require.LessOrEqual(t, off+n, len(r.taken), "allocation [%d, %d) beyond %d units", off, off+n, len(r.taken))
	for u := off; u < off+n; u++ {
		require.False(t, r.taken[u], "unit %d given out twice (allocation at %d of %d)", u, off, n)
		r.taken[u] = true
	}
	r.live[off] = n
}

func (r *carverRef) give(off, lo, hi int) {
	for u := lo; u < hi; u++ {
		r.taken[u] = false
	}
	if lo == off {
		delete(r.live, off)
	} else {
		r.live[off] = lo - off
	}
}

// largest is the longest run of free units: what the carver must be able to give.
func (r *carverRef) largest() int {
	best, run := 0, 0
	for _, t := range r.taken {
		if t {
			run = 0
			continue
		}
		run++
		best = max(best, run)
	}
	return best
}

func (r *carverRef) free() int {
	n := 0
	for _, t := range r.taken {
		if !t {
			n++
		}
	}
	return n
}

// checkExtents compares the carver with the reference: free units, and the longest free
// extent equal to the longest free run (so free neighbours are always merged).
func checkExtents(t *testing.T, e *extents, ref *carverRef) {
	t.Helper()
	require.Equal(t, ref.free(), e.free, "free units")
	require.Equal(t, ref.largest(), e.largestFree(), "longest free extent")
}

// runCarverOps drives the extent carver and the reference with ops from next (alloc, free,
// shrink in place).
func runCarverOps(t *testing.T, units int, next func() (op, a, c int, ok bool)) {
	b := newExtents(units)
	ref := &carverRef{taken: make([]bool, units), live: map[int]int{}}
	checkExtents(t, b, ref)
	var offs []int
	for {
		op, a, c, ok := next()
		if !ok {
			break
		}
		switch {
		case op == 0 || len(offs) == 0: // alloc a+1 units (capped)
			n := 1 + a%units
			off, ok := b.alloc(n)
			require.Equal(t, n <= ref.largest(), ok, "alloc(%d) with longest free run %d", n, ref.largest())
			if ok {
				ref.take(t, off, n)
				offs = append(offs, off)
			}
		case op == 1: // free one
			i := a % len(offs)
			off := offs[i]
			b.release(off, off+ref.live[off])
			ref.give(off, off, off+ref.live[off])
			offs = append(offs[:i], offs[i+1:]...)
		default: // shrink one to c+1 units, in place
			off := offs[a%len(offs)]
			n := ref.live[off]
			keep := 1 + c%n
			b.release(off+keep, off+n)
			ref.give(off, off+keep, off+n)
		}
		checkExtents(t, b, ref)
	}
	for _, off := range offs {
		b.release(off, off+ref.live[off])
		ref.give(off, off, off+ref.live[off])
	}
	checkExtents(t, b, ref)
	require.Equal(t, units, b.largestFree(), "everything back in one extent")
}

func TestExtentsAgainstReference(t *testing.T) {
	r := newRand(t)
	for _, units := range []int{1, 2, 3, 7, 64, 100, 257} {
		steps := 0
		runCarverOps(t, units, func() (int, int, int, bool) {
			steps++
			return r.IntN(3), r.IntN(1 << 20), r.IntN(1 << 20), steps < 400
		})
	}
}

// Exact sizes: 72 units (a 4.5 MiB image in 64 KiB blocks) take 72; a freed extent merges with
// free neighbours on both sides.
func TestExtentsExactFit(t *testing.T) {
	e := newExtents(128)
	a, ok := e.alloc(72)
	require.True(t, ok)
	b, ok := e.alloc(40)
	require.True(t, ok)
	require.Equal(t, [2]int{0, 72}, [2]int{a, b})
	require.Equal(t, 16, e.largestFree())
	_, ok = e.alloc(17)
	require.False(t, ok)
	e.release(0, 72)
	c, ok := e.alloc(50) // first fit in the freed extent
	require.True(t, ok)
	require.Zero(t, c)
	e.release(72, 112) // merges with [112, 128) after it and [50, 72) before it
	require.Equal(t, 78, e.largestFree())
	e.release(0, 50)
	require.Equal(t, 128, e.largestFree())
	require.Equal(t, 128, e.free)
}

func FuzzExtents(f *testing.F) {
	f.Add(uint16(100), []byte{0, 10, 0, 0, 200, 0, 1, 0, 0, 2, 0, 3})
	f.Add(uint16(1), []byte{0, 0, 0})
	f.Add(uint16(4096), []byte{0, 255, 9, 0, 1, 2, 2, 1, 7, 1, 0, 0})
	f.Fuzz(func(t *testing.T, units uint16, ops []byte) {
		if units == 0 || units > 4096 {
			return
		}
		runCarverOps(t, int(units), func() (int, int, int, bool) {
			if len(ops) < 3 {
				return 0, 0, 0, false
			}
			op, a, c := int(ops[0]%3), int(ops[1])*int(units)/256, int(ops[2])
			ops = ops[3:]
			return op, a, c, true
		})
	})
}
