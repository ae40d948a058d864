package mocker

import (
	"context"
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
