package wire

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"dataplane/features"
)

// pair connects two Conns over a real socket on loopback: "tcp" or "unix".
func pair(t testing.TB, network string, opts Options) (client, server *Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "wire.sock")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan net.Conn, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			done <- nil
			return
		}
		done <- nc
	}()
	nc, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := <-done
	if sc == nil {
		t.Fatal("accept failed")
	}
	client, server = NewConn(nc, opts), NewConn(sc, opts)
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// shmBuf is sender memory that can travel as shared memory: a region of a MemfdAllocator, as
// a feature store on that allocator would hand out.
type shmBuf struct {
	a features.MemfdAllocator
	r features.Region
}

func newShmBuf(t testing.TB, size int64) *shmBuf {
	t.Helper()
	s := &shmBuf{}
	r, err := s.a.Map(size)
	if err != nil {
		t.Fatal(err)
	}
	s.r = r
	t.Cleanup(func() { s.a.Unmap(r) })
	return s
}

// send sends payload p (which lies in s's region when s is not nil) as shm or in the stream.
func (s *shmBuf) send(ctx context.Context, c *Conn, h Header, p []byte) error {
	if s == nil {
		return c.Send(ctx, h, p)
	}
	fd, off, ok := s.a.FD(uintptr(unsafePointer(p)))
	if !ok {
		panic("payload not in the shm region")
	}
	return c.SendShm(ctx, h, p, fd, off)
}

func randBytes(r *rand.Rand, n int) []byte {
	var seed [32]byte
	for i := range 4 {
		binary.LittleEndian.PutUint64(seed[8*i:], r.Uint64())
	}
	b := make([]byte, n)
	rand.NewChaCha8(seed).Read(b)
	return b
}

var testKey = features.Key{Salt: "tenant-a", Content: "sha256:ab12", Model: "clip-vit-l-14", Preprocess: "336/center"}

