package router

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"

	"dataplane/router/internal/testrand"
)

func readJSON(t testing.TB, name string, v any) {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, v))
}

func u64(t testing.TB, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	require.NoError(t, err)
	return v
}

// The XXH3 primitive against the reference C library (python3-xxhash), every length class.
func TestXXH3AgainstReference(t *testing.T) {
	var vecs []struct {
		Len  int    `json:"len"`
		Seed string `json:"seed"`
		Hash string `json:"hash"`
	}
	readJSON(t, "xxh3_vectors.json", &vecs)
	require.Greater(t, len(vecs), 1000)
	for _, v := range vecs {
		data := make([]byte, v.Len)
		for i := range data {
			data[i] = byte(i*131 + 7)
		}
		require.Equal(t, u64(t, v.Hash), xxh3.HashSeed(data, u64(t, v.Seed)), "len %d seed %s", v.Len, v.Seed)
	}
}

// Block and sequence hashes, with LoRA, salt and media, against the Python computation.
func TestBlockHashesAgainstReference(t *testing.T) {
	var cases []struct {
		BlockSize int      `json:"block_size"`
		Tokens    []uint32 `json:"tokens"`
		Lora      string   `json:"lora"`
		Salt      string   `json:"salt"`
		Media     []struct {
			Hash   string `json:"hash"`
			Offset int    `json:"offset"`
			Length int    `json:"length"`
		} `json:"media"`
		Local []string `json:"local"`
		Seq   []string `json:"seq"`
	}
	readJSON(t, "block_vectors.json", &cases)
	for i, c := range cases {
		h, err := NewHasher(c.BlockSize)
		require.NoError(t, err)
		var media []Media
		for _, m := range c.Media {
			// The generator draws ranges that may run past the prompt; clip them like a caller would.
			length := min(m.Length, len(c.Tokens)-m.Offset)
			if length > 0 {
				media = append(media, Media{Hash: u64(t, m.Hash), Offset: m.Offset, Length: length})
			}
		}
		seed := SeedFor(c.Lora, c.Salt)
		local, err := h.Local(nil, c.Tokens, seed, media)
		require.NoError(t, err)
		seq, err := h.Sequence(nil, c.Tokens, seed, media)
		require.NoError(t, err)
		require.Len(t, local, len(c.Local), "case %d", i)
		for j := range local {
			require.Equal(t, u64(t, c.Local[j]), local[j], "case %d local %d", i, j)
			require.Equal(t, u64(t, c.Seq[j]), seq[j], "case %d seq %d", i, j)
		}
	}
}

func TestSeedMixing(t *testing.T) {
	require.Equal(t, HashSeed, SeedFor("", ""))
	require.NotEqual(t, SeedFor("a", ""), SeedFor("", "a"), "LoRA and salt mix with different inner seeds")
	require.Equal(t, HashSeed+xxh3.HashString("x")+xxh3.HashStringSeed("y", 1), SeedFor("x", "y"))
}

func TestHasherErrors(t *testing.T) {
	_, err := NewHasher(0)
	require.Equal(t, ErrBlockSize(0), err)
	h, err := NewHasher(4)
	require.NoError(t, err)
	tokens := make([]uint32, 10)
	for _, m := range []Media{{Offset: -1, Length: 1}, {Offset: 0, Length: 0}, {Offset: 9, Length: 2}, {Offset: 11, Length: 1}} {
		_, err := h.Local(nil, tokens, HashSeed, []Media{{Offset: 0, Length: 1}, m})
		var bad *ErrBadMedia
		require.True(t, errors.As(err, &bad), "%+v", m)
		require.Equal(t, 1, bad.Item)
	}
	out, err := h.Sequence([]uint64{42}, tokens, HashSeed, nil)
	require.NoError(t, err)
	require.Len(t, out, 3, "appends two full blocks, keeps what was there")
	require.Equal(t, uint64(42), out[0])
}

