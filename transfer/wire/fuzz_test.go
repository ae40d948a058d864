package wire

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// FuzzDecodeHeader: any bytes either decode to a header that encodes back to the same bytes,
// or fail with ErrFrame / ErrTooLarge; and a Conn reading them as a stream ends with an error
// or a clean EOF, never a panic or a hang, allocating nothing from the declared lengths beyond
// its limits. Compressed payloads are decompressed too (a corrupt one is ErrChecksum).
func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []Header{
		{Kind: KindFeatures, RequestID: 1, Key: testKey, DType: DTypeBF16, Rows: 2, Cols: 3},
		{Kind: KindEncode, RequestID: 1 << 40, Key: testKey, DType: DTypeF32, Rows: 3, Cols: 1, Text: "frames=8"},
		{Kind: KindError, RequestID: 2, Text: "out of memory"},
		{Kind: KindFeatures, Flags: FlagShm, ShmOffset: 4096, ShmLen: 5, DType: DTypeU8, Rows: 1, Cols: 5},
		{Kind: KindEncode, Flags: FlagShmReply, ShmOffset: 8192, ShmLen: 1 << 20, DType: DTypeF32, Rows: 1, Cols: 2},
		{Kind: KindFeatures, Flags: FlagInPlace, DType: DTypeBF16, Rows: 2, Cols: 2},
	} {
		payload := make([]byte, h.Rows*h.Cols*uint32(h.DType.Size()))
		if h.Flags&(FlagShm|FlagInPlace) != 0 { // no payload in the stream
			h.Len, h.Sum = int64(len(payload)), Checksum(payload)
			b, err := AppendHeader(nil, &h, DefaultMaxPayload)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
			continue
		}
		f.Add(encoded(f, h, payload))
	}
	// Compressed frames (version 2): each codec, and one whose bytes do not decompress.
	p := make([]byte, 8<<10)
	for i := range p {
		p[i] = byte(i % 7)
	}
	for _, codec := range []Compress{CompressS2, CompressZstd} {
		h := Header{Kind: KindFeatures, RequestID: 5, Key: testKey, DType: DTypeBF16, Rows: 4, Cols: 1 << 10}
		z, flag, _, ok := compress(codec, h.DType, p)
		if !ok {
			f.Fatalf("%v: did not shrink", codec)
		}
		h.Flags, h.Len, h.Sum, h.CompressedLen = flag, int64(len(p)), Checksum(p), int64(len(z))
		b, err := AppendHeader(nil, &h, DefaultMaxPayload)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(append(b, z...))
		f.Add(append(b, make([]byte, len(z))...))
	}
	f.Add([]byte("DPWF"))
	f.Fuzz(func(t *testing.T, b []byte) {
		const limit = 1 << 16
		h, n, err := DecodeHeader(b, limit)
		if err != nil {
			if !errors.Is(err, ErrFrame) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("error of no kind: %v", err)
			}
		} else {
			again, err := AppendHeader(nil, &h, limit)
			if err != nil || !bytes.Equal(again, b[:n]) {
				t.Fatalf("decoded %+v, encodes back to %x (%v), not %x", h, again, err, b[:n])
			}
		}

		a, z := net.Pipe()
		c := NewConn(z, Options{MaxPayload: limit, ReadTimeout: time.Second})
		go func() { a.Write(b); a.Close() }()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		defer c.Close()
		buf := make([]byte, limit)
		for range 64 {
			h, err := c.Next(ctx)
			if err != nil {
				return
			}
			if h.Flags&(FlagShm|FlagShmReply) != 0 {
				t.Fatal("a shared-memory frame on a pipe, which carries no descriptor")
			}
			if err := c.ReadPayload(ctx, buf); err != nil && !errors.Is(err, ErrChecksum) {
				return
			}
		}
	})
}
