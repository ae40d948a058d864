package index

import "unsafe"

// Counts counts, per (block, worker), how many users a block has on a worker: the router's slot
// tracker counts the requests in flight that use each block. It is a table of the index's kind
// (table.go, one count word per key) rather than a Go map: each count is a cache miss into a
// table of every active block of every worker, and a call's blocks are prefetched countRun at a
// time so that their misses overlap (a 750-block prompt is 750 of them on Incr and 750 on
// Decr). The router's BenchmarkRoute1024 times both against a Go map.
//
// Keys pack the block's sequence hash and the worker into one word with bit 63 set (a branch
// key's mark, keys.go, so a probe never stops at a look-alike "sibling"): two (block, worker)
// pairs share a count only on a 63-bit collision.
//
// A Counts is not safe for concurrent use: its user serialises calls (the slot tracker's mutex).
type Counts struct {
	sh    shard // one goroutine at a time: the version is unused
	keys  [countRun]uint64
	addrs [countRun]uintptr
}

const countRun = 64 // counts prefetched ahead

// NewCounts returns an empty Counts.
func NewCounts() *Counts {
	c := &Counts{}
	c.sh.tab.Store(newTable(minSlots, 2))
	c.sh.scratch = make([]uint64, 1)
	return c
}

func countKeyOf(seq uint64, w Worker) uint64 {
	return seq ^ (uint64(w)+1)*0x9e3779b97f4a7c15 | branchBit
}

// run computes the keys of seqs[from:from+countRun] for worker w into c.keys, prefetches their
// slots and returns them.
func (c *Counts) run(seqs []uint64, from int, w Worker) []uint64 {
	ks := c.keys[:min(countRun, len(seqs)-from)]
	t := c.sh.tab.Load()
	addrs := c.addrs[:len(ks)]
	for j := range ks {
		ks[j] = countKeyOf(seqs[from+j], w)
		addrs[j] = uintptr(unsafe.Pointer(&t.slots[(ks[j]&t.mask)*2]))
	}
	prefetch(addrs)
	return ks
}

// Incr adds one to the count of each block of seqs (sequence hashes) on worker w.
func (c *Counts) Incr(seqs []uint64, w Worker) {
	for from := 0; from < len(seqs); from += countRun {
		for _, k := range c.run(seqs, from, w) {
			t := c.sh.tab.Load()
			if i := t.find(k); i >= 0 {
				n := &t.words(i)[0]
				n.Store(n.Load() + 1)
			} else {
				c.sh.insert(k, holder{bit: 1})
			}
		}
	}
}

// Decr subtracts one from the count of each block of seqs on worker w, deletes the counts that
// reach zero and appends keys[i] to gone for each such seqs[i] (keys is the caller's: the
// blocks' index keys, for the slot tracker). A block Incr never counted is skipped.
func (c *Counts) Decr(seqs, keys []uint64, w Worker, gone []uint64) []uint64 {
	for from := 0; from < len(seqs); from += countRun {
		for j, k := range c.run(seqs, from, w) {
			t := c.sh.tab.Load()
			i := t.find(k)
			if i < 0 {
				continue
			}
			n := &t.words(i)[0]
			if v := n.Load(); v > 1 {
				n.Store(v - 1)
				continue
			}
			c.sh.delete(t, i)
			gone = append(gone, keys[from+j])
		}
	}
	return gone
}

// Len is the number of (block, worker) pairs with a count.
func (c *Counts) Len() int { return int(c.sh.tab.Load().used.Load()) }
