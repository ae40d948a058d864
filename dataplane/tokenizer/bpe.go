package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
)

// bpe is a byte-level BPE model. Vocabulary strings are kept as the raw bytes they stand for,
// so a pre-token is merged straight from the input bytes.
type bpe struct {
	vocab        map[string]int32 // raw bytes -> id
	merges       map[uint64]merge // pairKey(left id, right id) -> rank and merged id
	byteID       [256]int32       // the id of each single byte
	ignoreMerges bool             // a pre-token that is itself in the vocabulary is one token (Llama-3)
	scratch      sync.Pool        // *bpeScratch, one per concurrent word merge
	cache        wordCache
}

// wordCache remembers the ids of recently merged words: real text repeats its words, and a
// hit costs one hash and one comparison instead of a merge. It is direct-mapped and lock-free:
// cacheSlots slots, each holding the last word (at most cacheMaxWord bytes) that hashed to it,
// so it is bounded (about 1 MiB) and safe for concurrent Encodes; a collision just overwrites.
type wordCache struct {
	seed  maphash.Seed
	slots [cacheSlots]atomic.Pointer[cacheEntry]
}

const (
	cacheSlots   = 1 << 14
	cacheMaxWord = 32
)

type cacheEntry struct {
	word string
	ids  []int32
}

type merge struct {
	rank int32 // position in the merges list: lower merges first
	id   int32 // the id of the merged token
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// naiveMax is the longest word merged by the quadratic scan; longer words use the heap. The
// scan is faster for the short words that make up real text; the heap bounds the cost of
// pathological ones (a megabyte of one letter is one pre-token).
const naiveMax = 48

// appendWord appends the ids of one pre-token (raw bytes, non-empty).
func (m *bpe) appendWord(dst []int32, w string) []int32 {
	if len(w) == 1 {
		return append(dst, m.byteID[w[0]])
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[w]; ok {
			return append(dst, id)
		}
	}
	var slot *atomic.Pointer[cacheEntry]
	if len(w) <= cacheMaxWord {
		slot = &m.cache.slots[maphash.String(m.cache.seed, w)&(cacheSlots-1)]
		if e := slot.Load(); e != nil && e.word == w {
			return append(dst, e.ids...)
		}
	}
	sc, _ := m.scratch.Get().(*bpeScratch)
	if sc == nil {
		sc = new(bpeScratch)
	}
	start := len(dst)
	if len(w) <= naiveMax {
		dst = m.mergeNaive(dst, w, sc)
	} else {
		dst = m.mergeHeap(dst, w, sc)
	}
	m.scratch.Put(sc)
	if slot != nil {
		// Clone: w points into the caller's text, which the cache must not keep alive.
		slot.Store(&cacheEntry{word: strings.Clone(w), ids: append([]int32(nil), dst[start:]...)})
	}
	return dst
}

type bpeScratch struct {
	ids   []int32
	ranks []int32
	syms  []symbol
	heap  pairHeap
}

const noRank = int32(1<<31 - 1)

func (m *bpe) rank(a, b int32) (merge, bool) {
	mg, ok := m.merges[pairKey(a, b)]
	return mg, ok
}

// mergeNaive repeatedly merges the lowest-ranked adjacent pair (the leftmost of equals) —
// the definition of BPE — scanning the whole word each time.
func (m *bpe) mergeNaive(dst []int32, w string, sc *bpeScratch) []int32 {
	ids := sc.ids[:0]
	for i := 0; i < len(w); i++ {
		ids = append(ids, m.byteID[w[i]])
	}
	ranks := sc.ranks[:0]
	for i := 0; i+1 < len(ids); i++ {
		ranks = append(ranks, m.pairRank(ids[i], ids[i+1]))
	}
	for len(ids) > 1 {
		best := 0
		for i := 1; i < len(ranks); i++ {
			if ranks[i] < ranks[best] {
				best = i
			}
		}
		if ranks[best] == noRank {
			break
		}
		mg, _ := m.rank(ids[best], ids[best+1])
		ids[best] = mg.id
		ids = append(ids[:best+1], ids[best+2:]...)
		ranks = append(ranks[:best], ranks[best+1:]...)
		if best > 0 {
			ranks[best-1] = m.pairRank(ids[best-1], ids[best])
		}
		if best < len(ranks) {
			ranks[best] = m.pairRank(ids[best], ids[best+1])
		}
	}
	dst = append(dst, ids...)
	sc.ids, sc.ranks = ids, ranks
	return dst
}

func (m *bpe) pairRank(a, b int32) int32 {
	if mg, ok := m.rank(a, b); ok {
		return mg.rank
	}
	return noRank
}

// symbol is one token of a word being merged, in a doubly linked list by byte position.
type symbol struct {
	id         int32
	prev, next int32 // positions of the neighbours, -1 at the ends
	alive      bool
}

// candidate is a pair that may merge: the symbol at pos with its right neighbour.
type candidate struct {
	rank, pos int32
}

// pairHeap is a min-heap of candidates by (rank, pos): the lowest merge first, leftmost first.
type pairHeap []candidate

func (h pairHeap) less(i, j int) bool {
	return h[i].rank < h[j].rank || (h[i].rank == h[j].rank && h[i].pos < h[j].pos)
}

func (h *pairHeap) push(c candidate) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *pairHeap) pop() candidate {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, r, small := 2*i+1, 2*i+2, i
		if l < len(s) && s.less(l, small) {
			small = l
		}
		if r < len(s) && s.less(r, small) {
			small = r
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}

// mergeHeap is the same merge order in O(n log n): candidates wait in a heap and are checked
// against the current neighbours when they come out (a stale one is dropped).
func (m *bpe) mergeHeap(dst []int32, w string, sc *bpeScratch) []int32 {
	n := len(w)
	syms := sc.syms[:0]
	for i := 0; i < n; i++ {
		syms = append(syms, symbol{id: m.byteID[w[i]], prev: int32(i - 1), next: int32(i + 1), alive: true})
	}
	syms[n-1].next = -1
	h := sc.heap[:0]
	for i := 0; i+1 < n; i++ {
		if r := m.pairRank(syms[i].id, syms[i+1].id); r != noRank {
			h.push(candidate{rank: r, pos: int32(i)})
		}
	}
	for len(h) > 0 {
		c := h.pop()
		left := &syms[c.pos]
		if !left.alive || left.next < 0 {
			continue
		}
		right := &syms[left.next]
		mg, ok := m.rank(left.id, right.id)
		if !ok || mg.rank != c.rank {
			continue // the pair changed since this candidate was pushed
		}
		left.id = mg.id
		right.alive = false
		left.next = right.next
		if right.next >= 0 {
			syms[right.next].prev = c.pos
		}
		if left.prev >= 0 {
			if r := m.pairRank(syms[left.prev].id, left.id); r != noRank {
				h.push(candidate{rank: r, pos: left.prev})
			}
		}
		if left.next >= 0 {
			if r := m.pairRank(left.id, syms[left.next].id); r != noRank {
				h.push(candidate{rank: r, pos: c.pos})
			}
		}
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	sc.syms, sc.heap = syms, h
	return dst
}