// TestRoundTrip sends features of several shapes over TCP, a Unix socket and shared memory and
// checks that every header field and payload byte arrives, checksums verified.
func TestRoundTrip(t *testing.T) {
	for _, mode := range []string{"tcp", "unix", "shm"} {
		t.Run(mode, func(t *testing.T) {
			network := mode
			if mode == "shm" {
				network = "unix"
			}
			client, server := pair(t, network, Options{})
			var shm *shmBuf
			if mode == "shm" {
				shm = newShmBuf(t, 8<<20)
			}
			r := rand.New(rand.NewPCG(1, 2))
			shapes := [][2]uint32{{1, 2}, {577, 1024}, {3, 4097}, {1, 1}}
			ctx := context.Background()
			var sent []Header
			var payloads [][]byte
			off := 0
			for i, s := range shapes {
				h := Header{Kind: KindFeatures, RequestID: uint64(100 + i), Key: testKey, DType: DTypeBF16, Rows: s[0], Cols: s[1], Text: "layer=-2"}
				n := int(s[0] * s[1] * 2)
				p := randBytes(r, n)
				if shm != nil {
					off = (off + 4095) &^ 4095
					if i == 2 {
						off += 6 // an offset inside a page
					}
					p = append(shm.r.Host[off:off], p...)
					off += n
				}
				sent, payloads = append(sent, h), append(payloads, p)
			}
			// A frame without payload and an error frame too.
			sent = append(sent, Header{Kind: KindError, RequestID: 7, Key: testKey, Text: "encoder out of memory"})
			payloads = append(payloads, nil)

			errc := make(chan error, 1)
			go func() {
				for i, h := range sent {
					var err error
					if h.Kind == KindError {
						err = client.SendError(ctx, h.RequestID, h.Key, h.Text)
					} else {
						err = shm.send(ctx, client, h, payloads[i])
					}
					if err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			for i, want := range sent {
				h, err := server.Next(ctx)
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if h.Kind != want.Kind || h.RequestID != want.RequestID || h.Key != want.Key || h.DType != want.DType ||
					h.Rows != want.Rows || h.Cols != want.Cols || h.Text != want.Text || h.Len != int64(len(payloads[i])) {
					t.Fatalf("frame %d: header %+v, sent %+v", i, h, want)
				}
				if want.Kind == KindError {
					var re *RemoteError
					if !errors.As(h.Err(), &re) || re.Message != want.Text || !errors.Is(h.Err(), ErrRemote) {
						t.Fatalf("error frame: %v", h.Err())
					}
					continue
				}
				got := make([]byte, h.Len)
				if err := server.ReadPayload(ctx, got); err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if !bytes.Equal(got, payloads[i]) {
					t.Fatalf("frame %d: payload differs", i)
				}
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			client.Close()
			if _, err := server.Next(ctx); err != io.EOF {
				t.Fatalf("after the peer closed: %v, want io.EOF", err)
			}
		})
	}
}

// allocated is how many bytes the heap handed out while f ran (other goroutines included, so
// only a bound is meaningful).
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// TestCopiesCounted: sending 4 MiB and receiving it into a caller's buffer allocates no
// payload-sized buffer on either side (the payload goes from the sender's memory to the
// socket and from the socket to the receiver's memory). Over shared memory the receiver maps
// the sender's pages: a byte the sender changes afterwards shows through the mapping, so
// nothing was copied at all.
func TestCopiesCounted(t *testing.T) {
	const n = 4 << 20
	ctx := context.Background()
	for _, network := range []string{"tcp", "unix"} {
		client, server := pair(t, network, Options{})
		p := randBytes(rand.New(rand.NewPCG(3, 4)), n)
		dst := make([]byte, n)
		var wg sync.WaitGroup
		got := allocated(func() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := client.Send(ctx, Header{Kind: KindFeatures, RequestID: 1, Key: testKey, DType: DTypeU8, Rows: 1, Cols: n}, p); err != nil {
					t.Error(err)
				}
			}()
			if _, err := server.Next(ctx); err != nil {
				t.Fatal(err)
			}
			if err := server.ReadPayload(ctx, dst); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
		})
		if got > n/8 {
			t.Errorf("%s: %d bytes allocated to move %d", network, got, n)
		}
		if !bytes.Equal(dst, p) {
			t.Fatalf("%s: payload differs", network)
		}
	}

	client, server := pair(t, "unix", Options{})
	shm := newShmBuf(t, n)
	p := shm.r.Host[:n]
	copy(p, randBytes(rand.New(rand.NewPCG(5, 6)), n))
	var m *Mapping
	got := allocated(func() {
		if err := shm.send(ctx, client, Header{Kind: KindFeatures, RequestID: 2, Key: testKey, DType: DTypeU8, Rows: 1, Cols: n}, p); err != nil {
			t.Fatal(err)
		}
		if _, err := server.Next(ctx); err != nil {
			t.Fatal(err)
		}
		var err error
		if m, err = server.MapPayload(); err != nil {
			t.Fatal(err)
		}
	})
	defer m.Close()
	if got > n/8 {
		t.Errorf("shm: %d bytes allocated to move %d", got, n)
	}
	if !bytes.Equal(m.Bytes(), p) {
		t.Fatal("shm: payload differs")
	}
	p[12345] ^= 0xff // the sender writes after the transfer: the receiver sees its own pages change
	if m.Bytes()[12345] != p[12345] {
		t.Fatal("shm: the receiver's bytes are a copy, not the sender's pages")
	}
}

// encoded is a whole frame as bytes, for tests that cut or corrupt it.
func encoded(t testing.TB, h Header, payload []byte) []byte {
	t.Helper()
	h.Len, h.Sum = int64(len(payload)), Checksum(payload)
	b, err := AppendHeader(nil, &h, DefaultMaxPayload)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, payload...)
}

