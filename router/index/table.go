package index

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// One shard of the index: an open-addressing hash table (linear probing) from sequence hash to
// holders, written under mu and read without any lock.
//
// Slots are flat runs of `stride` atomic words: the key (0 = empty), then tiers × words mask
// words (bit w of word w/64 of tier t: worker w holds the block on tier t or faster is NOT
// implied; each tier has its own bits), or in the id layout a few worker ids (ids.go). Every
// word is read and written atomically, so readers never see a torn word and the race detector
// sees no race.
//
// Readers are optimistic (a seqlock): setting or clearing a holder bit (or an inline id) is one
// atomic word and needs nothing more; only changes that move keys (deleting a key shifts later
// keys of its probe run back, a resize swaps the table) and, in the id layout, every change to
// an overflow bitmap or the pool make version odd for their duration. A reader that saw the
// version change retries; it never waits on a lock.
type shard struct {
	version atomic.Uint64
	tab     atomic.Pointer[table]
	sum     atomic.Pointer[table] // group summaries (summary.go); nil where the index keeps none
	// sum's slots and mask, on this line: a 4K-token lookup reads 16 groups' summaries, and a
	// load of the table's header before each slot would be another cache miss in the way.
	// Written with sum, under an odd version.
	sumSlots atomic.Pointer[atomic.Uint64]
	sumMask  atomic.Uint64
	ids      *idSets  // the id layout's overflow bitmaps (ids.go); nil in the mask layout
	_        [16]byte // keep writers' lock off the readers' cache line

	mu      sync.Mutex // held by writers; guards everything below and all writes to tab's slots
	scratch []uint64   // mask words of a key being inserted
	// redirects counts the blocks whose child key had its home in this shard and that went to
	// their branch key because a sibling held that place (Index.store1).
	redirects uint64
}

type table struct {
	slots  []atomic.Uint64
	mask   uint64 // slot count - 1 (a power of two)
	stride int
	used   atomic.Int64 // keys in the table; written under the shard lock, read by metrics
}

const (
	// minSlots holds two groups of index keys (keys.go) without growing: a group lands in one
	// shard, and a smaller floor made small indexes grow and shrink on every stored group.
	minSlots = 2 * keyGroup
	// maxLoadNum/maxLoadDen is the load that triggers growth; a table shrinks to half below 1/8.
	maxLoadNum, maxLoadDen = 13, 16
	// zeroKey stands in for a key of 0, since key 0 marks an empty slot (aligned: it can only
	// come from OwnKey).
	zeroKey = 0x9e3779b97f4a7c10
)

func keyOf(h uint64) uint64 {
	if h == 0 {
		return zeroKey
	}
	return h
}

func newTable(slots, stride int) *table {
	return &table{slots: make([]atomic.Uint64, slots*stride), mask: uint64(slots - 1), stride: stride}
}

func (t *table) size() int { return int(t.mask) + 1 }

// sparse reports whether t should shrink to half: under 1/8 full and above minSlots.
func (t *table) sparse() bool { return t.size() > minSlots && int(t.used.Load())*8 < t.size() }

// find returns the slot index holding key, or -1.
func (t *table) find(key uint64) int {
	i, _ := t.probe(key)
	return i
}

// probe returns the slot index holding key, or -1 and whether the key is blocked: a child key
// (keys.go) is stored only where no other child key has its home, so there is at most one such
// key, in its probe run, and the search for a child key stops at the first (a sibling).
func (t *table) probe(key uint64) (slot int, blocked bool) {
	st := t.stride
	cont := continues(key)
	for i, n := key&t.mask, 0; n <= int(t.mask); i, n = (i+1)&t.mask, n+1 {
		k := t.slots[int(i)*st].Load()
		if k == key {
			return int(i), false
		}
		if k == 0 {
			return -1, false
		}
		if cont && sibling(k, key) {
			return -1, true
		}
	}
	return -1, false
}

// sibling reports whether k, a key in the table, is a child key with the same home as child key
// key: where key would go, another block is (keys.go).
func sibling(k, key uint64) bool { return (k^key)&keyHomeMask == 0 && continues(k) }

// slotHint is where a lookup found the previous block of a prompt: its table and slot (-1: not
// found). Blocks after the first of a group (keys.go) usually sit in the next slot, however far
// a collision pushed the group from its home, so lookups look there first; otherwise a block
// whose group was pushed d slots away would probe those d slots again.
type slotHint struct {
	t    *table
	slot int
}

// next is the slot the hint suggests for key in t, or -1.
func (h slotHint) next(t *table, key uint64) int {
	if h.t != t || h.slot < 0 || !continues(key) {
		return -1
	}
	return (h.slot + 1) & int(t.mask)
}

// findAfter is find, looking first at the slot hint suggests.
func (t *table) findAfter(key uint64, hint slotHint) int {
	if i := hint.next(t, key); i >= 0 && t.slots[i*t.stride].Load() == key {
		return i
	}
	return t.find(key)
}

// words returns slot i's mask words.
func (t *table) words(i int) []atomic.Uint64 {
	base := i*t.stride + 1
	return t.slots[base : base+t.stride-1]
}

