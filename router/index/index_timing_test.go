package index

import (
	"flag"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"dataplane/router/internal/testrand"
)

// Index benchmarks against a fleet of 64 workers holding 10M (block, worker) entries, each timed
// beside a plain RWMutex-guarded map index (mutexIndex) in the same run:
//
//	BenchmarkMatch4K          (a) one 4K-token prompt (256 blocks) per lookup: p50, p99, and
//	                          the memory floor of such lookups (their own lines, prefetched)
//	BenchmarkLinesOverPages       what the floor is made of: 64 lines over 64 to 8 pages
//	BenchmarkMatch4KApart     (a) the same, index and baseline timed in separate stretches
//	BenchmarkMatch4KHalfCached    a prompt whose second half is new: the lookup ends mid-way
//	BenchmarkEventsWhileMatching (b) block events applied per second by 2 writers while a reader
//	                          looks up continuously, GOMAXPROCS = 2; lookup p99 meanwhile
//	BenchmarkIndexMemory      (c) heap bytes per (block, worker) entry after GC
//
// The fleet: 11,100 conversations of 256 blocks, each held by 4 workers; each conversation starts
// with one of 50 shared system prompts of 16 to 48 blocks (about 222 conversations branch from
// each, mostly in the middle of a key group): ~10M entries over ~2.5M blocks. Hashes are random
// (what xxh3 gives).

var heapProfile = flag.String("router.heapprofile", "", "BenchmarkIndexMemory writes a heap profile with the index and baseline loaded to this file")

const (
	fleetWorkers  = 64
	fleetChains   = 11_100
	fleetLen      = 256 // blocks per conversation: 4,096 tokens at block size 16
	fleetHolders  = 4
	fleetPrompts  = 50
	fleetSysLen   = 32 // mean system prompt length; each prompt's is drawn from [16, 48]
	eventBatchLen = 32 // blocks per store or remove event
)

type fleet struct {
	chains  [][]uint64
	holders [][]int
}

var (
	fleetOnce sync.Once
	theFleet  *fleet
)

func getFleet() *fleet {
	fleetOnce.Do(func() {
		r := rand.New(rand.NewPCG(1, 2))
		sys := make([][]uint64, fleetPrompts)
		for i := range sys {
			// Lengths that are no multiple of the key group (keys.go): conversations branch from a
			// shared prompt mid-group, where they would all want the same slots.
			sys[i] = testrand.Hashes(r, fleetSysLen/2+r.IntN(fleetSysLen+1))
		}
		f := &fleet{}
		for range fleetChains {
			p := sys[r.IntN(fleetPrompts)]
			c := append(slices.Clone(p), testrand.Hashes(r, fleetLen-len(p))...)
			f.chains = append(f.chains, c)
			f.holders = append(f.holders, r.Perm(fleetWorkers)[:fleetHolders])
		}
		theFleet = f
	})
	return theFleet
}

// build loads the fleet into a fresh index and a fresh baseline.
func (f *fleet) build(tb testing.TB) (*Index, *mutexIndex) {
	ix, err := New(DefaultOptions())
	if err != nil {
		tb.Fatal(err)
	}
	for range fleetWorkers {
		if _, err := ix.AddWorker(0); err != nil {
			tb.Fatal(err)
		}
	}
	base := newMutexIndex()
	for i, c := range f.chains {
		for _, w := range f.holders[i] {
			ix.Store(Worker(w), 0, 0, c, nil)
			base.Store(w, c)
		}
	}
	return ix, base
}

var (
	builtOnce sync.Once
	builtIx   *Index
	builtBase *mutexIndex
)

func getBuilt(tb testing.TB) (*Index, *mutexIndex) {
	builtOnce.Do(func() { builtIx, builtBase = getFleet().build(tb) })
	return builtIx, builtBase
}

var (
	slotWordsOnce sync.Once
	slotWords     [][]*atomic.Uint64
)

// getSlotWords returns, for each conversation of the fleet, the holder-mask words of its blocks
// in the built index (one mask word per slot: 64 workers, one tier).
func getSlotWords(tb testing.TB) [][]*atomic.Uint64 {
	ix, _ := getBuilt(tb)
	slotWordsOnce.Do(func() {
		for _, c := range getFleet().chains {
			tabs, slots := ix.chainSlots(c)
			ws := make([]*atomic.Uint64, len(c))
			for i, slot := range slots {
				if slot < 0 {
					tb.Fatalf("block %d of a conversation is not in the index", i)
				}
				ws[i] = &tabs[i].words(slot)[0]
			}
			slotWords = append(slotWords, ws)
		}
	})
	return slotWords
}

