package dataplane

import (
	"crypto/sha256"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/sequence"
	"dataplane/native"
	"dataplane/router"
	"dataplane/transfer"
)

// embedsCase is a merged sequence built by hand: text rows from a table, one item's rows.
type embedsCase struct {
	table, item native.Matrix
	pm          *sequence.PositionMap
	merged      native.Matrix
}

func newEmbedsCase(t testing.TB, r *rand.Rand, hidden, vocab, text, start, itemRows int) embedsCase {
	rowBytes := hidden * 2
	fill := func(rows int) native.Matrix {
		m := native.Matrix{Data: make([]byte, rows*rowBytes), DType: native.BF16, Rows: rows, Cols: hidden}
		for i := range m.Data {
			m.Data[i] = byte(r.Uint32())
		}
		return m
	}
	c := embedsCase{table: fill(vocab), item: fill(itemRows)}
	ids := make([]int32, text)
	for i := range ids {
		ids[i] = int32(r.IntN(vocab))
	}
	c.pm = &sequence.PositionMap{Len: text + itemRows, TextIDs: ids,
		Spans: []sequence.MediaSpan{{Item: 0, MediaID: "img", Start: start, End: start + itemRows}}}
	c.merged = native.Matrix{Data: make([]byte, c.pm.Len*rowBytes), DType: native.BF16, Rows: c.pm.Len, Cols: hidden}
	tx := 0
	for row := range c.pm.Len {
		dst := c.merged.Data[row*rowBytes : (row+1)*rowBytes]
		if row >= start && row < start+itemRows {
			copy(dst, c.item.Data[(row-start)*rowBytes:])
			continue
		}
		copy(dst, c.table.Data[int(ids[tx])*rowBytes:])
		tx++
	}
	return c
}

// rows reads text rows from the table and, when ready, the item's rows.
func (c embedsCase) rows(ready bool) rowsAt {
	row := c.table.Cols * 2
	return func(rs rowSrc) []byte {
		if rs.item < 0 {
			return c.table.Data[int(rs.v)*row : (int(rs.v)+1)*row]
		}
		if !ready {
			return nil
		}
		return c.item.Data[int(rs.v)*row : (int(rs.v)+1)*row]
	}
}

// A request's blocks are hashed before routing exactly as vLLM hashes the tensor it receives
// (BlockDigests over the merged sequence): text blocks from the table at once, the item's once
// its features are there; past the first block that cannot be known, nothing matches. After
// the merge the rest are remembered, so the same prefix is known in full the next time, before
// its media are encoded.
func TestPlanEmbedsMatchesMergedDigests(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const bs = 16
	c := newEmbedsCase(t, r, 64, 50, 100, 37, 40) // 140 rows: 8 full blocks, the item in blocks 2..4
	want := make([]transfer.Digest, c.pm.Len/bs)
	require.NoError(t, transfer.BlockDigests(c.merged, bs, 1, nil, want))
	src := rowSources(c.pm)
	keys := blockKeys(src, []uint64{42}, bs)
	require.Len(t, keys, 8)

	cache := newDigestCache(1 << 10)
	p, media := planEmbeds(src, keys, bs, cache, c.rows(true), "req-1")
	require.Equal(t, 8, p.routed)
	for b := range want {
		require.True(t, p.known[b])
		require.Equal(t, want[b], p.digests[b], "block %d", b)
		require.Equal(t, router.Media{Hash: router.EmbedsDigestHash(want[b][:]), Offset: b * bs, Length: bs}, media[b])
	}

	// The item still encoding, a cold cache: blocks 0 and 1 (text) are known, the rest not.
	cold := newDigestCache(1 << 10)
	p, media = planEmbeds(src, keys, bs, cold, c.rows(false), "req-2")
	require.Equal(t, 2, p.routed)
	require.Equal(t, []bool{true, true, false, false, false, false, false, false}, p.known)
	for b := 2; b < 8; b++ {
		require.NotEqual(t, router.EmbedsDigestHash(want[b][:]), media[b].Hash, "block %d must match nothing", b)
	}
	_, again := planEmbeds(src, keys, bs, newDigestCache(8), c.rows(false), "req-3")
	require.NotEqual(t, media[5].Hash, again[5].Hash, "unknown blocks differ between requests")
	require.NoError(t, p.fill(c.merged, bs, 2, cold))
	require.Equal(t, want, p.digests)
	require.Equal(t, 8, cold.len())

	// Next time: everything from the cache, the item not encoded yet.
	p, media = planEmbeds(src, keys, bs, cold, c.rows(false), "req-4")
	require.Equal(t, 8, p.routed)
	for b := range want {
		require.Equal(t, router.EmbedsDigestHash(want[b][:]), media[b].Hash)
	}
	// Another item (another key) in the same place is another block.
	other := blockKeys(src, []uint64{43}, bs)
	require.Equal(t, keys[:2], other[:2])
	require.NotEqual(t, keys[2], other[2])
}

func TestDigestCacheBounded(t *testing.T) {
	c := newDigestCache(100)
	for i := range 1000 {
		c.put(blockKey{uint64(i), 1}, transfer.Digest{byte(i)})
		require.LessOrEqual(t, c.len(), 100)
	}
	d, ok := c.get(blockKey{999, 1})
	require.True(t, ok)
	require.Equal(t, byte(999%256), d[0])
	_, ok = c.get(blockKey{0, 1})
	require.False(t, ok)
}

// What hashing a prompt_embeds request costs before routing: a 4,096-row prompt (3,520 text
// rows and a 576-row picture at row 512) of hidden 4,096 in bf16 (32 MiB merged), its digests
// cold (text blocks hashed from the table, the picture's from its features) and warm (every
// block from the cache), beside SHA-256 over the same 32 MiB, the ceiling (x-sha256). Text-only
// requests never come here.
//
//	go test -run '^$' -bench EmbedsRoute -count 6 ./dataplane | go tool benchstat -col /cache -
func BenchmarkEmbedsRoute(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	const bs = 16
	c := newEmbedsCase(b, r, 4096, 2048, 3520, 512, 576)
	src := rowSources(c.pm)
	b.Run("cache=cold", func(b *testing.B) {
		b.SetBytes(int64(len(c.merged.Data)))
		for b.Loop() {
			keys := blockKeys(src, []uint64{7}, bs)
			planEmbeds(src, keys, bs, newDigestCache(1<<12), c.rows(true), "r")
		}
	})
	warm := newDigestCache(1 << 12)
	planEmbeds(src, blockKeys(src, []uint64{7}, bs), bs, warm, c.rows(true), "r")
	b.Run("cache=warm", func(b *testing.B) {
		b.SetBytes(int64(len(c.merged.Data)))
		for b.Loop() {
			keys := blockKeys(src, []uint64{7}, bs)
			planEmbeds(src, keys, bs, warm, c.rows(false), "r")
		}
	})
	b.Run("cache=x-sha256", func(b *testing.B) {
		b.SetBytes(int64(len(c.merged.Data)))
		for b.Loop() {
			_ = sha256.Sum256(c.merged.Data)
		}
	})
}
