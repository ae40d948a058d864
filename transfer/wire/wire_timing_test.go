package wire

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

// Transfer benchmarks. Each iteration moves the same payload twice on the same kind of
// socket, once through the protocol (Send → Next + ReadPayload into a buffer, checksums on
// both sides) and once as a plain conn.Write / io.ReadFull of the same bytes, and reports both
// throughputs and their ratio (x-raw: the median over iterations of raw time / protocol time;
// the goal is ≥ 0.8).
// For shared memory the comparison is memcpy of the same bytes (x-memcpy).

var benchSizes = []int{256 << 10, 4 << 20, 32 << 20} // a small item, a LLaVA image (576 × 4096 bf16 = 4.5 MiB), a video

func BenchmarkTransfer(b *testing.B) {
	for _, network := range []string{"tcp", "unix"} {
		for _, n := range benchSizes {
			b.Run(fmt.Sprintf("%s/%dKiB", network, n>>10), func(b *testing.B) { benchTransfer(b, network, n) })
		}
	}
}

func benchTransfer(b *testing.B, network string, n int) {
	ctx := context.Background()
	client, server := pair(b, network, Options{})
	rawA, rawB := pair(b, network, Options{})
	payload := randBytes(rand.New(rand.NewPCG(1, 1)), n)
	dst := make([]byte, n)
	h := Header{Kind: KindFeatures, Key: testKey, DType: DTypeBF16, Rows: uint32(n / 2048), Cols: 1024}

	// The receivers run on their own goroutines for the whole benchmark, like a daemon's.
	wireDone, rawDone := make(chan error), make(chan error)
	go func() {
		for {
			if _, err := server.Next(ctx); err != nil {
				return
			}
			wireDone <- server.ReadPayload(ctx, dst)
		}
	}()
	go func() {
		for {
			_, err := io.ReadFull(rawB.Net(), dst)
			if err != nil {
				return
			}
			rawDone <- nil
		}
	}()
	presum := h
	presum.Sum = Checksum(payload)
	var tWire, tPre, tRaw time.Duration
	var rWire, rPre []float64 // per-iteration ratios: their median shrugs off bursts of other work
	b.SetBytes(int64(n))
	for b.Loop() {
		t0 := time.Now()
		if err := client.Send(ctx, h, payload); err != nil {
			b.Fatal(err)
		}
		if err := <-wireDone; err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := rawA.Net().Write(payload); err != nil {
			b.Fatal(err)
		}
		<-rawDone
		t2 := time.Now()
		if err := client.Send(ctx, presum, payload); err != nil {
			b.Fatal(err)
		}
		if err := <-wireDone; err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		tWire += t1.Sub(t0)
		tRaw += t2.Sub(t1)
		tPre += t3.Sub(t2)
		rWire = append(rWire, t2.Sub(t1).Seconds()/t1.Sub(t0).Seconds())
		rPre = append(rPre, t2.Sub(t1).Seconds()/t3.Sub(t2).Seconds())
	}
	mbs := func(d time.Duration) float64 { return float64(n) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbs(tWire), "wire-MB/s")
	b.ReportMetric(mbs(tPre), "presum-MB/s")
	b.ReportMetric(mbs(tRaw), "raw-MB/s")
	b.ReportMetric(median(rWire), "x-raw")
	b.ReportMetric(median(rPre), "presum-x-raw")
	client.Close()
	rawA.Close()
}

// BenchmarkShm: a shared-memory frame (sender checksum, header + descriptor over a Unix
// socket, receiver maps and checks the checksum, unmaps) beside memcpy of the same bytes into
// a warm buffer.
func BenchmarkShm(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) { benchShm(b, n) })
	}
}

func benchShm(b *testing.B, n int) {
	ctx := context.Background()
	client, server := pair(b, "unix", Options{})
	shm := newShmBuf(b, int64(n))
	payload := shm.r.Host[:n]
	copy(payload, randBytes(rand.New(rand.NewPCG(2, 2)), n))
	dst := make([]byte, n)
	copy(dst, payload)
	h := Header{Kind: KindFeatures, Key: testKey, DType: DTypeU8, Rows: 1, Cols: uint32(n)}
	presum := h
	presum.Sum = Checksum(payload)
	frame := func(h Header) {
		if err := shm.send(ctx, client, h, payload); err != nil {
			b.Fatal(err)
		}
		if _, err := server.Next(ctx); err != nil {
			b.Fatal(err)
		}
		m, err := server.MapPayload()
		if err != nil {
			b.Fatal(err)
		}
		m.Close()
	}
	var tWire, tPre, tCopy time.Duration
	var rWire, rPre []float64
	b.SetBytes(int64(n))
	for b.Loop() {
		t0 := time.Now()
		frame(h)
		t1 := time.Now()
		copy(dst, payload)
		t2 := time.Now()
		frame(presum)
		t3 := time.Now()
		tWire += t1.Sub(t0)
		tCopy += t2.Sub(t1)
		tPre += t3.Sub(t2)
		rWire = append(rWire, t2.Sub(t1).Seconds()/t1.Sub(t0).Seconds())
		rPre = append(rPre, t2.Sub(t1).Seconds()/t3.Sub(t2).Seconds())
	}
	mbs := func(d time.Duration) float64 { return float64(n) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbs(tWire), "shm-MB/s")
	b.ReportMetric(mbs(tPre), "presum-MB/s")
	b.ReportMetric(mbs(tCopy), "memcpy-MB/s")
	b.ReportMetric(median(rWire), "x-memcpy")
	b.ReportMetric(median(rPre), "presum-x-memcpy")
}

func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// BenchmarkChecksum: XXH3-64 (used) beside CRC-32C (SSE4.2, Go's hash/crc32 Castagnoli), over
// a 256 KiB chunk (in L2, as the receiver hashes what it just read) and a 32 MiB payload (from
// DRAM, as a sender hashes a cold item).
func BenchmarkChecksum(b *testing.B) {
	tab := crc32.MakeTable(crc32.Castagnoli)
	for _, n := range []int{256 << 10, 32 << 20} {
		p := randBytes(rand.New(rand.NewPCG(3, 3)), n)
		b.Run(fmt.Sprintf("xxh3/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				xxh3.Hash(p)
			}
		})
		b.Run(fmt.Sprintf("crc32c/%dKiB", n>>10), func(b *testing.B) {
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				crc32.Checksum(p, tab)
			}
		})
	}
}
