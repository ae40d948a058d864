package index

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"dataplane/router/internal/testrand"
)

// Benchmarks at 10,000 workers (issue 22, "an index for fleets"), the id layout (ids.go) beside
// the mask layout in the same run:
//
//	BenchmarkFleetMatch4K            (a) lookups of a 4K-token prompt: p50, p99, holders named
//	BenchmarkFleetEventsWhileMatching (b) block events per second from 2 writers while a reader
//	                                 looks up, GOMAXPROCS = 2
//	BenchmarkFleetMemory             (c) heap bytes after GC, per (block, worker) entry and in all
//
// The fleet: conversations of 256 blocks held by 1 to 4 workers each (drawn uniformly), each
// starting with one of the fleet's shared system prompts (16 to 48 blocks), which are therefore
// held by the hundreds of workers holding a conversation that starts with them: their blocks
// overflow into bitmaps and a lookup of one names hundreds of holders. At 10M (block, worker)
// entries ("10M"), the mask layout would need ~12 GB (157 mask words a slot), so it is measured
// only on the fleet scaled down to 1M entries ("1M": a tenth of the conversations and of the
// prompts, so a prompt has as many holders), beside the id layout on the same fleet. The mask
// layout's lookups clear their whole answer as Match did before the id layout (40 KB at 10,000
// workers), inside the timing.

const (
	bigFleetWorkers = 10_000
	bigFleetChains  = 15_500 // ~10M entries
	bigFleetPrompts = 100
)

// bigFleet is a fleet built into one index; what the memory benchmark reports is measured as
// it is built.
type bigFleet struct {
	*fleet
	ix               *Index
	heap             int64 // live heap the index took, after GC
	entries, blocks  int64
	bitmaps, holders int // overflowed blocks, and the mean holders a lookup names
}

var (
	bigFleetsMu sync.Mutex
	bigFleets   = map[string]*bigFleet{}
)

// getBigFleet builds (once) the fleet at the given scale (1: 10M entries, 10: 1M) into an index
// of the given layout.
func getBigFleet(tb testing.TB, scale int, ids bool) *bigFleet {
	bigFleetsMu.Lock()
	defer bigFleetsMu.Unlock()
	name := fmt.Sprintf("%d/%v", scale, ids)
	if bf := bigFleets[name]; bf != nil {
		return bf
	}
	f := makeBigFleet(bigFleetChains/scale, bigFleetPrompts/scale)
	before := liveHeap()
	ix, err := newIndex(Options{MaxWorkers: bigFleetWorkers, Tiers: 1, Shards: 256}, ids)
	if err != nil {
		tb.Fatal(err)
	}
	for range bigFleetWorkers {
		if _, err := ix.AddWorker(0); err != nil {
			tb.Fatal(err)
		}
	}
	for i, c := range f.chains {
		for _, w := range f.holders[i] {
			ix.Store(Worker(w), 0, 0, c, nil)
		}
	}
	bf := &bigFleet{fleet: f, ix: ix, heap: liveHeap() - before, entries: ix.Entries(), blocks: ix.Blocks()}
	if ids {
		bf.bitmaps = ix.bitmapsInUse()
	}
	var m Match
	for _, c := range f.chains[:1000] {
		ix.Match(c, &m)
		bf.holders += len(m.Holders())
	}
	bf.holders /= 1000
	bigFleets[name] = bf
	return bf
}

func makeBigFleet(chains, prompts int) *fleet {
	r := rand.New(rand.NewPCG(9, 10))
	sys := make([][]uint64, prompts)
	for i := range sys {
		sys[i] = testrand.Hashes(r, fleetSysLen/2+r.IntN(fleetSysLen+1))
	}
	f := &fleet{}
	for range chains {
		p := sys[r.IntN(prompts)]
		f.chains = append(f.chains, append(slices.Clone(p), testrand.Hashes(r, fleetLen-len(p))...))
		holders := make([]int, 1+r.IntN(4))
		for i := range holders {
			holders[i] = r.IntN(bigFleetWorkers) // (a repeat only stores the chain again)
		}
		f.holders = append(f.holders, holders)
	}
	return f
}

// bigFleetCases are the (scale, layout) pairs measured: the id layout at 10M and 1M entries,
// the mask layout at 1M.
var bigFleetCases = []struct {
	name  string
	scale int
	ids   bool
}{{"ids-10M", 1, true}, {"ids-1M", 10, true}, {"masks-1M", 10, false}}

// (a) Lookups of a random conversation's whole 256 blocks, the prompts drawn at random.
func BenchmarkFleetMatch4K(b *testing.B) {
	for _, c := range bigFleetCases {
		b.Run(c.name, func(b *testing.B) {
			bf := getBigFleet(b, c.scale, c.ids)
			r := rand.New(rand.NewPCG(3, 4))
			var m Match
			ix := bf.ix
			ix.Match(bf.chains[0], &m)
			lat := make(latencies, 0, 1<<20)
			q := make([]uint64, fleetLen)
			for b.Loop() {
				copy(q, bf.chains[r.IntN(len(bf.chains))])
				t0 := time.Now()
				if !c.ids {
					clear(m.blocks) // what Match cost before: its whole answer cleared
				}
				ix.Match(q, &m)
				lat = append(lat, time.Since(t0))
			}
			b.ReportMetric(lat.quantile(0.5), "p50-ns")
			b.ReportMetric(lat.quantile(0.99), "p99-ns")
			b.ReportMetric(float64(bf.holders), "holders")
		})
	}
}

// (b) The event benchmark of the 64-worker fleet (BenchmarkEventsWhileMatching: 2 writers
// storing and removing 32-block runs of new sequences, a reader looking up the fleet's
// prompts meanwhile, GOMAXPROCS = 2) on the 10,000-worker fleets.
func BenchmarkFleetEventsWhileMatching(b *testing.B) {
	for _, c := range bigFleetCases {
		b.Run(c.name, func(b *testing.B) {
			bf := getBigFleet(b, c.scale, c.ids)
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
			batches := 40_000
			if !c.ids {
				batches = 4_000 // a mask-layout slot is 1,264 bytes: each insert writes them all
			}
			var rate float64
			var lat latencies
			for b.Loop() {
				r, l := churn(&ixAdapter{ix: bf.ix}, bf.chains, bigFleetWorkers, batches)
				rate += r
				lat = append(lat, l...)
			}
			b.ReportMetric(rate/float64(b.N), "events/s")
			b.ReportMetric(lat.quantile(0.5), "busy-p50-ns")
			b.ReportMetric(lat.quantile(0.99), "busy-p99-ns")
		})
	}
}

// (c) The heap the index took as it was built, after GC.
func BenchmarkFleetMemory(b *testing.B) {
	for _, c := range bigFleetCases {
		b.Run(c.name, func(b *testing.B) {
			bf := getBigFleet(b, c.scale, c.ids)
			for b.Loop() {
			}
			b.ReportMetric(float64(bf.heap)/float64(bf.entries), "B/entry")
			b.ReportMetric(float64(bf.heap)/float64(bf.blocks), "B/block")
			b.ReportMetric(float64(bf.heap)/1e9, "heap-GB")
			b.ReportMetric(float64(bf.entries)/1e6, "M-entries")
			b.ReportMetric(float64(bf.blocks)/1e6, "M-blocks")
			b.ReportMetric(float64(bf.bitmaps), "bitmaps")
		})
	}
}
