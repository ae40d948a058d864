package kvevents

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/router"
	"dataplane/router/internal/testrand"
)

// A feed registers workers with its router and gives each an engine on the worker's index slot;
// removing one drops both. Media that map past the index's tiers are refused.
func TestFeedWorkers(t *testing.T) {
	r, err := router.New(router.DefaultOptions())
	require.NoError(t, err)
	bad := DefaultOptions()
	bad.Media = map[string]int{"GPU": 0, "CPU": 1}
	_, err = NewFeed(r, bad)
	require.ErrorContains(t, err, `medium "CPU" maps to tier 1, the index has 1 tiers`)

	f, err := NewFeed(r, DefaultOptions())
	require.NoError(t, err)
	a, err := f.AddWorker("a")
	require.NoError(t, err)
	b, err := f.AddWorker("b")
	require.NoError(t, err)
	_, err = f.AddWorker("a")
	require.Error(t, err, "a name is registered once")
	require.Equal(t, []string{"a", "b"}, r.Workers())
	require.NotEqual(t, a.Worker(), b.Worker())
	require.Same(t, a, f.Engine("a"))
	require.Nil(t, f.Engine("c"))

	// What b's engine applies is what the router sees for b.
	c := newConvo(testrand.New(t), 2)
	b.Live(0, batchOf(false, func(e *msgpackEncoder) { c.stored(e, 0, 2, false) }, 1), nil)
	var d router.Decision
	require.NoError(t, r.Decide(router.Request{Tokens: c.tokens}, &d))
	require.Equal(t, 2, d.Score("b").Overlap)
	require.Equal(t, int64(1), f.Stats().Batches.Load())

	require.NoError(t, f.RemoveWorker("b"))
	require.Nil(t, f.Engine("b"))
	require.Equal(t, []string{"a"}, r.Workers())
	require.Zero(t, r.Index().Blocks(), "b's entries went with it")
	var unknown *router.ErrUnknownWorker
	require.True(t, errors.As(f.RemoveWorker("b"), &unknown))
}

// Forget drops a worker's entries while another goroutine feeds its engine (the daemon's health
// prober against a KV-event subscriber; run under -race), and the engine replays them from 0
// at its next batch.
func TestFeedForgetWhileFed(t *testing.T) {
	const per, batches = 4, 200
	r, err := router.New(router.DefaultOptions())
	require.NoError(t, err)
	f, err := NewFeed(r, DefaultOptions())
	require.NoError(t, err)
	eng, err := f.AddWorker("w")
	require.NoError(t, err)
	// One conversation growing by per blocks a batch, every batch kept for replay as vLLM's
	// publisher keeps them.
	c := newConvo(testrand.New(t), per*(batches+1))
	payloads := make([][]byte, batches+1)
	for k := range payloads {
		payloads[k] = batchOf(false, func(e *msgpackEncoder) { c.stored(e, k*per, (k+1)*per, false) }, 1)
	}
	replays := 0
	replay := func(from uint64, deliver func(uint64, []byte)) error {
		replays++
		for seq := from; seq < uint64(len(payloads)); seq++ {
			deliver(seq, payloads[seq])
		}
		return nil
	}
	held := func() int64 { return r.Index().Held(eng.Worker(), 0) }

	done := make(chan struct{})
	go func() { // the subscriber: the engine's one goroutine
		defer close(done)
		for seq := range uint64(batches) {
			eng.Live(seq, payloads[seq], replay)
		}
	}()
	forgets := 0
	for fed := false; !fed; forgets++ {
		require.NoError(t, f.Forget("w"))
		select {
		case <-done:
			fed = true
		case <-time.After(50 * time.Microsecond):
		}
	}
	require.NoError(t, f.Forget("w"))
	require.Zero(t, held(), "forgotten: nothing of w's left in the index")
	var d router.Decision
	require.NoError(t, r.Decide(router.Request{Tokens: c.tokens}, &d))
	require.Zero(t, d.Score("w").Overlap)
	require.Error(t, f.Forget("nobody"))

	// The worker publishes again: its next batch replays what it holds from 0.
	replays = 0
	eng.Live(batches, payloads[batches], replay)
	require.Equal(t, 1, replays)
	require.Equal(t, int64(per*(batches+1)), held(), "every block back")
	require.NoError(t, r.Decide(router.Request{Tokens: c.tokens}, &d))
	require.Equal(t, per*(batches+1), d.Score("w").Overlap)
	t.Logf("%d forgets while %d batches were fed; %d blocks restored by one replay", forgets, batches, held())
}
