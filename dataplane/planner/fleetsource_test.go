package planner

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/router/fleet"
)

func TestFleetSource(t *testing.T) {
	s := NewFleetSource()
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	pull := func() (Sample, Pools) {
		smp, p, err := s.Pull(context.Background())
		require.NoError(t, err)
		return smp, p
	}
	smp, p := pull()
	require.Equal(t, Pools{}, p)
	require.True(t, math.IsNaN(smp.PrefillQueue) && math.IsNaN(smp.DecodeKV), "nothing measured")

	s.Join(fleet.Worker{Name: "p0", Role: fleet.Prefill})
	s.Join(fleet.Worker{Name: "p1", Role: fleet.Prefill, Load: &fleet.Load{Waiting: 3}})
	s.Join(fleet.Worker{Name: "d0", Role: fleet.Decode, Load: &fleet.Load{ActiveBlocks: 50, KVBlocks: 100}})
	s.Join(fleet.Worker{Name: "a0-0", Role: fleet.Aggregated})
	s.Join(fleet.Worker{Name: "e0", Role: fleet.Encoder})
	s.OnLoad("p0", fleet.Load{Waiting: 1})
	s.OnLoad("a0-0", fleet.Load{ActiveBlocks: 90, KVBlocks: 100})
	s.OnLoad("ghost", fleet.Load{Waiting: 100}) // never announced: dropped
	smp, p = pull()
	require.Equal(t, Pools{Prefill: 2, Decode: 2}, p)
	require.InDelta(t, 2, smp.PrefillQueue, 1e-12, "(1 + 3) waiting over 2 prefill workers")
	require.InDelta(t, 0.7, smp.DecodeKV, 1e-12, "mean of 0.5 and 0.9")
	require.Equal(t, 1, s.Count(PoolDecode, "a0"))
	require.Equal(t, []string{"a0-0"}, s.Names("a0"))

	// Unknown counts (-1) and unknown sizes are left out; so are stale loads.
	s.OnLoad("p1", fleet.Load{Waiting: -1})
	s.OnLoad("d0", fleet.Load{ActiveBlocks: 5, KVBlocks: 0})
	smp, _ = pull()
	require.InDelta(t, 1, smp.PrefillQueue, 1e-12)
	require.InDelta(t, 0.9, smp.DecodeKV, 1e-12)
	now = now.Add(4 * time.Second)
	smp, p = pull()
	require.True(t, math.IsNaN(smp.PrefillQueue) && math.IsNaN(smp.DecodeKV), "stale")
	require.Equal(t, Pools{Prefill: 2, Decode: 2}, p, "but still counted: the lease says who is there")

	s.Leave("p0", "deleted")
	s.Model = "other"
	_, p = pull()
	require.Equal(t, Pools{}, p, "another model's workers")
}
