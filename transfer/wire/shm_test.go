package wire

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
	h.Len, h.Sum, h.Flags = 4096, Checksum(payload), FlagShm
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
