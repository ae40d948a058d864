package kvevents

import (
	"cmp"
	"slices"
	"sync/atomic"
)

// An engine's cap on the blocks it keeps in the index per tier: its KV cache's size in blocks.
// A publisher whose remove events are lost (or that never sends any) would otherwise grow its
// worker's entries without bound. Past the cap the engine evicts the blocks it stored first:
// each tier keeps the order its blocks were stored in, a ring of engine hashes. Removals leave
// their ring entry behind; an entry is stale when its block is gone from the hash map, no
// longer on that tier, or was stored again since (another stamp), and is skipped when it
// reaches the head or when a full ring is compacted. Memory: O(capacity) per tier; cost: O(1)
// amortised per stored block.
//
// The engine's KV cache decides what it evicts by recency of use, which its events do not show;
// the order of storing is the router's best view of it. Within one stored chain the tail goes
// first (vLLM frees a sequence's blocks tail first), so a partly evicted chain keeps a prefix
// that can still match. With several tiers, a block's stamp is taken when the engine first holds
// it on any tier: a block dropped from one tier and stored there again while another tier keeps
// it may leave that tier earlier than its second store would have it.
type capacity struct {
	want  atomic.Int64 // set by SetCapacity from any goroutine, adopted by the engine's own
	limit int64        // the cap in force: most blocks per tier; 0: none
	order []storeOrder // per tier, while a cap is in force
	stamp uint32       // the next new block's stamp (counted uncapped too, so a cap set later orders what is held)
	keys  []uint64     // scratch: index keys being evicted
}

// storeOrder is one tier's blocks in the order they were stored, oldest at head, in a ring
// whose size is a power of two.
type storeOrder struct {
	ring    []orderEntry
	head, n int
	held    int64 // blocks the engine holds on the tier (its hash map's view)
}

type orderEntry struct {
	eh    uint64 // the engine's block hash
	stamp uint32 // the block's stamp when the entry was written
}

// SetCapacity caps the blocks the engine keeps in the index per tier (blocks ≤ 0: no cap): its
// engine's KV cache size in blocks. Safe from any goroutine; the engine adopts it at its next
// stored block, in its own goroutine: it evicts its oldest blocks down to the cap, counted in
// Stats.Evicted, then sets the index's cap for the worker to the same number, a backstop that
// evicts in table order if the two ever disagree. If the index holds blocks of the worker that
// the engine has forgotten (its hash map's generations rolled over while no cap was in force),
// the worker's view is dropped instead, as after an unrecoverable gap: those entries could
// never be removed.
func (e *Engine) SetCapacity(blocks int64) { e.kvcap.want.Store(max(blocks, 0)) }

// Capacity is the capacity last set (0: none); safe from any goroutine.
func (e *Engine) Capacity() int64 { return e.kvcap.want.Load() }

// adoptCap puts the cap asked for by SetCapacity in force.
func (e *Engine) adoptCap(limit int64) {
	c := &e.kvcap
	c.limit = limit
	if limit == 0 {
		c.order = nil
		e.ix.SetCapacity(e.worker, 0)
		return
	}
	if c.order == nil {
		e.orderHeld()
	}
	for t := range c.order {
		if e.ix.Held(e.worker, t) > c.order[t].held {
			var n int64
			for t := range c.order {
				n += e.ix.Held(e.worker, t)
			}
			e.stats.Evicted.Add(n)
			e.clearView()
			break
		}
		e.evictOldest(t, c.order[t].held-limit)
		e.shrink(t, ringSize(2*int(min(limit, 1<<40))))
	}
	e.ix.SetCapacity(e.worker, limit)
}

// shrink gives tier t a ring of size (a power of two) if its ring is larger and its live
// entries fill at most half of it: after a lower capacity, or one that came late.
func (e *Engine) shrink(t, size int) {
	o := &e.kvcap.order[t]
	if len(o.ring) <= size {
		return
	}
	e.compact(t)
	if 2*o.n > size || len(o.ring) <= size {
		return
	}
	ring := make([]orderEntry, size)
	for i := range o.n {
		ring[i] = o.ring[(o.head+i)&(len(o.ring)-1)]
	}
	o.ring, o.head = ring, 0
}

