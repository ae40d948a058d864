package api

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// unusedConns tracks accepted connections that have not sent a byte yet. fasthttp counts a
// connection as busy from the moment it waits for its first request, so its graceful
// shutdown would wait up to ReadTimeout on a client's spare connection (Go's http.Transport
// dials those when many requests start together). Such a connection holds no request, so
// shutdown may close it at once.
type unusedConns struct {
	net.Listener
	late   time.Duration // how late a deadline may fire (lazyDeadlines)
	mu     sync.Mutex
	unused map[*trackedConn]struct{}
}

func trackUnused(ln net.Listener, late time.Duration) *unusedConns {
	return &unusedConns{Listener: ln, late: late, unused: make(map[*trackedConn]struct{})}
}

func (l *unusedConns) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{lazyDeadlines: lazyDeadlines{Conn: c, late: int64(l.late)}, owner: l}
	l.mu.Lock()
	l.unused[tc] = struct{}{}
	l.mu.Unlock()
	return tc, nil
}

// closeUnused closes every connection that has not sent a byte and has none waiting.
func (l *unusedConns) closeUnused() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.unused {
		if c.pending() {
			continue // a request arrived and fasthttp is about to read it
		}
		c.used.Store(true)
		c.Conn.Close() //nolint:errcheck // the peer never spoke; nothing to report
		delete(l.unused, c)
	}
}

func (l *unusedConns) forget(c *trackedConn) {
	if c.used.Swap(true) {
		return
	}
	l.mu.Lock()
	delete(l.unused, c)
	l.mu.Unlock()
}

type trackedConn struct {
	lazyDeadlines
	owner *unusedConns
	used  atomic.Bool
}

func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.lazyDeadlines.Read(b)
	if n > 0 && !c.used.Load() {
		c.owner.forget(c)
	}
	return n, err
}

func (c *trackedConn) Close() error {
	c.owner.forget(c)
	return c.Conn.Close()
}

// SyscallConn lets the disconnect watcher peek at the socket under the wrapper.
func (c *trackedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, syscall.EINVAL
	}
	return sc.SyscallConn()
}

// pending reports whether the peer sent bytes not read yet (peeked, not consumed).
func (c *trackedConn) pending() bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	n, _ := peekSocket(raw)
	return n > 0
}

// peekSocket looks at the socket without consuming or waiting: n > 0 means bytes wait to be
// read; n == 0 with a nil error means the peer closed its end; an error (EAGAIN) means
// nothing has arrived. It uses Control, not Read: the socket's reader may sit in Read holding
// its read lock.
func peekSocket(raw syscall.RawConn) (n int, err error) {
	if cerr := raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); cerr != nil {
		return -1, cerr
	}
	return n, err
}
