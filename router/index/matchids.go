package index

import (
	"math/bits"
	"unsafe"
)

// Lookups in the id layout (ids.go).
//
// A lookup keeps its workers (those holding every block so far) as a short list while few, each
// with the fastest tier it still counts on (a worker counted on tier t is counted on every
// slower tier: tiers include the faster ones), and as masks per tier, with the list of words
// still in play, while many: when the first block is overflowed and held by more than
// sparseMax workers. Most blocks have the holder set of the block before (a conversation's
// workers, a system prompt's), and those are skipped on one comparison: the inline words, or an
// overflowed block's hash (ids.go). Only the workers whose count ends are written, and listed in
// Match.holders, so nothing here is O(MaxWorkers).
//
// The walk is the mask layout's: blocks in consecutive slots, read a group at a time under one
// version check, a run of slots prefetched ahead, a branch key looked for where a child key is
// missing (keys.go).

// sparseMax is the most workers a lookup keeps as a list: past it, the masks of an overflowed
// block (157 words a tier at 10,000 workers) cost less than a bit test per worker.
const sparseMax = 64

// spEntry is a worker a lookup still counts, and the fastest tier it does.
type spEntry struct{ w, lvl int32 }

// matchIDs is Match for the id layout.
func (ix *Index) matchIDs(seqs []uint64, m *Match) {
	l := ix.ids
	n := len(seqs)
	m.keys = resize(m.keys, n)
	keys := m.keys
	m.sp, m.live, m.dense = m.sp[:0], m.live[:0], false
	var addrs [2 * matchRun]uintptr
	// With summaries (16-bit entries), a group's keys are computed when it is walked, and the
	// slots prefetched are those of the groups the summaries do not let it skip (readSums);
	// without, all keys at once, and a run of slots ahead.
	var sums [sumWindow]uint64
	var ovfs uint32 // bit g: sums[g] is a bitmap hash
	const window = sumWindow * keyGroup
	next := n
	if !ix.idSums {
		fillKeys(keys, seqs)
		ix.prefetchSlots(keys[:min(matchRun, n)], addrs[:0])
		next = matchRun // the first block not prefetched yet
	}
	var hs [keyGroup * 2]uint64
	hw := l.hw
	j := 0
	for j < n {
		if j+matchRun >= next && next < n {
			ix.prefetchSlots(keys[next:min(next+matchRun, n)], addrs[:0])
			next += matchRun
		}
		if ix.idSums && j%keyGroup == 0 {
			if j%window == 0 {
				ovfs = ix.readSums(seqs[j:min(j+window, n)], &sums, addrs[:0])
			}
			end := min(j+keyGroup, n)
			if g := j % window / keyGroup; end-j == keyGroup && sums[g] != 0 {
				sig, ovf := [2]uint64{sums[g], 0}, ovfs>>g&1 != 0
				if ovf {
					sig = [2]uint64{ovfMark, sums[g]}
				}
				// Every block of the group has the holders sig: apply them once (an overflowed
				// set only when the block before had it; else the group is walked).
				switch {
				case j > 0 && sig == m.sig:
					j = end
					continue
				case ovf:
				case j == 0:
					m.startInline(l, sig[:1])
					m.sig, j = sig, end
					continue
				default:
					m.sig = sig
					if m.dense {
						m.denseToList(l, sig[:1], j)
					} else {
						m.listStep(l, sig[:1], nil, j)
					}
					if len(m.sp) == 0 {
						return
					}
					j = end
					continue
				}
			}
			fillKeys(keys[j:end], seqs[j:])
		}
		key := keys[j]
		end := min(j+keyGroup-keyPos(key), n)
		s := ix.shardOf(key)
		cnt, v := s.readRun(keys[j:end], hs[:], hw)
		if cnt == 0 {
			if continues(key) {
				// Not in its parent's group: it may have branched off a sibling there. Look for
				// it and the rest of its group under its branch key (keys.go).
				branch(keys[j:end], seqs[j:end])
				ix.prefetchSlots(keys[j:end], addrs[:0])
				continue
			}
			break // nobody holds block j
		}
		ix.prefetchBitmaps(s, hs[:cnt*hw], hw, addrs[:0])
		for k := range cnt {
			if !m.stepIDs(l, s, keys[j+k], hs[k*hw:(k+1)*hw], v, j+k) {
				return
			}
		}
		j += cnt
	}
	m.endIDs(l, j)
}

