// Package index is the router's cache index: which workers hold which KV blocks (by sequence
// hash), per tier, in sharded open-addressing tables that lookups read without a lock; and
// Counts, a per-(block, worker) counter of the same kind. It imports only the standard
// library. README.md is its map, LOCKS.md (in the router's folder) its locking, NOTES.md how
// the layout was measured into shape.
package index

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Options size an Index. DefaultOptions has the defaults.
type Options struct {
	// MaxWorkers is how many workers can be registered at once; rounded up to a multiple of 64.
	// Up to maskMaxWorkers a block's holders are a bit mask (one word per 64 workers per tier);
	// past that a small set of worker ids that overflows into a bitmap (ids.go). Default 64.
	MaxWorkers int
	// Tiers is the number of storage tiers tracked per block (tier 0 is device memory; vLLM's
	// "GPU" medium; further tiers e.g. "CPU"). Default 1.
	Tiers int
	// Shards is the number of independently locked tables, a power of two. Default 256.
	Shards int
}

// DefaultOptions: 64 workers, one tier, 256 shards.
func DefaultOptions() Options {
	return Options{MaxWorkers: 64, Tiers: 1, Shards: 256}
}

// Worker is a worker's slot in an Index: a small dense number handed out by AddWorker.
type Worker int

// Index maps blocks (by index key: keys.go) to the workers holding each block, per tier. Matching
// (reads) never takes a lock; writes lock one shard per block. All methods are safe for
// concurrent use; events of one worker must be applied in order by the caller (one goroutine
// per worker does it), and nothing may store for a worker after RemoveWorker.
type Index struct {
	opts   Options
	words  int       // mask words per tier (the id layout: per tier of an overflow bitmap)
	stride int       // words per slot: key + tiers × words (the id layout: key + ids.hw)
	ids    *idLayout // the id layout (ids.go); nil in the mask layout
	sums   bool      // one mask word, one tier: group summaries and match1
	idSums bool      // the id layout with 16-bit entries: group summaries of its own (summary.go)
	shift  uint
	shards []shard

	regMu   sync.Mutex // guards registration (live flags are read atomically)
	workers []workerState
}

type workerState struct {
	live     atomic.Bool
	capacity atomic.Int64   // most blocks per tier; 0: no cap
	counts   []atomic.Int64 // blocks held per tier

	evictMu sync.Mutex    // serialises evictions of this worker
	cursor  []evictCursor // per tier: where the next eviction scan starts
}

type evictCursor struct{ shard, slot int }

// ErrOptions reports an unusable Options field.
type ErrOptions struct{ Field, Problem string }

func (e *ErrOptions) Error() string { return "index options: " + e.Field + " " + e.Problem }

// ErrNoWorkerSlot means MaxWorkers workers are registered already.
type ErrNoWorkerSlot struct{ Max int }

func (e *ErrNoWorkerSlot) Error() string {
	return fmt.Sprintf("index full: %d workers registered (index.Options.MaxWorkers)", e.Max)
}

// maskMaxWorkers is the most workers the mask layout is chosen for: one mask word, the layout the
// group summaries and the fastest lookups are built for. Past it a slot with a word per 64
// workers per tier costs more than a set of ids (NOTES.md, "An index for fleets").
const maskMaxWorkers = 64

// New returns an empty index.
func New(opts Options) (*Index, error) { return newIndex(opts, opts.MaxWorkers > maskMaxWorkers) }

