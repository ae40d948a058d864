package features

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const kib = 1 << 10

// fakeClock is a settable clock for TTLs.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *fakeClock { return &fakeClock{now: time.Unix(1_800_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// newTestStore is a store of hostBlocks (and devBlocks) 4 KiB blocks that never waits.
func newTestStore(t testing.TB, hostBlocks, devBlocks int64, clock *fakeClock) *Store {
	t.Helper()
	o := Options{
		Host:    PoolOptions{Capacity: hostBlocks * 4 * kib, BlockBytes: 4 * kib, Allocator: &MmapAllocator{}},
		MaxWait: -1,
	}
	if devBlocks > 0 {
		o.Device = PoolOptions{Capacity: devBlocks * 4 * kib, BlockBytes: 4 * kib, Allocator: &MmapAllocator{}}
	}
	if clock != nil {
		o.Now = clock.Now
	}
	s, err := New(o)
	require.NoError(t, err)
	return s
}

// requireEmpty checks every byte is back and closes the store.
func requireEmpty(t testing.TB, s *Store) {
	t.Helper()
	st := s.Stats()
	pools := []PoolStats{st.Host}
	if st.Device != nil {
		pools = append(pools, *st.Device)
	}
	for i, p := range pools {
		require.Zero(t, p.Used+p.Reserved+p.Requested+p.Idle, "%s pool not empty: %+v", p.Name, p)
		require.Equal(t, p.Capacity, p.Free, "%s pool", p.Name)
		require.Equal(t, s.pools()[i].maxAlloc(), p.LargestFree, "%s pool: free blocks not merged back", p.Name)
	}
	for _, state := range AllStates {
		require.Zero(t, st.Records[state], "records %v", state)
	}
	require.NoError(t, s.Close())
}

func key(content string) Key {
	return Key{Salt: "tenant-a", Content: content, Model: "llava-1.5-7b", Preprocess: "336/crop"}
}

func item(content string, n int64) Item {
	return Item{Key: key(content), MediaID: content + ".png", Bytes: n}
}

// admitEncode admits an item that must miss, writes fill into its buffer and completes it.
func admitEncode(t testing.TB, r *Request, it Item, fill byte) *Record {
	t.Helper()
	rec, job, err := r.Admit(context.Background(), it)
	require.NoError(t, err)
	require.NotNil(t, job, "expected a miss for %q", it.Key.Content)
	b := job.Buffer().Bytes()
	require.Len(t, b, int(it.Bytes))
	for i := range b {
		b[i] = fill
	}
	require.NoError(t, job.Complete(it.Bytes))
	return rec
}

func TestLifecycleDiscardAfterPrefill(t *testing.T) {
	s := newTestStore(t, 64, 0, nil)
	r, err := s.Begin("req-1", Policy{})
	require.NoError(t, err)
	rec, job, err := r.Admit(context.Background(), item("cat", 10*kib+1))
	require.NoError(t, err)
	require.Equal(t, StateEncoding, rec.State())
	st := s.Stats()
	require.Equal(t, int64(12*kib), st.Host.Reserved, "10 KiB + 1 rounds up to three 4 KiB blocks")
	require.Equal(t, int64(10*kib+1), st.Host.Requested)
	require.Zero(t, st.Host.Used)
	_, err = rec.Host()
	require.ErrorIs(t, err, ErrIllegalTransition, "no read view while encoding")

	copy(job.Buffer().Bytes(), "features")
	require.NoError(t, job.Complete(5*kib)) // settles to the actual size: the tail goes back
	<-rec.Ready()
	require.Equal(t, StateEncodedHost, rec.State())
	st = s.Stats()
	require.Equal(t, int64(8*kib), st.Host.Used)
	require.Zero(t, st.Host.Reserved)
	v, err := rec.Host()
	require.NoError(t, err)
	require.Equal(t, int64(5*kib), v.Len())
	require.Equal(t, "features", string(v.Bytes()[:8]))
	require.Equal(t, []string{"req-1"}, rec.Requests())

	_, err = r.Stage(context.Background(), rec)
	require.ErrorIs(t, err, ErrNoDevice, "a CPU-only store skips staging")
	require.NoError(t, r.Merged())
	require.Equal(t, StateMerged, rec.State())
	require.NoError(t, r.Prefilled())
	require.Equal(t, StateDiscarded, rec.State())
	require.NoError(t, r.Done(), "Done after a discarding prefill does nothing")
	requireEmpty(t, s)
}

