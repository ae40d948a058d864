package features

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"dataplane/native"
)

// Feature sizes of the models in REFERENCE.md, in bytes (bf16).
var (
	llavaImage   = int64(576 * 4096 * 2)  // 4.5 MiB
	qwenImage    = int64(1225 * 3584 * 2) // ≈ 8.4 MiB
	whisper30s   = int64(1500 * 1280 * 2) // ≈ 3.7 MiB
	videoMin     = int64(30e6)            // seed 001's videos: 30–125 MB
	videoMax     = int64(125e6)
	mergedMin    = int64(5000 * 4096 * 2) // merged sequences of 5k–32k tokens
	mergedMax    = int64(32768 * 4096 * 2)
	benchUnit    = int64(64 << 10)
	benchPoolCap = int64(4 << 30)
)

// traceSize draws a size from the phase's mix: images and audio first, then videos, then
// merged sequences, then all of them: the shifts a node sees when its traffic changes.
func traceSize(r *rand.Rand, phase int) int64 {
	between := func(lo, hi int64) int64 { return lo + r.Int64N(hi-lo) }
	switch k := r.IntN(10); phase % 4 {
	case 0:
		return []int64{llavaImage, qwenImage, whisper30s}[k%3]
	case 1:
		if k < 6 {
			return between(videoMin, videoMax)
		}
		return llavaImage
	case 2:
		if k < 5 {
			return between(mergedMin, mergedMax)
		}
		return qwenImage
	default:
		if k < 3 {
			return between(videoMin, videoMax)
		}
		if k < 5 {
			return between(mergedMin, mergedMax)
		}
		return []int64{llavaImage, qwenImage, whisper30s}[k%3]
	}
}

type carver interface {
	alloc(n int) (int, bool)
	release(off, n int)
}

type buddyCarver struct{ *buddy }

func (b buddyCarver) release(off, n int) { b.buddy.release(off, off+n) }

type extentCarver struct{ *extents }

func (e extentCarver) release(off, n int) { e.extents.release(off, off+n) }

// replay runs a carver as a full pool does: before each allocation it frees random live items
// (as releases would) until the new one fits by bytes within the target load, and while the
// carver still refuses it (fragmentation: the bytes are free, not in one piece it can give) it
// frees more. load sums the occupancy after each allocation: how much of the budget the
// carver really keeps in use.
type replay struct {
	c       carver
	live    [][2]int // offset, units
	inUse   int
	allocs  int
	refused int
	load    float64
	ops     int
	elapsed time.Duration
}

func (p *replay) freeOne(r *rand.Rand) {
	i := r.IntN(len(p.live))
	t0 := time.Now()
	p.c.release(p.live[i][0], p.live[i][1])
	p.elapsed += time.Since(t0)
	p.ops++
	p.inUse -= p.live[i][1]
	p.live[i] = p.live[len(p.live)-1]
	p.live = p.live[:len(p.live)-1]
}

func (p *replay) step(r *rand.Rand, n, units, target int) {
	for p.inUse+n > target && len(p.live) > 0 {
		p.freeOne(r)
	}
	for {
		t0 := time.Now()
		off, ok := p.c.alloc(n)
		p.elapsed += time.Since(t0)
		p.ops++
		if ok {
			p.live = append(p.live, [2]int{off, n})
			p.inUse += n
			p.allocs++
			p.load += float64(p.inUse) / float64(units)
			return
		}
		p.refused++
		if len(p.live) == 0 {
			return
		}
		p.freeOne(r)
	}
}

