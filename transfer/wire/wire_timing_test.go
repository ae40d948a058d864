package wire

import (
	"context"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
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

// BenchmarkTransferCompressed: real encoder outputs (WIRE_FEATURES from testdata/featgen.go;
// without it, openai/CLIP's reference outputs from ../shared/fixtures as bf16) sent over TCP
// loopback, each iteration once raw and once with each codec on the same payload, one frame
// at a time (compress, send, decompress in series: a lone item's latency), or WIRE_INFLIGHT
// frames sent at once from as many goroutines (a stream of items: the senders compress in
// parallel, the one receiver reads and decompresses in turn). The link is loopback or paced to
// a slower one (WIRE_LINK_GBPS, e.g. 2.5). Reported: MB/s of features
// delivered per codec (none-, s2-, zstd-MB/s), the compression ratio, and the median of raw
// time / compressed time (x-none: above 1 means it paid).
func BenchmarkTransferCompressed(b *testing.B) {
	var link float64 // bytes per second; 0: loopback as it is
	if s := os.Getenv("WIRE_LINK_GBPS"); s != "" {
		g, err := strconv.ParseFloat(s, 64)
		if err != nil {
			b.Fatal(err)
		}
		link = g * 1e9 / 8
	}
	inflight := 1
	if s := os.Getenv("WIRE_INFLIGHT"); s != "" {
		var err error
		if inflight, err = strconv.Atoi(s); err != nil || inflight < 1 {
			b.Fatalf("WIRE_INFLIGHT=%q", s)
		}
	}
	for _, t := range compressInputs(b) {
		dt := map[string]DType{"BF16": DTypeBF16, "F16": DTypeF16, "F32": DTypeF32}[t.DType]
		rows := 1
		if len(t.Shape) == 2 {
			rows = t.Shape[0]
		}
		h := Header{Kind: KindFeatures, Key: testKey, DType: dt, Rows: uint32(rows), Cols: uint32(len(t.Data) / dt.Size() / rows), Sum: Checksum(t.Data)}
		b.Run(t.Name, func(b *testing.B) { benchTransferCompressed(b, h, t.Data, link, inflight) })
	}
}

func benchTransferCompressed(b *testing.B, h Header, payload []byte, link float64, inflight int) {
	ctx := context.Background()
	codecs := []Compress{CompressNone, CompressS2, CompressZstd}
	senders := make([]*Conn, len(codecs))
	frames := make(chan Header, inflight)
	for i, codec := range codecs {
		client, srv := pair(b, "tcp", Options{})
		var nc net.Conn = client.Net()
		if link > 0 {
			nc = &paced{Conn: nc, rate: link}
		}
		senders[i] = NewConn(nc, Options{Compress: codec})
		dst := make([]byte, len(payload))
		go func() { // the receiver, for the whole benchmark
			for {
				h, err := srv.Next(ctx)
				if err != nil {
					return
				}
				if err := srv.ReadPayload(ctx, dst); err != nil {
					panic(err)
				}
				frames <- h
			}
		}()
	}
	times := make([]time.Duration, len(codecs))
	ratios := make([][]float64, len(codecs))
	var zlen [3]int64
	b.SetBytes(int64(len(payload) * inflight))
	for b.Loop() {
		var t [3]time.Duration
		for i, c := range senders {
			t0 := time.Now()
			for range inflight {
				go func() {
					if err := c.Send(ctx, h, payload); err != nil {
						panic(err)
					}
				}()
			}
			var got Header
			for range inflight {
				got = <-frames
			}
			t[i] = time.Since(t0)
			times[i] += t[i]
			zlen[i] = got.streamLen()
		}
		for i := range codecs {
			ratios[i] = append(ratios[i], t[0].Seconds()/t[i].Seconds())
		}
	}
	for i, codec := range codecs {
		b.ReportMetric(float64(len(payload)*inflight)*float64(b.N)/times[i].Seconds()/1e6, codec.String()+"-MB/s")
		if i > 0 {
			b.ReportMetric(float64(len(payload))/float64(zlen[i]), codec.String()+"-ratio")
			b.ReportMetric(median(ratios[i]), codec.String()+"-x-none")
		}
	}
}

// paced writes at most rate bytes per second: a link slower than loopback. Each 32 KiB chunk
// waits until the link is done with the bytes before it, so a frame arrives no more than one
// chunk's time early; oversleeping (a loaded machine) is made up by shorter waits after.
type paced struct {
	net.Conn
	rate float64
	next time.Time // when the link is free again
}

func (p *paced) Write(b []byte) (int, error) {
	if now := time.Now(); p.next.Before(now) {
		p.next = now // idle since the last write: no credit
	}
	n := 0
	for n < len(b) {
		time.Sleep(time.Until(p.next))
		w, err := p.Conn.Write(b[n:min(len(b), n+32<<10)])
		n += w
		if err != nil {
			return n, err
		}
		p.next = p.next.Add(time.Duration(float64(w) / p.rate * 1e9))
	}
	return n, nil
}