// insertNew puts key (known absent) with its mask words into the first empty slot of its run
// and returns the slot. The masks are written before the key, so a reader that finds the key
// reads its masks.
func (t *table) insertNew(key uint64, masks []uint64) int {
	st := t.stride
	i := key & t.mask
	for t.slots[int(i)*st].Load() != 0 {
		i = (i + 1) & t.mask
	}
	w := t.words(int(i))
	for j, m := range masks {
		w[j].Store(m)
	}
	t.slots[int(i)*st].Store(key)
	t.used.Add(1)
	return int(i)
}

// deleteAt empties slot i and shifts later keys of its probe run back into the hole (so lookups
// need no tombstones). Callers make the shard version odd around it.
func (t *table) deleteAt(i int) {
	st := t.stride
	hole := uint64(i)
	for j := (hole + 1) & t.mask; ; j = (j + 1) & t.mask {
		k := t.slots[int(j)*st].Load()
		if k == 0 {
			break
		}
		home := k & t.mask
		// Move k into the hole unless its home lies cyclically in (hole, j].
		if (j-home)&t.mask >= (j-hole)&t.mask {
			src, dst := t.slots[int(j)*st:int(j)*st+st], t.slots[int(hole)*st:int(hole)*st+st]
			for w := 1; w < st; w++ {
				dst[w].Store(src[w].Load())
			}
			dst[0].Store(k)
			hole = j
		}
	}
	base := int(hole) * st
	for w := range st {
		t.slots[base+w].Store(0)
	}
	t.used.Add(-1)
}

// rebuilt returns a copy of t with room for its keys at the given slot count.
func (t *table) rebuilt(slots int) *table {
	nt := newTable(slots, t.stride)
	masks := make([]uint64, t.stride-1)
	for i := 0; i < t.size(); i++ {
		k := t.slots[i*t.stride].Load()
		if k == 0 {
			continue
		}
		ws := t.words(i)
		for j := range ws {
			masks[j] = ws[j].Load()
		}
		nt.insertNew(k, masks)
	}
	return nt
}

// read copies key's mask words into dst (len stride-1), only those at the indexes in sel (nil:
// all of them), and reports whether the key is present, without locking: it retries while a
// writer is moving keys.
func (s *shard) read(key uint64, dst []uint64, sel []int32, hint *slotHint) bool {
	for spins := 0; ; spins++ {
		v := s.version.Load()
		if v&1 == 0 {
			t := s.tab.Load()
			i := t.findAfter(key, *hint)
			if i >= 0 {
				ws := t.words(i)
				if sel == nil {
					for j := range ws {
						dst[j] = ws[j].Load()
					}
				} else {
					for _, j := range sel {
						dst[j] = ws[j].Load()
					}
				}
			}
			if s.version.Load() == v {
				*hint = slotHint{t, i}
				return i >= 0
			}
		}
		if spins&63 == 63 {
			runtime.Gosched() // the writer may have been descheduled mid-move
		}
	}
}

// read1 is read for the common layout of one mask word (≤ 64 workers, one tier), without the
// copy loop. It returns 0 when the key is absent.
func (s *shard) read1(key uint64) uint64 {
	for spins := 0; ; spins++ {
		v := s.version.Load()
		if v&1 == 0 {
			t := s.tab.Load()
			var m uint64
			if i := t.find(key); i >= 0 {
				m = t.slots[i*2+1].Load()
			}
			if s.version.Load() == v {
				return m
			}
		}
		if spins&63 == 63 {
			runtime.Gosched()
		}
	}
}

// The write side. Each method must be called with s.mu held.

// holder is one (worker, tier) of a block's holders, in both layouts' terms: mask word and bit
// (the mask layout), worker and tier (the id layout, ids.go).
type holder struct {
	word    int
	bit     uint64
	w, tier int
}

// setBit adds holder h to key, inserting the key if absent, and reports whether h was new and
// whether the key was.
func (s *shard) setBit(key uint64, h holder) (added, created bool) {
	t := s.tab.Load()
	if i := t.find(key); i >= 0 {
		return s.setAt(t, i, h), false
	}
	s.insert(key, h)
	return true, true
}

// setAt adds holder h to slot i and reports whether it was new.
func (s *shard) setAt(t *table, i int, h holder) bool {
	if s.ids != nil {
		return s.setID(t, i, h.w, h.tier)
	}
	old := t.words(i)[h.word].Or(h.bit)
	return old&h.bit == 0
}

// insert adds key (known absent) held by h, growing the table first if needed.
func (s *shard) insert(key uint64, h holder) {
	t := s.tab.Load()
	if (int(t.used.Load())+1)*maxLoadDen > t.size()*maxLoadNum {
		t = s.swap(t.rebuilt(t.size() * 2))
	}
	words := s.scratch[:t.stride-1]
	clear(words)
	if s.ids != nil {
		words[0] = s.ids.lay.entry(h.w, 1<<h.tier)
	} else {
		words[h.word] = h.bit
	}
	t.insertNew(key, words)
}