func TestReuseCacheKeysAndTTL(t *testing.T) {
	clock := newClock()
	s := newTestStore(t, 64, 0, clock)
	a, _ := s.Begin("turn-1", Policy{Kind: KeepForReuse, TTL: time.Minute})
	rec := admitEncode(t, a, item("cat", 8*kib), 7)
	require.NoError(t, a.Merged())
	require.NoError(t, a.Prefilled())
	require.Equal(t, StateCached, rec.State())
	require.Equal(t, int64(8*kib), s.Stats().Host.Idle)

	b, _ := s.Begin("turn-2", Policy{})
	got, job, err := b.Admit(context.Background(), item("cat", 8*kib))
	require.NoError(t, err)
	require.Nil(t, job, "a hit skips encoding")
	require.Same(t, rec, got)
	require.Equal(t, StateEncodedHost, rec.State())
	v, _ := rec.Host()
	require.Equal(t, byte(7), v.Bytes()[0])

	// Anything else in the key misses: another tenant's salt, model or preprocessing.
	for _, k := range []Key{
		{Salt: "tenant-b", Content: "cat", Model: "llava-1.5-7b", Preprocess: "336/crop"},
		{Salt: "tenant-a", Content: "cat", Model: "qwen2-vl-7b", Preprocess: "336/crop"},
		{Salt: "tenant-a", Content: "cat", Model: "llava-1.5-7b", Preprocess: "448/pad"},
	} {
		other, job, err := b.Admit(context.Background(), Item{Key: k, MediaID: "x", Bytes: 4 * kib})
		require.NoError(t, err)
		require.NotNil(t, job, "key %+v must not see the tenant-a entry", k)
		require.NotSame(t, rec, other)
		require.NoError(t, job.Complete(4*kib))
	}
	// b discards after prefill, but turn-1's TTL still runs: the entry stays cached.
	require.NoError(t, b.Merged())
	require.NoError(t, b.Prefilled())
	require.Equal(t, StateCached, rec.State())
	require.Equal(t, 1, s.Stats().Records[StateCached])

	clock.Advance(time.Minute)
	c, _ := s.Begin("turn-3", Policy{})
	_, job, err = c.Admit(context.Background(), item("cat", 8*kib))
	require.NoError(t, err)
	require.NotNil(t, job, "an expired entry is a miss")
	require.Equal(t, StateDiscarded, rec.State())
	require.Equal(t, uint64(1), s.Stats().Evictions[evictTTL])
	c.Cancel()
	require.ErrorIs(t, job.Complete(8*kib), ErrAbandoned)
	requireEmpty(t, s)
}

func TestSharedWhileEncoding(t *testing.T) {
	s := newTestStore(t, 64, 0, nil)
	a, _ := s.Begin("a", Policy{})
	b, _ := s.Begin("b", Policy{})
	rec, job, err := a.Admit(context.Background(), item("video", 40*kib))
	require.NoError(t, err)
	shared, noJob, err := b.Admit(context.Background(), item("video", 40*kib))
	require.NoError(t, err)
	require.Nil(t, noJob)
	require.Same(t, rec, shared)
	require.Equal(t, 2, rec.Refs())
	require.ElementsMatch(t, []string{"a", "b"}, rec.Requests())
	require.Equal(t, int64(40*kib), s.Stats().Host.Reserved, "one reservation for both")

	err = b.Merged()
	require.ErrorIs(t, err, ErrIllegalTransition, "cannot merge while encoding")
	var te *TransitionError
	require.ErrorAs(t, err, &te)
	require.Equal(t, StateEncoding, te.From)
	select {
	case <-rec.Ready():
		t.Fatal("ready before Complete")
	default:
	}
	require.NoError(t, job.Complete(40*kib))
	<-rec.Ready()
	require.NoError(t, b.Merged())
	require.NoError(t, b.Prefilled())
	require.Equal(t, StatePrefilled, rec.State(), "b's progress shows while a still holds it")
	require.Equal(t, 1, rec.Refs())
	a.Cancel()
	require.Equal(t, StateDiscarded, rec.State())
	requireEmpty(t, s)
}

