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
	running bool // the polling goroutine is alive
	free    sync.Pool
}

const disconnectPoll = 50 * time.Millisecond

// disconnectWatch is one request's place in the watcher (nil: none).
type disconnectWatch struct {
	owner  *disconnectWatcher
	conn   net.Conn
	cancel context.CancelCauseFunc // called with errClientLeft
	at     int                     // index in owner.active; -1 once out of it
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
	w.owner, w.conn, w.cancel = d, conn, cancel
	d.mu.Lock()
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
	d.mu.Unlock()
	*w = disconnectWatch{}
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
// cancellations run after the lock is let go: a context's cancel runs code of its own.
func (d *disconnectWatcher) poll() {
	var left []context.CancelCauseFunc
	for {
		time.Sleep(disconnectPoll)
		d.mu.Lock()
		if len(d.active) == 0 {
			d.running = false
			d.mu.Unlock()
			return
		}
		for i := 0; i < len(d.active); {
			w := d.active[i]
			if !peerClosed(w.conn) {
				i++
				continue
			}
			left = append(left, w.cancel)
			d.remove(w) // active[i] is now another request
		}
		d.mu.Unlock()
		for i, cancel := range left {
			cancel(errClientLeft)
			left[i] = nil
		}
		left = left[:0]
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
