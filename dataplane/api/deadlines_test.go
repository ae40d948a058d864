package api

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// socketDeadlines is a connection that records the deadlines given to it, by the wall clock
// (lazyDeadlines gives them the monotonic reading of its base as well).
type socketDeadlines struct {
	net.Conn
	read, write []time.Time
}

func (c *socketDeadlines) Read([]byte) (int, error)  { return 0, nil }
func (c *socketDeadlines) Write([]byte) (int, error) { return 0, nil }
func (c *socketDeadlines) SetReadDeadline(t time.Time) error {
	c.read = append(c.read, t.Round(0))
	return nil
}
func (c *socketDeadlines) SetWriteDeadline(t time.Time) error {
	c.write = append(c.write, t.Round(0))
	return nil
}

// fasthttp's asks for one keep-alive request (server.go, v1.74.0, serveConn): the idle timeout
// before waiting for it, the header timeout once a byte came, the body's once the headers
// were read, and the response's before writing it.
func (c *lazyDeadlines) request(now time.Time) {
	c.SetReadDeadline(now.Add(2 * time.Minute)) //nolint:errcheck
	c.Read(nil)                                 //nolint:errcheck // the request arrives at once
	c.SetReadDeadline(now.Add(10 * time.Second))
	c.SetReadDeadline(now.Add(time.Minute))
	c.SetWriteDeadline(now.Add(10 * time.Minute)) //nolint:errcheck
	c.Write(nil)                                  //nolint:errcheck
}

func TestLazyDeadlinesSkipAsksWithinLate(t *testing.T) {
	sock := &socketDeadlines{}
	c := &lazyDeadlines{Conn: sock, late: int64(time.Second)}
	t0 := time.Unix(1_000_000, 0)
	c.request(t0)
	require.Equal(t, []time.Time{t0.Add(2*time.Minute + time.Second)}, sock.read, "the idle deadline, late by late")
	require.Equal(t, []time.Time{t0.Add(10*time.Minute + time.Second)}, sock.write)
	// Requests within late of the first need no update: the socket's deadlines are at most
	// late after what they ask.
	for ms := range 1000 {
		c.request(t0.Add(time.Duration(ms+1) * time.Millisecond))
	}
	require.Len(t, sock.read, 1)
	require.Len(t, sock.write, 1)
	// One past it moves each deadline once.
	t1 := t0.Add(1001 * time.Millisecond)
	c.request(t1)
	require.Equal(t, t1.Add(2*time.Minute+time.Second), sock.read[1])
	require.Equal(t, t1.Add(10*time.Minute+time.Second), sock.write[1])
	require.Len(t, sock.read, 2)
}

func TestLazyDeadlinesNeverEarly(t *testing.T) {
	sock := &socketDeadlines{}
	c := &lazyDeadlines{Conn: sock, late: int64(time.Second)}
	t0 := time.Unix(1_000_000, 0)
	c.request(t0)
	// A shorter deadline before a read (a header that came in pieces) reaches the socket.
	c.SetReadDeadline(t0.Add(10 * time.Second)) //nolint:errcheck
	c.Read(nil)                                 //nolint:errcheck
	require.Equal(t, t0.Add(11*time.Second), sock.read[len(sock.read)-1])
	// So does a later one.
	c.SetReadDeadline(t0.Add(time.Minute)) //nolint:errcheck
	c.Read(nil)                            //nolint:errcheck
	require.Equal(t, t0.Add(61*time.Second), sock.read[len(sock.read)-1])
	// None clears it, once.
	c.SetReadDeadline(time.Time{}) //nolint:errcheck
	c.Read(nil)                    //nolint:errcheck
	c.Read(nil)                    //nolint:errcheck
	require.Equal(t, []time.Time{{}}, sock.read[len(sock.read)-1:])
	require.Len(t, sock.read, 4)
	// With late 0 every new deadline goes to the socket as asked.
	exact := &lazyDeadlines{Conn: sock, late: 0}
	exact.SetWriteDeadline(t0.Add(time.Second)) //nolint:errcheck
	exact.Write(nil)                            //nolint:errcheck
	exact.SetWriteDeadline(t0.Add(time.Second)) //nolint:errcheck
	exact.Write(nil)                            //nolint:errcheck
	require.Equal(t, t0.Add(time.Second), sock.write[len(sock.write)-1])
}

// A deadline asked while a Read is blocked reaches it, from another goroutine, as on a socket:
// one that ends it, and one that extends it.
func TestLazyDeadlinesReachABlockedRead(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	peer, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer peer.Close()
	raw, err := ln.Accept()
	require.NoError(t, err)
	c := &lazyDeadlines{Conn: raw, late: int64(10 * time.Millisecond)}
	defer c.Close()

	got := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		got <- err
	}()
	time.Sleep(20 * time.Millisecond) // blocked, with no deadline
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(start.Add(30*time.Millisecond)))
	select {
	case err := <-got:
		require.True(t, errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
		require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "never early")
	case <-time.After(5 * time.Second):
		t.Fatal("a deadline asked during a Read did not end it")
	}

	require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	go func() {
		_, err := c.Read(make([]byte, 1))
		got <- err
	}()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	time.Sleep(150 * time.Millisecond) // past the first deadline
	_, err = peer.Write([]byte{1})
	require.NoError(t, err)
	select {
	case err := <-got:
		require.NoError(t, err, "the extended deadline held")
	case <-time.After(5 * time.Second):
		t.Fatal("no read")
	}
}

// Through the server: headers sent a byte at a time are cut at --header-timeout, late by at
// most an eighth of the shortest timeout; a keep-alive connection that sent its requests
// quickly is not cut by the deadlines its earlier requests asked for.
func TestHeaderTimeoutWithLazyDeadlines(t *testing.T) {
	opts := DefaultOptions()
	opts.HeaderTimeout = 400 * time.Millisecond
	late := 400 * time.Millisecond / 8
	base, _ := startServer(t, opts)
	addr := strings.TrimPrefix(base, "http://")

	slow, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer slow.Close()
	start := time.Now()
	cut := make(chan time.Duration, 1)
	go func() {
		io.Copy(io.Discard, slow) //nolint:errcheck // until the server closes it
		cut <- time.Since(start)
	}()
	header := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("a", 100)
	for i := 0; i < len(header); i++ {
		if _, err := slow.Write([]byte{header[i]}); err != nil {
			break // closed: the timeout came
		}
		select {
		case took := <-cut:
			require.GreaterOrEqual(t, took, opts.HeaderTimeout, "cut early")
			require.Less(t, took, opts.HeaderTimeout+late+time.Second, "cut late") // a busy machine's scheduling on top
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("headers sent over %v were not cut", time.Since(start))
}

func TestKeepAliveOutlivesEarlierDeadlines(t *testing.T) {
	opts := DefaultOptions()
	opts.HeaderTimeout, opts.IdleTimeout = 200*time.Millisecond, 2*time.Second
	base, _ := startServer(t, opts)
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	r := bufio.NewReader(conn)
	// Requests 100 ms apart for a second: each within its header timeout, together five of it.
	for i := range 10 {
		_, err := fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(r, nil)
		require.NoError(t, err, "request %d", i)
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		time.Sleep(100 * time.Millisecond)
	}
}