// mutexIndex is the baseline: one map from sequence hash to a holder bit mask under one
// sync.RWMutex, the obvious way to write an index.
type mutexIndex struct {
	mu sync.RWMutex
	m  map[uint64]uint64
}

func newMutexIndex() *mutexIndex { return &mutexIndex{m: map[uint64]uint64{}} }

func (x *mutexIndex) Store(w int, hs []uint64) {
	x.mu.Lock()
	for _, h := range hs {
		x.m[h] |= 1 << w
	}
	x.mu.Unlock()
}

func (x *mutexIndex) Remove(w int, hs []uint64) {
	x.mu.Lock()
	for _, h := range hs {
		if v := x.m[h] &^ (1 << w); v == 0 {
			delete(x.m, h)
		} else {
			x.m[h] = v
		}
	}
	x.mu.Unlock()
}

func (x *mutexIndex) Match(hs []uint64, out *[64]int32) {
	*out = [64]int32{}
	x.mu.RLock()
	defer x.mu.RUnlock()
	active := x.m[hs[0]]
	for i := 1; i < len(hs) && active != 0; i++ {
		na := active & x.m[hs[i]]
		for gone := active &^ na; gone != 0; gone &= gone - 1 {
			out[trailingZeros(gone)] = int32(i)
		}
		active = na
	}
	for ; active != 0; active &= active - 1 {
		out[trailingZeros(active)] = int32(len(hs))
	}
}

func trailingZeros(x uint64) int {
	n := 0
	for x&1 == 0 {
		x >>= 1
		n++
	}
	return n
}

type latencies []time.Duration

func (l latencies) quantile(q float64) float64 {
	s := slices.Clone(l)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))].Nanoseconds())
}

// matchSetup is what the lookup benchmarks share: the loaded fleet, checked to agree with the
// baseline, and the generator that draws the prompts.
func matchSetup(b *testing.B) (*Index, *mutexIndex, *fleet, *rand.Rand) {
	ix, base := getBuilt(b)
	f := getFleet()
	checkAgree(b, ix, base, f.chains[0])
	return ix, base, f, rand.New(rand.NewPCG(3, 4))
}

// (a) Lookup latency of one 256-block prompt fully held by 4 workers (no early exit), the
// prompt drawn at random per lookup, alternating index and baseline.
func BenchmarkMatch4K(b *testing.B) {
	ix, base, f, r := matchSetup(b)
	var m Match
	var out [64]int32
	ours, theirs := make(latencies, 0, 1<<20), make(latencies, 0, 1<<20)
	c := make([]uint64, fleetLen)
	// The machine's own tail: the same lookup against an index small enough to stay in cache,
	// timed in the same loop. Its p99 is what a shared VM adds to any microsecond operation.
	small, _ := New(DefaultOptions())
	sw, _ := small.AddWorker(0)
	smallChain := testrand.Hashes(r, fleetLen)
	small.Store(sw, 0, 0, smallChain, nil)
	noise := make(latencies, 0, 1<<20)
	// The memory floor: the words a lookup of another random prompt must read (its blocks' holder
	// masks, found beforehand), all prefetched at once and then loaded, with no computation in
	// between, so the core overlaps as many misses as it can (plain loads alone overlap about
	// half as many: the reorder buffer fills first). No lookup of that prompt can be faster.
	words := getSlotWords(b)
	floor := make(latencies, 0, 1<<20)
	ws := make([]*atomic.Uint64, fleetLen)
	addrs := make([]uintptr, fleetLen)
	var sum uint64
	// ns/op counts all of it; the per-lookup latencies are what is reported. (No StopTimer in
	// the loop: it reads memory statistics, which stops the world and evicts the caches the next
	// lookup would use.)
	for b.Loop() {
		copy(ws, words[r.IntN(len(words))])
		for i, w := range ws {
			addrs[i] = uintptr(unsafe.Pointer(w))
		}
		tf := time.Now()
		prefetch(addrs)
		for _, w := range ws {
			sum += w.Load()
		}
		floor = append(floor, time.Since(tf))
		// A decision matches hashes it has just computed: they are in cache, as here.
		copy(c, f.chains[r.IntN(len(f.chains))])
		t0 := time.Now()
		ix.Match(c, &m)
		t1 := time.Now()
		base.Match(c, &out)
		t2 := time.Now()
		small.Match(smallChain, &m)
		t3 := time.Now()
		ours = append(ours, t1.Sub(t0))
		theirs = append(theirs, t2.Sub(t1))
		noise = append(noise, t3.Sub(t2))
	}
	reportLatency(b, "", ours, theirs)
	b.ReportMetric(floor.quantile(0.5), "floor-p50-ns")
	b.ReportMetric(floor.quantile(0.99), "floor-p99-ns")
	b.ReportMetric(ours.quantile(0.5)/floor.quantile(0.5), "x-floor-p50")
	b.ReportMetric(ours.quantile(0.99)/floor.quantile(0.99), "x-floor-p99")
	runtime.KeepAlive(sum)
	b.ReportMetric(noise.quantile(0.5), "cached-p50-ns")
	b.ReportMetric(noise.quantile(0.99), "cached-p99-ns")
	b.ReportMetric(noise.quantile(0.999), "cached-p999-ns")
}

