package index

import (
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// Group summaries: a lookup that reads one word for a whole key group (keys.go) instead of its
// sixteen slots.
//
// A 4K-token lookup touches 16 groups, each on its own page of the index's tables, and reads
// every block's slot to find where each worker's overlap ends. Mostly none ends there: a prompt's
// holders change at a handful of blocks (where a shared system prompt ends, where a worker's copy
// ends). So each shard of a one-word, one-tier index also keeps, per group whose blocks are
// all in the table under their child keys (no branch, exactly one block at the group's first
// position), the AND of their holder masks: the workers that hold the whole group. A lookup reads
// that word for every group first, all of them prefetched at once from tables a quarter the
// index's size, and walks only the groups where its set of workers would shrink, or that have no
// summary (a branch, the prompt's last blocks, where the match ends).
//
// A summary's key is a mix of the group's first and last keys (their identity bits and home),
// with the group's home in its low 32 bits. A block's sequence hash covers every block before it,
// so the last key's 31 identity bits stand for the group's other blocks as well: a lookup whose
// group differs from the stored one in any block finds the summary only on a 31-bit collision of
// the last blocks' hashes, as it would misread a block's own slot only on one (keys.go), and then
// overestimates by at most that group. So the summary stands for the same slots the walk would
// read. Writers recompute a group's summary under its shard's lock after every change to a key
// with that home (Store, Remove, a cleared worker, a cap eviction), and readers check the shard's
// version around the read as they do for the slots, so a lookup sees a summary that is at most as
// stale as the slots it replaces.
// The first group of a prompt needs one more fact: that every worker holding its first block holds
// the whole group (a lookup's workers are those of the first block); sumFirst in the key says so.

const (
	sumFirst = 1 << 32 // in a summary's key: the group's first block has exactly the summary's holders
	// sumOverflow is sumFirst's bit in the id layout's summaries: the value is a bitmap hash
	// (every block of the group is overflowed, with the same holders).
	sumOverflow = sumFirst
	sumMark     = 1 << 63 // set in every summary key, so none is 0 (an empty slot)
	// sumWindow is how many groups' summaries a lookup reads (and prefetches) at once: an
	// 8K-token prompt's 32, and the next window's while it walks.
	sumWindow = 32
	// sumWalksAhead is how many groups a lookup expects to walk per window and prefetches the
	// slots of: a few holder changes per prompt, a branch, its end.
	sumWalksAhead = 8
)

// sumKey is the summary key of a group whose first and last keys are those (see above), with
// the group's home in the low 32 bits: cheap, as a lookup computes one per group, and the keys
// are hashes already.
func sumKey(first, last uint64) uint64 {
	h := (first ^ bits.RotateLeft64(last, 29)) * 0x9e3779b97f4a7c15
	return h&^(keyHomeMask|sumFirst) | sumMark | first&keyHomeMask
}

// sumKeyOf is the summary key of the group of blocks with sequence hashes seqs (seqs[0] starts
// it), from their chain keys (keys.go), without computing the others.
func sumKeyOf(seqs *[keyGroup]uint64) uint64 {
	first := OwnKey(seqs[0])
	return sumKey(first, seqs[keyGroup-1]&childID|first&keyHomeMask|(keyGroup-1))
}

// homeOf is the home of the group a key's slot run belongs to: its home bits, position cleared.
func homeOf(key uint64) uint64 { return key & keyHomeMask &^ keyPosMask }

// resum recomputes the summary of the group with home `home` (keys.go) in s, which must be
// locked: it exists when the table holds exactly one key at the group's first position and a
// child key at each of the others, and some worker holds them all.
func (s *shard) resum(home uint64) {
	st := s.sum.Load()
	if st == nil {
		return
	}
	var key, cum uint64
	var ok bool
	if s.ids != nil {
		key, cum, ok = s.groupSig(home)
	} else {
		key, cum, ok = s.groupAnd(home)
	}
	old := st.sumAt(home)
	if ok {
		if old >= 0 && st.slots[old*2].Load() == key {
			st.slots[old*2+1].Store(cum)
			return
		}
	}
	if old >= 0 {
		s.version.Add(1)
		st.deleteAt(old)
		s.version.Add(1)
		if st.sparse() {
			st = s.swapSum(st.rebuilt(st.size() / 2))
		}
	}
	if ok {
		// At most half full: most lookups of an absent summary end at once.
		if (int(st.used.Load())+1)*2 > st.size() {
			st = s.swapSum(st.rebuilt(st.size() * 2))
		}
		st.insertNew(key, []uint64{cum})
	}
}

// groupAnd is the summary key and holders of the group with home `home` in a one-word, one-tier
// table, and whether it has one.
func (s *shard) groupAnd(home uint64) (key, cum uint64, ok bool) {
	t := s.tab.Load()
	var firstKey, lastKey, first uint64
	cum = ^uint64(0)
	for q := range keyGroup {
		i, n := t.atHome(home + uint64(q))
		if n != 1 {
			return 0, 0, false
		}
		k, m := t.slots[i*2].Load(), t.slots[i*2+1].Load()
		if q == 0 {
			firstKey, first = k, m
		}
		lastKey = k
		if cum &= m; cum == 0 {
			return 0, 0, false
		}
	}
	key = sumKey(firstKey, lastKey)
	if first == cum {
		key |= sumFirst
	}
	return key, cum, true
}

// groupSig is groupAnd for the id layout with 16-bit entries (ids.go): a group has a summary
// when all its blocks have the same holders (most do: a conversation's, a system prompt's), and
// it is their holder word, or for overflowed blocks their bitmaps' hash with sumOverflow set in
// the key. (A lookup that meets a group whose holders differ from the block's before walks it.)
func (s *shard) groupSig(home uint64) (key, sig uint64, ok bool) {
	t := s.tab.Load()
	var firstKey, lastKey uint64
	ovf := false
	for q := range keyGroup {
		i, n := t.atHome(home + uint64(q))
		if n != 1 {
			return 0, 0, false
		}
		k, h := t.slots[i*2].Load(), t.slots[i*2+1].Load()
		o := overflowed(h)
		if o {
			h = s.ids.lay.bitmap(s.ids.pool.Load(), h>>32)[bmHash].Load()
		}
		if q == 0 {
			firstKey, sig, ovf = k, h, o
		} else if h != sig || o != ovf {
			return 0, 0, false
		}
		lastKey = k
	}
	if sig == 0 {
		return 0, 0, false // (a hash of 0 would read as no summary)
	}
	key = sumKey(firstKey, lastKey)
	if ovf {
		key |= sumOverflow
	}
	return key, sig, true
}

// swapSum installs nt as the summary table of a live shard (locked), under an odd version.
func (s *shard) swapSum(nt *table) *table {
	s.version.Add(1)
	s.setSum(nt)
	s.version.Add(1)
	return nt
}

// setSum installs nt as the shard's summary table (see swapSum for a live shard).
func (s *shard) setSum(nt *table) {
	s.sum.Store(nt)
	s.sumSlots.Store(&nt.slots[0])
	s.sumMask.Store(nt.mask)
}

// atHome finds the keys of a one-word table whose home bits are h that a group's walk could
// read there: at a group's first position (h aligned) every key, elsewhere child keys only (a
// branch key starts a slot run of its own). It returns the slot of the first and how many there
// are (child keys: at most one, keys.go).
func (t *table) atHome(h uint64) (slot, n int) {
	slot = -1
	first := h&keyPosMask == 0
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		k := t.slots[i*2].Load()
		if k == 0 {
			return slot, n
		}
		if k&keyHomeMask == h && (first || continues(k)) {
			if n == 0 {
				slot = int(i)
			}
			n++
			if !first {
				return slot, n
			}
		}
	}
}

