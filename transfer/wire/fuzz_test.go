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
// its limits.
func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []Header{
		{Kind: KindFeatures, RequestID: 1, Key: testKey, DType: DTypeBF16, Rows: 2, Cols: 3},
		{Kind: KindEncode, RequestID: 1 << 40, Key: testKey, DType: DTypeF32, Rows: 3, Cols: 1, Text: "frames=8"},
		{Kind: KindError, RequestID: 2, Text: "out of memory"},
		{Kind: KindFeatures, Flags: FlagShm, ShmOffset: 4096, DType: DTypeU8, Rows: 1, Cols: 5},
	} {
		payload := make([]byte, h.Rows*h.Cols*uint32(h.DType.Size()))
		if h.Flags&FlagShm != 0 {
			h.Len, h.Sum = int64(len(payload)), Checksum(payload)
			b, _ := AppendHeader(nil, &h, DefaultMaxPayload)
			f.Add(b)
			continue
		}
		f.Add(encoded(f, h, payload))
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
			if h.Flags&FlagShm != 0 {
				t.Fatal("a shared-memory frame on a pipe, which carries no descriptor")
			}
			if err := c.ReadPayload(ctx, buf); err != nil && !errors.Is(err, ErrChecksum) {
				return
			}
		}
	})
}