// What the memory floor is made of: loading 64 cache lines from a 64 MB buffer, all prefetched at
// once and then loaded, spread over 64, 32, 16 or 8 pages (4 KB), and 128 lines over 32 pages.
// Between loads, 2,048 random lines of another 128 MB evict caches and TLB, as a busy router's
// other work would. On a VM a page's first touch costs a nested page walk, so the number of
// pages, more than the number of lines, sets the floor.
func BenchmarkLinesOverPages(b *testing.B) {
	buf := make([]uint64, 64<<20/8)
	other := make([]uint64, 128<<20/8)
	for i := range buf {
		buf[i] = uint64(i)
	}
	r := rand.New(rand.NewPCG(7, 8))
	layouts := []struct {
		name         string
		pages, lines int // lines per page, adjacent
	}{{"64x1", 64, 1}, {"32x2", 32, 2}, {"16x4", 16, 4}, {"8x8", 8, 8}, {"32x4", 32, 4}}
	lat := make([]latencies, len(layouts))
	addrs, ptrs := make([]uintptr, 0, 128), make([]*uint64, 0, 128)
	var sum uint64
	for b.Loop() {
		for li, l := range layouts {
			for range 2048 {
				sum += other[r.IntN(len(other))]
			}
			addrs, ptrs = addrs[:0], ptrs[:0]
			for range l.pages {
				page := r.IntN(len(buf)/512) * 512 // 512 words: 4 KB
				first := r.IntN(64/l.lines) * l.lines * 8
				for j := range l.lines {
					ptrs = append(ptrs, &buf[page+first+j*8])
					addrs = append(addrs, uintptr(unsafe.Pointer(ptrs[len(ptrs)-1])))
				}
			}
			t0 := time.Now()
			prefetch(addrs)
			for _, p := range ptrs {
				sum += *p
			}
			lat[li] = append(lat[li], time.Since(t0))
		}
	}
	runtime.KeepAlive(sum)
	for li, l := range layouts {
		b.ReportMetric(lat[li].quantile(0.5), l.name+"-p50-ns")
	}
	b.ReportMetric(lat[1].quantile(0.5)/lat[3].quantile(0.5), "x-32-vs-8-pages")
}

// (a') The same lookups with the index and the baseline timed in separate stretches of 4,096
// lookups each, alternating, instead of one after the other: here a lookup follows lookups of its
// own structure, not the baseline's, whose 70 MB map evicts the index from L2 and L3 between
// index lookups in BenchmarkMatch4K. Both are reported: Match4K is the colder condition.
func BenchmarkMatch4KApart(b *testing.B) {
	ix, base, f, r := matchSetup(b)
	var m Match
	var out [64]int32
	ours, theirs := make(latencies, 0, 1<<20), make(latencies, 0, 1<<20)
	c := make([]uint64, fleetLen)
	const stretch = 4096
	n := 0
	for b.Loop() {
		copy(c, f.chains[r.IntN(len(f.chains))])
		if n/stretch%2 == 0 {
			t0 := time.Now()
			ix.Match(c, &m)
			ours = append(ours, time.Since(t0))
		} else {
			t0 := time.Now()
			base.Match(c, &out)
			theirs = append(theirs, time.Since(t0))
		}
		n++
	}
	if len(theirs) == 0 { // too few iterations to reach a baseline stretch
		for range len(ours) {
			copy(c, f.chains[r.IntN(len(f.chains))])
			t0 := time.Now()
			base.Match(c, &out)
			theirs = append(theirs, time.Since(t0))
		}
	}
	reportLatency(b, "", ours, theirs)
}

