package mocker

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// kvModel is a deliberately naive KV cache: a ref-count map and the inactive blocks in a slice
// in LRU order. KV must make the same moves and evict the same blocks in the same order.
type kvModel struct {
	capacity int
	refs     map[uint64]int
	lru      []uint64 // inactive, least recently used first
	partial  int
	stored   []uint64
	evicted  []uint64
}

func (m *kvModel) used() int { return len(m.refs) + m.partial }

func (m *kvModel) room() bool {
	if m.used() < m.capacity {
		return true
	}
	if len(m.lru) == 0 {
		return false
	}
	h := m.lru[0]
	m.lru = m.lru[1:]
	delete(m.refs, h)
	m.evicted = append(m.evicted, h)
	return true
}

func (m *kvModel) use(hashes []uint64) (int, bool) {
	for i, h := range hashes {
		if r, ok := m.refs[h]; ok {
			if r == 0 {
				m.lru = slices.DeleteFunc(m.lru, func(x uint64) bool { return x == h })
			}
			m.refs[h] = r + 1
			continue
		}
		if !m.room() {
			return i, false
		}
		m.refs[h] = 1
		m.stored = append(m.stored, h)
	}
	return len(hashes), true
}

func (m *kvModel) deref(hashes []uint64) {
	for _, h := range slices.Backward(hashes) {
		if m.refs[h]--; m.refs[h] == 0 {
			m.lru = append(m.lru, h)
		}
	}
}

type recorder struct{ stored, evicted []uint64 }

func (r *recorder) Stored(h, _ uint64, _ int) { r.stored = append(r.stored, h) }
func (r *recorder) Evicted(h uint64)          { r.evicted = append(r.evicted, h) }

// Random Use / Deref / partial / Promote sequences: KV agrees with the naive model on every
// count and on which blocks are stored and evicted, in order.
func TestKVAgainstModel(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for round := range 50 {
		capacity := 4 + r.IntN(60)
		rec := &recorder{}
		kv := NewKV(capacity, rec)
		m := &kvModel{capacity: capacity, refs: map[uint64]int{}}
		var held [][]uint64 // references taken, to deref later
		partials := 0
		for range 400 {
			switch op := r.IntN(10); {
			case op < 4: // use a few blocks from a small universe (sharing happens)
				hashes := make([]uint64, 1+r.IntN(6))
				for i := range hashes {
					hashes[i] = uint64(1 + r.IntN(3*capacity))
				}
				hashes = slices.Compact(hashes)
				n, err := kv.Use(hashes, 0)
				mn, ok := m.use(hashes)
				require.Equal(t, mn, n, "round %d", round)
				require.Equal(t, ok, err == nil, "round %d", round)
				held = append(held, hashes[:n])
			case op < 7 && len(held) > 0:
				i := r.IntN(len(held))
				kv.Deref(held[i])
				m.deref(held[i])
				held = slices.Delete(held, i, i+1)
			case op < 8:
				err := kv.UsePartial()
				ok := m.room()
				require.Equal(t, ok, err == nil)
				if ok {
					m.partial++
					partials++
				}
			case op < 9 && partials > 0:
				h := uint64(1 + r.IntN(3*capacity))
				kv.Promote(h, 0, 0)
				m.partial--
				partials--
				if rf, ok := m.refs[h]; ok {
					if rf == 0 {
						m.lru = slices.DeleteFunc(m.lru, func(x uint64) bool { return x == h })
					}
					m.refs[h] = rf + 1
				} else {
					m.refs[h] = 1
					m.stored = append(m.stored, h)
				}
				held = append(held, []uint64{h})
			case partials > 0:
				kv.Destroy(1)
				m.partial--
				partials--
			}
			require.LessOrEqual(t, kv.Used(), capacity)
			require.Equal(t, m.used(), kv.Used())
			require.Equal(t, len(m.lru), kv.Inactive())
			require.Equal(t, kv.Used()-kv.Inactive(), kv.Active())
			for h, rf := range m.refs {
				require.Equal(t, rf, kv.Refs(h), "block %d", h)
				require.True(t, kv.Cached(h))
			}
		}
		require.Equal(t, m.stored, rec.stored, "round %d: stored blocks", round)
		require.Equal(t, m.evicted, rec.evicted, "round %d: evicted blocks (LRU order)", round)
	}
}

// A finished sequence is evicted from its tail, as vLLM does, so the cache never holds a block
// without the blocks before it (the router's index relies on it: router/index/keys.go).
func TestKVEvictsTailFirst(t *testing.T) {
	var rec recorder
	kv := NewKV(4, &rec)
	_, err := kv.Use([]uint64{1, 2, 3}, 0)
	require.NoError(t, err)
	kv.Deref([]uint64{1, 2, 3})
	_, err = kv.Use([]uint64{7, 8, 9}, 0)
	require.NoError(t, err)
	require.Equal(t, []uint64{3, 2}, rec.evicted)
	require.True(t, kv.Cached(1))
}

// The full cache refuses a block only when nothing inactive is left to evict.
func TestKVFull(t *testing.T) {
	kv := NewKV(2, nil)
	n, err := kv.Use([]uint64{1, 2, 3}, 0)
	require.Equal(t, 2, n)
	var full *ErrKVFull
	require.ErrorAs(t, err, &full)
	require.Equal(t, 2, full.Capacity)
	require.Error(t, kv.UsePartial())
	kv.Deref([]uint64{1})
	require.Equal(t, 1, kv.Free())
	require.NoError(t, kv.UsePartial()) // evicts 1
	require.False(t, kv.Cached(1))
	require.Equal(t, 0, kv.Free())
}
