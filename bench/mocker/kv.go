package mocker

import "fmt"

// KV is an engine's KV-cache block manager, as vLLM's prefix cache behaves and Dynamo's mocker
// models it: a fixed number of blocks; full blocks are named by their sequence hash and shared
// by every request whose prompt starts the same way; partial blocks (a request's unfinished
// last block) belong to one request. A full block is active while some request references it
// (ref-counted) and inactive (cached, evictable, LRU order) when none does. The four moves:
//
//	Use      reference full blocks: active → ref+1; inactive → active; absent → allocate
//	         (evicting the least recently used inactive block if the cache is full), Stored
//	Deref    drop a reference, last block first; the last one moves the block to the inactive
//	         LRU (still cached), so children are evicted before their parents
//	Destroy  free a request's partial blocks
//	Promote  a partial block that filled up becomes a full block with its hash, Stored
//
// Every block that becomes cached or is evicted is reported to the Observer, which turns them
// into KV events. KV is not safe for concurrent use: one engine loop owns it.
type KV struct {
	capacity int
	partial  int // partial blocks held by requests

	index map[uint64]int32 // full block hash → slot
	slots []kvSlot
	free  []int32 // unused slots

	// The inactive LRU: a doubly linked list through slots; head is the least recently used.
	head, tail int32
	inactive   int

	obs KVObserver
}

type kvSlot struct {
	hash       uint64
	refs       int32
	prev, next int32 // inactive list links (-1: none)
}

// KVObserver hears about blocks entering and leaving the cache, in order.
type KVObserver interface {
	// Stored: a full block became cached: block number block of its sequence (0 is a
	// sequence's first block), whose parent block is parent.
	Stored(hash, parent uint64, block int)
	// Evicted: an inactive block was dropped to make room.
	Evicted(hash uint64)
}

// ErrKVFull: every block is active or partial, so nothing can be evicted to make room.
type ErrKVFull struct{ Capacity int }

func (e *ErrKVFull) Error() string {
	return fmt.Sprintf("KV cache full: all %d blocks in use by running requests", e.Capacity)
}

// NewKV returns an empty cache of capacity blocks reporting to obs (nil: nobody).
func NewKV(capacity int, obs KVObserver) *KV {
	kv := &KV{capacity: capacity, index: map[uint64]int32{}, head: -1, tail: -1, obs: obs} // grows with use: idle engines cost little
	if kv.obs == nil {
		kv.obs = nopObserver{}
	}
	return kv
}

type nopObserver struct{}

func (nopObserver) Stored(uint64, uint64, int) {}
func (nopObserver) Evicted(uint64)             {}

// Capacity is the number of blocks.
func (kv *KV) Capacity() int { return kv.capacity }

// Used counts blocks holding data: active, inactive and partial.
func (kv *KV) Used() int { return len(kv.index) + kv.partial }

// Active counts blocks referenced by requests (full and partial): what cannot be evicted.
func (kv *KV) Active() int { return len(kv.index) - kv.inactive + kv.partial }

// Inactive counts cached blocks no request references.
func (kv *KV) Inactive() int { return kv.inactive }

// Free counts blocks that can be handed out now without failing: empty or evictable.
func (kv *KV) Free() int { return kv.capacity - kv.Active() }

// Cached reports whether a full block is in the cache (active or inactive).
func (kv *KV) Cached(hash uint64) bool {
	_, ok := kv.index[hash]
	return ok
}

// Refs is a full block's reference count (0 if inactive or absent).
func (kv *KV) Refs(hash uint64) int {
	if s, ok := kv.index[hash]; ok {
		return int(kv.slots[s].refs)
	}
	return 0
}

// Hashes calls f for every cached full block (order unspecified).
func (kv *KV) Hashes(f func(hash uint64, refs int)) {
	for h, s := range kv.index {
		f(h, int(kv.slots[s].refs))
	}
}

// CachedPrefix is how many leading hashes are cached: the prompt blocks a request would reuse.
func (kv *KV) CachedPrefix(hashes []uint64) int {
	for i, h := range hashes {
		if !kv.Cached(h) {
			return i
		}
	}
	return len(hashes)
}

