package synth

import (
	"bytes"
	"os"
	"testing"
	"time"
)

// Learning Mooncake's conversation trace (12,031 requests) against just parsing it, and
// synthesizing a trace of the same size against learning it: both reported as ratios of the
// same-loop baseline.
func BenchmarkTreeAndSynth(b *testing.B) {
	raw, err := os.ReadFile(conversation)
	if err != nil {
		b.Skip(err)
	}
	var readT, buildT, synthT time.Duration
	k := DefaultKnobs()
	k.Seed = 1
	n := 0
	for b.Loop() {
		t0 := time.Now()
		recs, err := ReadTrace(bytes.NewReader(raw), DefaultLimits())
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		tree, err := BuildTree(recs, 512)
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		out, err := Synthesize(tree, k)
		if err != nil {
			b.Fatal(err)
		}
		readT += t1.Sub(t0)
		buildT += t2.Sub(t1)
		synthT += time.Since(t2)
		n = len(out)
	}
	b.ReportMetric(float64(buildT.Nanoseconds())/float64(b.N*n), "build-ns/request")
	b.ReportMetric(float64(synthT.Nanoseconds())/float64(b.N*n), "synth-ns/request")
	b.ReportMetric(float64(buildT)/float64(readT), "build/parse")
	b.ReportMetric(float64(synthT)/float64(readT), "synth/parse")
}