// newIndex is New with the layout chosen by the caller (tests and benchmarks use both layouts at
// sizes New would not choose them for).
func newIndex(opts Options, ids bool) (*Index, error) {
	switch {
	case opts.MaxWorkers <= 0 || opts.MaxWorkers > 1<<16:
		return nil, &ErrOptions{"MaxWorkers", fmt.Sprintf("%d: want 1..65536", opts.MaxWorkers)}
	case opts.Tiers <= 0 || opts.Tiers > 8:
		return nil, &ErrOptions{"Tiers", fmt.Sprintf("%d: want 1..8", opts.Tiers)}
	case opts.Shards <= 0 || opts.Shards > 1<<16 || opts.Shards&(opts.Shards-1) != 0:
		return nil, &ErrOptions{"Shards", fmt.Sprintf("%d: want a power of two up to 65536", opts.Shards)}
	}
	words := (opts.MaxWorkers + 63) / 64
	opts.MaxWorkers = words * 64
	ix := &Index{
		opts:    opts,
		words:   words,
		stride:  1 + opts.Tiers*words,
		shift:   uint(64 - bits.TrailingZeros(uint(opts.Shards))),
		shards:  make([]shard, opts.Shards),
		workers: make([]workerState, opts.MaxWorkers),
	}
	if ids {
		ix.ids = newIDLayout(opts.MaxWorkers, opts.Tiers)
		ix.stride = 1 + ix.ids.hw
	}
	ix.sums = ix.ids == nil && ix.stride == 2
	ix.idSums = ix.ids != nil && ix.ids.eb == 16
	if opts.Shards == 1 {
		ix.shift = 64 // x >> 64 is 0 in Go
	}
	for i := range ix.shards {
		ix.shards[i].tab.Store(newTable(minSlots, ix.stride))
		if ix.sums || ix.idSums { // lookups read group summaries (summary.go)
			ix.shards[i].setSum(newTable(minSlots, 2))
		}
		if ix.ids != nil {
			ix.shards[i].ids = newIDSets(ix.ids)
		}
		ix.shards[i].scratch = make([]uint64, ix.stride-1)
	}
	for i := range ix.workers {
		ix.workers[i].counts = make([]atomic.Int64, opts.Tiers)
		ix.workers[i].cursor = make([]evictCursor, opts.Tiers)
	}
	return ix, nil
}

// Options returns the options the index was built with (MaxWorkers rounded up).
func (ix *Index) Options() Options { return ix.opts }

// AddWorker registers a worker holding at most capacity blocks per tier (0: no cap) and
// returns its slot. Slots of removed workers are reused.
func (ix *Index) AddWorker(capacity int64) (Worker, error) {
	ix.regMu.Lock()
	defer ix.regMu.Unlock()
	for i := range ix.workers {
		ws := &ix.workers[i]
		if !ws.live.Load() {
			ws.capacity.Store(max(capacity, 0))
			ws.live.Store(true)
			return Worker(i), nil
		}
	}
	return -1, &ErrNoWorkerSlot{Max: ix.opts.MaxWorkers}
}

// SetCapacity changes a worker's cap (e.g. when its engine reports its block count) and evicts
// down to it.
func (ix *Index) SetCapacity(w Worker, capacity int64) {
	ws := &ix.workers[w]
	ws.capacity.Store(max(capacity, 0))
	for tier := range ix.opts.Tiers {
		ix.enforceCap(w, tier)
	}
}

// RemoveWorker drops everything the worker holds and frees its slot.
func (ix *Index) RemoveWorker(w Worker) {
	ix.ClearWorker(w)
	ix.regMu.Lock()
	ix.workers[w].live.Store(false)
	ix.regMu.Unlock()
}

// ClearWorker drops everything the worker holds (vLLM's AllBlocksCleared, an engine restart).
// It walks every shard: O(index size), for rare events.
func (ix *Index) ClearWorker(w Worker) {
	ws := &ix.workers[w]
	word, bit := bitOf(int(w))
	cleared := make([]int64, ix.opts.Tiers)
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.Lock()
		s.clearWorker(int(w), word, bit, 0, ix.opts.Tiers, ix.words, 0, -1, cleared)
		s.mu.Unlock()
	}
	for tier, n := range cleared {
		ws.counts[tier].Add(-n)
	}
}

// shardOf picks a key's shard from the top bits of its low 32 (the home bits, see keys.go), so
// a group of blocks shares a shard. Tables pick slots from the low bits; they overlap the shard
// bits only past 2^32 slots in all.
func (ix *Index) shardOf(key uint64) *shard { return &ix.shards[(key<<32)>>ix.shift] }

// holderOf is worker w on tier in both layouts' terms.
func (ix *Index) holderOf(w Worker, tier int) holder {
	word, bit := bitOf(int(w))
	return holder{word: word + tier*ix.words, bit: bit, w: int(w), tier: tier}
}