// The common case in real traffic: a prompt whose first half is cached (a conversation's
// earlier turns) and whose second half is new, so each lookup ends at block 128, where it finds
// neither the block's child key nor its own.
func BenchmarkMatch4KHalfCached(b *testing.B) {
	ix, _, f, r := matchSetup(b)
	var m Match
	ours := make(latencies, 0, 1<<20)
	c := make([]uint64, fleetLen)
	for b.Loop() {
		copy(c, f.chains[r.IntN(len(f.chains))])
		for i := fleetLen / 2; i < fleetLen; i++ {
			c[i] = r.Uint64()
		}
		t0 := time.Now()
		ix.Match(c, &m)
		ours = append(ours, time.Since(t0))
	}
	b.ReportMetric(ours.quantile(0.5), "p50-ns")
	b.ReportMetric(ours.quantile(0.99), "p99-ns")
}

func reportLatency(b *testing.B, prefix string, ours, theirs latencies) {
	p50, p99 := ours.quantile(0.5), ours.quantile(0.99)
	b50, b99 := theirs.quantile(0.5), theirs.quantile(0.99)
	b.ReportMetric(p50, prefix+"p50-ns")
	b.ReportMetric(p99, prefix+"p99-ns")
	b.ReportMetric(b50, prefix+"base-p50-ns")
	b.ReportMetric(b99, prefix+"base-p99-ns")
	b.ReportMetric(b99/p99, prefix+"x-base-p99")
}

func checkAgree(b *testing.B, ix *Index, base *mutexIndex, c []uint64) {
	var m Match
	var out [64]int32
	ix.Match(c, &m)
	base.Match(c, &out)
	held := 0
	for w := range fleetWorkers {
		if m.Blocks(Worker(w), 0) != int(out[w]) {
			b.Fatalf("index and baseline disagree on worker %d: %d vs %d", w, m.Blocks(Worker(w), 0), out[w])
		}
		if out[w] == fleetLen {
			held++
		}
	}
	if held < fleetHolders {
		b.Fatalf("only %d workers hold the whole prompt", held)
	}
}

// indexLike is what the event benchmark drives: the index or the baseline. store writes to keys
// what remove takes later.
type indexLike interface {
	store(w int, seqs, keys []uint64)
	remove(w int, keys []uint64)
	match(seqs []uint64)
}

type ixAdapter struct {
	ix *Index
	m  Match
}

func (a *ixAdapter) store(w int, seqs, keys []uint64) { a.ix.Store(Worker(w), 0, 0, seqs, keys) }
func (a *ixAdapter) remove(w int, keys []uint64)      { a.ix.Remove(Worker(w), 0, keys) }
func (a *ixAdapter) match(seqs []uint64)              { a.ix.Match(seqs, &a.m) }

type baseAdapter struct {
	x   *mutexIndex
	out [64]int32
}

func (a *baseAdapter) store(w int, seqs, keys []uint64) { a.x.Store(w, seqs); copy(keys, seqs) }
func (a *baseAdapter) remove(w int, keys []uint64)      { a.x.Remove(w, keys) }
func (a *baseAdapter) match(seqs []uint64)              { a.x.Match(seqs, &a.out) }

