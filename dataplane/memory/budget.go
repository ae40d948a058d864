// Package memory is the process's budget for memory that grows with requests: request bodies
// as their bytes arrive, decoded pictures and frames, fetched media, encoder inputs. Each
// request holds an Account; everything it reserves is given back when the account closes.
// A reservation that can never fit is refused at once (TooLarge: the API's 413); one that
// cannot fit now waits in a bounded FIFO queue up to MaxWait (or its context's deadline),
// then is refused (Full or QueueFull: 503 with Retry-After). Bodies still arriving reserve as
// intake (ReserveIntake), held to a share of the budget and served after everything else, so
// half-read bodies can never starve the requests already being worked on. Limit says how much
// memory the process may have (cgroup, then physical memory). Standard library only.
package memory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Options configure a Budget. Zero fields take the defaults in New.
type Options struct {
	Capacity   int64         // bytes; must be > 0
	MaxWait    time.Duration // longest wait for room, in all, per account (a context deadline may cut it); 2 s; < 0: never wait
	MaxWaiters int           // bounded wait queue; more are refused at once; 4096
	RetryAfter time.Duration // what refusals tell clients; 1 s
	// IntakeCapacity bounds what intake reservations (bodies still arriving) hold at once;
	// Capacity/2 when 0. The rest stays for requests whose bodies are in.
	IntakeCapacity int64
}

// Reason says why a reservation was refused.
type Reason uint8

const (
	TooLarge  Reason = iota + 1 // larger than the whole budget: it can never fit
	Full                        // no room within the wait
	QueueFull                   // too many reservations already waiting
	Closed                      // the account was closed (its request ended)
)

func (r Reason) String() string {
	switch r {
	case TooLarge:
		return "too_large"
	case Full:
		return "full"
	case QueueFull:
		return "queue_full"
	case Closed:
		return "closed"
	}
	return "unknown"
}

// ErrBudget is what every refusal wraps.
var ErrBudget = errors.New("memory budget")

// Error is a refused reservation. Its RetryAfter is 0 when retrying cannot help.
type Error struct {
	What       string // what the bytes were for ("request body", "picture 3"), when the caller says
	Reason     Reason
	Need       int64
	Free       int64
	Capacity   int64
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	what := ""
	if e.What != "" {
		what = e.What + ": "
	}
	switch e.Reason {
	case TooLarge:
		return fmt.Sprintf("%s%d bytes can never fit the server's memory budget of %d bytes (--memory-bytes)", what, e.Need, e.Capacity)
	case Closed:
		return what + "the request already ended"
	}
	return fmt.Sprintf("%sthe server's memory is busy: need %d bytes, %d of %d free (%v)", what, e.Need, e.Free, e.Capacity, e.Reason)
}

func (e *Error) Unwrap() error { return ErrBudget }

// Budget is a byte budget shared by the process's requests. Safe for concurrent use.
type Budget struct {
	opts Options

	mu      sync.Mutex
	used    int64
	peak    int64
	intake  int64     // of used: held by intake reservations
	waiters []*waiter // FIFO: the head is served first, so a large reservation is not starved
	// intakeWaiters wait behind waiters: a request already in the work is served before a
	// body still arriving (FIFO among themselves).
	intakeWaiters []*waiter
	refused       [Closed + 1]int64
}

type waiter struct {
	n     int64
	ready chan struct{} // closed once granted (used already counts it)
}

// New makes a budget.
func New(opts Options) (*Budget, error) {
	if opts.Capacity <= 0 {
		return nil, fmt.Errorf("memory: capacity %d bytes", opts.Capacity)
	}
	if opts.MaxWait == 0 {
		opts.MaxWait = 2 * time.Second
	}
	if opts.MaxWaiters <= 0 {
		opts.MaxWaiters = 4096
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = time.Second
	}
	if opts.IntakeCapacity <= 0 || opts.IntakeCapacity > opts.Capacity {
		opts.IntakeCapacity = opts.Capacity / 2
	}
	return &Budget{opts: opts}, nil
}