// readSums reads the summaries of the full groups of blocks with sequence hashes seqs (seqs[0]
// starting a group; at most sumWindow groups) into sums (0: none, or a writer moved summaries
// meanwhile, and the group is walked) and returns which are bitmap hashes (bit g). It then
// prefetches the slots of the groups a walk will likely read: those without a summary, those
// whose bitmap hash is not the group's before, and a partial group at the end.
func (ix *Index) readSums(seqs []uint64, sums *[sumWindow]uint64, addrs []uintptr) (ovfs uint32) {
	var sks [sumWindow]uint64
	ng := len(seqs) / keyGroup
	prefetch(ix.prefetchSums(seqs, &sks, addrs[:0]))
	for g := range ng {
		s := ix.shardOf(sks[g])
		sums[g] = 0
		for range 4 { // a writer moving the shard's summaries on every try: walk the group
			v := s.version.Load()
			if v&1 != 0 {
				continue
			}
			slots, mask := s.sumSlots.Load(), s.sumMask.Load()
			if s.version.Load() != v {
				continue
			}
			c, ovf := readSum(slots, mask, sks[g])
			if s.version.Load() == v {
				sums[g] = c
				if ovf {
					ovfs |= 1 << g
				}
				break
			}
		}
	}
	addrs, walks := addrs[:0], 0
	for g := range ng {
		ovf := ovfs>>g&1 != 0
		if sums[g] != 0 && (!ovf || g > 0 && sums[g] == sums[g-1] && ovfs>>(g-1)&1 != 0) {
			continue
		}
		if walks++; walks > sumWalksAhead {
			break
		}
		addrs = ix.appendGroup1(addrs, OwnKey(seqs[g*keyGroup]))
	}
	if len(seqs)%keyGroup != 0 && walks < sumWalksAhead {
		addrs = ix.appendGroup1(addrs, OwnKey(seqs[ng*keyGroup]))
	}
	prefetch(addrs)
	return ovfs
}

// prefetchBitmaps prefetches the headers of the overflowed blocks among a run read from s
// (holder words hs, hw per block): a system prompt's group is sixteen bitmaps, whose hashes
// the lookup compares one after another.
func (ix *Index) prefetchBitmaps(s *shard, hs []uint64, hw int, addrs []uintptr) {
	var p *bitmapPool
	for q := 0; q < len(hs); q += hw {
		if !overflowed(hs[q]) {
			continue
		}
		if p == nil {
			p = s.ids.pool.Load()
		}
		if off := int(hs[q]>>32) * ix.ids.size; off < len(p.words) {
			addrs = append(addrs, uintptr(unsafe.Pointer(&p.words[off])))
		}
	}
	prefetch(addrs)
}

// stepIDs applies block i (key in shard s; holder words h, read at version v) to the lookup's
// workers and reports whether any is left.
func (m *Match) stepIDs(l *idLayout, s *shard, key uint64, h []uint64, v uint64, i int) bool {
	for {
		if !overflowed(h[0]) {
			sig := [2]uint64{h[0], 0}
			if len(h) > 1 {
				sig[1] = h[1]
			}
			if i > 0 && sig == m.sig {
				return true // the block before's holders: the same workers go on
			}
			m.sig = sig
			switch {
			case i == 0:
				m.startInline(l, h)
			case m.dense:
				m.denseToList(l, h, i)
			default:
				m.listStep(l, h, nil, i)
			}
			return len(m.sp) > 0
		}
		if ok, more := m.overflowStep(l, s, h[0], v, i); ok {
			return more
		}
		// A writer changed the shard since the block was read: read it again.
		h = m.one[:l.hw]
		found := false
		if found, v = s.readOne(key, h); !found {
			m.endIDs(l, i)
			return false
		}
	}
}

// overflowStep applies overflowed block i (first holder word h0, read at version v) and
// reports whether it could (false: the shard changed since v; nothing was applied) and whether
// any worker is left. It reads what it needs of the bitmap first, then checks the version, then
// applies it.
func (m *Match) overflowStep(l *idLayout, s *shard, h0, v uint64, i int) (ok, more bool) {
	bm := l.bitmap(s.ids.pool.Load(), h0>>32)
	if bm == nil { // a pool that changed since v; at v itself it cannot happen (ids.go)
		if s.version.Load() != v {
			return false, false
		}
		m.endIDs(l, i) // (a broken pool: end here rather than spin)
		m.dense, m.sp, m.live = false, m.sp[:0], m.live[:0]
		return true, false
	}
	sig := [2]uint64{ovfMark, bm[bmHash].Load()}
	if i > 0 && sig == m.sig {
		return s.version.Load() == v, true
	}
	masks, words := bm[bmHeader:], l.words
	switch {
	case i == 0:
		for q := range m.buf {
			m.buf[q] = masks[q].Load()
		}
	case m.dense:
		for t := range l.tiers {
			for _, wd := range m.live {
				m.buf[t*words+int(wd)] = masks[t*words+int(wd)].Load()
			}
		}
	default:
		m.lv = resize(m.lv, len(m.sp))
		for k, a := range m.sp {
			m.lv[k] = int32(l.tiers)
			for t := range l.tiers {
				if masks[t*words+int(a.w)/64].Load()>>(a.w%64)&1 != 0 {
					m.lv[k] = int32(t)
					break
				}
			}
		}
	}
	count := bm[bmCount].Load()
	if s.version.Load() != v {
		return false, false
	}
	m.sig = sig
	switch {
	case i == 0:
		m.startBitmap(l, count)
	case m.dense:
		m.denseStep(l, i)
		return true, len(m.live) > 0
	default:
		m.listStep(l, nil, m.lv, i)
	}
	return true, m.dense && len(m.live) > 0 || len(m.sp) > 0
}

