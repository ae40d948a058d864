package native

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// GEMM benchmarks report GFLOP/s and x-peak: the share of the machine's FMA peak, measured by
// FMAPeak on the same number of threads in the same run (goal >= 0.70).

var gemmShapes = []struct {
	name    string
	m, n, k int
}{
	{"vit-b-qkv-b1", 197, 768, 768},       // ViT-B/16-224, one image
	{"vit-b-fc1-b8", 8 * 197, 3072, 768},  // a batch of 8
	{"vit-b-fc2-b8", 8 * 197, 768, 3072},  //
	{"whisper-base-fc1", 1500, 2048, 512}, // Whisper-base, 30 s
}

// measurePeak times FMAPeak for about 50 ms and returns flop/s.
func measurePeak(threads int, isa ISA) float64 {
	iters := int64(1 << 20)
	for {
		t0 := time.Now()
		flops := FMAPeak(iters, threads, isa)
		if d := time.Since(t0); d > 50*time.Millisecond {
			return flops / d.Seconds()
		}
		iters *= 2
	}
}

func BenchmarkGEMM(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
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
				peak := measurePeak(threads, ISAAuto)
				for b.Loop() {
					if err := MulPacked(c, a, w, opt); err != nil {
						b.Fatal(err)
					}
				}
				rate := flops * float64(b.N) / b.Elapsed().Seconds()
				b.ReportMetric(rate/1e9, "GFLOP/s")
				b.ReportMetric(peak/1e9, "peak-GFLOP/s")
				b.ReportMetric(rate/peak, "x-peak")
			})
		}
		w.Free()
	}
}