func TestIllegalTransitionsChangeNothing(t *testing.T) {
	s := newTestStore(t, 64, 16, nil)
	r, _ := s.Begin("r", Policy{})
	rec, job, err := r.Admit(context.Background(), item("cat", 8*kib))
	require.NoError(t, err)
	before := s.Stats()
	f := func(kind error, call func() error) {
		t.Helper()
		require.ErrorIs(t, call(), kind)
		require.Equal(t, before, s.Stats(), "a refused step changed the store")
	}
	f(ErrIllegalTransition, func() error { _, err := r.Stage(context.Background(), rec); return err })
	f(ErrIllegalTransition, r.Merged)
	f(ErrIllegalTransition, r.Prefilled)
	f(ErrIllegalTransition, r.Done)
	f(ErrOverEstimate, func() error { return job.Complete(8*kib + 1) })
	f(ErrInvalid, func() error { return job.Complete(0) })
	f(ErrInvalid, func() error {
		_, _, err := r.Admit(context.Background(), Item{Key: Key{Content: "x"}, Bytes: 1})
		return err
	})
	f(ErrInvalid, func() error { _, _, err := r.Admit(context.Background(), item("dog", 0)); return err })
	f(ErrInvalid, func() error { _, err := s.Begin("x", Policy{Kind: KeepForReuse}); return err })
	other, _ := s.Begin("other", Policy{})
	f(ErrNotHeld, func() error { _, err := other.Stage(context.Background(), rec); return err })

	require.NoError(t, job.Complete(8*kib))
	before = s.Stats()
	f(ErrIllegalTransition, func() error { return job.Complete(8 * kib) })
	f(ErrIllegalTransition, func() error { return job.Fail(errors.New("late")) })
	dev, err := r.Stage(context.Background(), rec)
	require.NoError(t, err)
	require.Equal(t, int64(8*kib), dev.Len())
	require.Equal(t, StateStagedDevice, rec.State())
	before = s.Stats()
	f(ErrIllegalTransition, func() error { _, err := r.Stage(context.Background(), rec); return err })
	require.NoError(t, r.Merged())
	before = s.Stats()
	f(ErrIllegalTransition, r.Merged)
	f(ErrIllegalTransition, func() error { _, _, err := r.Admit(context.Background(), item("dog", 1)); return err })
	f(ErrIllegalTransition, func() error { _, err := r.AllocMerged(context.Background(), false, 1); return err })
	require.NoError(t, r.Prefilled())
	requireEmpty(t, s)
}

// Encoding fails after the reservation: the bytes go back, holders see the failure, and the
// next admission of the key encodes afresh.
func TestFaultEncodeFails(t *testing.T) {
	s := newTestStore(t, 64, 0, nil)
	a, _ := s.Begin("a", Policy{})
	b, _ := s.Begin("b", Policy{})
	rec, job, _ := a.Admit(context.Background(), item("bad", 16*kib))
	_, _, _ = b.Admit(context.Background(), item("bad", 16*kib))
	cause := errors.New("CUDA out of memory")
	require.NoError(t, job.Fail(cause))
	<-rec.Ready()
	require.Equal(t, StateDiscarded, rec.State())
	require.Zero(t, s.Stats().Host.Reserved)
	for _, r := range []*Request{a, b} {
		err := r.Merged()
		require.ErrorIs(t, err, ErrEncodeFailed)
		require.ErrorIs(t, err, cause)
	}
	c, _ := s.Begin("c", Policy{})
	_, job2, err := c.Admit(context.Background(), item("bad", 16*kib))
	require.NoError(t, err)
	require.NotNil(t, job2, "a failed key is forgotten")
	a.Cancel()
	b.Cancel()
	c.Cancel()
	require.ErrorIs(t, job2.Complete(16*kib), ErrAbandoned)
	requireEmpty(t, s)
}

