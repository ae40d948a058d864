package wire

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"dataplane/features"
)

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	d, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(d)
}

// TestShmChecks: the receiver maps only a memfd sealed against shrinking, only inside its
// size; a frame with two descriptors is refused; no descriptor leaks on any of these paths.
func TestShmChecks(t *testing.T) {
	ctx := context.Background()
	memfd := func(size int64, seal bool) int {
		fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, size); err != nil {
			t.Fatal(err)
		}
		if seal {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	payload := make([]byte, 4096)
	h := Header{Kind: KindFeatures, RequestID: 1, Key: testKey}
	before := openFDs(t)
	for _, tc := range []struct {
		name string
		fd   int
		off  int64
	}{
		{"unsealed", memfd(8192, false), 0},
		{"past the end", memfd(8192, true), 6000},
	} {
		client, server := pair(t, "unix", Options{})
		if err := client.SendShm(ctx, h, payload, tc.fd, tc.off); err != nil {
			t.Fatal(err)
		}
		if _, err := server.Next(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := server.MapPayload(); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v, want ErrFrame", tc.name, err)
		}
		unix.Close(tc.fd)
		client.Close()
		server.Close()
	}

	// Two descriptors with one header: refused, both closed.
	client, server := pair(t, "unix", Options{})
	a, b := memfd(4096, true), memfd(4096, true)
	h.Len, h.ShmLen, h.Sum, h.Flags = 4096, 4096, Checksum(payload), FlagShm
	hdr, err := AppendHeader(nil, &h, DefaultMaxPayload)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := client.Net().(*net.UnixConn).WriteMsgUnix(hdr, unix.UnixRights(a, b), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := server.Next(ctx); !errors.Is(err, ErrFrame) {
		t.Errorf("two descriptors: %v, want ErrFrame", err)
	}
	unix.Close(a)
	unix.Close(b)
	client.Close()
	server.Close()
	time.Sleep(10 * time.Millisecond) // the accepted sockets' close is asynchronous in the poller
	if after := openFDs(t); after > before {
		t.Errorf("%d descriptors open before, %d after", before, after)
	}
}

// TestServerMaxConns: with MaxConns 1 a second connection is not served until the first
// closes.
func TestServerMaxConns(t *testing.T) {
	srv := &Server{MaxConns: 1, Handler: func(ctx context.Context, c *Conn, h *Header) error {
		return c.Send(ctx, Header{Kind: KindFeatures, RequestID: h.RequestID, Key: h.Key}, nil)
	}}
	first := serve(t, "tcp", srv)
	ctx := context.Background()
	ping := func(c *Conn, ctx context.Context) error {
		if err := c.Send(ctx, Header{Kind: KindEncode, RequestID: 1, Key: testKey}, nil); err != nil {
			return err
		}
		_, err := c.Next(ctx)
		return err
	}
	if err := ping(first, ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := net.Dial("tcp", first.Net().RemoteAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	second := NewConn(nc, Options{})
	defer second.Close()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := ping(second, short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second connection served beside the first: %v", err)
	}
	// Once the first closes, the server takes the second from the backlog; that one's Conn
	// broke on its deadline, so close it too: then a third is served.
	first.Close()
	nc3, err := net.Dial("tcp", first.Net().RemoteAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	third := NewConn(nc3, Options{})
	defer third.Close()
	second.Close()
	long, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	if err := ping(third, long); err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
}

// TestInPlaceReply is same-node remote encoding with no copy at all: A's store runs on a
// MemfdAllocator; A admits the item and sends the encode request naming its job's buffer; B
// maps that range writable, encodes into it, answers in place; A checks the checksum and
// completes the job. The features were written once, by B, into A's budget.
func TestInPlaceReply(t *testing.T) {
	alloc := &features.MemfdAllocator{}
	store, err := features.New(features.Options{Host: features.PoolOptions{Capacity: 16 << 20, BlockBytes: 64 << 10, Allocator: alloc}})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	const rows, cols = 256, 1024                // bf16 features: 512 KiB
	encode := func(in []byte, out []byte) int { // a stand-in for the model: deterministic in the input
		for i := range rows * cols {
			binary.LittleEndian.PutUint16(out[2*i:], uint16(i)^uint16(in[i%len(in)]))
		}
		return rows * cols * 2
	}
	srv := &Server{Handler: func(ctx context.Context, c *Conn, h *Header) error {
		in := make([]byte, h.Len)
		if err := c.ReadPayload(ctx, in); err != nil {
			return c.SendError(ctx, h.RequestID, h.Key, err.Error())
		}
		m, err := c.MapReply()
		if err != nil {
			return c.SendError(ctx, h.RequestID, h.Key, err.Error())
		}
		defer m.Close()
		if len(m.Bytes()) < rows*cols*2 {
			return c.SendError(ctx, h.RequestID, h.Key, "reply range too small")
		}
		n := encode(in, m.Bytes())
		return c.SendInPlace(ctx, Header{Kind: KindFeatures, RequestID: h.RequestID, Key: h.Key, DType: DTypeBF16, Rows: rows, Cols: cols}, m.Bytes()[:n])
	}}
	cl := NewClient(serve(t, "unix", srv), NewWindow(4, 1<<20))
	defer cl.Close()
	ctx := context.Background()
	for i := range 3 {
		key := testKey
		key.Content = fmt.Sprintf("img-%d", i)
		req, _ := store.Begin(key.Content, features.Policy{})
		rec, job, err := req.Admit(ctx, features.Item{Key: key, MediaID: "0", Bytes: rows * cols * 2})
		if err != nil {
			t.Fatal(err)
		}
		fd, off, ok := alloc.FD(job.Buffer().Addr())
		if !ok {
			t.Fatal("job buffer not in a memfd")
		}
		input := []byte(fmt.Sprintf("pixels of image %d", i))
		got := allocated(func() {
			err = cl.CallWithReply(ctx, Header{Kind: KindEncode, Key: key, DType: DTypeU8, Rows: 1, Cols: uint32(len(input))}, input,
				fd, off, job.Buffer().Len(), func(ctx context.Context, c *Conn, h *Header) error { return ReceiveInto(ctx, c, h, job) })
		})
		if err != nil {
			t.Fatal(err)
		}
		if got > rows*cols { // less than half the features' size: they were not copied
			t.Errorf("item %d: %d bytes allocated", i, got)
		}
		<-rec.Ready()
		v, err := rec.Host()
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, rows*cols*2)
		encode(input, want)
		if !bytes.Equal(v.Bytes(), want) {
			t.Fatalf("item %d: features differ", i)
		}
		req.Cancel()
	}

	// A wrong checksum in an in-place answer fails the job.
	raw, c := pair(t, "unix", Options{})
	req, _ := store.Begin("bad", features.Policy{})
	rec, job, err := req.Admit(ctx, features.Item{Key: features.Key{Content: "bad", Model: "m"}, MediaID: "0", Bytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Send(ctx, Header{Kind: KindFeatures, RequestID: 1, Key: testKey}, nil); err != nil { // an ordinary empty frame first
		t.Fatal(err)
	}
	if err := raw.SendInPlace(ctx, Header{Kind: KindFeatures, RequestID: 2, Key: testKey, Sum: 12345}, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	c.Next(ctx)
	h, err := c.Next(ctx)
	if err != nil || h.Flags&FlagInPlace == 0 {
		t.Fatalf("in-place header: %+v %v", h, err)
	}
	if err := ReceiveInto(ctx, c, &h, job); !errors.Is(err, ErrChecksum) {
		t.Fatalf("bad in-place checksum: %v", err)
	}
	<-rec.Ready()
	if rec.Err() == nil {
		t.Fatal("the job did not fail")
	}
	req.Cancel()
}
