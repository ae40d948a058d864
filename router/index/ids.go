package index

import (
	"math/bits"
	"sync/atomic"
)

// The id layout: a block's holders as a small set of worker ids, for fleets past
// maskMaxWorkers.
//
// In the mask layout a slot has a bit per worker per tier: at 10,000 workers 157 words a tier
// for a block that one to four workers hold (most blocks: a conversation lives on a few
// workers). Here a slot's holder words are a set of inline entries instead, and a block held by
// more workers than fit points to an overflow bitmap in its shard's pool (a shared system
// prompt on hundreds of workers).
//
// Inline entries are eb bits each, 64/eb to a word, 0 = empty, a worker at most once:
//   - eb = 16 (one tier, fewer than 65,536 workers): worker + 1, four in one word, in ascending
//     order (empty ones last), so that equal sets are equal words;
//   - eb = 32 (more tiers): tier mask << 16 | worker (the mask is never 0), two in a word, two
//     words, in no order.
//
// An overflowed slot's first holder word is its bitmap's index << 32 | ovfMark, the rest 0: no
// word of entries has its low 32 bits all ones (that would be one worker twice, or a tier mask
// of 0xffff). A bitmap is bmHeader words (its slot's key, its distinct workers, a hash of its
// (worker, tier) bits) and then a mask of words per tier, as a mask-layout slot has.
//
// Readers take no lock, as in the mask layout: adding or dropping an inline entry is one atomic
// word, and a reader sees it or not. Everything else (a slot overflowing into a bitmap or
// shrinking back, a bitmap's bits, count and hash, bitmaps moving in the pool, the pool growing
// or shrinking) happens under an odd shard version, so a reader that read an overflowed block
// and then found the version unchanged read one consistent state of it. The pool is dense:
// bitmap i of n in use sits at words [i·size, (i+1)·size); freeing one moves the last into its
// place (its key finds its slot, whose index is rewritten), and the pool halves when under a
// quarter full, so its memory is bounded by the blocks overflowed now, not ever.
//
// The hash lets a lookup skip a block whose holder set is the block before's (a system prompt's
// blocks are held by the same hundreds of workers): equal hashes of different sets need a 64-bit
// collision between the (worker, tier) sets of two consecutive blocks, and would overcount
// those blocks for the workers in which they differ, no worse than a key collision (keys.go).

const (
	ovfMark = 1<<32 - 1 // low bits of an overflowed slot's first holder word

	bmKey, bmCount, bmHash, bmHeader = 0, 1, 2, 3 // a bitmap's header words, then its masks

	inlineEntries = 4 // entries a slot holds before it overflows (eb = 16: one word, else two)
	// shrinkAt is how many workers an overflowed block keeps before it goes back inline: one
	// fewer than fit, so a block between four and five holders does not go back and forth.
	shrinkAt = inlineEntries - 1
	// minBitmaps is the smallest pool a shard keeps once it has overflowed a block.
	minBitmaps = 4
)

// idLayout is the id layout's shape, shared by an index's shards.
type idLayout struct {
	eb    uint   // bits per inline entry: 16 or 32
	emask uint64 // an entry's bits
	per   int    // entries per word
	hw    int    // holder words per slot
	tiers int
	words int // mask words per tier of a bitmap
	size  int // words per bitmap
}

func newIDLayout(maxWorkers, tiers int) *idLayout {
	l := &idLayout{eb: 32, tiers: tiers, words: maxWorkers / 64}
	if tiers == 1 && maxWorkers < 1<<16 {
		l.eb = 16
	}
	l.emask = 1<<l.eb - 1
	l.per = 64 / int(l.eb)
	l.hw = inlineEntries / l.per
	l.size = bmHeader + tiers*l.words
	return l
}

// entry is the inline entry of worker w on the tiers in tm.
func (l *idLayout) entry(w int, tm uint64) uint64 {
	if l.eb == 16 {
		return uint64(w) + 1
	}
	return tm<<16 | uint64(w)
}

