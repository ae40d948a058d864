package native

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// GEMM benchmarks report GFLOP/s and x-peak: the share of the machine's FMA peak, measured by
// FMAPeak with the widest ISA on the same number of threads in the same run (goal >= 0.8).
// On a shared machine other processes only ever slow a run down, so x-peak is the best call's
// rate over the best of several short peak measurements taken before and after the calls, and
// before and after every earlier shape on as many threads (a peak measured only while another
// process held a core would be too low and give ratios above 1).

var gemmShapes = []struct {
	name    string
	m, n, k int
}{
	{"vit-b-qkv-b1", 197, 2304, 768},      // ViT-B/16-224, one image: Q, K and V in one product
	{"vit-b-proj-b1", 197, 768, 768},      // attention output
	{"vit-b-fc2-b1", 197, 768, 3072},      //
	{"vit-b-fc1-b8", 8 * 197, 3072, 768},  // a batch of 8
	{"vit-b-fc2-b8", 8 * 197, 768, 3072},  //
	{"whisper-base-fc1", 1500, 2048, 512}, // Whisper-base, 30 s
}

// measurePeak times FMAPeak in 20 slices of about 5 ms and returns the best rate in flop/s.
func measurePeak(threads int, isa ISA) float64 {
	iters := int64(1 << 16)
	for {
		t0 := time.Now()
		FMAPeak(iters, threads, isa)
		if time.Since(t0) > 5*time.Millisecond {
			break
		}
		iters *= 2
	}
	best := 0.0
	for range 20 {
		t0 := time.Now()
		flops := FMAPeak(iters, threads, isa)
		best = max(best, flops/time.Since(t0).Seconds())
	}
	return best
}

func BenchmarkGEMM(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	bestPeak := map[int]float64{} // by threads, over the whole run
	for _, s := range gemmShapes {
		a, wt, c := randomF32(r, s.m*s.k), randomF32(r, s.n*s.k), make([]float32, s.m*s.n)
		w, err := PackWeights(Matrix{Data: AsBytes(wt), DType: F32, Rows: s.n, Cols: s.k})
		if err != nil {
			b.Fatal(err)
		}
		for _, threads := range threadCounts() {
			b.Run(fmt.Sprintf("%s/threads=%d", s.name, threads), func(b *testing.B) {
				opt := GEMMOptions{Threads: threads}
				flops := 2 * float64(s.m) * float64(s.n) * float64(s.k)
				peak := max(bestPeak[threads], measurePeak(threads, ISAAuto))
				fastest := time.Duration(1 << 62)
				for b.Loop() {
					t0 := time.Now()
					if err := MulPacked(c, a, w, opt); err != nil {
						b.Fatal(err)
					}
					fastest = min(fastest, time.Since(t0))
				}
				b.StopTimer()
				peak = max(peak, measurePeak(threads, ISAAuto))
				bestPeak[threads] = peak
				rate := flops * float64(b.N) / b.Elapsed().Seconds()
				b.ReportMetric(rate/1e9, "GFLOP/s")
				b.ReportMetric(peak/1e9, "peak-GFLOP/s")
				b.ReportMetric(flops/fastest.Seconds()/peak, "x-peak")
			})
		}
		w.Free()
	}
}
