package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Announcer keeps workers announced: it puts each one's announcement in the bucket at once and
// again every third of the lease (a heartbeat), and deletes them when it stops, so routers drop
// them at once rather than a lease later. A process that dies without stopping it leaves its
// workers until their lease runs out.
type Announcer struct {
	js   jetstream.JetStream
	opts BucketOptions
	list func() []Worker // the workers, each with its current load; called once per heartbeat

	// OnError, if set, hears about failed puts (NATS down, the bucket gone); the next
	// heartbeat tries again. Called from Run's goroutine.
	OnError func(error)
	// KeepOnStop leaves the announcements when Run stops, to expire with their lease: for an
	// announcer that is not the worker (a relay in front of an engine that goes on serving),
	// whose restart within the lease should not take the worker out of routing.
	KeepOnStop bool

	Puts, Errors atomic.Int64
	lease        atomic.Int64 // the bucket's lease in nanoseconds, once open
}

// NewAnnouncer announces the workers list returns, in the bucket opts names (created if
// missing: OpenBucket).
func NewAnnouncer(js jetstream.JetStream, opts BucketOptions, list func() []Worker) *Announcer {
	return &Announcer{js: js, opts: opts, list: list}
}

// Lease is the bucket's lease once Run opened it (0 before).
func (a *Announcer) Lease() time.Duration { return time.Duration(a.lease.Load()) }

// Run opens the bucket and announces until ctx ends, then deletes every announcement (with a
// few seconds' grace of its own). It returns an error only when the bucket cannot be opened at
// the start; later failures go to OnError and are retried at the next heartbeat.
func (a *Announcer) Run(ctx context.Context) error {
	b, err := OpenBucket(ctx, a.js, a.opts)
	if err != nil {
		return err
	}
	a.lease.Store(int64(b.Lease))
	announced := map[string]bool{}
	t := time.NewTicker(b.Lease / 3)
	defer t.Stop()
	for {
		reopen := a.putAll(ctx, b.KV, announced)
		select {
		case <-ctx.Done():
			if !a.KeepOnStop {
				a.deleteAll(b.KV, announced)
			}
			return nil
		case <-t.C:
		}
		if reopen {
			if nb, err := OpenBucket(ctx, a.js, a.opts); err == nil {
				b = nb
			} else {
				a.fail(err)
			}
		}
	}
}

// putAll puts every worker's announcement; it reports whether the bucket looked gone.
func (a *Announcer) putAll(ctx context.Context, kv jetstream.KeyValue, announced map[string]bool) (reopen bool) {
	now := map[string]bool{}
	for _, w := range a.list() {
		now[w.Name] = true
		if err := w.Check(); err != nil {
			a.fail(fmt.Errorf("announce: %w", err))
			continue
		}
		v, err := json.Marshal(w)
		if err != nil {
			a.fail(fmt.Errorf("announce %s: %w", w.Name, err))
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, a.Lease()/3)
		_, err = kv.Put(pctx, w.Name, v)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			a.fail(fmt.Errorf("announce %s: %w", w.Name, err))
			if gone(err) {
				return true
			}
			continue
		}
		a.Puts.Add(1)
		announced[w.Name] = true
	}
	// Workers the list no longer has leave now, not a lease later.
	for name := range announced {
		if !now[name] {
			a.delete(ctx, kv, name)
			delete(announced, name)
		}
	}
	return false
}

func (a *Announcer) deleteAll(kv jetstream.KeyValue, announced map[string]bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for name := range announced {
		a.delete(ctx, kv, name)
	}
}

func (a *Announcer) delete(ctx context.Context, kv jetstream.KeyValue, name string) {
	if err := kv.Delete(ctx, name); err != nil {
		a.fail(fmt.Errorf("withdraw %s: %w", name, err))
	}
}

func (a *Announcer) fail(err error) {
	a.Errors.Add(1)
	if a.OnError != nil {
		a.OnError(err)
	}
}