// decode is entry's inverse (e != 0).
func (l *idLayout) decode(e uint64) (w int, tm uint64) {
	if l.eb == 16 {
		return int(e) - 1, 1
	}
	return int(e & 0xffff), e >> 16
}

// lowest is the fastest tier worker w holds a block with inline holder words h on (l.tiers:
// none).
func (l *idLayout) lowest(h []uint64, w int32) int32 {
	if l.eb == 16 {
		want := uint64(w) + 1
		for x := h[0]; x != 0; x >>= 16 {
			if x&0xffff == want {
				return 0
			}
		}
		return int32(l.tiers)
	}
	for _, x := range h {
		for ; x != 0; x >>= 32 {
			if e := x & 0xffffffff; e>>16 != 0 && e&0xffff == uint64(w) {
				return int32(bits.TrailingZeros64(e >> 16))
			}
		}
	}
	return int32(l.tiers)
}

func overflowed(h0 uint64) bool { return h0&ovfMark == ovfMark }

// holderHash is a (worker, tier)'s part of a bitmap's hash (the xor of its holders' parts).
func holderHash(w, tier int) uint64 {
	x := (uint64(w)<<3 | uint64(tier) + 1) * 0x9e3779b97f4a7c15
	x ^= x >> 29
	x *= 0xbf58476d1ce4e5b9
	return x ^ x>>32
}

// idSets is a shard's overflow bitmaps. Written under the shard's lock.
type idSets struct {
	lay  *idLayout
	pool atomic.Pointer[bitmapPool] // read by lookups
	n    int                        // bitmaps in use
}

type bitmapPool struct{ words []atomic.Uint64 }

func newIDSets(l *idLayout) *idSets {
	s := &idSets{lay: l}
	s.pool.Store(&bitmapPool{})
	return s
}

// bitmap returns bitmap i of pool p (nil when p is too short: a reader's stale pool).
func (l *idLayout) bitmap(p *bitmapPool, i uint64) []atomic.Uint64 {
	off := int(i) * l.size
	if off+l.size > len(p.words) {
		return nil
	}
	return p.words[off : off+l.size : off+l.size]
}

// The write side: called with the shard's lock held.

// setID adds worker w on tier to slot i and reports whether it was new.
func (s *shard) setID(t *table, i, w, tier int) bool {
	l := s.ids.lay
	hw := t.words(i)
	h0 := hw[0].Load()
	if overflowed(h0) {
		bm := l.bitmap(s.ids.pool.Load(), h0>>32)
		if bm[l.bitIndex(w, tier)].Load()&(1<<(w%64)) != 0 {
			return false
		}
		s.version.Add(1)
		l.bmSet(bm, w, tier)
		s.version.Add(1)
		return true
	}
	bit := uint64(1) << tier
	free := -1
	for k := range inlineEntries {
		wd, sh := k/l.per, uint(k%l.per)*l.eb
		e := hw[wd].Load() >> sh & l.emask
		if e == 0 {
			if free < 0 {
				free = k
			}
			continue
		}
		if ew, tm := l.decode(e); ew == w {
			if tm&bit != 0 {
				return false
			}
			hw[wd].Store(hw[wd].Load() + bit<<16<<sh) // (eb = 32: one tier has eb = 16, and w has it)
			return true
		}
	}
	if free >= 0 {
		if l.eb == 16 { // kept sorted: the word is the set's one spelling (summary.go compares them)
			hw[0].Store(add16(hw[0].Load(), l.entry(w, bit)))
			return true
		}
		wd, sh := free/l.per, uint(free%l.per)*l.eb
		hw[wd].Store(hw[wd].Load() | l.entry(w, bit)<<sh)
		return true
	}
	// Full: the slot's holders move to a bitmap.
	s.version.Add(1)
	idx := s.allocBitmap()
	bm := l.bitmap(s.ids.pool.Load(), idx)
	bm[bmKey].Store(t.slots[i*t.stride].Load())
	for q := range hw {
		for x := hw[q].Load(); x != 0; x >>= l.eb {
			if e := x & l.emask; e != 0 {
				ew, tm := l.decode(e)
				for ; tm != 0; tm &= tm - 1 {
					l.bmSet(bm, ew, bits.TrailingZeros64(tm))
				}
			}
		}
	}
	l.bmSet(bm, w, tier)
	hw[0].Store(idx<<32 | ovfMark)
	for q := 1; q < len(hw); q++ {
		hw[q].Store(0)
	}
	s.version.Add(1)
	return true
}

