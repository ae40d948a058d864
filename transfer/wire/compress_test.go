package wire

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// lowEntropy is a [rows, cols] tensor of dtype d whose values sit on a coarse grid (as a
// preprocessed image's pixels do), so every codec shrinks it, shuffled or not.
func lowEntropy(r *rand.Rand, d DType, rows, cols int) []byte {
	b := make([]byte, rows*cols*d.Size())
	for i := range rows * cols {
		v := float32(math.Round(r.NormFloat64()*8) / 8)
		switch d {
		case DTypeF32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		case DTypeBF16:
			binary.LittleEndian.PutUint16(b[2*i:], uint16(math.Float32bits(v)>>16))
		case DTypeF16:
			binary.LittleEndian.PutUint16(b[2*i:], f16(v))
		}
	}
	return b
}

// f16 converts the grid's values (|v| < 8, multiples of 1/8) to IEEE half precision exactly.
func f16(v float32) uint16 {
	bits := math.Float32bits(v)
	sign := uint16(bits>>16) & 0x8000
	if v == 0 {
		return sign
	}
	exp := int(bits>>23&0xff) - 127 + 15
	return sign | uint16(exp)<<10 | uint16(bits>>13&0x3ff)
}

// TestCompressRoundTrip: each codec × dtype over TCP arrives byte for byte with its shape and
// checksum, compressed (the receiver's header says so, CompressedLen < Len); a payload that
// does not shrink (random bytes: the probe refuses a large one, the attempt a smaller one) and
// a small one go raw.
func TestCompressRoundTrip(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(7, 7))
	for _, codec := range []Compress{CompressS2, CompressZstd} {
		client, server := pair(t, "tcp", Options{Compress: codec})
		type frame struct {
			h    Header
			p    []byte
			want Flags
		}
		var frames []frame
		for i, d := range []DType{DTypeF32, DTypeF16, DTypeBF16} {
			h := Header{Kind: KindFeatures, RequestID: uint64(i), Key: testKey, DType: d, Rows: 577, Cols: 64}
			frames = append(frames, frame{h, lowEntropy(r, d, 577, 64), map[Compress]Flags{CompressS2: FlagS2, CompressZstd: FlagZstd}[codec]})
		}
		zipped := frames[0].want
		frames = append(frames,
			// Past probeMin: the probe lets the grid through and stops random bytes.
			frame{Header{Kind: KindFeatures, RequestID: 8, Key: testKey, DType: DTypeBF16, Rows: 1024, Cols: 256}, lowEntropy(r, DTypeBF16, 1024, 256), zipped},
			frame{Header{Kind: KindFeatures, RequestID: 9, Key: testKey, DType: DTypeBF16, Rows: 1024, Cols: 256}, randBytes(r, 512<<10), 0},
			frame{Header{Kind: KindEncode, RequestID: 10, Key: testKey, DType: DTypeBF16, Rows: 64, Cols: 512}, randBytes(r, 64<<10), 0},
			frame{Header{Kind: KindFeatures, RequestID: 11, Key: testKey, DType: DTypeF16, Rows: 1, Cols: 64}, make([]byte, 128), 0})
		go func() {
			for _, f := range frames {
				if err := client.Send(ctx, f.h, f.p); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		for _, f := range frames {
			h, err := server.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if h.Flags != f.want || h.Len != int64(len(f.p)) || h.DType != f.h.DType || h.Rows != f.h.Rows || h.Sum != Checksum(f.p) {
				t.Fatalf("%v %v frame %d: header %+v", codec, f.h.DType, f.h.RequestID, h)
			}
			if f.want != 0 && (h.CompressedLen <= 0 || h.CompressedLen >= h.Len) {
				t.Fatalf("%v %v: compressed length %d of %d", codec, h.DType, h.CompressedLen, h.Len)
			}
			got := make([]byte, h.Len)
			if err := server.ReadPayload(ctx, got); err != nil {
				t.Fatalf("%v %v: %v", codec, h.DType, err)
			}
			if !bytes.Equal(got, f.p) {
				t.Fatalf("%v %v: payload differs", codec, h.DType)
			}
		}
	}
}

// compressedFrame encodes a frame whose stream payload is z (already compressed), declaring
// payload p (its length and checksum).
func compressedFrame(t *testing.T, h Header, flag Flags, p, z []byte) []byte {
	t.Helper()
	h.Flags, h.Len, h.Sum, h.CompressedLen = flag, int64(len(p)), Checksum(p), int64(len(z))
	b, err := AppendHeader(nil, &h, DefaultMaxPayload)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, z...)
}