// sumAt is the slot of the summary with home `home` in a summary table, or -1 (a home has at
// most one: resum keeps it so).
func (t *table) sumAt(home uint64) int {
	for i := home & t.mask; ; i = (i + 1) & t.mask {
		k := t.slots[i*2].Load()
		if k == 0 {
			return -1
		}
		if k&keyHomeMask == home {
			return int(i)
		}
	}
}

// groupSums reads the summaries of the full groups of blocks with sequence hashes seqs (seqs[0]
// starting a group; sks holds their summary keys, from prefetchSums): for group g, cums[g] is the
// summary's holders (0: none, or a writer moved summaries meanwhile and the group is walked) and
// the returned firsts has bit g set when its first block's holders are the same. It then
// prefetches the summaries of the groups after them (next, same shape: their keys replace sks)
// and the slots of the groups a walk will likely read (at most sumWalksAhead, and the partial
// group at the end, if any).
func (ix *Index) groupSums(seqs, next []uint64, cums *[sumWindow]uint64, sks *[sumWindow]uint64,
	addrs []uintptr) (firsts uint64) {
	ng := len(seqs) / keyGroup
	for g := range ng {
		if g >= 2 && cums[g-1] == 0 && cums[g-2] == 0 {
			// Two groups in a row without a summary: the match most likely ends there (a branch is
			// one group). The rest is walked if the lookup gets there.
			clear(cums[g:ng])
			break
		}
		// Read without locking, as slots are (written out here: a call per group costs). A writer
		// moving the shard's summaries on every try makes the group one to walk.
		s := ix.shardOf(OwnKey(seqs[g*keyGroup]))
		cums[g] = 0
		for range 4 {
			v := s.version.Load()
			if v&1 != 0 {
				continue
			}
			// The slots and the mask are two words: only a version unchanged across both loads
			// makes them a pair (a shrink between them would send the probe past the slots).
			slots, mask := s.sumSlots.Load(), s.sumMask.Load()
			if s.version.Load() != v {
				continue
			}
			c, first := readSum(slots, mask, sks[g])
			if s.version.Load() == v {
				cums[g] = c
				if first {
					firsts |= 1 << g
				}
				break
			}
		}
	}
	// Prefetch the next window's summaries now, and the slots of the groups a walk will read:
	// those without a summary and those where the workers (as far as the summaries tell) shrink.
	addrs = ix.prefetchSums(next, sks, addrs[:0])
	run, walks := ^uint64(0), 0
	if firsts&1 != 0 {
		run = cums[0]
	}
	ends := false // the match likely ends in the group last prefetched
	for g := range ng {
		c := cums[g]
		if c != 0 && run&c == run && (g > 0 || firsts&1 != 0) {
			continue
		}
		if walks++; walks > sumWalksAhead {
			break
		}
		addrs = ix.appendGroup1(addrs, OwnKey(seqs[g*keyGroup]))
		if ends = c == 0 && (g+1 == ng || cums[g+1] == 0); ends {
			break
		}
		run &= c
	}
	if len(seqs)%keyGroup != 0 && walks <= sumWalksAhead && !ends {
		addrs = ix.appendGroup1(addrs, OwnKey(seqs[ng*keyGroup]))
	}
	prefetch(addrs)
	return firsts
}

