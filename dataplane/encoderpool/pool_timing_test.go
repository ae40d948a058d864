package encoderpool

import (
	"testing"
	"time"

	"dataplane/dataplane/encoder"
	"dataplane/native"
)

type nopModel struct{}

func (nopModel) Run([]encoder.Input, []native.Matrix) error { return nil }

// BenchmarkPoolOverhead: the pool's cost per job (queueing, batching, dispatch, reporting) with
// a model that does nothing, beside calling the model directly in the same loop (x-direct:
// pool time over direct time; what matters is that it is microseconds against milliseconds of
// encoding).
func BenchmarkPoolOverhead(b *testing.B) {
	p := New(Options{MaxBatch: 8, MaxWait: 50 * time.Microsecond, MaxQueued: 1 << 20})
	defer p.Close()
	out := native.Matrix{Data: make([]byte, 4), DType: native.F32, Rows: 1, Cols: 1}
	in := encoder.Input{Data: []float32{1}}
	done := make(chan error, 64)
	var pooled, direct time.Duration
	for b.Loop() {
		t0 := time.Now()
		for range 64 {
			if err := p.Submit(&Job{Model: nopModel{}, Input: in, Out: out, Tokens: 1, Done: func(err error) { done <- err }}); err != nil {
				b.Fatal(err)
			}
		}
		for range 64 {
			<-done
		}
		t1 := time.Now()
		for range 64 {
			_ = nopModel{}.Run([]encoder.Input{in}, []native.Matrix{out})
		}
		pooled += t1.Sub(t0)
		direct += time.Since(t1)
	}
	b.ReportMetric(float64(pooled.Nanoseconds())/float64(b.N*64), "ns/job")
	b.ReportMetric(float64(pooled)/float64(max(direct, 1)), "x-direct")
}