// TestCompressCorrupt: compressed bytes flipped in transit, or a stream that decodes to other
// bytes, are ErrChecksum, and the next frame still reads (the compressed length was known).
// A header whose compressed length is not below Len is refused before anything is read.
func TestCompressCorrupt(t *testing.T) {
	ctx := context.Background()
	p := lowEntropy(rand.New(rand.NewPCG(8, 8)), DTypeBF16, 577, 64)
	h := Header{Kind: KindFeatures, RequestID: 1, Key: testKey, DType: DTypeBF16, Rows: 577, Cols: 64}
	for _, codec := range []Compress{CompressS2, CompressZstd} {
		z, flag, _, ok := compress(codec, h.DType, p)
		if !ok {
			t.Fatalf("%v: did not shrink", codec)
		}
		good := compressedFrame(t, h, flag, p, z)
		bad := bytes.Clone(good)
		bad[len(bad)-len(z)/2] ^= 0x5a
		other := bytes.Clone(p)
		other[3] ^= 1 // decodes fine, to bytes the checksum does not match
		wz, _, _, _ := compress(codec, h.DType, other)
		wrong := compressedFrame(t, h, flag, p, wz)
		raw, c := rawPair(t, Options{})
		go raw.Write(append(append(bad, wrong...), good...))
		for i, want := range []error{ErrChecksum, ErrChecksum, nil} {
			if _, err := c.Next(ctx); err != nil {
				t.Fatalf("%v frame %d: %v", codec, i, err)
			}
			got := make([]byte, len(p))
			if err := c.ReadPayload(ctx, got); !errors.Is(err, want) || (want == nil && !bytes.Equal(got, p)) {
				t.Fatalf("%v frame %d: %v, want %v", codec, i, err, want)
			}
		}
		for _, zl := range []int64{int64(len(p)), int64(len(p)) + 1} {
			hh := h
			hh.Flags, hh.Len, hh.CompressedLen = flag, int64(len(p)), zl
			if _, err := AppendHeader(nil, &hh, DefaultMaxPayload); !errors.Is(err, ErrFrame) {
				t.Errorf("%v: compressed length %d of %d: %v, want ErrFrame", codec, zl, len(p), err)
			}
		}
	}
	hh := h
	hh.Flags, hh.Len, hh.CompressedLen = FlagS2|FlagZstd, int64(len(p)), 10
	if _, err := AppendHeader(nil, &hh, DefaultMaxPayload); !errors.Is(err, ErrFrame) {
		t.Errorf("two codecs: %v, want ErrFrame", err)
	}
}

// TestCompressBomb: a frame that declares 64 KiB of features but whose compressed bytes
// decode to 16 MiB (s2 declaring it, zstd with and without a content size) is refused as
// ErrChecksum without decoding more than the declared size, and the stream goes on.
func TestCompressBomb(t *testing.T) {
	ctx := context.Background()
	const declared, big = 64 << 10, 16 << 20
	zeros := make([]byte, big)
	var stream bytes.Buffer
	w, _ := zstd.NewWriter(&stream, zstd.WithEncoderLevel(zstd.SpeedFastest))
	w.Write(zeros)
	w.Close()
	bombs := []struct {
		name string
		flag Flags
		z    []byte
	}{
		{"s2", FlagS2, s2.Encode(nil, zeros)},
		{"zstd", FlagZstd, zstdEnc().EncodeAll(zeros, nil)},
		{"zstd stream", FlagZstd, stream.Bytes()},
	}
	p := make([]byte, declared)
	h := Header{Kind: KindFeatures, RequestID: 1, Key: testKey, DType: DTypeU8, Rows: 1, Cols: declared}
	for _, b := range bombs {
		raw, c := rawPair(t, Options{})
		go raw.Write(append(compressedFrame(t, h, b.flag, p, b.z), encoded(t, h, p)...))
		if _, err := c.Next(ctx); err != nil {
			t.Fatal(err)
		}
		dst := make([]byte, declared)
		_ = c.ReadPayload(ctx, dst) // warm the decoder's buffers
		var err error
		raw2, c2 := rawPair(t, Options{})
		go raw2.Write(append(compressedFrame(t, h, b.flag, p, b.z), encoded(t, h, p)...))
		if _, err := c2.Next(ctx); err != nil {
			t.Fatal(err)
		}
		got := allocated(func() { err = c2.ReadPayload(ctx, dst) })
		if !errors.Is(err, ErrChecksum) {
			t.Fatalf("%s bomb: %v, want ErrChecksum", b.name, err)
		}
		if got > big/4 {
			t.Errorf("%s bomb: %d bytes allocated", b.name, got)
		}
		if _, err := c2.Next(ctx); err != nil {
			t.Fatalf("%s: frame after the bomb: %v", b.name, err)
		}
		if err := c2.ReadPayload(ctx, dst); err != nil {
			t.Fatalf("%s: frame after the bomb: %v", b.name, err)
		}
	}
}