// orderHeld builds each tier's ring from what the hash map holds, oldest stamp first.
func (e *Engine) orderHeld() {
	c := &e.kvcap
	c.order = make([]storeOrder, e.ix.Options().Tiers)
	for t := range c.order {
		var held []orderEntry
		for _, m := range []map[uint64]engineBlock{e.older, e.blocks} {
			for eh, b := range m {
				if b.tiers&(1<<t) != 0 {
					held = append(held, orderEntry{eh, b.stamp})
				}
			}
		}
		// Ages, not stamps, so that a stamp counter that wrapped still sorts right.
		slices.SortFunc(held, func(a, b orderEntry) int { return cmp.Compare(a.stamp-c.stamp, b.stamp-c.stamp) })
		o := &c.order[t]
		o.ring = make([]orderEntry, ringSize(2*len(held)))
		o.n = copy(o.ring, held)
		o.held = int64(len(held))
	}
}

// ringSize is the smallest power of two ≥ n, at least 64.
func ringSize(n int) int {
	s := 64
	for s < n {
		s *= 2
	}
	return s
}

// clearView drops everything the engine holds (its index entries, its hash map, its store
// order) and keeps its place in the stream.
func (e *Engine) clearView() {
	e.ix.ClearWorker(e.worker)
	clear(e.blocks)
	clear(e.older)
	for t := range e.kvcap.order {
		o := &e.kvcap.order[t]
		o.head, o.n, o.held = 0, 0, 0
	}
}

// live says whether entry x of tier t still stands for a block the engine holds there.
func (e *Engine) live(x orderEntry, t int) (engineBlock, bool) {
	b, ok := e.lookup(x.eh)
	return b, ok && b.tiers&(1<<t) != 0 && b.stamp == x.stamp
}

// pushOrder records that the engine now holds block eh (with that stamp) on tier t.
func (e *Engine) pushOrder(t int, eh uint64, stamp uint32) {
	o := &e.kvcap.order[t]
	if o.n == len(o.ring) {
		e.compact(t)
	}
	o.ring[(o.head+o.n)&(len(o.ring)-1)] = orderEntry{eh, stamp}
	o.n++
	o.held++
}

// compact drops tier t's stale entries, keeping the order; a ring still more than half full
// doubles, so compactions cost O(1) amortised per push.
func (e *Engine) compact(t int) {
	o := &e.kvcap.order[t]
	mask := len(o.ring) - 1
	w := 0
	for i := range o.n {
		x := o.ring[(o.head+i)&mask]
		if _, ok := e.live(x, t); ok {
			o.ring[(o.head+w)&mask] = x
			w++
		}
	}
	o.n = w
	if 2*o.n > len(o.ring) {
		ring := make([]orderEntry, 2*len(o.ring))
		for i := range o.n {
			ring[i] = o.ring[(o.head+i)&mask]
		}
		o.ring, o.head = ring, 0
	}
}

// evictOldest drops up to k of tier t's oldest blocks from the index and the hash map.
func (e *Engine) evictOldest(t int, k int64) {
	if k <= 0 {
		return
	}
	o := &e.kvcap.order[t]
	mask := len(o.ring) - 1
	keys := e.kvcap.keys[:0]
	for k > 0 && o.n > 0 {
		x := o.ring[o.head]
		o.head = (o.head + 1) & mask
		o.n--
		b, ok := e.live(x, t)
		if !ok {
			continue
		}
		keys = append(keys, b.key)
		o.held--
		k--
		if b.tiers &^= 1 << t; b.tiers == 0 {
			e.forget(x.eh)
		} else {
			e.remember(x.eh, b)
		}
	}
	e.stats.Evicted.Add(int64(e.ix.Remove(e.worker, t, keys)))
	e.kvcap.keys = keys
}

// countStored updates the store order for block eh, held on the tiers in had before a store on
// tier and on b.tiers after it (a moved key can drop other tiers: Index.MoveKey).
func (e *Engine) countStored(eh uint64, b engineBlock, had uint8, tier int) {
	for t := range e.kvcap.order {
		switch bit := uint8(1) << t; {
		case had&bit != 0 && b.tiers&bit == 0:
			e.kvcap.order[t].held--
		case had&bit == 0 && b.tiers&bit != 0:
			e.pushOrder(t, eh, b.stamp)
		}
	}
}
