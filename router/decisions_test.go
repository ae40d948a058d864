package router

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// The log answers the latest decision under an id (or of all), forgets the oldest past its
// size, and keeps copies: the caller may reuse its Decision's slices after Add, and what Get
// returns is the caller's. Nil and empty score lists stay as they were.
func TestDecisionLog(t *testing.T) {
	l := NewDecisionLog(3)
	_, ok := l.Get("")
	require.False(t, ok, "empty")
	scores := []WorkerScore{{Worker: "a", Cost: 1}}
	l.Add("r1", Decision{Worker: "a", Scores: scores, Hashes: []uint64{7}})
	scores[0].Cost = 99 // the caller's buffer, reused
	got, ok := l.Get("r1")
	require.True(t, ok)
	require.Equal(t, 1.0, got.Decision.Scores[0].Cost, "the log kept its own copy")
	require.Nil(t, got.Decision.Hashes)
	got.Decision.Scores[0].Cost = 5
	again, _ := l.Get("r1")
	require.Equal(t, 1.0, again.Decision.Scores[0].Cost, "Get's answer is the caller's")

	l.Add("r2", Decision{Worker: "b", Scores: []WorkerScore{}})
	l.Add("r1", Decision{Worker: "c"}) // a reused id: the latest wins
	got, _ = l.Get("r1")
	require.Equal(t, "c", got.Decision.Worker)
	require.Nil(t, got.Decision.Scores)
	got, _ = l.Get("r2")
	require.NotNil(t, got.Decision.Scores)
	require.Empty(t, got.Decision.Scores)
	l.Add("r4", Decision{Worker: "d"})
	got, _ = l.Get("")
	require.Equal(t, "r4", got.RequestID)
	_, ok = l.Get("r2")
	require.True(t, ok)
	l.Add("r5", Decision{Worker: "e"}) // r2 is the oldest of the three now kept: gone
	_, ok = l.Get("r2")
	require.False(t, ok)
	got, _ = l.Get("r1")
	require.Equal(t, "c", got.Decision.Worker)
}

// Concurrent Adds and Gets (under -race): every slot holds a whole decision, never a mix.
func TestDecisionLogConcurrent(t *testing.T) {
	l := NewDecisionLog(RecentDecisions)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			d := Decision{Scores: make([]WorkerScore, 3)}
			for i := range 2000 {
				id := fmt.Sprintf("g%d-%d", g, i)
				d.Worker = id
				for j := range d.Scores {
					d.Scores[j].Worker = id
				}
				l.Add(id, d)
				if got, ok := l.Get(""); ok {
					for _, s := range got.Decision.Scores {
						require.Equal(t, got.Decision.Worker, s.Worker)
					}
					require.Equal(t, got.RequestID, got.Decision.Worker)
				}
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 8000, l.n.Load())
	found := 0
	for g := range 4 {
		for i := 1500; i < 2000; i++ {
			if got, ok := l.Get(fmt.Sprintf("g%d-%d", g, i)); ok {
				found++
				require.Equal(t, got.RequestID, got.Decision.Scores[2].Worker)
			}
		}
	}
	require.Equal(t, RecentDecisions, found, "the log is full of the latest decisions")
}