// BenchmarkCarverTrace replays the same trace (a 4 GiB pool in 64 KiB units; the sizes of
// LLaVA / Qwen2-VL images, Whisper audio, 30–125 MB videos and merged sequences, in mixes that
// shift every 20,000 items) through the buddy carver and the size-class alternative in the same
// loop, both aiming at 90% load. It reports the mean load each sustains (higher: more of the
// budget usable), refusals per allocation, and the size classes' time per operation over the
// buddy's (x-sizeclass-speed > 1: the buddy is faster).
func BenchmarkCarverTrace(b *testing.B) {
	perOp := func(p *replay) float64 { return float64(p.elapsed.Nanoseconds()) / float64(max(p.ops, 1)) }
	units := int(benchPoolCap / benchUnit)
	target := units * 9 / 10
	seed := rand.Uint64()
	b.Logf("random seed %#x", seed)
	ext := &replay{c: extentCarver{newExtents(units)}}
	bud := &replay{c: buddyCarver{newBuddy(units)}}
	sc := &replay{c: newSizeClasses(units)}
	re, rb, rs := rand.New(rand.NewPCG(seed, 1)), rand.New(rand.NewPCG(seed, 1)), rand.New(rand.NewPCG(seed, 1))
	sizes := rand.New(rand.NewPCG(seed, 2))
	i := 0
	for b.Loop() {
		n := int((traceSize(sizes, i/20000) + benchUnit - 1) / benchUnit)
		ext.step(re, n, units, target)
		bud.step(rb, n, units, target)
		sc.step(rs, n, units, target)
		i++
	}
	b.ReportMetric(perOp(ext), "extent-ns/op")
	b.ReportMetric(ext.load/float64(max(ext.allocs, 1)), "extent-load")
	b.ReportMetric(float64(ext.refused)/float64(max(ext.allocs, 1)), "extent-refusals/alloc")
	b.ReportMetric(perOp(bud), "buddy-ns/op")
	b.ReportMetric(perOp(sc), "sizeclass-ns/op")
	b.ReportMetric(perOp(sc)/perOp(bud), "x-sizeclass-speed")
	b.ReportMetric(bud.load/float64(max(bud.allocs, 1)), "buddy-load")
	b.ReportMetric(sc.load/float64(max(sc.allocs, 1)), "sizeclass-load")
	b.ReportMetric(float64(bud.refused)/float64(max(bud.allocs, 1)), "buddy-refusals/alloc")
	b.ReportMetric(float64(sc.refused)/float64(max(sc.allocs, 1)), "sizeclass-refusals/alloc")
}

// BenchmarkPoolAlloc times an allocation and its release from the host pool (the store's real
// path: lock, extent carve, accounting) beside make([]byte) of the same size in the same loop,
// and reports x-make: make's time over the pool's (> 1: the pool is faster). make also zeroes
// the bytes and leaves them to the garbage collector; the pool hands out memory as it was.
func BenchmarkPoolAlloc(b *testing.B) {
	s, err := New(Options{Host: PoolOptions{Capacity: benchPoolCap, BlockBytes: benchUnit}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, size := range []struct {
		name string
		n    int64
	}{{"64KiB", 64 << 10}, {"whisper-3.7MiB", whisper30s}, {"llava-4.5MiB", llavaImage}, {"qwen-8.4MiB", qwenImage}, {"video-125MB", videoMax}} {
		b.Run(size.name, func(b *testing.B) {
			var poolTime, makeTime time.Duration
			var sink []byte
			for b.Loop() {
				t0 := time.Now()
				a, err := s.reserve(ctx, s.host, size.n, true)
				if err != nil {
					b.Fatal(err)
				}
				s.mu.Lock()
				s.host.give(&a)
				s.mu.Unlock()
				t1 := time.Now()
				sink = make([]byte, size.n)
				makeTime += time.Since(t1)
				poolTime += t1.Sub(t0)
			}
			_ = sink
			b.ReportMetric(float64(poolTime.Nanoseconds())/float64(b.N), "pool-ns/op")
			b.ReportMetric(float64(makeTime.Nanoseconds())/float64(b.N), "make-ns/op")
			b.ReportMetric(float64(makeTime)/float64(poolTime), "x-make")
		})
	}
}

// BenchmarkGatherHugePages gathers random 8 KiB rows (a 32,000 × 4,096 f16 embedding table,
// 256 MiB, the merge's worst case) from a table in a pool region with and without
// MADV_HUGEPAGE, each beside memcpy of the same bytes in the same loop (x-memcpy, as the
// native merge benchmarks report it).
func BenchmarkGatherHugePages(b *testing.B) {
	const vocab, d, tokens = 32000, 4096, 8192
	r := rand.New(rand.NewPCG(1, 2))
	ids := make([]int32, tokens)
	for i := range ids {
		ids[i] = int32(r.IntN(vocab))
	}
	for _, huge := range []bool{false, true} {
		b.Run(fmt.Sprintf("hugepages=%v", huge), func(b *testing.B) {
			a := &MmapAllocator{HugePages: huge}
			tableRegion, err := a.Map(vocab * d * 2)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Unmap(tableRegion)
			for i := range tableRegion.Host {
				tableRegion.Host[i] = byte(i)
			}
			table := native.Matrix{Data: tableRegion.Host, DType: native.F16, Rows: vocab, Cols: d}
			dst := native.Matrix{Data: make([]byte, tokens*d*2), DType: native.F16, Rows: tokens, Cols: d}
			src := make([]byte, len(dst.Data))
			b.SetBytes(int64(len(dst.Data)))
			native.CopyParallel(dst.Data, src, 1)
			var gatherTime, copyTime time.Duration
			for b.Loop() {
				t0 := time.Now()
				if err := native.Gather(dst, table, ids, 1); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				native.CopyParallel(dst.Data, src, 1)
				copyTime += time.Since(t1)
				gatherTime += t1.Sub(t0)
			}
			b.ReportMetric(float64(copyTime)/float64(gatherTime), "x-memcpy")
		})
	}
}
