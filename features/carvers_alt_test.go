package features

import "math/bits"

// The two carvers the extent carver (extents.go) was chosen over, kept in a test file as the
// comparison in BenchmarkCarverTrace. Neither is used by the store.

// buddy carves a region of `units` equal blocks with the binary buddy method, extended to give
// out exact sizes: an allocation of n units takes the aligned block of the next power of two and
// frees its tail at once, so a 4.5 MiB image costs 4.5 MiB (rounded up to one unit), not 8.
// Any [off, off+n) is freed as the aligned power-of-two blocks it splits into, each merged with
// its buddy while the buddy is free, so shrinking an allocation in place is a partial free.
//
// Every operation is O(log units) and allocates nothing. Free lists are intrusive doubly linked
// lists threaded through next/prev, indexed by unit. Not safe for concurrent use: the pool's
// owner serialises calls.
//
// Its flaw, which BenchmarkCarverTrace shows: every allocation needs an aligned free block of
// the next power of two, and the trimmed tails are too small for the items that follow, so a
// loaded pool of 72- and 134-unit images refuses allocations with a third of it free.
type buddy struct {
	units   int
	orderAt []int8  // orderAt[u] = k when a free block of 2^k units starts at u, else -1
	next    []int32 // free-list links of the block starting at u
	prev    []int32
	heads   []int32 // first free block of each order, -1 when none
	free    int     // free units
}

func newBuddy(units int) *buddy {
	maxOrder := bits.Len(uint(units)) - 1
	b := &buddy{
		units:   units,
		orderAt: make([]int8, units),
		next:    make([]int32, units),
		prev:    make([]int32, units),
		heads:   make([]int32, maxOrder+1),
	}
	for i := range b.orderAt {
		b.orderAt[i] = -1
	}
	for k := range b.heads {
		b.heads[k] = -1
	}
	b.release(0, units)
	return b
}

// orderFor is the smallest k with 2^k >= n (n >= 1).
func orderFor(n int) int { return bits.Len(uint(n - 1)) }

// alloc takes n contiguous units and returns the first; ok is false when no free block of
// 2^orderFor(n) units exists (the free units may still add up to n: fragmentation).
func (b *buddy) alloc(n int) (off int, ok bool) {
	if n <= 0 || n > b.units {
		return 0, false
	}
	k := orderFor(n)
	j := k
	for j < len(b.heads) && b.heads[j] < 0 {
		j++
	}
	if j >= len(b.heads) {
		return 0, false
	}
	off = int(b.heads[j])
	b.unlink(off, j)
	for j > k { // split: keep the lower half, free the upper
		j--
		b.push(off+1<<j, j)
	}
	b.free -= 1 << k
	b.release(off+n, off+1<<k) // the tail beyond n goes straight back
	return off, true
}

// release frees units [lo, hi), which must be allocated.
func (b *buddy) release(lo, hi int) {
	for lo < hi {
		// The largest block that starts at lo (aligned) and fits before hi.
		k := bits.TrailingZeros(uint(lo))
		if lo == 0 {
			k = len(b.heads) - 1
		}
		for 1<<k > hi-lo {
			k--
		}
		b.freeBlock(lo, k)
		lo += 1 << k
	}
}

// freeBlock frees the aligned block of 2^k units at off, merging it with free buddies.
func (b *buddy) freeBlock(off, k int) {
	b.free += 1 << k
	for k+1 < len(b.heads) {
		bud := off ^ 1<<k
		if bud+1<<k > b.units || int(b.orderAt[bud]) != k {
			break
		}
		b.unlink(bud, k)
		off = min(off, bud)
		k++
	}
	b.push(off, k)
}

func (b *buddy) push(off, k int) {
	b.orderAt[off] = int8(k)
	h := b.heads[k]
	b.next[off], b.prev[off] = h, -1
	if h >= 0 {
		b.prev[h] = int32(off)
	}
	b.heads[k] = int32(off)
}

func (b *buddy) unlink(off, k int) {
	n, p := b.next[off], b.prev[off]
	if p >= 0 {
		b.next[p] = n
	} else {
		b.heads[k] = n
	}
	if n >= 0 {
		b.prev[n] = p
	}
	b.orderAt[off] = -1
}

// largestFree is the size in units of the largest free block (what one allocation can get).
func (b *buddy) largestFree() int {
	for k := len(b.heads) - 1; k >= 0; k-- {
		if b.heads[k] >= 0 {
			return 1 << k
		}
	}
	return 0
}

// fits reports whether alloc(n) would succeed now.
func (b *buddy) fits(n int) bool { return n > 0 && 1<<orderFor(n) <= b.largestFree() }

// sizeClasses is segregated free lists with four classes per power of two (at most 25% rounding), each class carving chunks of its own size from a bump pointer
// and keeping freed chunks for itself. Allocation and free are O(1), but memory once carved
// for one class never serves another, so a shift in the size mix strands it.
type sizeClasses struct {
	units int
	bump  int
	free  [][]int // class index → offsets of free chunks
	inUse int
}

func newSizeClasses(units int) *sizeClasses {
	return &sizeClasses{units: units, free: make([][]int, 4*64)}
}

// class returns the class index and chunk size (units) for n units.
func sizeClassOf(n int) (idx, size int) {
	if n <= 4 {
		return n, n
	}
	k := bits.Len(uint(n-1)) - 1 // 2^k < n <= 2^(k+1)
	step := 1 << (k - 2)         // four classes between 2^k and 2^(k+1)
	q := (n - (1 << k) + step - 1) / step
	return 4*k + q, 1<<k + q*step
}

func (c *sizeClasses) alloc(n int) (int, bool) {
	idx, size := sizeClassOf(n)
	if l := c.free[idx]; len(l) > 0 {
		off := l[len(l)-1]
		c.free[idx] = l[:len(l)-1]
		c.inUse += size
		return off, true
	}
	if c.bump+size > c.units {
		return 0, false
	}
	off := c.bump
	c.bump += size
	c.inUse += size
	return off, true
}

func (c *sizeClasses) release(off, n int) {
	idx, size := sizeClassOf(n)
	c.free[idx] = append(c.free[idx], off)
	c.inUse -= size
}