// A request cancelled in each state frees everything it alone holds.
func TestFaultCancelInEachState(t *testing.T) {
	f := func(name string, policy Policy, advance func(t *testing.T, r *Request, rec *Record, job *Job)) {
		t.Run(name, func(t *testing.T) {
			s := newTestStore(t, 64, 16, nil)
			r, _ := s.Begin(name, policy)
			rec, job, err := r.Admit(context.Background(), item("x", 12*kib))
			require.NoError(t, err)
			advance(t, r, rec, job)
			r.Cancel()
			r.Cancel() // idempotent
			if rec.State() == StateEncoding {
				select {
				case <-job.Context().Done():
				default:
					t.Fatal("the encoder was not told")
				}
				require.Equal(t, int64(12*kib), s.Stats().Host.Reserved, "the encoder still owns its buffer")
				require.ErrorIs(t, job.Complete(12*kib), ErrAbandoned)
			}
			require.Equal(t, StateDiscarded, rec.State())
			requireEmpty(t, s)
		})
	}
	complete := func(t *testing.T, job *Job) { require.NoError(t, job.Complete(12*kib)) }
	f("encoding", Policy{}, func(*testing.T, *Request, *Record, *Job) {})
	f("encoded", Policy{}, func(t *testing.T, _ *Request, _ *Record, job *Job) { complete(t, job) })
	f("staged", Policy{}, func(t *testing.T, r *Request, rec *Record, job *Job) {
		complete(t, job)
		_, err := r.Stage(context.Background(), rec)
		require.NoError(t, err)
		require.Equal(t, int64(12*kib), r.s.Stats().Device.Used)
	})
	f("merged", Policy{}, func(t *testing.T, r *Request, rec *Record, job *Job) {
		complete(t, job)
		_, err := r.AllocMerged(context.Background(), false, 20*kib)
		require.NoError(t, err)
		require.NoError(t, r.Merged())
	})
	f("prefilled-until-done", Policy{Kind: KeepUntilDone}, func(t *testing.T, r *Request, rec *Record, job *Job) {
		complete(t, job)
		require.NoError(t, r.Merged())
		require.NoError(t, r.Prefilled())
		require.Equal(t, StatePrefilled, rec.State())
	})
	// A keep policy does not survive a cancel: the disconnect frees what it alone held.
	f("merged-keep", Policy{Kind: KeepForReuse, TTL: time.Hour}, func(t *testing.T, r *Request, _ *Record, job *Job) {
		complete(t, job)
		require.NoError(t, r.Merged())
	})
}