// Capacity is the budget in bytes.
func (b *Budget) Capacity() int64 { return b.opts.Capacity }

// Stats are the budget's numbers now.
type Stats struct {
	Capacity, Used, Peak int64
	Intake               int64 // of Used: bodies still arriving
	Waiting              int   // reservations waiting, intake ones included
	Refused              map[Reason]int64
}

// Stats reads the numbers.
func (b *Budget) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := Stats{Capacity: b.opts.Capacity, Used: b.used, Peak: b.peak, Intake: b.intake,
		Waiting: len(b.waiters) + len(b.intakeWaiters), Refused: map[Reason]int64{}}
	for r := TooLarge; r <= Closed; r++ {
		s.Refused[r] = b.refused[r]
	}
	return s
}

// reserve takes n bytes, waiting in the queue up to wait or ctx's end (wait <= 0: not at all).
// intake reservations also count against IntakeCapacity and wait behind every other one.
func (b *Budget) reserve(ctx context.Context, n int64, what string, intake bool, wait time.Duration) error {
	if n <= 0 {
		return nil
	}
	b.mu.Lock()
	if n > b.opts.Capacity || intake && n > b.opts.IntakeCapacity {
		defer b.mu.Unlock()
		return b.refuseLocked(TooLarge, n, what)
	}
	if len(b.waiters) == 0 && (!intake || len(b.intakeWaiters) == 0) && b.fitsLocked(n, intake) {
		b.takeLocked(n, intake)
		b.mu.Unlock()
		return nil
	}
	if wait <= 0 {
		defer b.mu.Unlock()
		return b.refuseLocked(Full, n, what)
	}
	if len(b.waiters)+len(b.intakeWaiters) >= b.opts.MaxWaiters {
		defer b.mu.Unlock()
		return b.refuseLocked(QueueFull, n, what)
	}
	w := &waiter{n: n, ready: make(chan struct{})}
	queue := &b.waiters
	if intake {
		queue = &b.intakeWaiters
	}
	*queue = append(*queue, w)
	b.mu.Unlock()

	timer := time.NewTimer(wait)
	defer timer.Stop()
	var cause error
	select {
	case <-w.ready:
		return nil
	case <-timer.C:
	case <-ctx.Done():
		cause = ctx.Err()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // granted while we gave up: keep it
		return nil
	default:
	}
	for i, x := range *queue {
		if x == w {
			*queue = append((*queue)[:i], (*queue)[i+1:]...)
			break
		}
	}
	b.grantLocked() // the head may have been this waiter, blocking smaller ones behind it
	if cause != nil {
		return cause
	}
	return b.refuseLocked(Full, n, what)
}

func (b *Budget) fitsLocked(n int64, intake bool) bool {
	return b.used+n <= b.opts.Capacity && (!intake || b.intake+n <= b.opts.IntakeCapacity)
}

func (b *Budget) takeLocked(n int64, intake bool) {
	b.used += n
	b.peak = max(b.peak, b.used)
	if intake {
		b.intake += n
	}
}

func (b *Budget) refuseLocked(r Reason, n int64, what string) *Error {
	b.refused[r]++
	e := &Error{What: what, Reason: r, Need: n, Free: b.opts.Capacity - b.used, Capacity: b.opts.Capacity}
	if r == Full || r == QueueFull {
		e.RetryAfter = b.opts.RetryAfter
	}
	return e
}

// release gives n bytes back (intake ones: intake of them) and serves the queues in order.
func (b *Budget) release(n, intake int64) {
	if n <= 0 && intake <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	b.intake -= intake
	if b.used < 0 || b.intake < 0 {
		panic(fmt.Sprintf("memory: released more than reserved (used %d, intake %d)", b.used, b.intake))
	}
	b.grantLocked()
}

