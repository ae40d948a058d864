package router

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/router/topology"
)

// fleetWorker is a test fleet's worker: name, role, zone ("" for no label) and its reported
// active blocks (decode load) and prefill tokens (prefill load).
type fleetWorker struct {
	name, role, zone string
	active, prefill  int64
}

func disaggRouter(t *testing.T, o DisaggOptions, ws ...fleetWorker) *Router {
	t.Helper()
	opts := DefaultOptions()
	opts.Seed, opts.Disagg = 1, o
	r, err := New(opts)
	require.NoError(t, err)
	for _, w := range ws {
		_, err := r.AddWorker(w.name)
		require.NoError(t, err)
		info := WorkerInfo{Role: Role(w.role)}
		if w.zone != "" {
			info.Labels = map[string]string{"zone": w.zone}
		}
		require.NoError(t, r.SetWorkerInfo(w.name, info))
		require.NoError(t, r.ReportLoad(w.name, LoadReport{ActiveBlocks: w.active, PrefillTokens: w.prefill, Requests: 1}))
	}
	return r
}

func zoneLevel(p topology.Policy) DisaggOptions {
	o := DefaultDisaggOptions()
	o.Level, o.Policy = "zone", p
	return o
}

var prompt64 = func() []uint32 {
	out := make([]uint32, 64)
	for i := range out {
		out[i] = uint32(100 + i)
	}
	return out
}()

func disagg(t *testing.T, r *Router) (Decision, error) {
	t.Helper()
	var d Decision
	err := r.Route(Request{Tokens: prompt64}, &d)
	return d, err
}

// Level unset: no filtering; the decode worker is the least loaded wherever it is, and the
// decision is the same whatever the labels say.
func TestDisaggLevelUnset(t *testing.T) {
	ws := []fleetWorker{{"p0", "prefill", "z0", 0, 100}, {"p1", "prefill", "z1", 0, 0},
		{"d0", "decode", "z1", 50, 0}, {"d1", "decode", "z0", 5, 0}, {"dx", "decode", "", 30, 0}}
	r := disaggRouter(t, DefaultDisaggOptions(), ws...)
	d, err := disagg(t, r)
	require.NoError(t, err)
	require.Equal(t, "p1", d.Prefill, "the least prefill load")
	require.Equal(t, "d1", d.Decode, "the least decode load, in another zone")
	require.Equal(t, d.Decode, d.Worker)
	require.Nil(t, d.Topology)
	require.Len(t, d.PrefillScores, 2)
	require.Len(t, d.Scores, 3)
	for _, s := range d.Scores {
		require.True(t, s.Eligible, "%+v", s)
		require.Empty(t, s.Domain, "no level: domains play no part")
	}
	for i := range ws {
		ws[i].zone = ""
	}
	r2 := disaggRouter(t, DefaultDisaggOptions(), ws...)
	d2, err := disagg(t, r2)
	require.NoError(t, err)
	require.Equal(t, [2]string{d.Prefill, d.Decode}, [2]string{d2.Prefill, d2.Decode})
}

// Decode candidates are the prefill worker's zone: the less loaded decode worker elsewhere is
// passed over, and why is said.
func TestDisaggFilteredToDomain(t *testing.T) {
	for _, p := range []topology.Policy{topology.Fail, topology.Fallback} {
		r := disaggRouter(t, zoneLevel(p), fleetWorker{"p0", "prefill", "z0", 0, 0},
			fleetWorker{"d0", "decode", "z0", 50, 0}, fleetWorker{"d1", "decode", "z1", 5, 0})
		d, err := disagg(t, r)
		require.NoError(t, err, p)
		require.Equal(t, "d0", d.Decode, p)
		require.Equal(t, &TopologyChoice{Level: "zone", Domain: "z0", Policy: p}, d.Topology)
		require.Equal(t, `zone "z1", not the prefill worker's "z0"`, d.Score("d1").Excluded)
		require.Equal(t, "z0", d.Score("d0").Domain)
	}
}

