// Package kvevents keeps the router's index in step with what the engines cache: it decodes
// vLLM's KV-event batches (msgpack, both of msgspec's layouts), follows each publisher's
// sequence numbers (gaps replayed, restarts dropped), rehashes stored blocks as requests are
// hashed (package router) and writes the index (package index). Transports: vLLM's ZMQ
// publisher with its replay socket, and our engines' NATS subjects. README.md is its map.
package kvevents

import (
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"dataplane/router"
)

// Feed keeps a router's index in step with its workers' KV events: it registers workers with
// the router and gives each an Engine over the router's index, finds engines by worker name
// (for transports that name the worker, as NATS subjects do) and counts what happens to
// events across them (Stats; NewCollector exports the counts). The router knows nothing of
// it: a router without a feed routes on load alone.
type Feed struct {
	r     *router.Router
	opts  Options
	stats Stats

	mu      sync.Mutex                         // serialises AddWorker and RemoveWorker
	engines atomic.Pointer[map[string]*Engine] // copy-on-write, so Engine takes no lock
}

// NewFeed feeds r's index with opts (its Media checked against the index's tiers).
func NewFeed(r *router.Router, opts Options) (*Feed, error) {
	if err := opts.check(r.Index().Options().Tiers); err != nil {
		return nil, err
	}
	f := &Feed{r: r, opts: opts}
	f.engines.Store(&map[string]*Engine{})
	return f, nil
}

// AddWorker registers a healthy worker with the router and returns the engine that keeps its
// index entries from its KV events (feed it with Engine.Live, or hand it to SubscribeZMQ). The
// engine's capacity is the router's Options.Capacity until SetCapacity says otherwise.
func (f *Feed) AddWorker(name string) (*Engine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	slot, err := f.r.AddWorker(name)
	if err != nil {
		return nil, err
	}
	eng, err := NewEngine(f.r.Index(), slot, f.r.Options().BlockSize, &f.opts, &f.stats)
	if err != nil {
		_ = f.r.RemoveWorker(name) // just added: cannot fail
		return nil, err
	}
	eng.name = name
	eng.SetCapacity(f.r.Options().Capacity)
	next := maps.Clone(*f.engines.Load())
	next[name] = eng
	f.engines.Store(&next)
	return eng, nil
}

// SetCapacity sets the KV capacity of a worker's engine, in blocks (0: none; an engine's
// configured or reported block count): its engine keeps at most that many blocks per tier in
// the index, evicting the oldest it stored first, and the router's index cap for the worker
// (the backstop) follows. Safe from any goroutine; it takes effect in the engine's goroutine at
// its next stored block (Engine.SetCapacity).
func (f *Feed) SetCapacity(name string, blocks int64) error {
	if blocks < 0 {
		return fmt.Errorf("kv capacity of worker %q: %d blocks", name, blocks)
	}
	e := f.Engine(name)
	if e == nil {
		return &router.ErrUnknownWorker{Name: name}
	}
	e.SetCapacity(blocks)
	return nil
}

// RemoveWorker forgets a worker: its engine, and in the router its index entries and its
// requests in flight. Stop feeding its engine first.
func (f *Feed) RemoveWorker(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := (*f.engines.Load())[name]; !ok {
		return &router.ErrUnknownWorker{Name: name}
	}
	next := maps.Clone(*f.engines.Load())
	delete(next, name)
	f.engines.Store(&next)
	return f.r.RemoveWorker(name)
}

// Forget drops a worker's index entries while it stays registered (Engine.Forget: its engine
// replays them at its next batch), e.g. when the worker stopped answering its health checks. It
// is safe while another goroutine feeds the worker's engine.
func (f *Feed) Forget(name string) error {
	e := f.Engine(name)
	if e == nil {
		return &router.ErrUnknownWorker{Name: name}
	}
	e.Forget()
	return nil
}

// Engine is the engine of the worker with that name, or nil.
func (f *Feed) Engine(name string) *Engine { return (*f.engines.Load())[name] }

// Stats are the feed's event counters.
func (f *Feed) Stats() *Stats { return &f.stats }

// Router is the router the feed keeps in step.
func (f *Feed) Router() *router.Router { return f.r }