// clearID drops worker w on tier from slot i, deleting the slot when nobody is left, and reports
// whether w held it.
func (s *shard) clearID(t *table, i, w, tier int) bool {
	var cleared [8]int64
	if s.dropAt(t, i, w, tier, tier+1, cleared[:]) == 0 {
		return false
	}
	if s.emptyAt(t, i) {
		s.delete(t, i)
	}
	return true
}

// dropAt drops worker w from tiers [t0, t1) of slot i (an overflowed slot goes back inline when
// few enough are left) and returns how many entries it dropped, also added per tier into
// cleared. It deletes nothing.
func (s *shard) dropAt(t *table, i, w, t0, t1 int, cleared []int64) int {
	l := s.ids.lay
	hw := t.words(i)
	h0 := hw[0].Load()
	n := 0
	if overflowed(h0) {
		bm := l.bitmap(s.ids.pool.Load(), h0>>32)
		for tier := t0; tier < t1; tier++ {
			if bm[l.bitIndex(w, tier)].Load()&(1<<(w%64)) == 0 {
				continue
			}
			if n == 0 {
				s.version.Add(1)
			}
			l.bmClear(bm, w, tier)
			cleared[tier]++
			n++
		}
		if n > 0 {
			if bm[bmCount].Load() <= shrinkAt {
				s.toInline(t, i, h0>>32, bm)
			}
			s.version.Add(1)
		}
		return n
	}
	for k := range inlineEntries {
		wd, sh := k/l.per, uint(k%l.per)*l.eb
		e := hw[wd].Load() >> sh & l.emask
		if e == 0 {
			continue
		}
		ew, tm := l.decode(e)
		if ew != w {
			continue
		}
		keep := tm
		for tier := t0; tier < t1; tier++ {
			if tm&(1<<tier) != 0 {
				keep &^= 1 << tier
				cleared[tier]++
				n++
			}
		}
		switch {
		case n == 0:
		case l.eb == 16:
			hw[0].Store(drop16(hw[0].Load(), e))
		default:
			ne := uint64(0)
			if keep != 0 {
				ne = l.entry(w, keep)
			}
			hw[wd].Store(hw[wd].Load()&^(l.emask<<sh) | ne<<sh)
		}
		return n
	}
	return 0
}

// add16 adds entry e to x, a word of 16-bit entries in ascending order (empty ones last) with
// room for one more.
func add16(x, e uint64) uint64 {
	var out uint64
	sh := uint(0)
	for k := range 4 {
		v := x >> (16 * k) & 0xffff
		if e != 0 && (v == 0 || v > e) {
			out |= e << sh
			sh, e = sh+16, 0
		}
		if v != 0 {
			out |= v << sh
			sh += 16
		}
	}
	return out
}

// drop16 drops entry e from x, a word of 16-bit entries in ascending order (empty ones last).
func drop16(x, e uint64) uint64 {
	var out uint64
	sh := uint(0)
	for k := range 4 {
		if v := x >> (16 * k) & 0xffff; v != 0 && v != e {
			out |= v << sh
			sh += 16
		}
	}
	return out
}

