package mocker

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Loads reads each engine's queue and KV use on its loop: a long request shows as running
// with its blocks held, an idle engine as nothing.
func TestFleetLoads(t *testing.T) {
	f, _ := startFleet(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := f.Loads(ctx)
	require.NoError(t, err)
	require.Len(t, l, 3)
	require.Equal(t, EngineLoad{Blocks: DefaultOptions().Blocks}, l[1])

	done := make(chan struct{})
	r := &Request{ID: "long", Tokens: make([]uint32, 100), MaxTokens: 5000, Sink: func(o Output) {
		if o.Done {
			close(done)
		}
	}}
	require.NoError(t, f.Submit(ctx, 1, r))
	require.Eventually(t, func() bool {
		l, err := f.Loads(ctx)
		return err == nil && l[1].Running == 1 && l[1].ActiveBlocks >= 7 && l[1].PrefillTokens == 0
	}, 5*time.Second, 5*time.Millisecond, "100 prompt tokens computed, 7 blocks and more held")
	f.Abort(1, "long")
	<-done
	l, err = f.Loads(ctx)
	require.NoError(t, err)
	require.Zero(t, l[1].Running+l[1].Waiting+l[1].ActiveBlocks)
}
