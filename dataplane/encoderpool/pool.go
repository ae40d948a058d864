// Package encoderpool is the encoder worker loop: jobs (one preprocessed input each, with the
// feature-store buffer to write) queue per model and per priority; workers take batches that
// close on a size, a wait or a token budget, interactive work first, each worker owning its
// kernels' thread budget; a new job goes to the worker with the least estimated work ahead,
// using per-model costs calibrated online from measured encode times. A batch that fails is
// retried item by item, so one bad input fails alone.
package encoderpool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"dataplane/dataplane/encoder"
	"dataplane/dataplane/sequence"
	"dataplane/native"
)

// Priority orders work within a model's queue.
type Priority uint8

const (
	Interactive Priority = iota // a client is waiting
	Batch                       // offline work: encoded when no interactive work waits
)

// Model is what the pool needs of an encoder: dataplane/encoder's *Model satisfies it.
type Model interface {
	Run(inputs []encoder.Input, outs []native.Matrix) error
}

// Job is one input to encode into Out.
type Job struct {
	Model    Model
	Modality sequence.Modality // for metrics
	Input    encoder.Input
	Out      native.Matrix // [tokens, width], usually a feature-store view
	Tokens   int
	Priority Priority
	// Ctx cancels the job while it waits (client gone, deadline passed); a job already in a
	// running batch finishes.
	Ctx context.Context
	// Done is called exactly once, from a worker goroutine, with nil or the job's own error.
	Done func(err error)

	enqueued time.Time
	cost     float64 // estimated seconds
}

// Options configure the pool. Zero fields take DefaultOptions' values.
type Options struct {
	Workers        int           // worker loops (one per device; the CPU backend: usually 1)
	MaxBatch       int           // items per batch
	MaxWait        time.Duration // how long the first item of a batch waits for company
	MaxBatchTokens int           // tokens per batch
	MaxQueued      int           // jobs waiting in the whole pool; more are refused (ErrQueueFull)
	// SecondsPerToken seeds a model's cost estimate before any measurement (calibrated online).
	SecondsPerToken float64
	// Observe, if set, is told about every batch (for metrics).
	Observe func(BatchStats)
	Now     func() time.Time
}

// DefaultOptions: one worker, batches of up to 8 items or 16K tokens, 5 ms of batching delay.
func DefaultOptions() Options {
	return Options{Workers: 1, MaxBatch: 8, MaxWait: 5 * time.Millisecond, MaxBatchTokens: 16384, MaxQueued: 4096,
		SecondsPerToken: 1e-3, Now: time.Now}
}

func (o *Options) fill() {
	d := DefaultOptions()
	if o.Workers <= 0 {
		o.Workers = d.Workers
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = d.MaxBatch
	}
	if o.MaxWait <= 0 {
		o.MaxWait = d.MaxWait
	}
	if o.MaxBatchTokens <= 0 {
		o.MaxBatchTokens = d.MaxBatchTokens
	}
	if o.MaxQueued <= 0 {
		o.MaxQueued = d.MaxQueued
	}
	if o.SecondsPerToken <= 0 {
		o.SecondsPerToken = d.SecondsPerToken
	}
	if o.Now == nil {
		o.Now = d.Now
	}
}

// BatchStats describe one batch a worker ran.
type BatchStats struct {
	Worker   int
	Modality sequence.Modality
	Items    int
	Tokens   int
	Waited   time.Duration // the oldest item's time in the queue
	Took     time.Duration
	Err      error // the batch's error before the item-by-item retry, if any
}

var (
	// ErrQueueFull: the pool holds MaxQueued jobs already.
	ErrQueueFull = errors.New("encoder queue full")
	// ErrClosed: the pool is shutting down.
	ErrClosed = errors.New("encoder pool closed")
)

// Pool runs the workers. Submit from any goroutine; Close drains.
type Pool struct {
	opts    Options
	mu      sync.Mutex
	workers []*worker
	costs   map[Model]float64 // seconds per token, per model (EWMA of measurements)
	queued  int
	closed  bool
	wg      sync.WaitGroup
}

