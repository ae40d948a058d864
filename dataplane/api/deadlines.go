package api

import (
	"net"
	"sync/atomic"
	"time"
)

// lazyDeadlines is a connection whose deadlines reach the socket only when they matter. fasthttp
// sets four deadlines a request (idle, headers, body, response), each an update of the runtime's
// timer heap under its locks: about 0.5 µs a request in all (perf, BenchmarkTextOnlyHTTP). Here
// a deadline is kept as asked and given to the socket when a Read or Write starts (at once when
// one is running: a deadline still ends or extends it), and not even then while the socket's
// deadline is at most late after it. The socket is given the deadline plus late, so the asks of
// the requests that follow within late need nothing: a deadline fires up to late after it was
// asked for, never before. Older fasthttp servers skipped updates the same way
// (updateReadDeadline, "only if more than 25% of the last read deadline exceeded",
// golang/go#15133), firing up to a quarter early instead.
//
// Deadlines are nanoseconds since deadlineBase (0: none) in atomics, so that an ask from another
// goroutine and an operation starting meet: each stores its side first and then reads the
// other's, so at least one of them sees both. Measured from a time.Now they keep the monotonic
// clock, as the deadlines asked for do: a step of the wall clock moves none of them.
type lazyDeadlines struct {
	net.Conn
	late        int64 // nanoseconds; 0: every new deadline goes to the socket
	read, write deadline
}

var deadlineBase = time.Now()

type deadline struct {
	asked, socket atomic.Int64
	busy          atomic.Bool
}

func (c *lazyDeadlines) Read(b []byte) (int, error) {
	c.read.busy.Store(true)
	defer c.read.busy.Store(false)
	if err := c.update(&c.read); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *lazyDeadlines) Write(b []byte) (int, error) {
	c.write.busy.Store(true)
	defer c.write.busy.Store(false)
	if err := c.update(&c.write); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

func (c *lazyDeadlines) SetReadDeadline(t time.Time) error { return c.ask(&c.read, t) }

func (c *lazyDeadlines) SetWriteDeadline(t time.Time) error { return c.ask(&c.write, t) }

func (c *lazyDeadlines) SetDeadline(t time.Time) error {
	if err := c.ask(&c.read, t); err != nil {
		return err
	}
	return c.ask(&c.write, t)
}

func (c *lazyDeadlines) ask(d *deadline, t time.Time) error {
	var ns int64
	if !t.IsZero() {
		if ns = int64(t.Sub(deadlineBase)); ns == 0 {
			ns = 1 // 0 is none
		}
	}
	d.asked.Store(ns)
	if d.busy.Load() {
		return c.update(d)
	}
	return nil
}

// update gives the socket d's deadline unless it has one at most late after it.
func (c *lazyDeadlines) update(d *deadline) error {
	asked, socket := d.asked.Load(), d.socket.Load()
	if asked == 0 {
		if socket == 0 {
			return nil
		}
		return c.set(d, 0)
	}
	if socket != 0 && socket >= asked && socket-asked <= c.late {
		return nil
	}
	return c.set(d, asked+c.late)
}

func (c *lazyDeadlines) set(d *deadline, ns int64) error {
	var t time.Time
	if ns != 0 {
		t = deadlineBase.Add(time.Duration(ns))
	}
	var err error
	if d == &c.read {
		err = c.Conn.SetReadDeadline(t)
	} else {
		err = c.Conn.SetWriteDeadline(t)
	}
	if err == nil {
		d.socket.Store(ns)
	}
	return err
}