// Store records that worker w holds a chain of blocks on tier: seqs are their sequence hashes,
// first block first, and parent is the key of the block before the first (0: the chain starts a
// sequence). It writes each block's key (keys.go) to keys[i] (keys may be nil when the caller
// needs none) and returns how many (block, worker) entries were added; blocks already held are
// no-ops. A worker's blocks must be stored parent first and removed children first, as vLLM
// does: a block's key can change when nobody holds it for a while, and children stored under
// the old one are not found through the new one. Past the worker's cap, the index evicts the
// worker's entries in table order from a rotating cursor: the engine's own LRU order is not
// visible to a router, so the cap is a guard against lost remove events, not a cache model.
func (ix *Index) Store(w Worker, tier int, parent uint64, seqs, keys []uint64) int {
	if len(seqs) == 0 { // a prompt shorter than a block: nothing to store, nor prefetch scratch to clear
		ix.enforceCap(w, tier)
		return 0
	}
	h := ix.holderOf(w, tier)
	added := 0
	var ahead [matchRun]uint64
	var addrs [2 * matchRun]uintptr
	var last stored
	// A group's summary (summary.go) is recomputed once per run of its blocks that changed.
	home, dirty := uint64(0), false
	for i, seq := range seqs {
		if i%matchRun == 0 { // prefetch where the next blocks go if nothing branched
			p := parent
			n := min(matchRun, len(seqs)-i)
			for j := range n {
				p = ChildKey(p, seqs[i+j])
				ahead[j] = p
			}
			ix.prefetchSlots(ahead[:n], addrs[:0])
			if i == 0 && continues(ahead[0]) { // the first block may need its branch key looked at
				ix.prefetchHome(BranchKey(ahead[0], seq))
			}
		}
		key, isNew, st := ix.store1(parent, seq, last, h)
		last = st
		if h := homeOf(key); h != home || i == 0 {
			if dirty {
				ix.resum(home)
			}
			home, dirty = h, false
		}
		if isNew {
			added++
			dirty = true
		}
		if keys != nil {
			keys[i] = key
		}
		parent = key
	}
	if dirty {
		ix.resum(home)
	}
	ix.workers[w].counts[tier].Add(int64(added))
	ix.enforceCap(w, tier)
	return added
}

// stored is what Store knows about the block it stored last, for the next: whether the block
// was new (its key created by this store) and its shard's redirect count then.
type stored struct {
	created   bool
	redirects uint64
}

// store1 adds holder h to the block with sequence hash seq whose parent has key
// parent (prev: what storing the parent found) and returns the block's key, whether h was new, and what the next block needs to know. A block that would continue its parent's
// group goes there unless a sibling holds that place; then it goes to its branch key
// (keys.go). A block never has both keys at once: deciding needs both candidate shards locked
// (in shard order, the only place two are held; TryLock out of order, else both again in
// order), except where the parent was created by this very store and no block of the shard has
// gone to its branch key since. Then the block cannot have a branch key (it would have needed the
// parent to get one), and a new block in a new sequence costs one lock and one probe.
func (ix *Index) store1(parent, seq uint64, prev stored, h holder) (uint64, bool, stored) {
	ck := ChildKey(parent, seq)
	sc := ix.shardOf(ck)
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if !continues(ck) {
		added, created := sc.setBit(ck, h)
		return ck, added, stored{created, sc.redirects}
	}
	t := sc.tab.Load()
	i, blocked := t.probe(ck)
	if i >= 0 { // the block is there: the common case for a block stored before
		return ck, sc.setAt(t, i, h), stored{}
	}
	if !blocked && prev.created && prev.redirects == sc.redirects {
		sc.insert(ck, h)
		return ck, true, stored{true, sc.redirects}
	}
	bk := BranchKey(ck, seq)
	so := ix.shardOf(bk)
	if so != sc {
		if uintptr(unsafe.Pointer(so)) > uintptr(unsafe.Pointer(sc)) {
			so.mu.Lock()
		} else if !so.mu.TryLock() { // take both in shard order and look again
			sc.mu.Unlock()
			so.mu.Lock()
			sc.mu.Lock()
			t = sc.tab.Load()
			if i, blocked = t.probe(ck); i >= 0 {
				so.mu.Unlock()
				return ck, sc.setAt(t, i, h), stored{}
			}
		}
		defer so.mu.Unlock()
	}
	to := so.tab.Load()
	if j := to.find(bk); j >= 0 {
		return bk, so.setAt(to, j, h), stored{}
	}
	if blocked {
		sc.redirects++
		so.insert(bk, h)
		return bk, true, stored{true, so.redirects}
	}
	sc.insert(ck, h)
	return ck, true, stored{true, sc.redirects}
}