// worker is one loop with its own queues: per model, per priority, FIFO.
type worker struct {
	id      int
	queues  map[Model]*[2][]*Job // [priority] FIFO
	order   []Model              // models with queued jobs, oldest first (fairness between models)
	pending float64              // estimated seconds of queued + running work
	wake    chan struct{}        // one-slot notify
	dropped []*Job               // cancelled while queued, to be told outside the lock
}

// New starts the workers.
func New(opts Options) *Pool {
	opts.fill()
	p := &Pool{opts: opts, costs: map[Model]float64{}}
	for i := range opts.Workers {
		w := &worker{id: i, queues: map[Model]*[2][]*Job{}, wake: make(chan struct{}, 1)}
		p.workers = append(p.workers, w)
		p.wg.Add(1)
		go p.loop(w)
	}
	return p
}

// Submit queues a job on the worker with the least estimated work ahead and returns at once.
func (p *Pool) Submit(j *Job) error {
	if j.Model == nil || j.Done == nil || j.Tokens <= 0 {
		return fmt.Errorf("encoderpool: job needs a model, a Done function and a token count (got %d)", j.Tokens)
	}
	if j.Ctx == nil {
		j.Ctx = context.Background()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if p.queued >= p.opts.MaxQueued {
		return ErrQueueFull
	}
	j.enqueued = p.opts.Now()
	j.cost = p.costLocked(j.Model) * float64(j.Tokens)
	w := p.workers[0]
	for _, o := range p.workers[1:] {
		if o.pending < w.pending {
			w = o
		}
	}
	q := w.queues[j.Model]
	if q == nil {
		q = &[2][]*Job{}
		w.queues[j.Model] = q
		w.order = append(w.order, j.Model)
	}
	q[j.Priority] = append(q[j.Priority], j)
	w.pending += j.cost
	p.queued++
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return nil
}

// ETA estimates when a job of tokens tokens for m submitted now would be done: the least
// loaded worker's work ahead plus its own.
func (p *Pool) ETA(m Model, tokens int) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	ahead := p.workers[0].pending
	for _, w := range p.workers[1:] {
		ahead = min(ahead, w.pending)
	}
	return time.Duration((ahead + p.costLocked(m)*float64(tokens)) * float64(time.Second))
}

// SecondsPerToken is the current cost estimate for m.
func (p *Pool) SecondsPerToken(m Model) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.costLocked(m)
}

// Queued is the number of jobs waiting.
func (p *Pool) Queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.queued
}

// costLocked: p.mu must be held.
func (p *Pool) costLocked(m Model) float64 {
	if c, ok := p.costs[m]; ok {
		return c
	}
	return p.opts.SecondsPerToken
}

// Close stops accepting jobs, lets the workers finish everything queued, and waits for them.
func (p *Pool) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		for _, w := range p.workers {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// loop is one worker: wait for work, gather a batch, run it, repeat; exit when closed and empty.
func (p *Pool) loop(w *worker) {
	defer p.wg.Done()
	for {
		batch, wait, dropped := p.take(w)
		for _, j := range dropped {
			j.Done(fmt.Errorf("encoderpool: cancelled while queued: %w", j.Ctx.Err()))
		}
		if batch != nil {
			p.run(w, batch)
			continue
		}
		p.mu.Lock()
		done := p.closed && len(w.order) == 0
		p.mu.Unlock()
		if done {
			return
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-w.wake:
			case <-t.C:
			}
			t.Stop()
		} else {
			<-w.wake
		}
	}
}

