package dataplane

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"dataplane/dataplane/worker"
)

// holdWorker answers a generation when release is closed, or fails it when fail is set; it
// counts the generations it saw end.
type holdWorker struct {
	release chan struct{}
	fail    bool
	ended   atomic.Int32
}

func (h *holdWorker) Name() string { return "hold" }
func (h *holdWorker) Close() error { return nil }
func (h *holdWorker) Generate(ctx context.Context, req *worker.Request) (<-chan worker.Event, error) {
	if h.fail {
		return nil, errors.New("refused")
	}
	out := make(chan worker.Event, 1)
	go func() {
		defer close(out)
		defer h.ended.Add(1)
		select {
		case <-h.release:
			out <- worker.Event{Done: true, Tokens: 1}
		case <-ctx.Done():
			out <- worker.Event{Done: true, Err: ctx.Err()}
		}
	}()
	return out, nil
}

// Warm-ups are bounded: past InFlight one is dropped ("busy"), a slot frees when one ends; a
// refusal or a timeout counts as failed; close ends those in flight and waits for them, and
// none starts after it.
func TestWarmupsBounded(t *testing.T) {
	w := newWarmups(WarmupOptions{MinTokens: 1, InFlight: 2, Timeout: time.Minute}, slog.New(slog.DiscardHandler))
	held := &holdWorker{release: make(chan struct{})}
	req := &worker.Request{ID: "r-warmup", TokenIDs: []int32{5, 6, 7}}
	require.Empty(t, w.send(held, req))
	require.Empty(t, w.send(held, req))
	require.Equal(t, "busy", w.send(held, req))
	close(held.release) // both answer; their slots free
	require.Eventually(t, func() bool { return w.send(held, req) == "" }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return len(w.sem) == 0 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 3.0, count(w.sent))
	require.Zero(t, count(w.failed))

	require.Empty(t, w.send(&holdWorker{fail: true}, req))
	require.Eventually(t, func() bool { return count(w.failed) == 1 }, 5*time.Second, time.Millisecond)

	short := newWarmups(WarmupOptions{MinTokens: 1, InFlight: 1, Timeout: 10 * time.Millisecond}, slog.New(slog.DiscardHandler))
	require.Empty(t, short.send(&holdWorker{release: make(chan struct{})}, req))
	require.Eventually(t, func() bool { return count(short.failed) == 1 }, 5*time.Second, time.Millisecond, "timed out")

	stuck := &holdWorker{release: make(chan struct{})}
	require.Empty(t, w.send(stuck, req))
	w.close()
	require.Equal(t, int32(1), stuck.ended.Load(), "close ended it and waited")
	require.Equal(t, "closing", w.send(stuck, req))
	require.Empty(t, w.sem)
}

func count(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
