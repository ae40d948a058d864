package wire

import (
	"fmt"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/xxh3"
)

// Compress names a payload codec for Options.Compress. Off by default: it pays only where the
// link is slower than the cores compress (the README's rule), and only for bf16.
type Compress uint8

const (
	CompressNone Compress = iota
	// CompressS2: s2's "better" block encoder (s2's default one finds almost nothing in
	// features, shuffled or not).
	CompressS2
	// CompressZstd: zstd at its fastest level, one frame, no zstd checksum (Sum covers it).
	CompressZstd
)

// ParseCompress reads a codec name: none, s2 or zstd.
func ParseCompress(s string) (Compress, error) {
	switch s {
	case "", "none":
		return CompressNone, nil
	case "s2":
		return CompressS2, nil
	case "zstd":
		return CompressZstd, nil
	}
	return CompressNone, fmt.Errorf("wire: compression %q: want none, s2 or zstd", s)
}

func (c Compress) String() string {
	switch c {
	case CompressNone:
		return "none"
	case CompressS2:
		return "s2"
	case CompressZstd:
		return "zstd"
	}
	return fmt.Sprintf("compress(%d)", uint8(c))
}

// compressMin: smaller payloads go raw (a frame of a few KiB costs its system calls, not its
// bytes).
const compressMin = 4 << 10

// A payload of probeMin bytes or more is first probed: its first probeLen bytes, shuffled as
// the whole would be, through s2. Unless they shrink by an eighth, it goes raw without paying
// for compressing the rest: f16 features (ratio ≤ 1.07 shuffled, README) would cost a full
// compression for nothing (4–10× slower per frame on loopback), and no link is slow enough for
// a ratio under 1.14 to pay (the README's rule).
const (
	probeMin = 256 << 10
	probeLen = 64 << 10
)

// zstd coders are shared: EncodeAll and DecodeAll may run concurrently, each on one goroutine,
// at most GOMAXPROCS at once.
var (
	zstdEnc = sync.OnceValue(func() *zstd.Encoder {
		e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderCRC(false))
		if err != nil {
			panic(err) // only for invalid options
		}
		return e
	})
	zstdDec = sync.OnceValue(func() *zstd.Decoder {
		// DecodeAll writes no more than its destination's capacity: a frame that claims or
		// decodes to more than the header's Len is an error, not an allocation.
		d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecodeAllCapLimit(true))
		if err != nil {
			panic(err)
		}
		return d
	})
)

// compress encodes payload for a frame of dtype d into scratch taken from the pool; ok is
// false when it does not shrink (send it raw). The caller puts bufs back once written.
func compress(c Compress, d DType, payload []byte) (out []byte, flag Flags, bufs [][]byte, ok bool) {
	if c == CompressNone || len(payload) < compressMin || s2.MaxEncodedLen(len(payload)) < 0 {
		return nil, 0, nil, false // too small to pay, or too large for an s2 block
	}
	if len(payload) >= probeMin && !worthIt(d, payload[:probeLen]) {
		return nil, 0, nil, false
	}
	in := payload
	if d.Size() == 2 {
		tmp := scratch.get(len(payload))
		bufs = append(bufs, tmp)
		shuffle16(tmp, payload)
		in = tmp
	}
	zb := scratch.get(s2.MaxEncodedLen(len(in)))
	bufs = append(bufs, zb)
	switch c {
	case CompressS2:
		out, flag = s2.EncodeBetter(zb, in), FlagS2
	case CompressZstd:
		out, flag = zstdEnc().EncodeAll(in, zb[:0]), FlagZstd
	}
	if len(out) == 0 || len(out) >= len(payload) {
		scratch.put(bufs...)
		return nil, 0, nil, false
	}
	return out, flag, bufs, true
}

// worthIt says whether sample shrinks by an eighth under s2 (shuffled for 2-byte dtypes).
func worthIt(d DType, sample []byte) bool {
	src := sample
	if d.Size() == 2 {
		tmp := scratch.get(len(sample))
		defer scratch.put(tmp)
		shuffle16(tmp, sample)
		src = tmp
	}
	zb := scratch.get(s2.MaxEncodedLen(len(src)))
	defer scratch.put(zb)
	z := s2.EncodeBetter(zb, src)
	return len(z) > 0 && len(z) <= len(sample)-len(sample)/8
}