// (b) Steady-state churn: 2 writer goroutines (each owning half the workers, so each worker's
// events stay in order) store new 32-block runs and remove the runs they stored 64 events
// earlier, while one goroutine looks up random 256-block prompts without pause. GOMAXPROCS=2:
// writers and the reader share two cores. Reports block events per second and the lookup p99
// seen meanwhile, for the index and the baseline.
func BenchmarkEventsWhileMatching(b *testing.B) {
	ix, base := getBuilt(b)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	const batchesPerWriter = 40_000
	var oursRate, baseRate float64
	var oursLat, baseLat latencies
	for b.Loop() {
		rate, lat := churn(&ixAdapter{ix: ix}, getFleet().chains, fleetWorkers, batchesPerWriter)
		oursRate += rate
		oursLat = append(oursLat, lat...)
		b.StopTimer()
		rate, lat = churn(&baseAdapter{x: base}, getFleet().chains, fleetWorkers, batchesPerWriter)
		baseRate += rate
		baseLat = append(baseLat, lat...)
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(oursRate/n, "events/s")
	b.ReportMetric(baseRate/n, "base-events/s")
	b.ReportMetric(oursRate/baseRate, "x-base-events")
	reportLatency(b, "busy-", oursLat, baseLat)
}

// churn runs the event benchmark's writers against x, over worker slots [0, workers), while a
// reader looks up the prompts in chains, and returns the events applied per second and the
// lookups' latencies.
func churn(x indexLike, chains [][]uint64, workers, batches int) (rate float64, lat latencies) {
	const writers = 2
	var stop atomic.Bool
	var rwg sync.WaitGroup
	rwg.Add(1)
	var readerAdapter indexLike
	switch a := x.(type) {
	case *ixAdapter:
		readerAdapter = &ixAdapter{ix: a.ix}
	case *baseAdapter:
		readerAdapter = &baseAdapter{x: a.x}
	}
	go func() {
		defer rwg.Done()
		r := rand.New(rand.NewPCG(5, 6))
		for !stop.Load() {
			c := chains[r.IntN(len(chains))]
			t0 := time.Now()
			readerAdapter.match(c)
			lat = append(lat, time.Since(t0))
		}
	}()
	var wwg sync.WaitGroup
	start := time.Now()
	for g := range writers {
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			const window = 64
			var ring [window][]uint64
			var ringW [window]int
			var seqs []uint64
			w := g
			for i := range batches {
				slot := i % window
				if ring[slot] != nil {
					x.remove(ringW[slot], ring[slot])
				}
				seqs = seqs[:0]
				for range eventBatchLen { // a stored run of a new sequence
					seqs = append(seqs, r.Uint64())
				}
				w = (w + writers) % workers // this writer's workers: g, g+2, g+4, ...
				ring[slot] = resize(ring[slot], eventBatchLen)
				x.store(w, seqs, ring[slot])
				ringW[slot] = w
			}
			for slot := range ring { // leave the index as it was
				x.remove(ringW[slot], ring[slot])
			}
		}()
	}
	wwg.Wait()
	elapsed := time.Since(start)
	stop.Store(true)
	rwg.Wait()
	events := float64(writers * batches * eventBatchLen * 2) // every stored block is removed again
	return events / elapsed.Seconds(), lat
}

// (c) Heap bytes per (block, worker) entry, index and baseline, measured as the live heap after
// GC with the structure built minus before (the workload's own hash slices exist before).
//
// With -router.heapprofile=FILE it also writes the heap profile taken with both loaded: `go tool
// pprof -sample_index=inuse_space -top FILE` shows the bytes by allocation site (the index's are
// newTable's, the baseline's the map's).
func BenchmarkIndexMemory(b *testing.B) {
	f := getFleet()
	for b.Loop() {
		before := liveHeap()
		ix, base := f.build(b)
		withBoth := liveHeap()
		if *heapProfile != "" {
			out, err := os.Create(*heapProfile)
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.Lookup("heap").WriteTo(out, 0); err != nil {
				b.Fatal(err)
			}
			out.Close()
		}
		entries := ix.Entries()
		blocks := ix.Blocks()
		ixBytes := heapOf(func() { ix = nil }, withBoth)
		baseBytes := withBoth - before - ixBytes
		runtime.KeepAlive(base)
		b.ReportMetric(float64(ixBytes)/float64(entries), "B/entry")
		b.ReportMetric(float64(ixBytes)/float64(blocks), "B/block")
		b.ReportMetric(float64(baseBytes)/float64(entries), "base-B/entry")
		b.ReportMetric(float64(entries)/1e6, "M-entries")
		b.ReportMetric(float64(blocks)/1e6, "M-blocks")
	}
}

func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// heapOf drops a structure (drop clears the last reference) and returns how much heap that freed.
func heapOf(drop func(), with int64) int64 {
	drop()
	return with - liveHeap()
}
