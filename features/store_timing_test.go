package features

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkAdmitSettleRelease is the store's hot path under contention: each operation is one
// request that admits an item (a miss: reserve 4.5 MiB), completes it (settle), merges,
// prefills and so releases it, run from 4 goroutines per CPU on one store. Before the
// contended run it times the same loop on one goroutine, in the same benchmark, and reports
// x-serial: contended throughput over single-goroutine throughput (1 = the lock costs nothing
// under contention, < 1 = it does). ops/s is contended requests per second.
func BenchmarkAdmitSettleRelease(b *testing.B) {
	for _, tc := range []struct {
		name     string
		capacity int64 // "roomy": never full; "tight": room for a quarter of the goroutines, so they wait
	}{{"roomy", 4 << 30}, {"tight", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			procs := 4 * runtime.GOMAXPROCS(0)
			capacity := tc.capacity
			if capacity == 0 {
				capacity = int64(procs/4) * llavaImage
			}
			s, err := New(Options{Host: PoolOptions{Capacity: capacity, BlockBytes: benchUnit}, MaxWait: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			var id atomic.Int64
			one := func() {
				r, err := s.Begin("", Policy{})
				if err != nil {
					b.Fatal(err)
				}
				k := Key{Content: strconv.FormatInt(id.Add(1), 10), Model: "llava"}
				_, job, err := r.Admit(context.Background(), Item{Key: k, Bytes: llavaImage})
				if err != nil {
					b.Fatal(err)
				}
				if err := job.Complete(llavaImage); err != nil {
					b.Fatal(err)
				}
				if err := r.Merged(); err != nil {
					b.Fatal(err)
				}
				if err := r.Prefilled(); err != nil {
					b.Fatal(err)
				}
			}
			const serialOps = 20000
			t0 := time.Now()
			for range serialOps {
				one()
			}
			serial := time.Since(t0).Seconds() / serialOps
			waits0 := s.Stats().Host.Waits

			b.SetParallelism(4)
			t1 := time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					one()
				}
			})
			b.StopTimer()
			parallel := time.Since(t1).Seconds() / float64(b.N)
			b.ReportMetric(1/parallel, "ops/s")
			b.ReportMetric(serial/parallel, "x-serial")
			b.ReportMetric(float64(s.Stats().Host.Waits-waits0)/float64(b.N), "waits/op")
		})
	}
}