// TestCompressNotShm: shared-memory frames never compress (the payload is not in the stream;
// compressing would be a copy the receiver's mapping exists to avoid).
func TestCompressNotShm(t *testing.T) {
	ctx := context.Background()
	client, server := pair(t, "unix", Options{Compress: CompressZstd})
	shm := newShmBuf(t, 1<<20)
	p := shm.r.Host[:64<<10]
	copy(p, lowEntropy(rand.New(rand.NewPCG(9, 9)), DTypeBF16, 128, 256))
	if err := shm.send(ctx, client, Header{Kind: KindFeatures, RequestID: 1, Key: testKey, DType: DTypeBF16, Rows: 128, Cols: 256}, p); err != nil {
		t.Fatal(err)
	}
	h, err := server.Next(ctx)
	if err != nil || h.Flags != FlagShm || h.CompressedLen != 0 {
		t.Fatalf("%+v %v", h, err)
	}
	got := make([]byte, len(p))
	if err := server.ReadPayload(ctx, got); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("shm payload: %v", err)
	}
}

// TestProbe: the probe passes a sample that shrinks by an eighth and stops one that does not,
// so a large frame that would not shrink costs no full compression.
func TestProbe(t *testing.T) {
	r := rand.New(rand.NewPCG(10, 10))
	if !worthIt(DTypeBF16, lowEntropy(r, DTypeBF16, 128, 256)) {
		t.Error("a compressible sample refused")
	}
	if worthIt(DTypeBF16, randBytes(r, probeLen)) {
		t.Error("random bytes pass the probe")
	}
}

// TestCompressConcurrent: senders compressing on their own goroutines share the zstd coder and
// the scratch pool; every frame arrives whole and in its sender's order.
func TestCompressConcurrent(t *testing.T) {
	ctx := context.Background()
	client, server := pair(t, "tcp", Options{Compress: CompressZstd})
	const senders, each = 4, 6
	payloads := make([][]byte, senders)
	for g := range payloads {
		payloads[g] = lowEntropy(rand.New(rand.NewPCG(uint64(g), 11)), DTypeBF16, 256, 256)
	}
	for g := range senders {
		go func() {
			for i := range each {
				h := Header{Kind: KindFeatures, RequestID: uint64(g*100 + i), Key: testKey, DType: DTypeBF16, Rows: 256, Cols: 256}
				if err := client.Send(ctx, h, payloads[g]); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	next := make([]int, senders)
	got := make([]byte, 256*256*2)
	for range senders * each {
		h, err := server.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g, i := int(h.RequestID/100), int(h.RequestID%100)
		if h.Flags != FlagZstd || next[g] != i {
			t.Fatalf("frame %d of sender %d: flags %#x, want frame %d", i, g, h.Flags, next[g])
		}
		next[g]++
		if err := server.ReadPayload(ctx, got); err != nil || !bytes.Equal(got, payloads[g]) {
			t.Fatalf("frame %d of sender %d: %v", i, g, err)
		}
	}
}