// toInline moves the holders of overflowed slot i (bitmap idx, bm; few enough to fit) back into
// the slot and frees the bitmap. Under an odd version.
func (s *shard) toInline(t *table, i int, idx uint64, bm []atomic.Uint64) {
	l := s.ids.lay
	var hw [inlineEntries]uint64
	k := 0
	for wd := range l.words {
		var any uint64
		for tier := range l.tiers {
			any |= bm[bmHeader+tier*l.words+wd].Load()
		}
		for ; any != 0; any &= any - 1 {
			w := wd*64 + bits.TrailingZeros64(any)
			var tm uint64
			for tier := range l.tiers {
				tm |= bm[l.bitIndex(w, tier)].Load() >> (w % 64) & 1 << tier
			}
			hw[k/l.per] |= l.entry(w, tm) << (uint(k%l.per) * l.eb)
			k++
		}
	}
	ws := t.words(i)
	for q := range ws {
		ws[q].Store(hw[q])
	}
	s.freeBitmap(idx)
}

// bitIndex is the bitmap word of worker w on tier.
func (l *idLayout) bitIndex(w, tier int) int { return bmHeader + tier*l.words + w/64 }

// holdsAny reports whether worker w is in bitmap bm on any tier.
func (l *idLayout) holdsAny(bm []atomic.Uint64, w int) bool {
	for tier := range l.tiers {
		if bm[l.bitIndex(w, tier)].Load()&(1<<(w%64)) != 0 {
			return true
		}
	}
	return false
}

// bmSet adds (w, tier), absent, to bitmap bm, keeping its count and hash. Under an odd version.
func (l *idLayout) bmSet(bm []atomic.Uint64, w, tier int) {
	if !l.holdsAny(bm, w) {
		bm[bmCount].Add(1)
	}
	bm[l.bitIndex(w, tier)].Or(1 << (w % 64))
	bm[bmHash].Store(bm[bmHash].Load() ^ holderHash(w, tier))
}

// bmClear drops (w, tier), present, from bitmap bm, keeping its count and hash. Under an odd
// version.
func (l *idLayout) bmClear(bm []atomic.Uint64, w, tier int) {
	bm[l.bitIndex(w, tier)].And(^uint64(1 << (w % 64)))
	if !l.holdsAny(bm, w) {
		bm[bmCount].Add(^uint64(0))
	}
	bm[bmHash].Store(bm[bmHash].Load() ^ holderHash(w, tier))
}

// allocBitmap returns the index of a zeroed bitmap, growing the pool if it is full. Under an odd
// version.
func (s *shard) allocBitmap() uint64 {
	l, p := s.ids.lay, s.ids.pool.Load()
	if (s.ids.n+1)*l.size > len(p.words) {
		s.resizePool(max(minBitmaps, 2*len(p.words)/l.size))
	}
	s.ids.n++
	return uint64(s.ids.n - 1)
}

// freeBitmap frees bitmap idx, whose slot no longer points to it: the last bitmap moves into
// its place, and the pool halves when under a quarter full. Under an odd version.
func (s *shard) freeBitmap(idx uint64) {
	l, p := s.ids.lay, s.ids.pool.Load()
	last := uint64(s.ids.n - 1)
	lb := l.bitmap(p, last)
	if idx != last {
		dst := l.bitmap(p, idx)
		for q := range dst {
			dst[q].Store(lb[q].Load())
		}
		if !brokenRepoint {
			t := s.tab.Load()
			t.words(t.find(dst[bmKey].Load()))[0].Store(idx<<32 | ovfMark)
		}
	}
	for q := range lb {
		lb[q].Store(0)
	}
	s.ids.n--
	if c := len(p.words) / l.size; c > minBitmaps && s.ids.n*4 < c {
		s.resizePool(c / 2)
	}
}

// brokenRepoint, when set, makes freeBitmap leave the moved bitmap's slot pointing at its old
// place: only the test that proves the model check catches a broken pool sets it.
var brokenRepoint bool

// resizePool replaces the pool with one of room for c bitmaps, holding the ones in use. Under
// an odd version.
func (s *shard) resizePool(c int) {
	l, p := s.ids.lay, s.ids.pool.Load()
	np := &bitmapPool{words: make([]atomic.Uint64, c*l.size)}
	for q := range s.ids.n * l.size {
		np.words[q].Store(p.words[q].Load())
	}
	s.ids.pool.Store(np)
}