// clearBit drops holder h of key and deletes the key when nobody is left. It reports whether h
// held it.
func (s *shard) clearBit(key uint64, h holder) bool {
	t := s.tab.Load()
	i := t.find(key)
	if i < 0 {
		return false
	}
	if s.ids != nil {
		return s.clearID(t, i, h.w, h.tier)
	}
	old := t.words(i)[h.word].And(^h.bit)
	if old&h.bit == 0 {
		return false
	}
	if old == h.bit && s.emptyAt(t, i) {
		s.delete(t, i)
	}
	return true
}

func (s *shard) emptyAt(t *table, i int) bool {
	ws := t.words(i)
	for j := range ws {
		if ws[j].Load() != 0 {
			return false
		}
	}
	return true
}

// delete removes slot i (whose masks are all zero) and shrinks the table when it is mostly empty.
func (s *shard) delete(t *table, i int) {
	s.version.Add(1)
	deleteSlot(t, i)
	s.version.Add(1)
	if t.sparse() {
		s.swap(t.rebuilt(t.size() / 2))
	}
}

// brokenDelete, when set, stands in for table.deleteAt in every shard's deletes. Only the
// tests that prove the model checks catch a broken index set it (to a delete that leaves a
// hole in the probe run); it is nil otherwise, and the hot shard struct carries no test state.
var brokenDelete func(t *table, i int)

// deleteSlot deletes slot i of a shard's table: t.deleteAt, unless a test broke it.
func deleteSlot(t *table, i int) {
	if brokenDelete != nil {
		brokenDelete(t, i)
		return
	}
	t.deleteAt(i)
}

func (s *shard) swap(nt *table) *table {
	s.version.Add(1)
	s.tab.Store(nt)
	s.version.Add(1)
	return nt
}

// clearWorker drops worker w (mask word `word`, bit `bit` in the mask layout) from tiers [t0, t1)
// of every key from slot `from` on, and deletes emptied keys. It stops after `limit` entries
// (limit < 0: no limit), adds the entries dropped per tier into cleared, and returns the slot to
// resume from (-1 at the table's end).
func (s *shard) clearWorker(w, word int, bit uint64, t0, t1, wordsPerTier, from, limit int, cleared []int64) int {
	t := s.tab.Load()
	for i := from; i < t.size(); {
		key := t.slots[i*t.stride].Load()
		if key == 0 {
			i++
			continue
		}
		ws := t.words(i)
		hit := false
		if s.ids != nil {
			n := s.dropAt(t, i, w, t0, t1, cleared)
			hit, limit = n > 0, limit-n
		}
		for tier := t0; tier < t1 && s.ids == nil; tier++ {
			w := &ws[tier*wordsPerTier+word]
			if w.Load()&bit != 0 {
				w.And(^bit)
				cleared[tier]++
				hit = true
				limit--
			}
		}
		if hit && s.emptyAt(t, i) {
			// The shift may move a later key into slot i, so look at i again; a key moved from the
			// start of the table to its end may be visited twice, which is harmless. A shrink
			// rebuilds the table: continue in the new one from its start.
			s.version.Add(1)
			deleteSlot(t, i)
			s.version.Add(1)
			if t.sparse() {
				t = s.swap(t.rebuilt(t.size() / 2))
				i = 0
			}
		} else {
			i++
		}
		if hit {
			s.resum(homeOf(key))
		}
		if limit == 0 {
			return i
		}
	}
	return -1
}

// bitOf maps a worker slot to its mask word and bit.
func bitOf(w int) (int, uint64) { return w / 64, 1 << (uint(w) % 64) }

// readOne copies key's holder words into dst (len stride-1) and reports whether the key is
// present and the version it read them at, without locking: it retries while a writer is
// moving keys.
func (s *shard) readOne(key uint64, dst []uint64) (found bool, v uint64) {
	for spins := 0; ; spins++ {
		v = s.version.Load()
		if v&1 == 0 {
			t := s.tab.Load()
			i := t.find(key)
			if i >= 0 {
				ws := t.words(i)
				for j := range dst {
					dst[j] = ws[j].Load()
				}
			}
			if s.version.Load() == v {
				return i >= 0, v
			}
		}
		if spins&63 == 63 {
			runtime.Gosched()
		}
	}
}

// readRun finds keys[0] and reads on while the slots after it hold keys[1:] (a group's blocks,
// keys.go), copying each one's hw holder words to dst (hw per key), without locking. It returns
// how many keys it read (0: keys[0] is absent) and the version they are valid at.
func (s *shard) readRun(keys, dst []uint64, hw int) (n int, v uint64) {
	for spins := 0; ; spins++ {
		v = s.version.Load()
		if v&1 == 0 {
			t := s.tab.Load()
			n = 0
			if i := t.find(keys[0]); i >= 0 {
				slots, st, mask := t.slots, t.stride, int(t.mask)
				for n < len(keys) {
					base := i * st
					if slots[base].Load() != keys[n] {
						break
					}
					for q := range hw {
						dst[n*hw+q] = slots[base+1+q].Load()
					}
					n++
					i = (i + 1) & mask
				}
			}
			if s.version.Load() == v {
				return n, v
			}
		}
		if spins&63 == 63 {
			runtime.Gosched()
		}
	}
}