// Use references the full blocks hashes[i] for i in [from, len), whose parents are the blocks
// before them (hashes[from-1] is the parent of the first; a sequence's first block has none).
// On ErrKVFull the blocks referenced so far stay referenced and the count of them is returned,
// so the caller can Deref exactly those.
func (kv *KV) Use(hashes []uint64, from int) (int, error) {
	for i := from; i < len(hashes); i++ {
		h := hashes[i]
		if s, ok := kv.index[h]; ok {
			kv.ref(s)
			continue
		}
		if !kv.makeRoom() {
			return i - from, &ErrKVFull{Capacity: kv.capacity}
		}
		kv.insert(h)
		var parent uint64
		if i > 0 {
			parent = hashes[i-1]
		}
		kv.obs.Stored(h, parent, i)
	}
	return len(hashes) - from, nil
}

// UsePartial takes a block for a request's unfinished last block.
func (kv *KV) UsePartial() error {
	if !kv.makeRoom() {
		return &ErrKVFull{Capacity: kv.capacity}
	}
	kv.partial++
	return nil
}

// Destroy frees n partial blocks.
func (kv *KV) Destroy(n int) {
	if n > kv.partial {
		panic(fmt.Sprintf("mocker: Destroy(%d) with %d partial blocks", n, kv.partial)) // an engine bug, not input
	}
	kv.partial -= n
}

// Promote turns one partial block that just filled up into the full block hash, block number
// block of its sequence after parent (as for Use). If another request already holds an
// identical block, the two share it and the partial block's space is freed.
func (kv *KV) Promote(hash, parent uint64, block int) {
	kv.Destroy(1)
	if s, ok := kv.index[hash]; ok {
		kv.ref(s)
		return
	}
	kv.insert(hash) // the partial block's room is reused: no eviction needed
	kv.obs.Stored(hash, parent, block)
}

// Deref drops one reference to each block of a sequence, its last block first: a block nobody
// references becomes the most recently used inactive block, so a sequence's tail is evicted
// before its head, never a block before the blocks after it (vLLM's KVCacheManager.free: "We
// free the blocks in reverse order so that the tail blocks are evicted first").
func (kv *KV) Deref(hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		h := hashes[i]
		s, ok := kv.index[h]
		if !ok || kv.slots[s].refs <= 0 {
			panic(fmt.Sprintf("mocker: Deref of block %#x that is not active", h)) // an engine bug
		}
		if kv.slots[s].refs--; kv.slots[s].refs == 0 {
			kv.pushTail(s)
		}
	}
}

// Clear drops every inactive block (vLLM's reset_prefix_cache); it reports how many.
func (kv *KV) Clear() int {
	n := 0
	for kv.head >= 0 {
		kv.evict()
		n++
	}
	return n
}

func (kv *KV) ref(s int32) {
	if kv.slots[s].refs == 0 {
		kv.unlink(s)
	}
	kv.slots[s].refs++
}

// makeRoom makes sure one block can be added, evicting the LRU inactive block if needed.
func (kv *KV) makeRoom() bool {
	if kv.Used() < kv.capacity {
		return true
	}
	if kv.head < 0 {
		return false
	}
	kv.evict()
	return true
}

func (kv *KV) evict() {
	s := kv.head
	kv.unlink(s)
	h := kv.slots[s].hash
	delete(kv.index, h)
	kv.free = append(kv.free, s)
	kv.obs.Evicted(h)
}

func (kv *KV) insert(h uint64) {
	var s int32
	if n := len(kv.free); n > 0 {
		s, kv.free = kv.free[n-1], kv.free[:n-1]
	} else {
		s = int32(len(kv.slots))
		kv.slots = append(kv.slots, kvSlot{})
	}
	kv.slots[s] = kvSlot{hash: h, refs: 1, prev: -1, next: -1}
	kv.index[h] = s
}

func (kv *KV) pushTail(s int32) {
	kv.slots[s].prev, kv.slots[s].next = kv.tail, -1
	if kv.tail >= 0 {
		kv.slots[kv.tail].next = s
	} else {
		kv.head = s
	}
	kv.tail = s
	kv.inactive++
}

func (kv *KV) unlink(s int32) {
	p, n := kv.slots[s].prev, kv.slots[s].next
	if p >= 0 {
		kv.slots[p].next = n
	} else {
		kv.head = n
	}
	if n >= 0 {
		kv.slots[n].prev = p
	} else {
		kv.tail = p
	}
	kv.slots[s].prev, kv.slots[s].next = -1, -1
	kv.inactive--
}
