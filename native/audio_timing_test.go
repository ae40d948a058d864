package native

import (
	"fmt"
	"math"
	"syscall"
	"testing"
	"time"
)

// benchBeside times op every iteration and, untimed but in the same loop, ref on every
// refEvery-th iteration (references can be much slower than what they measure), and reports
// x-NAME: ref's mean time per call over op's.
func benchBeside(b *testing.B, name string, refEvery int, op, ref func() error) {
	var refTime time.Duration
	refCalls := 0
	for i := 0; b.Loop(); i++ {
		if err := op(); err != nil {
			b.Fatal(err)
		}
		if i%refEvery == 0 {
			b.StopTimer()
			t0 := time.Now()
			if err := ref(); err != nil {
				b.Fatal(err)
			}
			refTime += time.Since(t0)
			refCalls++
			b.StartTimer()
		}
	}
	opMean := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(refTime.Seconds()/float64(refCalls)/opMean, "x-"+name)
}

// Log-mel of 30 s of audio (Hugging Face's convention: one 480,000-sample chunk, 3000 frames),
// 80 mels, timed beside the straightforward dense-DFT version on the same input in the same loop.
// x-dft is how many times faster the FFT path is; ms/item is its time per 30 s of audio (the goal
// is <= 3 ms on one core).
func BenchmarkLogMel30s(b *testing.B) {
	x := make([]float32, 480000)
	for i := range x {
		t := float64(i) / WhisperSampleRate
		x[i] = float32(0.3*math.Sin(2*math.Pi*220*t) + 0.1*math.Sin(2*math.Pi*3150*t+1.1) + 0.01*math.Sin(float64(i)*1e-3*float64(i)))
	}
	frames := LogMelFrames(len(x))
	dst, ref := make([]float32, 80*frames), make([]float32, 80*frames)
	for _, isa := range SupportedISAs() {
		for _, threads := range threadCounts() {
			b.Run(fmt.Sprintf("%v/threads=%d", isa, threads), func(b *testing.B) {
				in := LogMelInput{Samples: x, Mels: 80, Threads: threads, ISA: isa}
				var cpu time.Duration
				benchBeside(b, "dft", 16,
					func() error { c0 := cpuTime(); _, err := LogMel(dst, in); cpu += cpuTime() - c0; return err },
					func() error { return LogMelDFT(ref, in) })
				b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/item")
				// CPU time (user + system, all threads): steadier than wall time on a shared machine.
				b.ReportMetric(cpu.Seconds()*1e3/float64(b.N), "cpu-ms/item")
			})
		}
	}
}

// cpuTime is the process's user + system CPU time (bench/peers report cpu_ms_per_item alike).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