// resum recomputes the summary of the group with home `home` (summary.go), if the index keeps
// summaries.
func (ix *Index) resum(home uint64) {
	if !ix.sums && !ix.idSums {
		return
	}
	s := ix.shardOf(home)
	s.mu.Lock()
	s.resum(home)
	s.mu.Unlock()
}

// Remove records that worker w no longer holds the blocks on tier (by the keys Store returned).
// Blocks nobody holds any more are deleted at once. It returns how many entries were removed.
func (ix *Index) Remove(w Worker, tier int, keys []uint64) int {
	removed := ix.clearEach(w, tier, keys)
	ix.workers[w].counts[tier].Add(-int64(removed))
	return removed
}

// MoveKey handles a block (sequence hash seq, parent key pk) that worker w just stored on tier
// under key, and held on the tiers in held (bit t: tier t) under another key, old: a cap
// evicted a block before it, and this time a sibling decided otherwise (keys.go). The worker's
// bits at the old key would never be removed, so they go; its other tiers are stored under the
// new key. It returns the tiers the worker now holds the block on besides tier. A writer that
// remembers the keys Store chose (an engine) calls it when Store gives a block it holds a new
// one.
func (ix *Index) MoveKey(w Worker, held uint8, old, pk, seq, key uint64, tier int) uint8 {
	var moved uint8
	for t := range ix.opts.Tiers {
		if held&(1<<t) == 0 {
			continue
		}
		ix.Remove(w, t, []uint64{old})
		if t == tier {
			continue
		}
		var k [1]uint64
		ix.Store(w, t, pk, []uint64{seq}, k[:])
		if k[0] != key { // the index changed meanwhile (a cap evicted the block at key, or another
			// worker's sibling came or went): drop the tier rather than track two keys
			ix.Remove(w, t, k[:])
			continue
		}
		moved |= 1 << t
	}
	return moved
}

// clearEach clears worker w's bit on tier for each key, under its shard's lock, prefetching runs
// of slots ahead, and counts the bits that were set.
func (ix *Index) clearEach(w Worker, tier int, keys []uint64) int {
	h := ix.holderOf(w, tier)
	changed := 0
	var addrs [2 * matchRun]uintptr
	dirty := false // a bit of the current group changed: its summary is recomputed at the group's end
	for i, k := range keys {
		if i%matchRun == 0 {
			ix.prefetchSlots(keys[i:min(i+matchRun, len(keys))], addrs[:0])
		}
		key := keyOf(k)
		s := ix.shardOf(key)
		s.mu.Lock()
		if s.clearBit(key, h) {
			changed++
			dirty = true
		}
		if dirty && (i+1 == len(keys) || homeOf(keyOf(keys[i+1])) != homeOf(key)) {
			s.resum(homeOf(key))
			dirty = false
		}
		s.mu.Unlock()
	}
	return changed
}

func (ix *Index) enforceCap(w Worker, tier int) {
	ws := &ix.workers[w]
	capacity := ws.capacity.Load()
	if capacity == 0 || ws.counts[tier].Load() <= capacity {
		return
	}
	ws.evictMu.Lock()
	defer ws.evictMu.Unlock()
	word, bit := bitOf(int(w))
	cleared := make([]int64, ix.opts.Tiers)
	c := &ws.cursor[tier]
	// At most one full pass plus the rest of the starting shard.
	for passes := 0; passes <= len(ix.shards); {
		excess := ws.counts[tier].Load() - ws.capacity.Load()
		if excess <= 0 {
			return
		}
		s := &ix.shards[c.shard]
		s.mu.Lock()
		next := s.clearWorker(int(w), word, bit, tier, tier+1, ix.words, c.slot, int(excess), cleared)
		s.mu.Unlock()
		ws.counts[tier].Add(-cleared[tier])
		cleared[tier] = 0
		if next < 0 {
			c.shard, c.slot = (c.shard+1)%len(ix.shards), 0
			passes++
		} else {
			c.slot = next
		}
	}
}

