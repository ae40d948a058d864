package mocker

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A virtual loop runs timed callbacks in time order (FIFO among equal times), jumps its clock
// to each, and returns when nothing is left.
func TestLoopVirtualOrder(t *testing.T) {
	l := NewLoop(Clock{Virtual: true})
	var got []string
	var at []time.Duration
	add := func(d time.Duration, name string) {
		l.At(d, func(now time.Duration) { got = append(got, name); at = append(at, now) })
	}
	add(3*time.Second, "c")
	add(time.Second, "a")
	add(time.Second, "b")
	l.At(2*time.Second, func(now time.Duration) {
		got = append(got, "mid")
		at = append(at, now)
		add(now, "same-time") // scheduled from a callback, runs next at the same time
	})
	require.NoError(t, l.Run(context.Background()))
	require.Equal(t, []string{"a", "b", "mid", "same-time", "c"}, got)
	require.Equal(t, []time.Duration{time.Second, time.Second, 2 * time.Second, 2 * time.Second, 3 * time.Second}, at)
}

// A real-time loop wakes for work handed in from another goroutine, and stops with ctx.
func TestLoopRealTimeDo(t *testing.T) {
	l := NewLoop(Clock{Speedup: 1000})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	fired := make(chan time.Duration, 1)
	l.Do(func(now time.Duration) {
		l.At(now+time.Second, func(now time.Duration) { fired <- now }) // 1 s of engine time: 1 ms of wall time
	})
	now := <-fired
	require.GreaterOrEqual(t, now, time.Second)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	n, _, _ := l.Lag()
	require.Positive(t, n)
}

// The timer heap pops entries by time, FIFO among equal times, however pushes and pops mix.
func TestTimerHeapOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var h timerHeap
	var seq uint64
	last := timerEntry{at: -1}
	popped := 0
	for range 5000 {
		if len(h) > 0 && rng.IntN(3) == 0 {
			e := h.pop()
			if popped > 0 {
				require.True(t, e.at > last.at || e.at == last.at && e.seq > last.seq, "%v after %v", e, last)
			}
			last = e
			popped++
			continue
		}
		seq++
		at := last.at + time.Duration(rng.IntN(8)) // never before what was popped
		h.push(timerEntry{at: max(at, 0), seq: seq})
	}
	for len(h) > 0 {
		e := h.pop()
		require.True(t, e.at > last.at || e.at == last.at && e.seq > last.seq, "%v after %v", e, last)
		last = e
	}
}
