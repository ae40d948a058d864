package dataplane

import (
	"context"
	"errors"
	"testing"
	"time"
)

// An item whose predicted wait for a CPU slot, plus its own hold, passes its deadline is
// refused at once; one that fits waits for the slot.
func TestCPUSlotsShedWhatWouldMissItsDeadline(t *testing.T) {
	c := newCPUSlots(1)
	release, err := c.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	release() // the first hold: the estimate is now about 50 ms
	if c.hold < 50*time.Millisecond {
		t.Fatalf("hold %v after a 50 ms hold", c.hold)
	}
	held, _ := c.acquire(context.Background())

	tight, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond) // < wait + hold
	defer cancel()
	start := time.Now()
	_, err = c.acquire(tight)
	var busy *busyError
	if !errors.As(err, &busy) {
		t.Fatalf("got %v, want a busyError", err)
	}
	if took := time.Since(start); took > 20*time.Millisecond {
		t.Errorf("refused after %v; want at once", took)
	}

	roomy, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	time.AfterFunc(30*time.Millisecond, held)
	rel, err := c.acquire(roomy)
	if err != nil {
		t.Fatalf("with time to wait: %v", err)
	}
	rel()
	if n := c.waiting.Load(); n != 0 || len(c.sem) != 0 {
		t.Errorf("waiting %d, held %d after all released", n, len(c.sem))
	}
}

// Without a deadline, or before any hold was measured, nothing is shed.
func TestCPUSlotsWaitWithoutEstimate(t *testing.T) {
	c := newCPUSlots(1)
	held, _ := c.acquire(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	time.AfterFunc(20*time.Millisecond, held)
	rel, err := c.acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rel()
}