// A cached entry evicted while another request is about to reuse it: once reused, its refcount
// protects it from eviction; evicted first, the reuse is a clean miss.
func TestFaultEvictVersusReuse(t *testing.T) {
	clock := newClock()
	s := newTestStore(t, 16, 0, clock) // 64 KiB
	keep := Policy{Kind: KeepForReuse, TTL: time.Hour}
	a, _ := s.Begin("a", keep)
	cat := admitEncode(t, a, item("cat", 32*kib), 1)
	dog := admitEncode(t, a, item("dog", 32*kib), 2)
	require.NoError(t, a.Merged())
	require.NoError(t, a.Prefilled())
	require.Equal(t, int64(64*kib), s.Stats().Host.Idle)

	b, _ := s.Begin("b", Policy{})
	got, job, err := b.Admit(context.Background(), item("cat", 32*kib)) // refcount 1 again
	require.NoError(t, err)
	require.Nil(t, job)
	require.Same(t, cat, got)

	// c needs 64 KiB: dog is evictable, cat is in use by b: refused, and nothing evicted,
	// since evicting dog alone could not make room.
	c, _ := s.Begin("c", Policy{})
	_, _, err = c.Admit(context.Background(), item("elephant", 64*kib))
	var be *BudgetError
	require.ErrorAs(t, err, &be)
	require.Equal(t, RejectTimeout, be.Reason)
	require.Equal(t, StateCached, dog.State())
	// 32 KiB fits once dog goes.
	_, job, err = c.Admit(context.Background(), item("mouse", 32*kib))
	require.NoError(t, err)
	require.Equal(t, StateDiscarded, dog.State())
	require.Equal(t, StateEncodedHost, cat.State())
	v, _ := cat.Host()
	require.Equal(t, byte(1), v.Bytes()[32*kib-1], "the reused entry's bytes are intact")
	require.Equal(t, uint64(1), s.Stats().Evictions[evictLRU])

	// Evicted before the reuse: the reuse misses and encodes again.
	d, _ := s.Begin("d", Policy{})
	_, job2, err := d.Admit(context.Background(), item("dog", 32*kib))
	require.ErrorIs(t, err, ErrBudget, "pool full of in-use records")
	require.Nil(t, job2)
	require.NoError(t, job.Complete(32*kib))
	c.Cancel()
	_, job2, err = d.Admit(context.Background(), item("dog", 32*kib))
	require.NoError(t, err)
	require.NotNil(t, job2, "dog was evicted: a miss")
	require.NoError(t, job2.Complete(32*kib))
	b.Cancel()
	d.Cancel()
	require.Equal(t, StateCached, cat.State(), "a's TTL still runs after b let go")
	clock.Advance(time.Hour)
	require.Equal(t, 1, s.Sweep())
	requireEmpty(t, s)
}

func TestBudgetRefusals(t *testing.T) {
	o := Options{
		Host:       PoolOptions{Capacity: 64 * kib, BlockBytes: 4 * kib, Allocator: &MmapAllocator{}},
		MaxWait:    20 * time.Millisecond,
		MaxWaiters: 1,
		RetryAfter: 3 * time.Second,
	}
	s, err := New(o)
	require.NoError(t, err)
	hog, _ := s.Begin("hog", Policy{})
	admitEncode(t, hog, item("big", 64*kib), 0)

	r, _ := s.Begin("r", Policy{})
	_, _, err = r.Admit(context.Background(), item("huge", 64*kib+1))
	var be *BudgetError
	require.ErrorAs(t, err, &be)
	require.Equal(t, RejectTooLarge, be.Reason)
	require.Zero(t, be.RetryAfter)

	// One waiter fills the queue; a second is refused at once (the API answers 429).
	waited := make(chan error, 1)
	go func() {
		_, _, err := r.Admit(context.Background(), item("a", 4*kib))
		waited <- err
	}()
	require.Eventually(t, func() bool { return s.Stats().Host.Waiting == 1 }, 5*time.Second, time.Millisecond)
	r2, _ := s.Begin("r2", Policy{})
	_, _, err = r2.Admit(context.Background(), item("b", 4*kib))
	require.ErrorAs(t, err, &be)
	require.Equal(t, RejectQueueFull, be.Reason)
	require.Equal(t, 3*time.Second, be.RetryAfter)

	err = <-waited // nothing freed within MaxWait (the API answers 503)
	require.ErrorAs(t, err, &be)
	require.Equal(t, RejectTimeout, be.Reason)
	st := s.Stats().Host
	require.Equal(t, [numRejections]uint64{1, 1, 1}, st.Rejections)
	require.Equal(t, uint64(1), st.Waits)
	require.Zero(t, st.Waiting)
	hog.Cancel()
	r.Cancel()
	requireEmpty(t, s)
}