// errCorrupt wraps ErrChecksum: a compressed payload that does not decompress to Len bytes
// was read whole, so like a checksum mismatch it fails the item and leaves the stream in sync.
func errCorrupt(h *Header, err error) error {
	return fmt.Errorf("%w: frame %d (item %q): compressed payload of %d bytes does not decompress to %d: %v",
		ErrChecksum, h.RequestID, h.Key.Content, h.CompressedLen, h.Len, err)
}

// decompress turns the frame's compressed bytes z into dst (len(dst) = h.Len), unshuffling
// 2-byte dtypes, and checks Sum over the result.
func decompress(h *Header, z, dst []byte) error {
	out := dst
	if h.DType.Size() == 2 {
		out = scratch.get(len(dst))
		defer scratch.put(out)
	}
	var got []byte
	var err error
	switch h.Flags & flagsZip {
	case FlagS2:
		// The block declares its decoded length first: check it before decoding (a bomb
		// declares small and is refused here; one that declares big too).
		var n int
		if n, err = s2.DecodedLen(z); err == nil && n != len(out) {
			err = fmt.Errorf("s2 block declares %d bytes", n)
		}
		if err == nil {
			got, err = s2.Decode(out, z)
		}
	case FlagZstd:
		got, err = zstdDec().DecodeAll(z, out[:0:len(out)])
	}
	if err == nil && (len(got) != len(out) || &got[0] != &out[0]) {
		err = fmt.Errorf("decoded %d bytes", len(got))
	}
	if err != nil {
		return errCorrupt(h, err)
	}
	var sum uint64
	if h.DType.Size() == 2 {
		sum = unshuffleSum(dst, out)
	} else {
		sum = Checksum(dst)
	}
	if sum != h.Sum {
		return fmt.Errorf("%w: frame %d (item %q): %#016x, header says %#016x", ErrChecksum, h.RequestID, h.Key.Content, sum, h.Sum)
	}
	return nil
}

// shuffle16 writes the low bytes of src's 16-bit elements, then their high bytes: for bf16 the
// high byte (sign and 7 exponent bits) varies little across a tensor, so the compressor finds
// long runs there that interleaved bytes hide.
func shuffle16(dst, src []byte) {
	n := len(src) / 2
	lo, hi := dst[:n], dst[n:2*n]
	for i := range n {
		lo[i], hi[i] = src[2*i], src[2*i+1]
	}
}

// unshuffle16 undoes shuffle16.
func unshuffle16(dst, src []byte) {
	n := len(src) / 2
	lo, hi := src[:n], src[n:2*n]
	for i := range n {
		dst[2*i], dst[2*i+1] = lo[i], hi[i]
	}
}

// unshuffleSum unshuffles src into dst a chunk at a time and hashes each chunk while it is
// still in the cache.
func unshuffleSum(dst, src []byte) uint64 {
	n := len(src) / 2
	sum := xxh3.New()
	const step = readChunk / 2
	for i := 0; i < n; i += step {
		j := min(i+step, n)
		d := dst[2*i : 2*j]
		lo, hi := src[i:j], src[n+i:n+j]
		for k := range lo {
			d[2*k], d[2*k+1] = lo[k], hi[k]
		}
		sum.Write(d)
	}
	return sum.Sum64()
}

// scratchPool lends the buffers compression needs (a shuffled copy, the compressed bytes) for
// one frame at a time. It keeps at most scratchKeep buffers of at most scratchMax bytes: a
// 32 MiB payload's worth; larger frames allocate and leave theirs to the collector.
type scratchPool struct{ c chan []byte }

const (
	scratchKeep = 4
	scratchMax  = 40 << 20 // s2.MaxEncodedLen(32 MiB) is 37.3 MiB
)

var scratch = scratchPool{c: make(chan []byte, scratchKeep)}

func (p *scratchPool) get(n int) []byte {
	select {
	case b := <-p.c:
		if cap(b) >= n {
			return b[:n]
		}
	default:
	}
	return make([]byte, n, max(n, compressMin))
}

func (p *scratchPool) put(bufs ...[]byte) {
	for _, b := range bufs {
		if cap(b) > scratchMax {
			continue
		}
		select {
		case p.c <- b:
		default:
		}
	}
}