// Blocks is the number of distinct blocks in the index (its nodes).
func (ix *Index) Blocks() int64 {
	var n int64
	for i := range ix.shards {
		n += ix.shards[i].tab.Load().used.Load()
	}
	return n
}

// Bytes is the memory of the index's tables, summaries and overflow bitmaps (the arrays that
// grow with what it holds; read without a lock, so a moment's figure while writers work).
func (ix *Index) Bytes() int64 {
	var words int
	for i := range ix.shards {
		sh := &ix.shards[i]
		words += len(sh.tab.Load().slots)
		if t := sh.sum.Load(); t != nil {
			words += len(t.slots)
		}
		if sh.ids != nil {
			words += len(sh.ids.pool.Load().words)
		}
	}
	return int64(words) * 8
}

// Entries is the number of (block, worker, tier) entries.
func (ix *Index) Entries() int64 {
	var n int64
	for i := range ix.workers {
		for t := range ix.workers[i].counts {
			n += ix.workers[i].counts[t].Load()
		}
	}
	return n
}

// Held is how many blocks worker w holds on tier.
func (ix *Index) Held(w Worker, tier int) int64 { return ix.workers[w].counts[tier].Load() }

// Match is the answer to a query: for each worker and tier, how many leading blocks of the
// query the worker holds on that tier or a faster one (tier 0: device memory only; tier 1:
// device or the next tier, ...). Reuse one Match per goroutine; it allocates only when the
// index layout is larger than the last one it served (or a query has more holders).
type Match struct {
	n, tiers, maxWorkers int
	blocks               []int32  // [tier*maxWorkers + worker]
	holders              []Worker // the workers with a count > 0 on some tier
	// scan: holders is not kept while matching (match1: at most 64 workers, whose counts
	// Holders reads instead), scanned: Holders has listed them since.
	scan, scanned bool
	active, buf   []uint64
	keys          []uint64 // the query's keys (scratch)
	live, sel     []int32  // mask words still in play, and their indexes in a slot (scratch)

	// The id layout's lookup (matchids.go): its workers as a list while few, else as masks in
	// active and live.
	sp    []spEntry
	lv    []int32 // scratch: each sp worker's lowest tier in an overflowed block
	dense bool
	sig   [2]uint64 // the holder set of the block before
	one   [2]uint64 // scratch: one slot's holder words
}

// Len is the number of blocks queried.
func (m *Match) Len() int { return m.n }

// Blocks is how many leading blocks of the query worker w holds on tier or a faster one.
func (m *Match) Blocks(w Worker, tier int) int { return int(m.blocks[tier*m.maxWorkers+int(w)]) }

// Holders lists the workers that hold at least the query's first block on some tier (Blocks(w,
// Tiers-1) > 0), each once, in no particular order: a caller can score only these instead of
// every worker slot. It is valid until the next Match with m.
func (m *Match) Holders() []Worker {
	if m.scan && !m.scanned { // (one mask word, one tier: 64 counts to look at)
		m.holders = m.holders[:0]
		for w, n := range m.blocks {
			if n > 0 {
				m.holders = append(m.holders, Worker(w))
			}
		}
		m.scanned = true
	}
	return m.holders
}

// clearAll is the most counts a Match clears all of: below it, clearing them (a few lines) costs
// less than clearing the last query's holders one by one; 64 workers on up to 4 tiers.
const clearAll = 256