// newWaitingStore is a store of hostBlocks 4 KiB blocks of host memory whose admissions wait
// up to a minute for memory.
func newWaitingStore(t testing.TB, hostBlocks int64) *Store {
	t.Helper()
	s, err := New(Options{Host: PoolOptions{Capacity: hostBlocks * 4 * kib, BlockBytes: 4 * kib, Allocator: &MmapAllocator{}}, MaxWait: time.Minute})
	require.NoError(t, err)
	return s
}

// A waiting admission proceeds when memory comes free, first come first served: a small
// request arriving later does not pass a large one waiting ahead.
func TestBudgetWaitFIFO(t *testing.T) {
	s := newWaitingStore(t, 16)
	hog, _ := s.Begin("hog", Policy{})
	admitEncode(t, hog, item("h1", 32*kib), 0)
	admitEncode(t, hog, item("h3", 16*kib), 0)
	hog2, _ := s.Begin("hog2", Policy{})
	admitEncode(t, hog2, item("h2", 16*kib), 0)

	order := make(chan string, 2)
	big, _ := s.Begin("big", Policy{})
	small, _ := s.Begin("small", Policy{})
	go func() {
		_, job, err := big.Admit(context.Background(), item("big", 48*kib))
		if err == nil {
			err = job.Complete(48 * kib)
		}
		order <- "big " + errString(err)
	}()
	require.Eventually(t, func() bool { return s.Stats().Host.Waiting == 1 }, 5*time.Second, time.Millisecond)
	go func() {
		_, job, err := small.Admit(context.Background(), item("small", 16*kib))
		if err == nil {
			err = job.Complete(16 * kib)
		}
		order <- "small " + errString(err)
	}()
	require.Eventually(t, func() bool { return s.Stats().Host.Waiting == 2 }, 5*time.Second, time.Millisecond)
	// 16 KiB free: enough for small, but big is ahead of it and nobody passes the head of the
	// queue, not small and not a newcomer.
	hog2.Cancel()
	newcomer, _ := s.Begin("newcomer", Policy{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, _, err := newcomer.Admit(ctx, item("newcomer", 4*kib))
	cancel()
	require.ErrorIs(t, err, ErrBudget) // its deadline passed in the queue
	newcomer.Cancel()
	require.Equal(t, 2, s.Stats().Host.Waiting)
	require.Empty(t, order, "small passed big")
	hog.Cancel() // 64 KiB free: big, then small beside it
	got := []string{<-order, <-order}
	require.ElementsMatch(t, []string{"big ok", "small ok"}, got)

	// A waiter whose client disconnects leaves the queue with the context's error.
	ctx, cancel = context.WithCancel(context.Background())
	late, _ := s.Begin("late", Policy{})
	done := make(chan error, 1)
	go func() { _, _, err := late.Admit(ctx, item("late", 4*kib)); done <- err }()
	require.Eventually(t, func() bool { return s.Stats().Host.Waiting == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Zero(t, s.Stats().Host.Waiting)
	big.Cancel()
	small.Cancel()
	requireEmpty(t, s)
}

// expiredCtx is a context whose deadline has passed but which does not report it through
// Deadline, so a waiter can only see it through Done: the branch the timer races with.
type expiredCtx struct{ context.Context }

func (expiredCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (expiredCtx) Err() error                  { return context.DeadlineExceeded }
func (expiredCtx) Done() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// A deadline that passes while waiting is the budget's timeout (503, Retry-After), however
// the wait learns of it; only a cancelled client gets the context's own error.
func TestBudgetWaitDeadlineIsTimeout(t *testing.T) {
	s := newWaitingStore(t, 2)
	hog, _ := s.Begin("hog", Policy{})
	admitEncode(t, hog, item("h", 8*kib), 0)

	r, _ := s.Begin("r", Policy{})
	_, _, err := r.Admit(expiredCtx{context.Background()}, item("r", 4*kib))
	var be *BudgetError
	require.ErrorAs(t, err, &be)
	require.Equal(t, RejectTimeout, be.Reason)
	require.Equal(t, uint64(1), s.Stats().Host.Rejections[RejectTimeout])
	require.Zero(t, s.Stats().Host.Waiting)
	r.Cancel()
	hog.Cancel()
	requireEmpty(t, s)
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

func TestCloseRefusesWhileInUse(t *testing.T) {
	s := newTestStore(t, 16, 0, nil)
	r, _ := s.Begin("r", Policy{Kind: KeepForReuse, TTL: time.Hour})
	admitEncode(t, r, item("x", 4*kib), 0)
	require.ErrorIs(t, s.Close(), ErrInUse)
	require.NoError(t, r.Merged())
	require.NoError(t, r.Prefilled()) // cached: Close evicts it
	require.NoError(t, s.Close())
	require.Equal(t, uint64(1), s.Stats().Evictions[evictClose])
	_, err := s.Begin("after", Policy{})
	require.ErrorIs(t, err, ErrClosed)
}

// A request drops a failed item and goes on with the rest; dropping frees what it alone held.
func TestDropAnItem(t *testing.T) {
	s := newTestStore(t, 64, 0, nil)
	r, _ := s.Begin("r", Policy{})
	bad, badJob, _ := r.Admit(context.Background(), item("bad", 16*kib))
	good, goodJob, _ := r.Admit(context.Background(), item("good", 16*kib))
	require.NoError(t, badJob.Fail(errors.New("out of memory")))
	require.NoError(t, goodJob.Complete(16*kib))
	require.ErrorIs(t, r.Merged(), ErrEncodeFailed, "the failed item blocks the merge")
	require.NoError(t, r.Drop(bad))
	require.ErrorIs(t, r.Drop(bad), ErrIllegalTransition, "dropped already")
	require.Equal(t, []*Record{good}, r.Records())

	// Dropping an item still being encoded orphans it: freed when its encoder ends.
	late, lateJob, _ := r.Admit(context.Background(), item("late", 16*kib))
	require.NoError(t, r.Drop(late))
	require.NoError(t, r.Merged())
	require.ErrorIs(t, r.Drop(good), ErrIllegalTransition, "not after the merge")
	require.NoError(t, r.Prefilled())
	require.ErrorIs(t, lateJob.Complete(16*kib), ErrAbandoned)
	requireEmpty(t, s)
}

// OnForget follows the cache policy: a kept entry's key stays until its TTL passes, a
// discarded one goes at prefill, and one orphaned while encoding goes when its last holder
// leaves. (TestModel checks it after every step of random sequences.)
func TestOnForgetFollowsPolicy(t *testing.T) {
	clock := newClock()
	s := newTestStore(t, 64, 0, clock)
	var forgot []string
	s.opts.OnForget = func(k Key) { forgot = append(forgot, k.Content) }

	kept, _ := s.Begin("kept", Policy{Kind: KeepForReuse, TTL: time.Minute})
	admitEncode(t, kept, item("cat", 4*kib), 1)
	require.NoError(t, kept.Merged())
	require.NoError(t, kept.Prefilled())
	gone, _ := s.Begin("gone", Policy{})
	admitEncode(t, gone, item("dog", 4*kib), 2)
	require.NoError(t, gone.Merged())
	require.NoError(t, gone.Prefilled())
	require.Equal(t, []string{"dog"}, forgot, "discarded after prefill; the kept one stays")

	left, _ := s.Begin("left", Policy{})
	_, job, err := left.Admit(context.Background(), item("owl", 4*kib))
	require.NoError(t, err)
	left.Cancel()
	require.Equal(t, []string{"dog", "owl"}, forgot, "orphaned while encoding: its key is free again")
	require.ErrorIs(t, job.Complete(4*kib), ErrAbandoned)

	clock.Advance(time.Minute)
	require.Equal(t, 1, s.Sweep())
	require.Equal(t, []string{"dog", "owl", "cat"}, forgot, "the kept one at its TTL")
	requireEmpty(t, s)
}