// startInline starts the lookup's workers from the first block's inline holders h.
func (m *Match) startInline(l *idLayout, h []uint64) {
	for _, x := range h {
		for ; x != 0; x >>= l.eb {
			e := x & l.emask
			if e == 0 {
				continue
			}
			w, tm := l.decode(e)
			// (A reader racing a writer can see a worker twice: dropped from one place, added in
			// another.)
			if !m.listed(int32(w)) {
				m.sp = append(m.sp, spEntry{int32(w), int32(bits.TrailingZeros64(tm))})
			}
		}
	}
}

func (m *Match) listed(w int32) bool {
	for _, a := range m.sp {
		if a.w == w {
			return true
		}
	}
	return false
}

// startBitmap starts the lookup's workers from the first block's bitmap masks (in m.buf; count
// workers): as a list when few, else as masks with each tier's counting the faster ones.
func (m *Match) startBitmap(l *idLayout, count uint64) {
	words, tiers := l.words, l.tiers
	if count <= sparseMax {
		for wd := range words {
			var any uint64
			for t := range tiers {
				any |= m.buf[t*words+wd]
			}
			for ; any != 0; any &= any - 1 {
				b := bits.TrailingZeros64(any)
				lvl := 0
				for m.buf[lvl*words+wd]>>b&1 == 0 {
					lvl++
				}
				m.sp = append(m.sp, spEntry{int32(wd*64 + b), int32(lvl)})
			}
		}
		return
	}
	m.dense = true
	for wd := range words {
		var cum uint64
		for t := range tiers {
			cum |= m.buf[t*words+wd]
			m.active[t*words+wd] = cum
		}
		if cum != 0 {
			m.live = append(m.live, int32(wd))
		}
	}
}

// listStep applies block i to the listed workers: each one's fastest tier in it is lowest(h)
// for inline holder words h, else lv[k] for the k-th.
func (m *Match) listStep(l *idLayout, h []uint64, lv []int32, i int) {
	tiers := int32(l.tiers)
	n := 0
	for k, a := range m.sp {
		var nl int32
		if lv != nil {
			nl = lv[k]
		} else {
			nl = l.lowest(h, a.w)
		}
		if nl > a.lvl {
			m.recordOne(a.w, a.lvl, nl, i)
			a.lvl = nl
		}
		if a.lvl < tiers {
			m.sp[n] = a
			n++
		}
	}
	m.sp = m.sp[:n]
}

// denseStep applies block i, overflowed, its masks in m.buf, to workers held as masks.
func (m *Match) denseStep(l *idLayout, i int) {
	words := l.words
	n := 0
	for _, wd := range m.live {
		left := false
		var cum uint64
		for t := range l.tiers {
			w := t*words + int(wd)
			cum |= m.buf[w]
			na := m.active[w] & cum
			m.record(t, int(wd), m.active[w]&^na, i)
			m.active[w] = na
			left = left || na != 0
		}
		if left {
			m.live[n] = wd
			n++
		}
	}
	m.live = m.live[:n]
}

// denseToList applies block i, with inline holders h, to workers held as masks: those of h
// still in the masks go on as a list, the rest end at i.
func (m *Match) denseToList(l *idLayout, h []uint64, i int) {
	words, tiers := l.words, l.tiers
	for _, x := range h {
		for ; x != 0; x >>= l.eb {
			e := x & l.emask
			if e == 0 {
				continue
			}
			w, tm := l.decode(e)
			if m.listed(int32(w)) {
				continue
			}
			wd, bit := w/64, uint64(1)<<(w%64)
			lvl := max(tiers, bits.TrailingZeros64(tm))
			for t := range tiers {
				if m.active[t*words+wd]&bit != 0 {
					lvl = max(t, bits.TrailingZeros64(tm))
					break
				}
			}
			if lvl >= tiers {
				continue
			}
			for t := lvl; t < tiers; t++ { // it goes on there: not an end
				m.active[t*words+wd] &^= bit
			}
			m.sp = append(m.sp, spEntry{int32(w), int32(lvl)})
		}
	}
	for t := range tiers {
		for _, wd := range m.live {
			m.record(t, int(wd), m.active[t*words+int(wd)], i)
		}
	}
	m.dense, m.live = false, m.live[:0]
}

// endIDs records every worker still counted as holding the first n blocks.
func (m *Match) endIDs(l *idLayout, n int) {
	if m.dense {
		for t := range l.tiers {
			for _, wd := range m.live {
				m.record(t, int(wd), m.active[t*l.words+int(wd)], n)
			}
		}
		return
	}
	for _, a := range m.sp {
		m.recordOne(a.w, a.lvl, int32(l.tiers), n)
	}
}

// recordOne sets worker w's count on tiers [from, to) to n (> 0), listing it in holders when to
// is the last tier.
func (m *Match) recordOne(w, from, to int32, n int) {
	for t := from; t < to; t++ {
		m.blocks[int(t)*m.maxWorkers+int(w)] = int32(n)
	}
	if int(to) == m.tiers {
		m.holders = append(m.holders, Worker(w))
	}
}