// A prefix's hashes do not depend on what follows it, and a changed token changes its block and
// every later sequence hash but nothing before.
func TestSequencePrefixProperty(t *testing.T) {
	r := testrand.New(t)
	h, _ := NewHasher(16)
	tokens := make([]uint32, 16*20+5)
	for i := range tokens {
		tokens[i] = r.Uint32()
	}
	full, _ := h.Sequence(nil, tokens, HashSeed, nil)
	part, _ := h.Sequence(nil, tokens[:16*7+3], HashSeed, nil)
	require.Equal(t, full[:7], part)
	k := r.IntN(len(full))
	tokens[k*16+r.IntN(16)]++
	changed, _ := h.Sequence(nil, tokens, HashSeed, nil)
	require.Equal(t, full[:k], changed[:k])
	for i := k; i < len(full); i++ {
		require.NotEqual(t, full[i], changed[i])
	}
	// Chain over locals reproduces Sequence, including from a parent in the middle.
	local, _ := h.Local(nil, tokens, HashSeed, nil)
	tail := append([]uint64(nil), local[5:]...)
	Chain(tail, changed[4], true)
	require.Equal(t, changed[5:], tail)
}

// A prompt_embeds request as vLLM's KV events describe it (tokens of zeros, each block keyed by
// the SHA-256 of its slice of the tensor) hashes, with EmbedsDigestHash per block, to the
// sequence vllm_ref.py computes with python3-xxhash (../transfer/testdata/vllm).
func TestEmbedsBlocksAgainstReference(t *testing.T) {
	var v struct {
		Embeds struct {
			Rows      int `json:"rows"`
			BlockSize int `json:"block_size"`
			Cases     []struct {
				DType   string              `json:"dtype"`
				Digests []string            `json:"digests"`
				Seqs    map[string][]string `json:"router_sequence"`
			} `json:"cases"`
		} `json:"embeds"`
	}
	readJSON(t, "../../transfer/testdata/vllm/vectors.json", &v)
	e := v.Embeds
	require.NotEmpty(t, e.Cases)
	h, err := NewHasher(e.BlockSize)
	require.NoError(t, err)
	for _, c := range e.Cases {
		media := make([]Media, len(c.Digests))
		for i, d := range c.Digests {
			raw, err := hex.DecodeString(d)
			require.NoError(t, err)
			media[i] = Media{Hash: EmbedsDigestHash(raw), Offset: i * e.BlockSize, Length: e.BlockSize}
		}
		require.Len(t, c.Seqs, 2)
		for salt, want := range c.Seqs {
			got, err := h.Sequence(nil, make([]uint32, e.Rows), SeedFor("", salt), media)
			require.NoError(t, err)
			require.Len(t, got, len(want))
			for i := range want {
				require.Equal(t, u64(t, want[i]), got[i], "%s salt %q block %d", c.DType, salt, i)
			}
		}
	}
}

// Local passes media in order by a cursor; on random media, ordered or not, overlapping or not,
// every block gets exactly the items a full scan finds.
func TestLocalMediaCursorAgainstScan(t *testing.T) {
	r := testrand.New(t)
	h, err := NewHasher(8)
	require.NoError(t, err)
	for range 2000 {
		tokens := make([]uint32, r.IntN(100))
		var media []Media
		at := 0
		for range r.IntN(6) {
			m := Media{Hash: r.Uint64(), Offset: r.IntN(len(tokens) + 1), Length: 1 + r.IntN(20)}
			if r.IntN(2) == 0 { // one after another
				m.Offset = min(at+r.IntN(10), len(tokens))
				at = m.Offset + m.Length
			}
			if m.Offset+m.Length > len(tokens) || m.Length <= 0 {
				continue
			}
			media = append(media, m)
		}
		got, err := h.Local(nil, tokens, 7, media)
		require.NoError(t, err)
		for b := range got {
			var ids []uint64
			for _, m := range media {
				if m.Offset < (b+1)*8 && m.Offset+m.Length > b*8 {
					ids = append(ids, m.Hash)
				}
			}
			require.Equal(t, h.LocalBlock(tokens[b*8:(b+1)*8], 7, ids), got[b], "block %d of %+v", b, media)
		}
	}
}
