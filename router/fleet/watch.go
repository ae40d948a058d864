package fleet

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Handler hears what a Watcher sees, one call at a time from its goroutine.
type Handler interface {
	Join(w Worker)          // a worker appeared (or came back after it left)
	Update(w Worker)        // a known worker's heartbeat: its announcement, maybe changed
	Leave(name, why string) // it withdrew, its lease ran out, or it vanished while unwatched
}

// WatchStats count what a Watcher saw.
type WatchStats struct {
	Joins, Updates, Leaves atomic.Int64
	Expired                atomic.Int64 // leaves because the lease ran out by the watcher's clock
	BadValues              atomic.Int64 // announcements that did not parse or check: ignored
	Rewatches              atomic.Int64 // watches started again (a reconnect, a watch that ended)
}

// Watcher follows the announcement bucket and tells its Handler who joins and leaves. A
// worker leaves when its key is deleted (a clean stop), when the server's delete marker for
// an expired entry arrives (servers with markers: Bucket.Markers), and in any case when the
// watcher's own clock finds its lease over: every entry's deadline is its server timestamp
// plus the lease, kept within [now, now + lease] of the watcher's clock so that a skewed
// server clock can neither expire a fresh entry nor keep a dead one beyond a lease. While the
// connection is down nothing expires (a router cut off from NATS cannot tell a dead worker from
// a silent one); after a reconnect the watch starts again from the bucket's current entries,
// which also finds the workers whose entries vanished meanwhile.
type Watcher struct {
	kv    jetstream.KeyValue
	lease time.Duration
	nc    *nats.Conn // for its state and reconnect count; nil: assumed always connected
	h     Handler
	now   func() time.Time

	Stats WatchStats

	ready     chan struct{}
	readyOnce sync.Once

	mu    sync.Mutex // guards known; only Run's goroutine writes it
	known map[string]*watched
}

type watched struct {
	w        Worker
	deadline time.Time
}

// NewWatcher watches b for h. nc is the connection b was opened on (nil in tests that never
// disconnect).
func NewWatcher(b *Bucket, nc *nats.Conn, h Handler) *Watcher {
	return &Watcher{kv: b.KV, lease: b.Lease, nc: nc, h: h, now: time.Now, ready: make(chan struct{}),
		known: map[string]*watched{}}
}

// Ready is closed once the bucket's entries at the start have all been handed to Join: a
// router that registers them before it reads the KV-event stream loses no worker's events.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Workers lists the workers known now, sorted by name.
func (w *Watcher) Workers() []Worker {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Worker, 0, len(w.known))
	for _, k := range w.known {
		out = append(out, k.w)
	}
	slices.SortFunc(out, func(a, b Worker) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

var errRewatch = errors.New("fleet watch: start again")

// Run watches until ctx ends. A watch that fails or ends is started again after a pause (at
// most a third of the lease), so Run returns only when ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	pause := 50 * time.Millisecond
	for {
		err := w.watch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		w.Stats.Rewatches.Add(1)
		if !errors.Is(err, errRewatch) {
			select { // a failure, not a reconnect: back off
			case <-ctx.Done():
				return nil
			case <-time.After(pause):
			}
			pause = min(2*pause, w.lease/3)
		} else {
			pause = 50 * time.Millisecond
		}
	}
}

// watch runs one watch of the whole bucket: the current entries, a nil marker, then changes.
func (w *Watcher) watch(ctx context.Context) error {
	kw, err := w.kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer kw.Stop() //nolint:errcheck
	sweep := time.NewTicker(max(w.lease/10, 20*time.Millisecond))
	defer sweep.Stop()
	var reconnects uint64
	if w.nc != nil {
		reconnects = w.nc.Stats().Reconnects
	}
	initial, seen, down := true, map[string]bool{}, false
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-kw.Updates():
			switch {
			case !ok:
				return errors.New("fleet watch ended")
			case e == nil: // the entries at the start are all in
				initial = false
				w.leaveUnseen(seen)
				w.readyOnce.Do(func() { close(w.ready) })
			default:
				if initial {
					seen[e.Key()] = true
				}
				w.apply(e, initial)
			}
		case <-sweep.C:
			if w.nc != nil {
				if !w.nc.IsConnected() {
					down = true
					continue
				}
				if down || w.nc.Stats().Reconnects != reconnects {
					return errRewatch // the server may have lost our consumer, or restarted
				}
			}
			w.expire(w.now())
		}
	}
}

func (w *Watcher) apply(e jetstream.KeyValueEntry, initial bool) {
	name := e.Key()
	switch e.Operation() {
	case jetstream.KeyValueDelete:
		w.leave(name, "withdrawn")
		return
	case jetstream.KeyValuePurge: // the server's marker when the TTL ran out, or a purge
		w.leave(name, "lease expired (server)")
		return
	}
	wk, err := ParseWorker(name, e.Value())
	if err != nil {
		w.Stats.BadValues.Add(1)
		return
	}
	now := w.now()
	deadline := e.Created().Add(w.lease)
	lo := now
	if initial { // an entry found by a (re)started watch gets one heartbeat to be refreshed
		lo = now.Add(w.lease / 3)
	}
	if deadline.Before(lo) {
		deadline = lo
	}
	if hi := now.Add(w.lease); deadline.After(hi) {
		deadline = hi
	}
	w.mu.Lock()
	k, ok := w.known[name]
	if ok {
		k.w, k.deadline = wk, deadline
	} else {
		w.known[name] = &watched{w: wk, deadline: deadline}
	}
	w.mu.Unlock()
	if ok {
		w.Stats.Updates.Add(1)
		w.h.Update(wk)
	} else {
		w.Stats.Joins.Add(1)
		w.h.Join(wk)
	}
}

func (w *Watcher) leave(name, why string) {
	w.mu.Lock()
	_, ok := w.known[name]
	delete(w.known, name)
	w.mu.Unlock()
	if ok {
		w.Stats.Leaves.Add(1)
		w.h.Leave(name, why)
	}
}

// leaveUnseen drops the workers a restarted watch did not find: their entries went while the
// watcher was not watching (expired without a marker, or deleted and the marker gone too).
func (w *Watcher) leaveUnseen(seen map[string]bool) {
	w.mu.Lock()
	var gone []string
	for name := range w.known {
		if !seen[name] {
			gone = append(gone, name)
		}
	}
	w.mu.Unlock()
	for _, name := range gone {
		w.leave(name, "gone while not watched")
	}
}

func (w *Watcher) expire(now time.Time) {
	w.mu.Lock()
	var over []string
	for name, k := range w.known {
		if now.After(k.deadline) {
			over = append(over, name)
		}
	}
	w.mu.Unlock()
	for _, name := range over {
		w.Stats.Expired.Add(1)
		w.leave(name, "lease expired")
	}
}