// No decode worker in the prefill worker's zone, others elsewhere: fail is an error naming the
// zone; fallback routes to any decode worker and says so.
func TestDisaggNoSameDomainDecode(t *testing.T) {
	ws := []fleetWorker{{"p0", "prefill", "z0", 0, 0}, {"d1", "decode", "z1", 50, 0}, {"d2", "decode", "z2", 5, 0}}
	_, err := disagg(t, disaggRouter(t, zoneLevel(topology.Fail), ws...))
	var mismatch *ErrNoDecodeInDomain
	require.True(t, errors.As(err, &mismatch), "%v", err)
	require.Equal(t, "z0", mismatch.Domain)
	require.Equal(t, 2, mismatch.Elsewhere)
	require.Contains(t, err.Error(), `no decode worker in zone "z0"`)

	d, err := disagg(t, disaggRouter(t, zoneLevel(topology.Fallback), ws...))
	require.NoError(t, err)
	require.Equal(t, "d2", d.Decode, "any decode worker: the least loaded")
	require.True(t, d.Topology.Fallback)
}

// A decode worker without the zone label: excluded under fail; under fallback excluded while a
// same-zone worker exists, eligible when none does.
func TestDisaggMissingLabel(t *testing.T) {
	withSame := []fleetWorker{{"p0", "prefill", "z0", 0, 0}, {"d0", "decode", "z0", 50, 0}, {"dx", "decode", "", 0, 0}}
	noSame := []fleetWorker{{"p0", "prefill", "z0", 0, 0}, {"d1", "decode", "z1", 50, 0}, {"dx", "decode", "", 0, 0}}
	alone := []fleetWorker{{"p0", "prefill", "z0", 0, 0}, {"dx", "decode", "", 0, 0}}

	d, err := disagg(t, disaggRouter(t, zoneLevel(topology.Fail), withSame...))
	require.NoError(t, err)
	require.Equal(t, "d0", d.Decode)
	require.Equal(t, "no zone label", d.Score("dx").Excluded)
	_, err = disagg(t, disaggRouter(t, zoneLevel(topology.Fail), alone...))
	var mismatch *ErrNoDecodeInDomain
	require.True(t, errors.As(err, &mismatch), "%v", err)
	require.Equal(t, 1, mismatch.Unlabelled)

	d, err = disagg(t, disaggRouter(t, zoneLevel(topology.Fallback), withSame...))
	require.NoError(t, err)
	require.Equal(t, "d0", d.Decode, "a same-zone worker exists: the unlabelled one is excluded")
	require.Equal(t, "no zone label", d.Score("dx").Excluded)
	d, err = disagg(t, disaggRouter(t, zoneLevel(topology.Fallback), noSame...))
	require.NoError(t, err)
	require.Equal(t, "dx", d.Decode, "none in z0: the unlabelled one is eligible (and least loaded)")
	require.True(t, d.Topology.Fallback)

	// A prefill worker without the label: excluded under fail; under fallback eligible, its
	// decode worker any.
	pNoLabel := []fleetWorker{{"px", "prefill", "", 0, 0}, {"d0", "decode", "z0", 0, 0}}
	_, err = disagg(t, disaggRouter(t, zoneLevel(topology.Fail), pNoLabel...))
	var none *ErrNoWorker
	require.True(t, errors.As(err, &none), "%v", err)
	d, err = disagg(t, disaggRouter(t, zoneLevel(topology.Fallback), pNoLabel...))
	require.NoError(t, err)
	require.Equal(t, [2]string{"px", "d0"}, [2]string{d.Prefill, d.Decode})
	require.True(t, d.Topology.Fallback)
}

// Before the prefill choice, prefill workers with a decode worker in their zone are preferred,
// even when less attractive; when none has one, the others are eligible.
func TestDisaggPreferPrefillWithDecode(t *testing.T) {
	for _, p := range []topology.Policy{topology.Fail, topology.Fallback} {
		r := disaggRouter(t, zoneLevel(p), fleetWorker{"p0", "prefill", "z0", 0, 1000},
			fleetWorker{"p1", "prefill", "z1", 0, 0}, fleetWorker{"d0", "decode", "z0", 0, 0})
		d, err := disagg(t, r)
		require.NoError(t, err, p)
		require.Equal(t, "p0", d.Prefill, "p1 is idle but has no decode worker in z1")
		require.Equal(t, `no decode worker in its zone "z1" (others have one)`, d.PrefillScores[1].Excluded)
	}
	// None has one: the others are eligible (and fail then fails at the decode step).
	ws := []fleetWorker{{"p0", "prefill", "z0", 0, 1000}, {"p1", "prefill", "z1", 0, 0}, {"d2", "decode", "z2", 0, 0}}
	d, err := disagg(t, disaggRouter(t, zoneLevel(topology.Fallback), ws...))
	require.NoError(t, err)
	require.Equal(t, "p1", d.Prefill)
	_, err = disagg(t, disaggRouter(t, zoneLevel(topology.Fail), ws...))
	require.ErrorContains(t, err, `zone "z1"`)
}

