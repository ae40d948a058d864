package memory

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func newBudget(t *testing.T, o Options) *Budget {
	t.Helper()
	b, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func reason(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return 0
}

func TestReserveRefusesWhatCanNeverFit(t *testing.T) {
	b := newBudget(t, Options{Capacity: 100})
	a := b.Account()
	err := a.Reserve(context.Background(), 101, "request body")
	var e *Error
	if !errors.As(err, &e) || e.Reason != TooLarge || e.RetryAfter != 0 || !errors.Is(err, ErrBudget) {
		t.Fatalf("got %v, want TooLarge without Retry-After", err)
	}
	if got := e.Error(); got != "request body: 101 bytes can never fit the server's memory budget of 100 bytes (--memory-bytes)" {
		t.Errorf("message %q", got)
	}
}

func TestReserveWaitsThenRefusesWithRetryAfter(t *testing.T) {
	b := newBudget(t, Options{Capacity: 100, MaxWait: 30 * time.Millisecond, RetryAfter: 3 * time.Second})
	a := b.Account()
	if err := a.Reserve(context.Background(), 80, ""); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := b.Account().Reserve(context.Background(), 30, "")
	var e *Error
	if !errors.As(err, &e) || e.Reason != Full || e.RetryAfter != 3*time.Second || e.Free != 20 {
		t.Fatalf("got %+v", err)
	}
	if waited := time.Since(start); waited < 30*time.Millisecond {
		t.Errorf("refused after %v, before MaxWait", waited)
	}
	a.Close()
	if s := b.Stats(); s.Used != 0 || s.Peak != 80 || s.Refused[Full] != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestWaitersAreServedInOrderAsBytesComeBack(t *testing.T) {
	b := newBudget(t, Options{Capacity: 100, MaxWait: 5 * time.Second})
	hold := b.Account()
	if err := hold.Reserve(context.Background(), 100, ""); err != nil {
		t.Fatal(err)
	}
	accounts := make([]*Account, 3)
	granted := make(chan int, 3)
	for i, n := range []int64{60, 50, 10} {
		accounts[i] = b.Account()
		go func() {
			if err := accounts[i].Reserve(context.Background(), n, ""); err != nil {
				t.Error(err)
			}
			granted <- i
		}()
		for b.Stats().Waiting != i+1 { // queue them in this order
			time.Sleep(time.Millisecond)
		}
	}
	hold.Close()
	if i := <-granted; i != 0 {
		t.Fatalf("reservation %d served first, want the head (60 bytes)", i)
	}
	// 50 does not fit beside 60, and 10, which would, must not jump the queue ahead of it.
	time.Sleep(20 * time.Millisecond)
	if s := b.Stats(); s.Waiting != 2 || s.Used != 60 {
		t.Fatalf("with 60 held: %+v, want 50 and 10 still waiting", s)
	}
	accounts[0].Close()
	<-granted
	<-granted
	accounts[1].Close()
	accounts[2].Close()
	if s := b.Stats(); s.Used != 0 || s.Waiting != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestQueueIsBounded(t *testing.T) {
	b := newBudget(t, Options{Capacity: 10, MaxWait: time.Second, MaxWaiters: 1})
	hold := b.Account()
	hold.Reserve(context.Background(), 10, "")          //nolint:errcheck
	go b.Account().Reserve(context.Background(), 5, "") //nolint:errcheck
	for b.Stats().Waiting != 1 {
		time.Sleep(time.Millisecond)
	}
	if r := reason(b.Account().Reserve(context.Background(), 5, "")); r != QueueFull {
		t.Fatalf("reason %v, want QueueFull", r)
	}
	hold.Close()
}

func TestContextEndsTheWait(t *testing.T) {
	b := newBudget(t, Options{Capacity: 10, MaxWait: time.Minute})
	hold := b.Account()
	hold.Reserve(context.Background(), 10, "") //nolint:errcheck
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := b.Account().Reserve(ctx, 5, ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	hold.Close()
	if s := b.Stats(); s.Used != 0 || s.Waiting != 0 {
		t.Errorf("stats %+v", s)
	}
}

// A waiter at the head that gives up must not leave smaller ones behind it waiting.
func TestGivingUpHeadServesTheRest(t *testing.T) {
	b := newBudget(t, Options{Capacity: 10, MaxWait: time.Minute})
	hold := b.Account()
	hold.Reserve(context.Background(), 6, "") //nolint:errcheck
	ctx, cancel := context.WithCancel(context.Background())
	headDone := make(chan error, 1)
	go func() { headDone <- b.Account().Reserve(ctx, 8, "") }()
	for b.Stats().Waiting != 1 {
		time.Sleep(time.Millisecond)
	}
	small := make(chan error, 1)
	go func() { small <- b.Account().Reserve(context.Background(), 4, "") }()
	for b.Stats().Waiting != 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-headDone
	select {
	case err := <-small:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the small reservation still waits behind a head that left")
	}
}

func TestAccountCloseGivesEverythingBack(t *testing.T) {
	b := newBudget(t, Options{Capacity: 1000})
	a := b.Account()
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() { defer wg.Done(); a.Reserve(context.Background(), 10, "") }() //nolint:errcheck
	}
	wg.Wait()
	a.Release(100)
	if a.Held() != 400 || b.Stats().Used != 400 {
		t.Fatalf("held %d used %d", a.Held(), b.Stats().Used)
	}
	a.Close()
	a.Close()
	if b.Stats().Used != 0 {
		t.Fatalf("used %d after close", b.Stats().Used)
	}
	if r := reason(a.Reserve(context.Background(), 1, "")); r != Closed {
		t.Fatalf("reserve after close: %v", r)
	}
	var none *Account
	if none.Reserve(context.Background(), 1<<40, "") != nil || none.Held() != 0 {
		t.Fatal("a nil account accounts")
	}
	none.Release(1)
	none.Close()
}

func TestLimitReadsCgroupsThenMeminfo(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755) //nolint:errcheck
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	meminfo := write("meminfo", "MemTotal:       24576000 kB\nMemFree: 1 kB\n")
	f := func(self string, want int64) {
		t.Helper()
		got, _, err := limitFrom(filepath.Join(dir, "cg"), write("self", self), meminfo)
		if err != nil || got != want {
			t.Errorf("cgroup %q: %d, %v; want %d", self, got, err, want)
		}
	}
	write("cg/a/memory.max", "1073741824\n")
	write("cg/memory/b/memory.limit_in_bytes", "2147483648\n")
	write("cg/memory/c/memory.limit_in_bytes", "9223372036854771712\n")
	write("cg/d/memory.max", "max\n")
	f("0::/a\n", 1<<30)                          // v2
	f("4:memory:/b\n0::/\n", 2<<30)              // v1
	f("4:memory:/c\n", 24576000<<10)             // v1, no limit
	f("0::/d\n", 24576000<<10)                   // v2, no limit
	f("0::/a\n", 1<<30)                          // below physical memory
	write("cg/e/memory.max", "99999999999999\n") // above physical memory
	f("0::/e\n", 24576000<<10)
	if _, _, err := limitFrom(dir, "/nonexistent", filepath.Join(dir, "self")); err == nil {
		t.Error("a meminfo without MemTotal gave a limit")
	}
}

// Bodies still arriving hold at most IntakeCapacity; the rest stays for requests whose bodies
// are in, which never wait for intake room.
func TestIntakeIsHeldToItsShare(t *testing.T) {
	b := newBudget(t, Options{Capacity: 100, IntakeCapacity: 40, MaxWait: 20 * time.Millisecond})
	bodies := b.Account()
	if err := bodies.ReserveIntake(context.Background(), 40, "request body"); err != nil {
		t.Fatal(err)
	}
	if r := reason(b.Account().ReserveIntake(context.Background(), 1, "request body")); r != Full {
		t.Fatalf("intake past its share: reason %v, want Full", r)
	}
	work := b.Account()
	if err := work.Reserve(context.Background(), 60, "picture"); err != nil {
		t.Fatalf("work beside full intake: %v", err)
	}
	if r := reason(b.Account().ReserveIntake(context.Background(), 41, "")); r != TooLarge {
		t.Errorf("intake over IntakeCapacity: reason %v, want TooLarge", r)
	}
	bodies.EndIntake() // the body is in: its bytes stay, its intake room is free
	if s := b.Stats(); s.Used != 100 || s.Intake != 0 {
		t.Fatalf("after EndIntake: %+v", s)
	}
	work.Close()
	if err := b.Account().ReserveIntake(context.Background(), 40, ""); err != nil {
		t.Fatalf("intake after EndIntake: %v", err)
	}
	bodies.Close()
	if s := b.Stats(); s.Used != 40 || s.Intake != 40 {
		t.Errorf("stats %+v", s)
	}
}

// A request already being worked on is served before a body still arriving, even one that
// queued first: half-read bodies cannot starve the requests ahead of them.
func TestWorkIsServedBeforeIntake(t *testing.T) {
	b := newBudget(t, Options{Capacity: 100, MaxWait: 5 * time.Second})
	hold := b.Account()
	if err := hold.Reserve(context.Background(), 100, ""); err != nil {
		t.Fatal(err)
	}
	granted := make(chan string, 2)
	intake, work := b.Account(), b.Account()
	go func() {
		if err := intake.ReserveIntake(context.Background(), 10, ""); err != nil {
			t.Error(err)
		}
		granted <- "intake"
	}()
	for b.Stats().Waiting != 1 {
		time.Sleep(time.Millisecond)
	}
	go func() {
		if err := work.Reserve(context.Background(), 30, ""); err != nil {
			t.Error(err)
		}
		granted <- "work"
	}()
	for b.Stats().Waiting != 2 {
		time.Sleep(time.Millisecond)
	}
	hold.Release(35) // room for one of them: FIFO across both would grant the intake (10), then 25 < 30
	if first := <-granted; first != "work" {
		t.Fatalf("%s served first, want work", first)
	}
	hold.Close()
	if second := <-granted; second != "intake" {
		t.Fatalf("then %s", second)
	}
	work.Close()
	intake.Release(4) // intake bytes are given back too
	if s := b.Stats(); s.Used != 6 || s.Intake != 6 {
		t.Errorf("stats %+v", s)
	}
	intake.Close()
	if s := b.Stats(); s.Used != 0 || s.Intake != 0 || s.Waiting != 0 {
		t.Errorf("stats %+v", s)
	}
}

// MaxWait bounds an account's waits in all: a body reserved in many steps waits MaxWait once,
// not once per step.
func TestAccountWaitsMaxWaitInAll(t *testing.T) {
	b := newBudget(t, Options{Capacity: 100, MaxWait: 60 * time.Millisecond})
	hold := b.Account()
	if err := hold.Reserve(context.Background(), 100, ""); err != nil {
		t.Fatal(err)
	}
	a := b.Account()
	time.AfterFunc(40*time.Millisecond, func() { hold.Release(10) })
	if err := a.Reserve(context.Background(), 10, "step 1"); err != nil {
		t.Fatalf("step 1: %v", err)
	}
	start := time.Now()
	err := a.Reserve(context.Background(), 10, "step 2")
	if r := reason(err); r != Full {
		t.Fatalf("step 2: %v, want Full", err)
	}
	if waited := time.Since(start); waited > 45*time.Millisecond {
		t.Errorf("step 2 waited %v; the account had at most 20 ms of its 60 left", waited)
	}
	if r := reason(a.Reserve(context.Background(), 10, "step 3")); r != Full {
		t.Errorf("step 3: reason %v, want Full at once", r)
	}
	hold.Close()
	a.Close()
}
