package kvevents

import (
	"errors"
	"testing"

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
