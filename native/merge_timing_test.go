package native

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// Merge benchmarks. Each one also times memcpy of the same number of bytes into the same
// destination, on the same number of threads, interleaved with the merge in the same run, and
// reports the ratio as x-memcpy (merge throughput / memcpy throughput; the goal is >= 0.8).

const (
	benchDim   = 4096  // LLaVA-1.5-7B / Llama-2-7B hidden size
	benchVocab = 32000 // Llama-2 vocabulary: a 256 MiB fp16 table, far larger than any cache
)

// benchLayouts are merged sequences as segments (n > 0: n text tokens, n < 0: a span of -n rows).
var benchLayouts = []struct {
	name     string
	segments []int
}{
	// The seed's worked example: 19 text tokens, one 1,024-token image, one 3,840-token video.
	{"seed-4883", []int{12, -1024, 4, -3840, 3}},
	// 32K tokens: 16 images of 1,024 with 784 text tokens before each, then a 3,840-token video.
	{"32k", append(repeat([]int{784, -1024}, 16), -3840)},
	// Text only: the gather alone.
	{"gather-32k", []int{32768}},
}

func repeat(s []int, n int) []int {
	var out []int
	for range n {
		out = append(out, s...)
	}
	return out
}

func BenchmarkMerge(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	// The table in the daemon's allocation (dataplane's loadTable): 2 MiB pages where THP allows.
	pages, err := MapPages(benchVocab * benchDim * F16.Size())
	if err != nil {
		b.Fatal(err)
	}
	defer pages.Unmap()
	copy(pages.Data, randomBytes(r, len(pages.Data)))
	table := Matrix{Data: pages.Data, DType: F16, Rows: benchVocab, Cols: benchDim}
	for _, l := range benchLayouts {
		in := buildMerge(r, l.segments, benchDim, 2, F16, []DType{F16}, F16)
		for i := range in.TextIDs {
			in.TextIDs[i] = int32(r.IntN(benchVocab))
		}
		in.Table = table
		src := randomBytes(r, len(in.Dst.Data))
		for _, threads := range threadCounts() {
			in.Threads = threads
			b.Run(fmt.Sprintf("%s/threads=%d", l.name, threads), func(b *testing.B) {
				benchAgainstMemcpy(b, in.Dst.Data, src, threads, func() error { return Merge(in) })
			})
		}
	}
}

func threadCounts() []int {
	if n := DefaultThreads(); n > 1 {
		return []int{1, n}
	}
	return []int{1}
}

// benchAgainstMemcpy times op and, untimed but measured in the same loop, memcpy of len(dst)
// bytes from src into dst on the same number of threads.
func benchAgainstMemcpy(b *testing.B, dst, src []byte, threads int, op func() error) {
	b.SetBytes(int64(len(dst)))
	CopyParallel(dst, src, threads) // fault the pages in before timing
	var opTime, copyTime time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		b.StopTimer()
		CopyParallel(dst, src, threads)
		copyTime += time.Since(t1)
		b.StartTimer()
		opTime += t1.Sub(t0)
	}
	b.ReportMetric(float64(copyTime)/float64(opTime), "x-memcpy")
	b.ReportMetric(float64(len(dst))*float64(b.N)/copyTime.Seconds()/1e9, "memcpy-GB/s")
}
