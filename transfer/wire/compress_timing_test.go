package wire

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"

	"dataplane/transfer/safetensors"
)

// BenchmarkCompress measures whether compressing features pays: s2 and zstd on encoder
// outputs in f16 and bf16, as they are and byte-shuffled (the low bytes of all 16-bit
// elements, then the high bytes: sign, exponent and top mantissa bits gather where a
// compressor can find them). Reported per tensor: ratio (original / compressed), compress and
// decompress MB/s of original bytes on one core (shuffle included).
//
// Inputs: WIRE_FEATURES, a safetensors file of encoder outputs (testdata/featgen.go writes one
// from our encoder on the real fixture inputs); without it, openai/CLIP's reference outputs in
// ../shared/fixtures (f32, converted here; small). See the README for the numbers and the
// decision.
func BenchmarkCompress(b *testing.B) {
	tensors := compressInputs(b)
	zfast, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	zdef, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	zdec, _ := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	codecs := []struct {
		name string
		enc  func(dst, src []byte) []byte
		dec  func(dst, src []byte) ([]byte, error)
	}{
		{"s2", func(d, s []byte) []byte { return s2.Encode(d[:cap(d)], s) }, func(d, s []byte) ([]byte, error) { return s2.Decode(d[:cap(d)], s) }},
		{"s2better", func(d, s []byte) []byte { return s2.EncodeBetter(d[:cap(d)], s) }, func(d, s []byte) ([]byte, error) { return s2.Decode(d[:cap(d)], s) }},
		{"zstd1", func(d, s []byte) []byte { return zfast.EncodeAll(s, d[:0]) }, func(d, s []byte) ([]byte, error) { return zdec.DecodeAll(s, d[:0]) }},
		{"zstd3", func(d, s []byte) []byte { return zdef.EncodeAll(s, d[:0]) }, func(d, s []byte) ([]byte, error) { return zdec.DecodeAll(s, d[:0]) }},
	}
	for _, t := range tensors {
		for _, shuffled := range []bool{false, true} {
			for _, c := range codecs {
				name := t.Name + "/" + c.name
				if shuffled {
					name += "+shuffle"
				}
				b.Run(name, func(b *testing.B) {
					src := t.Data
					tmp := make([]byte, len(src))
					out := make([]byte, len(src))
					comp := make([]byte, 0, s2.MaxEncodedLen(len(src))+1024)
					var tEnc, tDec time.Duration
					var size int
					b.SetBytes(int64(len(src)))
					for b.Loop() {
						t0 := time.Now()
						in := src
						if shuffled {
							shuffle16(tmp, src)
							in = tmp
						}
						comp = c.enc(comp, in)
						t1 := time.Now()
						dec, err := c.dec(out, comp)
						if err != nil {
							b.Fatal(err)
						}
						if shuffled {
							unshuffle16(tmp, dec)
							dec = tmp
						}
						tDec += time.Since(t1)
						tEnc += t1.Sub(t0)
						size = len(comp)
						if !bytes.Equal(dec, src) {
							b.Fatal("round trip differs")
						}
					}
					mbs := func(d time.Duration) float64 { return float64(len(src)) * float64(b.N) / d.Seconds() / 1e6 }
					b.ReportMetric(float64(len(src))/float64(size), "ratio")
					b.ReportMetric(mbs(tEnc), "enc-MB/s")
					b.ReportMetric(mbs(tDec), "dec-MB/s")
				})
			}
		}
	}
}

func compressInputs(b *testing.B) []safetensors.Tensor {
	if path := os.Getenv("WIRE_FEATURES"); path != "" {
		f, err := safetensors.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { f.Close() })
		return f.Tensors
	}
	dir := filepath.Join("..", "..", "..", "shared", "fixtures")
	var ts []safetensors.Tensor
	for _, name := range []string{"clip_out_image_last_hidden", "clip_out_image_penultimate"} {
		raw, err := os.ReadFile(filepath.Join(dir, name+".f32"))
		if err != nil {
			b.Skipf("no WIRE_FEATURES and no fixtures: %v", err)
		}
		bf := make([]byte, len(raw)/2)
		for i := range len(raw) / 4 {
			bits := binary.LittleEndian.Uint32(raw[4*i:])
			bits += 0x7fff + (bits>>16)&1 // round to nearest even, as torch does (no NaNs here)
			binary.LittleEndian.PutUint16(bf[2*i:], uint16(bits>>16))
			_ = math.Float32frombits
		}
		ts = append(ts, safetensors.Tensor{Name: name + ".bf16", DType: "BF16", Shape: []int{len(raw) / 4}, Data: bf})
	}
	return ts
}