// The soft cost: decode blocks + weight × (latency + KV bytes / bandwidth) in blocks of prefill
// time; with a slow cross-zone link the same-zone worker wins despite more load, and a weight
// of 0 turns it off.
func TestDisaggSoftCost(t *testing.T) {
	o := DefaultDisaggOptions()
	var err error
	o.QoS, err = topology.ParseQoS("zone=1ms@1GB,local=10us@100GB")
	require.NoError(t, err)
	o.KVBytesPerToken = 1 << 17
	ws := []fleetWorker{{"p0", "prefill", "z0", 0, 0}, {"d0", "decode", "z0", 20, 0}, {"d1", "decode", "z1", 5, 0}}
	r := disaggRouter(t, o, ws...)
	d, err := disagg(t, r)
	require.NoError(t, err)
	require.Equal(t, "d0", d.Decode)
	kv := 64.0 * (1 << 17)
	far, near := d.Score("d1"), d.Score("d0")
	require.Equal(t, "zone", far.Link)
	require.Equal(t, "local", near.Link)
	require.InDelta(t, r.BlocksIn(1e-3+kv/1e9), far.KVTransfer, 1e-9)
	require.InDelta(t, far.DecodeBlocks+far.KVTransfer, far.Cost, 1e-9)
	require.InDelta(t, r.BlocksIn(10e-6+kv/100e9), near.KVTransfer, 1e-9)
	require.Equal(t, kv, d.Topology.KVBytes)

	o.TransferWeight = 0
	d, err = disagg(t, disaggRouter(t, o, ws...))
	require.NoError(t, err)
	require.Equal(t, "d1", d.Decode)
}

// Decide (an aggregated decision) never picks a prefill worker; Route takes two steps as soon
// as the fleet has one, and one again when it is gone.
func TestRouteByFleet(t *testing.T) {
	r := disaggRouter(t, DefaultDisaggOptions(), fleetWorker{"a0", "aggregated", "", 0, 0}, fleetWorker{"p0", "prefill", "", 0, 0},
		fleetWorker{"d0", "decode", "", 10, 0})
	require.True(t, r.Disaggregated())
	var d Decision
	require.NoError(t, r.Decide(Request{Tokens: prompt64}, &d))
	require.Equal(t, excludedPrefillOnly, d.Score("p0").Excluded)
	require.Equal(t, "a0", d.Worker)
	require.NoError(t, r.Route(Request{Tokens: prompt64}, &d))
	require.Equal(t, [2]string{"p0", "d0"}, [2]string{d.Prefill, d.Decode})
	require.NoError(t, r.RemoveWorker("p0"))
	require.False(t, r.Disaggregated())
	require.NoError(t, r.Route(Request{Tokens: prompt64}, &d))
	require.Empty(t, d.Prefill)
	require.Equal(t, "a0", d.Worker)
	require.Error(t, r.SetWorkerInfo("a0", WorkerInfo{Role: "encoder"}))
}

// Start counts the prefill step on the prefill worker (its uncached tokens) and the decode step
// on the decode worker (the prompt's blocks, nothing to prefill); PrefillDone ends the first,
// Finish the second.
func TestDisaggLifecycle(t *testing.T) {
	r := disaggRouter(t, DefaultDisaggOptions(), fleetWorker{"p0", "prefill", "", 0, 0}, fleetWorker{"d0", "decode", "", 0, 0})
	d, err := disagg(t, r)
	require.NoError(t, err)
	require.NoError(t, r.Start("q", d, d.Decode, time.Now()))
	load := func(name string) (int64, int64, int64) { return r.Slots().Load(r.find(name).slot) }
	b, p, q := load("p0")
	require.Equal(t, [3]int64{4, 64, 1}, [3]int64{b, p, q})
	b, p, q = load("d0")
	require.Equal(t, [3]int64{4, 0, 1}, [3]int64{b, p, q})
	require.Error(t, r.Start("q", d, d.Decode, time.Now()), "already tracked")

	r.PrefillDone("q")
	_, _, q = load("p0")
	require.Zero(t, q)
	require.True(t, r.Finish("q"))
	_, _, q = load("d0")
	require.Zero(t, q)

	require.NoError(t, r.Start("q2", d, d.Decode, time.Now()))
	r.FirstToken("q2") // ends the prefill step too
	_, _, q = load("p0")
	require.Zero(t, q)
	require.True(t, r.Finish("q2"))
	require.Zero(t, r.Slots().InFlight())
}
