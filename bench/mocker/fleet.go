package mocker

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// FleetOptions configure a fleet of engines. Engine i gets Engine with Name Prefix+i (and a
// seed derived from Engine.Seed when it is set).
type FleetOptions struct {
	Engines int     // how many; 1
	Prefix  string  // engine names: Prefix + index; "mock-"
	Engine  Options // each engine's options (Name is set per engine); DefaultOptions()
	Clock   Clock   // real time at speed 1 unless set
	// Loops is how many goroutines drive the engines (engines are spread round-robin); a
	// virtual clock always uses 1. 0: GOMAXPROCS.
	Loops int
	// Publisher receives every engine's KV events (nil: none). Per-engine publishers (a ZMQ
	// socket pair each) come from PublisherFor when it is set.
	Publisher    Publisher
	PublisherFor func(i int, name string) (Publisher, error)
}

// DefaultFleetOptions: one engine with Dynamo's defaults, real time.
func DefaultFleetOptions() FleetOptions {
	return FleetOptions{Engines: 1, Prefix: "mock-", Engine: DefaultOptions(), Clock: Clock{Speedup: 1}}
}

// Fleet is a set of engines driven by a few loops. Submit and Abort are safe from any
// goroutine; Run drives the loops until ctx ends.
type Fleet struct {
	opts    FleetOptions
	loops   []*Loop
	engines []*Engine
	loopOf  []*Loop
}

// NewFleet builds the engines; Run starts them.
func NewFleet(opts FleetOptions) (*Fleet, error) {
	if opts.Engines <= 0 {
		return nil, &ErrOptions{"Engines", fmt.Sprintf("%d: must be positive", opts.Engines)}
	}
	loops := opts.Loops
	if loops <= 0 {
		loops = runtime.GOMAXPROCS(0)
	}
	if opts.Clock.Virtual {
		loops = 1
	}
	loops = min(loops, opts.Engines)
	f := &Fleet{opts: opts}
	for range loops {
		f.loops = append(f.loops, NewLoop(opts.Clock))
	}
	for i := range opts.Engines {
		eo := opts.Engine
		eo.Name = fmt.Sprintf("%s%d", opts.Prefix, i)
		if eo.Seed != 0 {
			eo.Seed += uint64(i) * 0x9e3779b97f4a7c15
		}
		pub := opts.Publisher
		if opts.PublisherFor != nil {
			p, err := opts.PublisherFor(i, eo.Name)
			if err != nil {
				return nil, err
			}
			pub = p
		}
		e, err := NewEngine(eo, pub)
		if err != nil {
			return nil, err
		}
		f.engines = append(f.engines, e)
		f.loopOf = append(f.loopOf, f.loops[i%loops])
	}
	return f, nil
}

// Len is the number of engines.
func (f *Fleet) Len() int { return len(f.engines) }

// Engine returns engine i (its methods belong to its loop goroutine: use Inspect from outside).
func (f *Fleet) Engine(i int) *Engine { return f.engines[i] }

// Loops returns the loops (for lag statistics).
func (f *Fleet) Loops() []*Loop { return f.loops }

// Run drives every loop until ctx ends (a virtual fleet: until nothing is left to do).
func (f *Fleet) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(f.loops))
	for i, l := range f.loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.Run(ctx)
		}()
	}
	wg.Wait()
	return errs[0]
}

// Submit hands request r to engine i and waits for the engine to accept it (r.Sink then gets
// its outputs) or refuse it (ErrQueueFull, *ErrBadRequest). The fleet must be running.
func (f *Fleet) Submit(ctx context.Context, i int, r *Request) error {
	if i < 0 || i >= len(f.engines) {
		return fmt.Errorf("mock fleet: no engine %d (have %d)", i, len(f.engines))
	}
	res := make(chan error, 1)
	l, e := f.loopOf[i], f.engines[i]
	l.Do(func(now time.Duration) {
		wake, err := e.Submit(r, now)
		if wake {
			l.Wake(e)
		}
		res <- err
	})
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		// The loop may still accept it: abort in case it did.
		f.Abort(i, r.ID)
		return ctx.Err()
	}
}

// Post hands request r to engine i without waiting: r.Sink gets its outputs, or refused, on
// the loop goroutine, the engine's refusal (ErrQueueFull, *ErrBadRequest). The fleet must be
// running; i must be an engine's.
func (f *Fleet) Post(i int, r *Request, refused func(error)) {
	l, e := f.loopOf[i], f.engines[i]
	l.Do(func(now time.Duration) {
		wake, err := e.Submit(r, now)
		if wake {
			l.Wake(e)
		}
		if err != nil {
			refused(err)
		}
	})
}

// SubmitAt is Submit for loop-goroutine callers (a virtual-time harness): it submits at once.
func (f *Fleet) SubmitAt(i int, r *Request, now time.Duration) error {
	l, e := f.loopOf[i], f.engines[i]
	wake, err := e.Submit(r, now)
	if wake {
		l.Wake(e)
	}
	return err
}

// Abort ends request id on engine i early (safe from any goroutine).
func (f *Fleet) Abort(i int, id string) {
	l, e := f.loopOf[i], f.engines[i]
	l.Do(func(now time.Duration) {
		if e.Abort(id, now) {
			l.Wake(e)
		}
	})
}

// Inspect runs fn with engine i on its loop goroutine and waits for it.
func (f *Fleet) Inspect(ctx context.Context, i int, fn func(e *Engine)) error {
	done := make(chan struct{})
	f.loopOf[i].Do(func(time.Duration) {
		fn(f.engines[i])
		close(done)
	})
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Loop returns the loop driving engine i.
func (f *Fleet) Loop(i int) *Loop { return f.loopOf[i] }
