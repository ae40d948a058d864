package api

import (
	"context"
	"net"
	"sync"
	"syscall"
	"time"
)

// disconnectWatcher cancels a request when its client closes the connection while the request
// is worked on (fasthttp gives handlers no such signal): one goroutine peeks every
// disconnectPoll at the sockets of the requests in flight, which consumes nothing a pipelined
// next request sends. A request costs a slot in a list and no timer or goroutine of its own
// (the text-only path's profile showed a timer per request, and before it a goroutine); the
// goroutine runs only while requests are in flight. A client that leaves is noticed within
// disconnectPoll, as with a timer per request.
type disconnectWatcher struct {
	mu      sync.Mutex
	active  []*disconnectWatch
	running bool   // the polling goroutine is alive
	gen     uint64 // watches started
	free    sync.Pool
}

const disconnectPoll = 50 * time.Millisecond

// disconnectWatch is one request's place in the watcher (nil: none).
type disconnectWatch struct {
	owner  *disconnectWatcher
	conn   net.Conn
	cancel context.CancelCauseFunc // called with errClientLeft
	at     int                     // index in owner.active; -1 once out of it
	gen    uint64                  // which use of this (pooled) watch: the poller's snapshot checks it
}

// watch starts watching conn for the request that cancel ends; stop (once) ends it.
func (d *disconnectWatcher) watch(conn net.Conn, cancel context.CancelCauseFunc) *disconnectWatch {
	if _, ok := conn.(syscall.Conn); !ok {
		return nil
	}
	w, _ := d.free.Get().(*disconnectWatch)
	if w == nil {
		w = new(disconnectWatch)
	}
	d.mu.Lock()
	d.gen++
	w.owner, w.conn, w.cancel, w.gen = d, conn, cancel, d.gen
	w.at = len(d.active)
	d.active = append(d.active, w)
	if !d.running {
		d.running = true
		go d.poll()
	}
	d.mu.Unlock()
	return w
}

// stop ends the watch: once it returns, the request is not cancelled by it.
func (w *disconnectWatch) stop() {
	if w == nil {
		return
	}
	d := w.owner
	d.mu.Lock()
	if w.at >= 0 {
		d.remove(w)
	}
	*w = disconnectWatch{} // under the lock: the poller reads gen and at under it
	d.mu.Unlock()
	d.free.Put(w)
}

// remove takes w out of the active list (d.mu held).
func (d *disconnectWatcher) remove(w *disconnectWatch) {
	last := len(d.active) - 1
	moved := d.active[last]
	d.active[w.at], moved.at = moved, w.at
	d.active[last] = nil
	d.active = d.active[:last]
	w.at = -1
	if cap(d.active) > 1024 && len(d.active) < cap(d.active)/4 { // a burst is over: give back its room
		d.active = append([]*disconnectWatch(nil), d.active...)
	}
}

// poll checks the active requests' sockets every disconnectPoll until none is left. The
// sockets are peeked without the lock (thousands in flight take milliseconds, which new
// requests would wait for), from a snapshot; a request found gone is cancelled if its watch is
// still the one snapshotted (a watch is reused once stopped: gen tells them apart), after the
// lock is let go (a context's cancel runs code of its own).
func (d *disconnectWatcher) poll() {
	type seen struct {
		w    *disconnectWatch
		gen  uint64
		conn net.Conn
	}
	var snap []seen
	var left []context.CancelCauseFunc
	for {
		time.Sleep(disconnectPoll)
		d.mu.Lock()
		if len(d.active) == 0 {
			d.running = false
			d.mu.Unlock()
			return
		}
		for _, w := range d.active {
			snap = append(snap, seen{w, w.gen, w.conn})
		}
		d.mu.Unlock()
		gone := snap[:0]
		for _, c := range snap {
			if peerClosed(c.conn) {
				gone = append(gone, c)
			}
		}
		if len(gone) > 0 {
			d.mu.Lock()
			for _, c := range gone {
				if c.w.gen == c.gen && c.w.at >= 0 {
					left = append(left, c.w.cancel)
					d.remove(c.w)
				}
			}
			d.mu.Unlock()
		}
		for i, cancel := range left {
			cancel(errClientLeft)
			left[i] = nil
		}
		clear(snap)
		snap, left = snap[:0], left[:0]
	}
}

// peerClosed reports an orderly shutdown of conn's peer: the end of its stream.
func peerClosed(conn net.Conn) bool {
	raw, err := conn.(syscall.Conn).SyscallConn()
	if err != nil {
		return false
	}
	n, err := peekSocket(raw)
	return n == 0 && err == nil
}