// readSum returns the holders of the summary with key sk (0: none) in the summary table with
// these slots and mask, and whether its first block has the same holders. The caller checks the
// shard's version around it.
func readSum(slots *atomic.Uint64, mask, sk uint64) (cum uint64, first bool) {
	p := unsafe.Pointer(slots)
	for i := sk & mask; ; i = (i + 1) & mask {
		k := (*atomic.Uint64)(unsafe.Add(p, i*16)).Load()
		if k&^sumFirst == sk {
			return (*atomic.Uint64)(unsafe.Add(p, i*16+8)).Load(), k&sumFirst != 0
		}
		if k == 0 {
			return 0, false
		}
	}
}

// prefetchSums computes the summary keys of the full groups of blocks with sequence hashes seqs
// (seqs[0] starting a group) into sks and appends their slots' addresses to addrs (prefetching
// when full), returning addrs.
func (ix *Index) prefetchSums(seqs []uint64, sks *[sumWindow]uint64, addrs []uintptr) []uintptr {
	for g := range len(seqs) / keyGroup {
		sk := sumKeyOf((*[keyGroup]uint64)(seqs[g*keyGroup:]))
		sks[g] = sk
		s := ix.shardOf(sk) // (a summary key has its group's home)
		if len(addrs) == cap(addrs) {
			prefetch(addrs)
			addrs = addrs[:0]
		}
		// (Read without the version: a prefetch is a hint, and a torn pair only wastes it.)
		addrs = append(addrs, uintptr(unsafe.Pointer(s.sumSlots.Load()))+uintptr(sk&s.sumMask.Load())*16)
	}
	return addrs
}

// appendGroup1 appends the addresses of a one-word group's four lines and the two after them
// (pushSlots: where a collision pushes a group) to addrs, prefetching when full.
func (ix *Index) appendGroup1(addrs []uintptr, key uint64) []uintptr {
	if len(addrs)+(keyGroup+pushSlots)/4 > cap(addrs) {
		prefetch(addrs)
		addrs = addrs[:0]
	}
	t := ix.shardOf(key).tab.Load()
	p := uintptr(unsafe.Pointer(unsafe.SliceData(t.slots))) + uintptr(key&t.mask)*16
	for o := uintptr(0); o < (keyGroup+pushSlots)*16; o += 64 {
		addrs = append(addrs, p+o)
	}
	return addrs
}