// take returns a batch ready to run, or nil and how long until the oldest batch's wait is up
// (0: nothing queued). A batch is one model's jobs, interactive first; it is ready when it is
// full (items or tokens), when its first job has waited MaxWait, or when the pool is closing.
func (p *Pool) take(w *worker) (batch []*Job, wait time.Duration, dropped []*Job) {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer func() { dropped, w.dropped = w.dropped, nil }()
	now := p.opts.Now()
	var soonest time.Duration
	// Interactive work of any model before batch work of any model.
	for pri := Interactive; pri <= Batch; pri++ {
		for _, m := range slices.Clone(w.order) { // forget may shorten w.order
			if w.queues[m] == nil {
				continue
			}
			q := w.queues[m]
			p.dropCancelled(w, q, pri)
			jobs := q[pri]
			if len(jobs) == 0 {
				p.forget(w, m)
				continue
			}
			n, tokens := 0, 0
			for n < len(jobs) && n < p.opts.MaxBatch && (n == 0 || tokens+jobs[n].Tokens <= p.opts.MaxBatchTokens) {
				tokens += jobs[n].Tokens
				n++
			}
			full := n == p.opts.MaxBatch || n < len(jobs)
			waited := now.Sub(jobs[0].enqueued)
			if full || waited >= p.opts.MaxWait || p.closed {
				batch = append([]*Job(nil), jobs[:n]...)
				q[pri] = jobs[n:]
				p.queued -= n
				p.forget(w, m)
				return batch, 0, nil
			}
			if left := p.opts.MaxWait - waited; soonest == 0 || left < soonest {
				soonest = left
			}
		}
	}
	return nil, soonest, nil
}

// dropCancelled fails queued jobs whose context ended. p.mu must be held.
func (p *Pool) dropCancelled(w *worker, q *[2][]*Job, pri Priority) {
	kept := q[pri][:0]
	for _, j := range q[pri] {
		if j.Ctx.Err() != nil {
			p.queued--
			w.pending -= j.cost
			w.dropped = append(w.dropped, j)
			continue
		}
		kept = append(kept, j)
	}
	clear(q[pri][len(kept):])
	q[pri] = kept
}

// forget drops a model with nothing queued from the worker's order. p.mu must be held.
func (p *Pool) forget(w *worker, m Model) {
	if q := w.queues[m]; len(q[Interactive]) > 0 || len(q[Batch]) > 0 {
		return
	}
	delete(w.queues, m)
	for i, o := range w.order {
		if o == m {
			w.order = append(w.order[:i], w.order[i+1:]...)
			break
		}
	}
}

// run encodes a batch, calibrates the model's cost from the time it took, and reports each
// job. If the batch fails as a whole, each job is run alone so only bad ones fail.
func (p *Pool) run(w *worker, batch []*Job) {
	start := p.opts.Now()
	inputs := make([]encoder.Input, len(batch))
	outs := make([]native.Matrix, len(batch))
	tokens := 0
	for i, j := range batch {
		inputs[i], outs[i] = j.Input, j.Out
		tokens += j.Tokens
	}
	model := batch[0].Model
	err := model.Run(inputs, outs)
	took := p.opts.Now().Sub(start)
	errs := make([]error, len(batch))
	switch {
	case err != nil && len(batch) > 1:
		for i := range batch {
			errs[i] = model.Run(inputs[i:i+1], outs[i:i+1])
		}
	case err != nil:
		errs[0] = err
	}
	p.mu.Lock()
	for _, j := range batch {
		w.pending -= j.cost
	}
	if len(w.order) == 0 {
		w.pending = 0 // nothing queued: drop rounding drift
	}
	if err == nil && tokens > 0 {
		measured := took.Seconds() / float64(tokens)
		if old, ok := p.costs[model]; ok {
			p.costs[model] = 0.8*old + 0.2*measured
		} else {
			p.costs[model] = measured
		}
	}
	p.mu.Unlock()
	if p.opts.Observe != nil {
		p.opts.Observe(BatchStats{Worker: w.id, Modality: batch[0].Modality, Items: len(batch), Tokens: tokens,
			Waited: start.Sub(batch[0].enqueued), Took: took, Err: err})
	}
	for i, j := range batch {
		j.Done(errs[i])
	}
}