// grantLocked serves the waiters' head while it fits, then, once none is left, the intake
// waiters' head while it fits.
func (b *Budget) grantLocked() {
	for len(b.waiters) > 0 && b.fitsLocked(b.waiters[0].n, false) {
		w := b.waiters[0]
		b.waiters[0] = nil
		b.waiters = b.waiters[1:]
		b.takeLocked(w.n, false)
		close(w.ready)
	}
	for len(b.waiters) == 0 && len(b.intakeWaiters) > 0 && b.fitsLocked(b.intakeWaiters[0].n, true) {
		w := b.intakeWaiters[0]
		b.intakeWaiters[0] = nil
		b.intakeWaiters = b.intakeWaiters[1:]
		b.takeLocked(w.n, true)
		close(w.ready)
	}
}

// Account is one request's share of the budget: what it reserves is given back by Release or,
// all of it, by Close. Safe for concurrent use (a request's items reserve in parallel). A nil
// *Account reserves nothing and refuses nothing (accounting off).
type Account struct {
	b      *Budget
	mu     sync.Mutex
	held   int64         // all it holds
	intake int64         // of held: intake, until EndIntake
	waited time.Duration // in all its reservations: at most MaxWait
	closed bool
}

// Account opens an account for one request; a nil *Budget gives nil (accounting off).
func (b *Budget) Account() *Account {
	if b == nil {
		return nil
	}
	return &Account{b: b}
}

// Reserve takes n bytes for what (named in a refusal), waiting as Budget's options say. A
// refusal is an *Error, or ctx's error when it ended the wait.
func (a *Account) Reserve(ctx context.Context, n int64, what string) error {
	return a.reserve(ctx, n, what, false)
}

// ReserveIntake is Reserve for a body still arriving: held to the budget's IntakeCapacity and
// served after every other reservation, until EndIntake.
func (a *Account) ReserveIntake(ctx context.Context, n int64, what string) error {
	return a.reserve(ctx, n, what, true)
}

func (a *Account) reserve(ctx context.Context, n int64, what string, intake bool) error {
	if a == nil || n <= 0 {
		return nil
	}
	a.mu.Lock()
	closed, wait := a.closed, a.b.opts.MaxWait-a.waited
	a.mu.Unlock()
	if closed {
		return &Error{What: what, Reason: Closed, Need: n, Capacity: a.b.opts.Capacity}
	}
	start := time.Now()
	err := a.b.reserve(ctx, n, what, intake, wait)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.waited += time.Since(start) // a request waits MaxWait in all, not per step
	if err != nil {
		return err
	}
	if a.closed { // closed while we waited: the bytes go straight back
		a.b.release(n, intakeOf(n, intake))
		return &Error{What: what, Reason: Closed, Need: n, Capacity: a.b.opts.Capacity}
	}
	a.held += n
	a.intake += intakeOf(n, intake)
	return nil
}

func intakeOf(n int64, intake bool) int64 {
	if intake {
		return n
	}
	return 0
}

// EndIntake says the body is in: what the account reserved as intake stays reserved but no
// longer counts against IntakeCapacity (other bodies may arrive).
func (a *Account) EndIntake() {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.intake > 0 {
		a.b.release(0, a.intake)
		a.intake = 0
	}
}

// Fits refuses, as Reserve would, n bytes that can never fit the budget (nil when they
// could): a caller that knows a total up front learns it before reserving in steps.
func (a *Account) Fits(n int64, what string) error {
	if a == nil || n <= a.b.opts.Capacity {
		return nil
	}
	a.b.mu.Lock()
	defer a.b.mu.Unlock()
	return a.b.refuseLocked(TooLarge, n, what)
}

// Release gives back n of the bytes the account holds (no more than it holds; intake bytes
// last).
func (a *Account) Release(n int64) {
	if a == nil || n <= 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	n = min(n, a.held)
	in := max(0, n-(a.held-a.intake))
	a.held -= n
	a.intake -= in
	a.b.release(n, in)
}

// Held is what the account holds now.
func (a *Account) Held() int64 {
	if a == nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

// Close gives back everything the account holds; later reservations are refused.
func (a *Account) Close() {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	a.closed = true
	a.b.release(a.held, a.intake)
	a.held, a.intake = 0, 0
}