func (m *Match) reset(ix *Index, n int) {
	tiers, maxWorkers := ix.opts.Tiers, ix.opts.MaxWorkers
	if tiers != m.tiers || maxWorkers != m.maxWorkers || len(m.blocks) != tiers*maxWorkers || m.scan ||
		len(m.blocks) <= clearAll {
		m.blocks = resize(m.blocks, tiers*maxWorkers)
		clear(m.blocks)
	} else {
		// Only the holders' counts are non-zero (a worker counted on a tier is counted on the last
		// tier too: tiers include the faster ones): O(holders), not O(MaxWorkers).
		for _, w := range m.holders {
			for t := range tiers {
				m.blocks[t*maxWorkers+int(w)] = 0
			}
		}
	}
	m.n, m.tiers, m.maxWorkers = n, tiers, maxWorkers
	m.holders = m.holders[:0]
	m.scan, m.scanned = ix.sums, false
	m.active = resize(m.active, m.tiers*ix.words)
	if ix.ids != nil {
		m.buf = resize(m.buf, m.tiers*ix.words)
	} else {
		m.buf = resize(m.buf, ix.stride-1)
	}
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Match fills m with each worker's leading-block overlap with a sequence (its sequence hashes,
// first block first). It takes no lock and stops at the first block nobody holds. It walks the
// chain as Store built it: each block under its parent's group, or where it branched off a
// sibling, under its branch key (keys.go).
func (ix *Index) Match(seqs []uint64, m *Match) {
	m.reset(ix, len(seqs))
	if len(seqs) == 0 {
		return
	}
	if ix.sums {
		m.keys = resize(m.keys, len(seqs)) // match1 computes the keys of the groups it walks
		ix.match1(seqs, m)
		return
	}
	if ix.ids != nil {
		ix.matchIDs(seqs, m)
		return
	}
	m.keys = ChainKeys(m.keys[:0], seqs)
	// Prefetch the slots a run ahead, where the chain's keys put them (a branch moves only the
	// rest of its group: keys.go).
	var addrs [2 * matchRun]uintptr
	ix.prefetchSlots(m.keys[:min(matchRun, len(seqs))], addrs[:0])
	words, tiers := ix.words, ix.opts.Tiers
	hint := slotHint{slot: -1}
	// After the first block only the mask words with a worker left in them matter (with 1,024
	// workers, a block held by 4 has at most 4 of 16): live lists them, sel their indexes in a
	// slot's words, and only those are read and walked.
	live := m.live[:0]
	for wd := range words {
		live = append(live, int32(wd))
	}
	var sel []int32 // nil: read every word (the first block)
	var parent uint64
	for i, seq := range seqs {
		if i%matchRun == 0 && i+matchRun < len(seqs) {
			ix.prefetchSlots(m.keys[i+matchRun:min(i+2*matchRun, len(seqs))], addrs[:0])
		}
		key := ChildKey(parent, seq)
		found := ix.shardOf(key).read(key, m.buf, sel, &hint)
		if !found && continues(key) {
			key = BranchKey(key, seq)
			found = ix.shardOf(key).read(key, m.buf, sel, &hint)
		}
		if !found {
			clear(m.buf)
		}
		parent = key
		n := 0
		for _, wd := range live {
			left := false
			cum := uint64(0) // tier t counts blocks held on tier t or any faster tier
			for t := range tiers {
				w := t*words + int(wd)
				a := &m.active[w]
				cum |= m.buf[w]
				na := cum
				if i > 0 {
					na &= *a
					m.record(t, int(wd), *a&^na, i)
				}
				*a = na
				left = left || na != 0
			}
			if left {
				live[n] = wd
				n++
			}
		}
		if n == 0 {
			m.live = live
			return
		}
		if n < len(live) || sel == nil {
			live = live[:n]
			sel = m.sel[:0]
			for t := range tiers {
				for _, wd := range live {
					sel = append(sel, int32(t*words)+wd)
				}
			}
			m.sel = sel
		}
	}
	for t := range tiers {
		for _, wd := range live {
			m.record(t, int(wd), m.active[t*words+int(wd)], len(seqs))
		}
	}
	m.live = live
}

// record sets the count of every worker in gone (mask word wd of tier t) to n (> 0), and lists
// them in holders on the last tier (where every counted worker ends).
func (m *Match) record(t, wd int, gone uint64, n int) {
	base := t*m.maxWorkers + wd*64
	last := t == m.tiers-1
	for gone != 0 {
		b := bits.TrailingZeros64(gone)
		m.blocks[base+b] = int32(n)
		if last {
			m.holders = append(m.holders, Worker(wd*64+b))
		}
		gone &= gone - 1
	}
}

// record1 is record for match1 (one mask word, one tier), which lists no holders.
func (m *Match) record1(gone uint64, n int) {
	blocks := (*[64]int32)(m.blocks)
	for ; gone != 0; gone &= gone - 1 {
		blocks[bits.TrailingZeros64(gone)] = int32(n)
	}
}

// match1 is Match for one mask word and one tier; m.keys has room for the query's keys, and it
// computes those of the groups it walks (most it skips: summary.go). It reads the summaries of
// up to sumWindow groups at once, all prefetched, and prefetches the slots of the groups it will
// walk. A group's blocks (keys.go) usually sit in consecutive slots: after probing for a group's
// first block, the lookup reads on from the slot after it for as long as it finds the next key
// there, under one version check. A key found in a shard's table belongs to that shard, so
// those blocks need no shard lookup.
func (ix *Index) match1(seqs []uint64, m *Match) {
	keys := m.keys
	active := ^uint64(0)
	var addrs [2 * matchRun]uintptr
	var cums, sks [sumWindow]uint64
	const window = sumWindow * keyGroup
	prefetch(ix.prefetchSums(seqs[:min(window, len(seqs))], &sks, addrs[:0]))
	for base := 0; base < len(keys); base += window {
		run := keys[base:min(base+window, len(keys))]
		next := seqs[min(base+window, len(seqs)):min(base+2*window, len(seqs))]
		firsts := ix.groupSums(seqs[base:base+len(run)], next, &cums, &sks, addrs[:0])
		for j := 0; j < len(run); {
			if j%keyGroup == 0 && j+keyGroup <= len(run) {
				// A whole group from its start: skip it when its summary says no worker's overlap
				// ends in it (summary.go). The first group of the prompt only when its first block
				// has the summary's holders: they are the lookup's workers.
				if c := cums[j/keyGroup]; c != 0 {
					if base+j == 0 {
						if firsts&1 != 0 {
							active = c
							j += keyGroup
							continue
						}
					} else if active&c == active {
						j += keyGroup
						continue
					}
				}
			}
			if j%keyGroup == 0 { // a group to walk: its keys
				fillKeys(run[j:min(j+keyGroup, len(run))], seqs[base+j:])
			}
			key := run[j]
			s := ix.shardOf(key)
			v := s.version.Load()
			t := s.tab.Load()
			slots, mask := t.slots, t.mask
			// Probe for the first block, then read on while the next slot holds the next key, up
			// to the group's end or a block that leaves no worker (the lookup ends there). The
			// probe is table.find for stride 2, written out: calling find cost 20 % at p50 and
			// 40 % at p99 (NOTES.md).
			var h uint64
			found, cont := false, continues(key)
			i := key & mask
			for ; ; i = (i + 1) & mask {
				k := slots[i*2].Load()
				if k == key {
					h, found = slots[i*2+1].Load(), true
					break
				}
				if k == 0 || cont && sibling(k, key) {
					break
				}
			}
			if !found && cont && (v&1 != 0 || s.version.Load() != v) && s.read1(key) != 0 {
				continue // it is there: a writer moved keys while it was probed for
			}
			if !found && cont {
				// Not in its parent's group: the block may have branched off a sibling there. Look
				// for it and the rest of its group under its branch key; the groups after it keep
				// their keys (keys.go).
				end := min(j+keyGroup-keyPos(key), len(run))
				branch(run[j:end], seqs[base+j:])
				ix.prefetchSlots(run[j:end], addrs[:0])
				continue
			}
			h0, first, end := h, i, min(j+keyGroup-keyPos(key), len(run))
			n, act := 1, active&h
			if f := int(first) * 2; f+2*keyGroup <= len(slots) {
				// The group's slots as one array (no wrap at the table's end): no masking and no
				// bounds checks per block.
				g, want := (*[2 * keyGroup]atomic.Uint64)(slots[f:f+2*keyGroup]), run[j:end]
				if len(want) == keyGroup && act != 0 {
					// A whole group, the common case: compare all its keys at once, no branch per
					// block.
					w := (*[keyGroup]uint64)(want)
					diff, a := uint64(0), act
					for q := 1; q < keyGroup; q++ {
						diff |= g[2*q].Load() ^ w[q]
						a &= g[2*q+1].Load()
					}
					if diff == 0 {
						act, n = a, keyGroup
					}
				}
				for ; act != 0 && n < len(want); n++ {
					if g[2*n&(2*keyGroup-1)].Load() != want[n] {
						break
					}
					act &= g[(2*n+1)&(2*keyGroup-1)].Load()
				}
			} else {
				for ; act != 0 && j+n < end; n++ {
					i = (i + 1) & mask
					if slots[i*2].Load() != run[j+n] {
						break
					}
					act &= slots[i*2+1].Load()
				}
			}
			stale := v&1 != 0 || s.version.Load() != v
			if act != active || stale {
				// Some worker's overlap ends in this group (or a writer moved keys meanwhile and
				// the group is read again properly): find the block where each one ends. The
				// masks read again here are checked against the version again: a writer that
				// shifted the group since would hand the lookup another block's holders.
				var hs [keyGroup]uint64
				if !stale {
					hs[0] = h0 // (the slot of an absent first block may be one being filled)
					for k := 1; k < n; k++ {
						hs[k] = slots[((first+uint64(k))&mask)*2+1].Load()
					}
					stale = s.version.Load() != v
				}
				if stale {
					for k := range n {
						hs[k] = s.read1(run[j+k])
					}
				}
				for k, h := range hs[:n] {
					if na := active & h; na != active {
						if i := base + j + k; i > 0 {
							m.record1(active&^na, i)
						}
						if active = na; active == 0 {
							return
						}
					}
				}
			}
			j += n
		}
	}
	m.record1(active, len(keys))
}

// branch rewrites the keys of the rest of a group, keys (sequence hashes seqs), for a group
// that went to its branch key at keys[0]: keys[0] becomes that key, and the rest follow it.
func branch(keys, seqs []uint64) {
	keys[0] = BranchKey(keys[0], seqs[0])
	for i := 1; i < len(keys); i++ {
		keys[i] = ChildKey(keys[i-1], seqs[i])
	}
}

// matchRun is how many blocks are prefetched ahead: enough misses in flight to fill the core's
// miss buffers (64 blocks of a multi-word index: 4 groups, 16 lines or more), few enough that
// a prompt whose match ends early wastes little.
const matchRun = 64

// prefetchHome prefetches key's home slot.
func (ix *Index) prefetchHome(key uint64) {
	t := ix.shardOf(key).tab.Load()
	prefetch([]uintptr{uintptr(unsafe.Pointer(&t.slots[(key&t.mask)*uint64(t.stride)]))})
}

// prefetchSlots prefetches, for each run of keys that continue one another (a group's blocks,
// keys.go), the lines of their slots, and for a one-word index (16-byte slots) the pushSlots
// after them too (where a collision pushes a group: two more lines); for a key that starts no
// such run, its slot's first line. It uses addrs as scratch (prefetching whenever it is full,
// so any capacity will do). Writers use it too: a store or remove of a run of blocks misses the
// cache once per line, and these misses overlap as well. Only the run's last key is checked:
// prefetching is a hint, and a wrong one costs only time.
func (ix *Index) prefetchSlots(keys []uint64, addrs []uintptr) {
	addrs = addrs[:0]
	for i := 0; i < len(keys); {
		key := keyOf(keys[i])
		t := ix.shardOf(key).tab.Load()
		st := uint64(t.stride)
		last := min(i+keyGroup-keyPos(key), len(keys)) - 1 // where the group ends
		span := uint64(1)                                  // slots
		if d := uint64(last - i); d > 0 && keyOf(keys[last])&keyHomeMask == (key+d)&keyHomeMask {
			span = d + 1
			if st == 2 {
				span += pushSlots
			}
		} else {
			last = i
		}
		// One address per line: slot key+n, byte off within it (16-byte slots: four a line).
		slotBytes, n, off := st*8, uint64(0), uint64(0)
		for n < span {
			if len(addrs) == cap(addrs) {
				prefetch(addrs)
				addrs = addrs[:0]
			}
			addrs = append(addrs, uintptr(unsafe.Pointer(&t.slots[((key+n)&t.mask)*st]))+uintptr(off))
			if st == 2 {
				n += 4
				continue
			}
			for off += 64; off >= slotBytes; off -= slotBytes {
				n++
			}
		}
		i = last + 1
	}
	prefetch(addrs)
}