// rawPair is a Conn whose peer is a plain socket the test writes arbitrary bytes to.
func rawPair(t *testing.T, opts Options) (raw net.Conn, c *Conn) {
	a, b := pair(t, "tcp", opts)
	return a.Net(), b
}

// TestTruncated: a frame cut anywhere (in the fixed header, the metadata or the payload) is
// io.ErrUnexpectedEOF, never a short payload; and the Conn stays broken.
func TestTruncated(t *testing.T) {
	ctx := context.Background()
	frame := encoded(t, Header{Kind: KindFeatures, RequestID: 9, Key: testKey, DType: DTypeF16, Rows: 4, Cols: 8}, make([]byte, 64))
	for _, cut := range []int{1, HeaderSize - 1, HeaderSize + 3, len(frame) - 64, len(frame) - 1} {
		raw, c := rawPair(t, Options{})
		raw.Write(frame[:cut])
		raw.Close()
		h, err := c.Next(ctx)
		if err == nil {
			err = c.ReadPayload(ctx, make([]byte, h.Len))
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("cut at %d of %d: %v, want unexpected EOF", cut, len(frame), err)
		}
		if _, err2 := c.Next(ctx); err2 == nil {
			t.Errorf("cut at %d: the Conn reads on after a broken frame", cut)
		}
	}
}

// TestBadChecksum: a flipped payload bit is ErrChecksum and the next frame still reads; a
// flipped header bit is ErrFrame (the header's own checksum) before any length is trusted.
func TestBadChecksum(t *testing.T) {
	ctx := context.Background()
	h := Header{Kind: KindFeatures, RequestID: 1, Key: testKey, DType: DTypeBF16, Rows: 2, Cols: 64}
	frame := encoded(t, h, randBytes(rand.New(rand.NewPCG(1, 1)), 256))
	bad := bytes.Clone(frame)
	bad[len(bad)-100] ^= 0x10
	raw, c := rawPair(t, Options{})
	go func() { raw.Write(append(bad, frame...)) }()
	if _, err := c.Next(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.ReadPayload(ctx, make([]byte, 256)); !errors.Is(err, ErrChecksum) {
		t.Fatalf("corrupted payload: %v, want ErrChecksum", err)
	}
	if _, err := c.Next(ctx); err != nil {
		t.Fatalf("frame after a checksum mismatch: %v", err)
	}
	if err := c.ReadPayload(ctx, make([]byte, 256)); err != nil {
		t.Fatalf("frame after a checksum mismatch: %v", err)
	}

	for _, at := range []int{8, 17, 41, HeaderSize + 5} { // request id, length, rows, metadata
		bad := bytes.Clone(frame)
		bad[at] ^= 0x01
		if _, _, err := DecodeHeader(bad, DefaultMaxPayload); !errors.Is(err, ErrFrame) {
			t.Errorf("bit flipped at %d: %v, want ErrFrame", at, err)
		}
	}
}

// TestOversized: a frame that declares more than MaxPayload is refused from its header, before
// the receiver allocates or reads the payload; a sender refuses to send one, writing nothing.
func TestOversized(t *testing.T) {
	ctx := context.Background()
	client, server := pair(t, "tcp", Options{MaxPayload: 1 << 20})
	big := make([]byte, 1<<20+2)
	if err := client.Send(ctx, Header{Kind: KindFeatures, RequestID: 1, Key: testKey}, big); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("send: %v, want ErrTooLarge", err)
	}
	// The stream is intact after a refused send.
	if err := client.Send(ctx, Header{Kind: KindFeatures, RequestID: 2, Key: testKey}, big[:10]); err != nil {
		t.Fatal(err)
	}
	if h, err := server.Next(ctx); err != nil || h.RequestID != 2 {
		t.Fatalf("frame after a refused send: %+v %v", h, err)
	}

	// A header declaring 1 TiB of [2^20, 2^19] f16 reaches a receiver with a 1 MiB limit.
	raw, c := rawPair(t, Options{MaxPayload: 1 << 20})
	hdr := Header{Kind: KindFeatures, RequestID: 3, Key: testKey, DType: DTypeF16, Rows: 1 << 20, Cols: 1 << 19, Len: 1 << 40}
	b, err := AppendHeader(nil, &hdr, 1<<62)
	if err != nil {
		t.Fatal(err)
	}
	raw.Write(b)
	var h Header
	got := allocated(func() { h, err = c.Next(ctx) })
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized header: %+v %v, want ErrTooLarge", h, err)
	}
	if got > 1<<20 {
		t.Errorf("%d bytes allocated refusing an oversized frame", got)
	}
	// A metadata length past MaxMeta is refused the same way.
	b[50], b[51] = 0xff, 0xff
	if _, _, err := DecodeHeader(b, 1<<62); !errors.Is(err, ErrFrame) {
		t.Errorf("metadata of 65535 bytes: %v", err)
	}
}

