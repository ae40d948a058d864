package dataplane

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"

	"github.com/zeebo/xxh3"

	"dataplane/dataplane/sequence"
	"dataplane/native"
	"dataplane/router"
	"dataplane/transfer"
)

// A request sent as prompt_embeds (--handoff embeds) is cached by vLLM under token ids of zeros
// and, per full block, the SHA-256 of the block's rows of the tensor (transfer/NOTES.md §1);
// its KV events say so, and the router hashes them with router.EmbedsDigestHash. To route such
// a request by the blocks its engine will cache, the daemon hashes it the same way before
// sending it, and before its media are encoded: a block's rows are determined by where they
// come from (a text row by its token id, through the embedding table; a media row by its item's
// key and row), so a block's digest is remembered by that description (digestCache). At routing
// time a block is known from the cache, or computed then when its rows are at hand (text rows
// always; an item's once its features are, a reuse hit); the first block that is neither ends
// what can match (the chain hashes every later block with it). After the merge the blocks that
// were not known are hashed from the merged sequence and remembered, so the next request with
// the same prefix (a conversation's next turn, another tenant's same system prompt) finds them.
// Text-only requests go as token ids and never come here.

// rowSrc is where one row of a merged sequence comes from: text (item < 0, v the token id) or
// row v of media item `item`.
type rowSrc struct {
	item int32
	v    uint32
}

// blockKey names a block by the sources of its rows (XXH3-128 of their description).
type blockKey struct{ hi, lo uint64 }

// embedsPlan is one request's blocks as vLLM keys them: their sources' keys, which digests are
// known, and the digests.
type embedsPlan struct {
	pm      *sequence.PositionMap // the placement it was planned for (a dropped item re-places)
	keys    []blockKey
	known   []bool
	digests []transfer.Digest
	// routed is how many leading blocks the router got real hashes for.
	routed int
}

// rowSources lists where every row of pm's merged sequence comes from.
func rowSources(pm *sequence.PositionMap) []rowSrc {
	src := make([]rowSrc, pm.Len)
	t, row := 0, 0
	for _, sp := range pm.Spans {
		for ; row < sp.Start; row++ {
			src[row] = rowSrc{item: -1, v: uint32(pm.TextIDs[t])}
			t++
		}
		for ; row < sp.End; row++ {
			src[row] = rowSrc{item: int32(sp.Item), v: uint32(row - sp.Start)}
		}
	}
	for ; row < pm.Len; row++ {
		src[row] = rowSrc{item: -1, v: uint32(pm.TextIDs[t])}
		t++
	}
	return src
}

// blockKeys names every full block of src (bs rows each); itemHash[i] identifies item i's
// features (its key).
func blockKeys(src []rowSrc, itemHash []uint64, bs int) []blockKey {
	keys := make([]blockKey, len(src)/bs)
	buf := make([]byte, 0, 13*bs)
	for b := range keys {
		buf = buf[:0]
		for _, r := range src[b*bs : (b+1)*bs] {
			if r.item < 0 {
				buf = append(buf, 0)
				buf = binary.LittleEndian.AppendUint32(buf, r.v)
				continue
			}
			buf = append(buf, 1)
			buf = binary.LittleEndian.AppendUint64(buf, itemHash[r.item])
			buf = binary.LittleEndian.AppendUint32(buf, r.v)
		}
		h := xxh3.Hash128(buf)
		keys[b] = blockKey{h.Hi, h.Lo}
	}
	return keys
}

// rowsAt gives the bytes of the rows a block's digest is computed from: text rows from the
// table, media rows from an item's features; nil when an item's features are not at hand.
type rowsAt func(r rowSrc) []byte

// planEmbeds hashes a request's full blocks for routing: each block's digest from the cache,
// else computed from its rows (rows nil for a block whose rows are not all at hand), until the
// first block that is neither. It returns the plan and the router's media entries: one per
// full block, the digest's hash, or for blocks past the known ones a hash that matches nothing
// (unique, derived from id).
func planEmbeds(src []rowSrc, keys []blockKey, bs int, cache *digestCache, rows rowsAt, id string) (*embedsPlan, []router.Media) {
	p := &embedsPlan{keys: keys, known: make([]bool, len(keys)), digests: make([]transfer.Digest, len(keys))}
	media := make([]router.Media, len(keys))
	var h hash.Hash
	var parts [][]byte
	broken := false
	for b, k := range keys {
		if !broken {
			d, ok := cache.get(k)
			if !ok {
				if h == nil {
					h, parts = sha256.New(), make([][]byte, bs)
				}
				ok = true
				for i, r := range src[b*bs : (b+1)*bs] {
					if parts[i] = rows(r); parts[i] == nil {
						ok = false
						break
					}
				}
				if ok {
					d = transfer.RowsDigest(h, parts)
					cache.put(k, d)
				}
			}
			if ok {
				p.known[b], p.digests[b] = true, d
				p.routed = b + 1
				media[b] = router.Media{Hash: router.EmbedsDigestHash(d[:]), Offset: b * bs, Length: bs}
				continue
			}
			broken = true
		}
		var tag [8]byte
		binary.LittleEndian.PutUint64(tag[:], uint64(b))
		media[b] = router.Media{Hash: xxh3.HashString128(id + string(tag[:])).Lo, Offset: b * bs, Length: bs}
	}
	return p, media
}

// fill hashes the blocks of the merged sequence m the plan did not know and remembers them.
func (p *embedsPlan) fill(m native.Matrix, bs, threads int, cache *digestCache) error {
	missing := false
	for _, k := range p.known {
		missing = missing || !k
	}
	if !missing {
		return nil
	}
	if err := transfer.BlockDigests(m, bs, threads, func(b int) bool { return !p.known[b] }, p.digests); err != nil {
		return err
	}
	for b, k := range p.known {
		if !k {
			cache.put(p.keys[b], p.digests[b])
		}
	}
	return nil
}

// digestCache remembers block digests by their rows' description, bounded: two generations of
// at most max/2 entries each (48 bytes an entry); when the newer fills, the older is dropped.
// Safe for concurrent use.
type digestCache struct {
	mu       sync.Mutex
	max      int
	cur, old map[blockKey]transfer.Digest
}

// digestCacheEntries bounds the cache: 256 Ki blocks of 16 tokens (4 Mi prompt tokens of
// distinct text and media), about 25 MB at most with the maps' overhead.
const digestCacheEntries = 1 << 18

func newDigestCache(max int) *digestCache {
	return &digestCache{max: max, cur: map[blockKey]transfer.Digest{}, old: map[blockKey]transfer.Digest{}}
}

func (c *digestCache) get(k blockKey) (transfer.Digest, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.cur[k]; ok {
		return d, true
	}
	d, ok := c.old[k]
	if ok {
		c.add(k, d)
	}
	return d, ok
}

func (c *digestCache) put(k blockKey, d transfer.Digest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.add(k, d)
}

func (c *digestCache) add(k blockKey, d transfer.Digest) {
	if _, ok := c.cur[k]; !ok && len(c.cur) >= max(c.max/2, 1) {
		c.old, c.cur = c.cur, c.old
		clear(c.cur)
	}
	delete(c.old, k)
	c.cur[k] = d
}

func (c *digestCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.cur) + len(c.old)
}