// TestTimeouts: a peer that stops mid-frame hits ReadTimeout; a peer that stops reading hits
// WriteTimeout; a cancelled context ends a wait for the next header at once.
func TestTimeouts(t *testing.T) {
	ctx := context.Background()
	frame := encoded(t, Header{Kind: KindFeatures, RequestID: 1, Key: testKey}, make([]byte, 1000))
	for _, cut := range []int{3, HeaderSize + 10} { // in the fixed part, in the metadata
		raw, c := rawPair(t, Options{ReadTimeout: 50 * time.Millisecond})
		raw.Write(frame[:cut]) // then silence, connection open
		start := time.Now()
		_, err := c.Next(ctx)
		if err == nil || !errors.Is(err, errDeadline) {
			t.Fatalf("header stalled at %d: %v, want a deadline error", cut, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("header stalled at %d took %v", cut, d)
		}
	}
	// The same over a Unix socket, whose headers are read with recvmsg.
	uc, us := pair(t, "unix", Options{ReadTimeout: 50 * time.Millisecond})
	uc.Net().Write(frame[:3])
	if _, err := us.Next(ctx); !errors.Is(err, errDeadline) {
		t.Fatalf("unix header stalled: %v, want a deadline error", err)
	}

	client, _ := pair(t, "unix", Options{WriteTimeout: 50 * time.Millisecond})
	big := make([]byte, 64<<20) // more than the socket buffers hold
	if err := client.Send(ctx, Header{Kind: KindFeatures, RequestID: 2, Key: testKey}, big); !errors.Is(err, errDeadline) {
		t.Fatalf("peer not reading: %v, want a deadline error", err)
	}
	if err := client.Send(ctx, Header{Kind: KindFeatures, RequestID: 3, Key: testKey}, nil); err == nil {
		t.Fatal("a Conn whose send timed out mid-frame sends on")
	}

	_, idle := pair(t, "tcp", Options{})
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := idle.Next(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
}

// TestConcurrentSenders: frames from many goroutines on one Conn never interleave.
func TestConcurrentSenders(t *testing.T) {
	ctx := context.Background()
	client, server := pair(t, "unix", Options{})
	const senders, each = 8, 20
	var wg sync.WaitGroup
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 9))
			for i := range each {
				p := randBytes(r, 1+r.IntN(100<<10))
				p[0] = byte(g)
				if err := client.Send(ctx, Header{Kind: KindFeatures, RequestID: uint64(g*1000 + i), Key: testKey}, p); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	next := make([]int, senders)
	for range senders * each {
		h, err := server.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p := make([]byte, h.Len)
		if err := server.ReadPayload(ctx, p); err != nil {
			t.Fatal(err)
		}
		g, i := int(h.RequestID/1000), int(h.RequestID%1000)
		if int(p[0]) != g || next[g] != i {
			t.Fatalf("frame %d of sender %d out of order (want %d)", i, g, next[g])
		}
		next[g]++
	}
	wg.Wait()
}
