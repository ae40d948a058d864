package ab

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/bench/plot"
	"dataplane/bench/synth"
	"dataplane/dataplane/sequence"
	"dataplane/router/topology"
)

func synthesized(t *testing.T, requests int, k synth.Knobs) []synth.Record {
	t.Helper()
	f, err := os.Open("../../../shared/traces/mooncake_synthetic_trace.jsonl")
	if os.IsNotExist(err) {
		t.Skip("../shared/traces not here")
	}
	require.NoError(t, err)
	defer f.Close()
	recs, err := synth.ReadTrace(f, synth.DefaultLimits())
	require.NoError(t, err)
	tree, err := synth.BuildTree(recs, 512)
	require.NoError(t, err)
	k.Requests = requests
	if k.Seed == 0 {
		k.Seed = rand.Uint64()
	}
	t.Logf("synth seed %d", k.Seed)
	out, err := synth.Synthesize(tree, k)
	require.NoError(t, err)
	return out
}

// On a trace synthesized from Mooncake's synthetic workload, KV-aware routing finds more of the
// shared prefixes than round-robin and the first tokens come sooner; runs are deterministic.
func TestKVAwareBeatsRoundRobin(t *testing.T) {
	k := synth.DefaultKnobs()
	recs := synthesized(t, 400, k)
	opts := DefaultOptions()
	opts.Seed = rand.Uint64()
	opts.Policies = []string{RoundRobin, Random, KVAware}
	res, err := Run(context.Background(), recs, opts)
	require.NoError(t, err)
	require.Len(t, res, 3)
	rr, rnd, kv := res[0], res[1], res[2]
	for _, r := range res {
		t.Logf("%-11s TTFT p50 %7.0f p99 %7.0f ms, cache hit %.3f, %d rejected", r.Policy, r.TTFT.P50, r.TTFT.P99, r.CacheHit, r.Rejected)
		require.Zero(t, r.Rejected)
		require.Len(t, r.PerRequestTTFT, len(recs))
	}
	require.Greater(t, kv.CacheHit, rr.CacheHit)
	require.Greater(t, kv.CacheHit, rnd.CacheHit)
	require.Less(t, kv.TTFT.P50, rr.TTFT.P50)
	again, err := Run(context.Background(), recs, opts)
	require.NoError(t, err)
	require.Equal(t, res, again, "virtual time: the same answer every run")
}

// The goal: on a trace synthesized from Mooncake's synthetic workload (the README's
// seeds, 1,000 requests to keep the test short), KV-aware routing's TTFT p50 is at least twice
// as good as round-robin's. Virtual time makes the numbers exact: 281 vs 129 ms (2.18x) today;
// the full 3,993-request trace gives the README's 2.60x.
func TestKVAwareTwiceRoundRobinP50(t *testing.T) {
	k := synth.DefaultKnobs()
	k.Seed = 42
	recs := synthesized(t, 1000, k)
	opts := DefaultOptions()
	opts.Seed = 7
	opts.Policies = []string{RoundRobin, KVAware}
	res, err := Run(context.Background(), recs, opts)
	require.NoError(t, err)
	rr, kv := res[0], res[1]
	t.Logf("TTFT p50 round-robin %.0f ms, kv %.0f ms: %.2fx; p99 %.0f vs %.0f ms", rr.TTFT.P50, kv.TTFT.P50, rr.TTFT.P50/kv.TTFT.P50, rr.TTFT.P99, kv.TTFT.P99)
	require.Zero(t, rr.Rejected+kv.Rejected)
	require.GreaterOrEqual(t, rr.TTFT.P50, 2*kv.TTFT.P50, "KV-aware TTFT p50 at least 2x better")
}

// Synchronous encoding makes text-only requests wait behind media; asynchronous encoding does
// not: their first tokens come no later.
func TestEncodingModes(t *testing.T) {
	k := synth.DefaultKnobs()
	k.ImageShare = 0.4
	recs := synthesized(t, 200, k)
	opts := DefaultOptions()
	opts.Seed = 1
	opts.Policies = []string{RoundRobin}
	opts.Encodings = []string{EncodeNone, EncodeSync, EncodeAsync}
	opts.Encoder = SimEncoder{PerToken: DefaultSimEncoder().PerToken * 100, Workers: 2} // a slow encoder makes the queueing visible
	res, err := Run(context.Background(), recs, opts)
	require.NoError(t, err)
	none, sync, async := res[0], res[1], res[2]
	var textSync, textAsync []float64
	for i, r := range recs {
		if len(r.Media) == 0 {
			textSync = append(textSync, sync.PerRequestTTFT[i])
			textAsync = append(textAsync, async.PerRequestTTFT[i])
		}
	}
	require.NotEmpty(t, textSync)
	s, a := synth.Summarize(textSync), synth.Summarize(textAsync)
	t.Logf("TTFT mean: none %.0f, sync %.0f, async %.0f ms; text-only requests: sync %.0f, async %.0f ms", none.TTFT.Mean, sync.TTFT.Mean, async.TTFT.Mean, s.Mean, a.Mean)
	require.Greater(t, s.Mean, 1.2*a.Mean, "text-only requests wait behind media only when encoding is synchronous")
	require.Greater(t, sync.TTFT.Mean, async.TTFT.Mean)
	require.Greater(t, sync.TTFT.Mean, none.TTFT.Mean)
}

// Options that cannot work are errors naming the field.
func TestOptionErrors(t *testing.T) {
	recs := []synth.Record{{InputLength: 10, OutputLength: 2, HashIDs: []int64{1}}}
	o := DefaultOptions()
	o.Policies = []string{"smart"}
	_, err := Run(context.Background(), recs, o)
	var oe *ErrOptions
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "Policies", oe.Field)
	o = DefaultOptions()
	o.Router.BlockSize = 16
	_, err = Run(context.Background(), recs, o)
	require.ErrorAs(t, err, &oe)
	res, err := Run(context.Background(), recs, DefaultOptions())
	require.NoError(t, err)
	require.Equal(t, 3, len(res))
}

// kv-modality routes media requests at arrival and sends them when their features are ready:
// without encoding it is kv exactly; with encoding every request completes and no media
// request's first token comes before its encode could have finished.
func TestModalityAwarePolicy(t *testing.T) {
	k := synth.DefaultKnobs()
	k.ImageShare = 0.5
	k.Seed = 3
	recs := synthesized(t, 150, k)
	opts := DefaultOptions()
	opts.Seed = 5
	opts.Policies = []string{KVAware, ModalityAware}
	opts.Encodings = []string{EncodeNone, EncodeAsync}
	enc := SimEncoder{PerToken: DefaultSimEncoder().PerToken * 20, Workers: 4}
	opts.Encoder = enc
	res, err := Run(context.Background(), recs, opts)
	require.NoError(t, err)
	kvNone, modNone, modAsync := res[0], res[2], res[3]
	require.Equal(t, kvNone.PerRequestTTFT, modNone.PerRequestTTFT, "no encode wait: the same decisions")
	require.Zero(t, modAsync.Rejected)
	media := 0
	for i, r := range recs {
		if len(r.Media) > 0 {
			media++
			require.GreaterOrEqual(t, modAsync.PerRequestTTFT[i], float64(enc.Encode(r.Media))/1e6, "request %d", i)
		}
	}
	require.NotZero(t, media)
	t.Logf("TTFT p50: kv/async %.0f ms, kv-modality/async %.0f ms", res[1].TTFT.P50, modAsync.TTFT.P50)
}

// Calibrate turns the median of measured runs into a cost per token; bad counts are errors.
func TestCalibrate(t *testing.T) {
	calls := 0
	enc, err := Calibrate(func() error { calls++; time.Sleep(10 * time.Millisecond); return nil }, 100, 3, 4)
	require.NoError(t, err)
	require.Equal(t, 3, calls)
	require.GreaterOrEqual(t, enc.PerToken, 100*time.Microsecond, "at least the 10 ms sleep over 100 tokens")
	require.Equal(t, 4, enc.Slots())
	require.Equal(t, 50*enc.PerToken, enc.Encode([]synth.Media{{Tokens: 20}, {Tokens: 30}}))
	_, err = Calibrate(func() error { return nil }, 0, 3, 1)
	var oe *ErrOptions
	require.ErrorAs(t, err, &oe)
	_, err = Calibrate(func() error { return os.ErrClosed }, 10, 3, 1)
	require.ErrorIs(t, err, os.ErrClosed)
}

// The chart has one TTFT CDF per run, rejected requests left out, on a log-scaled axis.
func TestChart(t *testing.T) {
	res := []Result{
		{Policy: KVAware, Encoding: EncodeNone, PerRequestTTFT: []float64{30, 10, math.NaN(), 20}},
		{Policy: RoundRobin, Encoding: EncodeNone, PerRequestTTFT: []float64{50}},
	}
	c := Chart(res)
	require.Equal(t, plot.Log10, c.XScale)
	require.Len(t, c.Series, 2)
	require.Equal(t, "kv/none", c.Series[0].Name)
	require.Equal(t, []float64{10, 20, 30}, c.Series[0].X)
	require.NoError(t, c.WritePNG(io.Discard))
}

// A two-zone disaggregated fleet whose cross-zone KV moves are 10× slower: a topology-unaware
// router sends about half the moves across zones, the hard filter none, and first tokens come
// sooner with it; the soft cost crosses rarely; runs are deterministic.
func TestDisaggregatedTopology(t *testing.T) {
	recs := synthesized(t, 160, synth.DefaultKnobs())
	opts := DefaultOptions()
	opts.Seed = 3
	opts.Prefill, opts.Decode, opts.Layout = 4, 4, topology.Layout{Zones: 2}
	var err error
	opts.Transfer.QoS, err = topology.ParseQoS("zone=1ms@5GB/s,local=100us@50GB/s")
	require.NoError(t, err)
	opts.TransferWeight = 16
	opts.Policies = []string{DisaggRandom, Disagg, DisaggTopology, DisaggSoft}
	res, err := Run(context.Background(), recs, opts)
	require.NoError(t, err)
	require.Len(t, res, 4)
	for _, r := range res {
		t.Logf("%-16s TTFT p50 %5.0f p99 %5.0f ms, KV move p50 %5.1f ms, crossed %.2f, cache hit %.3f", r.Policy, r.TTFT.P50, r.TTFT.P99, r.KVMove.P50, r.Crossed, r.CacheHit)
		require.Zero(t, r.Rejected, r.Policy)
	}
	random, unaware, hard, soft := res[0], res[1], res[2], res[3]
	require.Greater(t, unaware.Crossed, 0.3)
	require.Zero(t, hard.Crossed)
	require.Less(t, soft.Crossed, unaware.Crossed/2)
	require.Less(t, hard.TTFT.P50, unaware.TTFT.P50)
	require.Less(t, hard.KVMove.P99, unaware.KVMove.P99)
	require.Greater(t, unaware.CacheHit, random.CacheHit, "the prefill step is KV-aware")
	opts.Policies = []string{DisaggTopology}
	again, err := Run(context.Background(), recs, opts)
	require.NoError(t, err)
	require.Equal(t, hard.PerRequestTTFT, again[0].PerRequestTTFT)

	opts.Prefill = 0
	_, err = Run(context.Background(), recs, opts)
	require.ErrorContains(t, err, "needs both")
	opts.Prefill, opts.Encodings = 4, []string{EncodeAsync}
	_, err = Run(context.Background(), recs, opts)
	require.ErrorContains(t, err, "disaggregated policies run with none")
}

// Per-class results and the baseline without media: the classes present, counted; the ratio is
// the text-only requests' p99 against the same requests in the baseline run; a synchronous
// encoder makes them wait (ratio above 1), an asynchronous one does not wait for videos.
func TestClassesAndBaseline(t *testing.T) {
	k := synth.DefaultKnobs()
	k.VideoShare, k.Seed = 0.3, 3
	recs := synthesized(t, 200, k)
	opts := DefaultOptions()
	opts.Seed = 1
	opts.Policies = []string{RoundRobin}
	opts.Encodings = []string{EncodeSync, EncodeAsync}
	opts.Baseline = true
	res, err := Run(context.Background(), recs, opts)
	require.NoError(t, err)
	require.Len(t, res, 3)
	base, sync, async := res[0], res[1], res[2]
	require.Equal(t, WithoutMedia, base.Encoding)
	require.Zero(t, base.TextVsBaseline)
	require.Equal(t, []string{synth.ClassText, synth.ClassVideo}, classesOf(base.ByClass), "the baseline's requests classed as in the trace")
	require.Equal(t, []string{synth.ClassText, synth.ClassVideo}, classesOf(sync.ByClass))
	require.Equal(t, len(recs), sync.ByClass[0].Requests+sync.ByClass[1].Requests)
	var text, textBase []float64
	for i := range recs {
		if len(recs[i].Media) == 0 {
			text, textBase = append(text, sync.PerRequestTTFT[i]), append(textBase, base.PerRequestTTFT[i])
		}
	}
	require.Len(t, text, sync.ByClass[0].Requests)
	require.InDelta(t, synth.Summarize(text).P99, sync.ByClass[0].TTFT.P99, 1e-9)
	require.InDelta(t, synth.Summarize(text).P99/synth.Summarize(textBase).P99, sync.TextVsBaseline, 1e-9)
	t.Logf("text-only p99 vs without media: sync %.3f, async %.3f", sync.TextVsBaseline, async.TextVsBaseline)
	require.Greater(t, sync.TextVsBaseline, async.TextVsBaseline)
}

func classesOf(c []ClassTTFT) []string {
	var out []string
	for _, x := range c {
		out = append(out, x.Class)
	}
	return out
}

// A video that says its frames costs frames × PerFrame; one that does not, its tokens.
func TestSimEncoderFrames(t *testing.T) {
	e := SimEncoder{PerToken: time.Microsecond, PerFrame: time.Millisecond, Workers: 1}
	require.Equal(t, 30*time.Millisecond+576*time.Microsecond, e.Encode([]synth.Media{{Tokens: 3840, Frames: 30}, {Tokens: 576}}))
	e.PerFrame = 0
	require.Equal(t, 3840*time.Microsecond, e.Encode([]synth.Media{{Tokens: 3840, Frames: 30}}))
}

// Encode/prefill overlap on an idle engine: a video request whose 4,096-token text prefix is
// not cached gets a warm-up while its 30 frames encode, and its first token comes a prefix's
// prefill sooner; a prefix already cached (an earlier request's) or too short gets none.
func TestOverlapWarmsPrefix(t *testing.T) {
	ids := func(from int64, n int) []int64 {
		var out []int64
		for i := range n {
			out = append(out, from+int64(i))
		}
		return out
	}
	video := func(id string, at int) []synth.Media {
		return []synth.Media{{Modality: sequence.Video, ID: id, Offset: at, Tokens: 600, Frames: 30, FPS: 2}}
	}
	recs := []synth.Record{
		{Timestamp: 0, InputLength: 4096, OutputLength: 2, HashIDs: ids(1, 8)},
		{Timestamp: 10_000, InputLength: 5120, OutputLength: 2, HashIDs: append(ids(1, 8), 100, 101), Media: video("a", 4096)}, // prefix cached
		{Timestamp: 20_000, InputLength: 5120, OutputLength: 2, HashIDs: append(ids(11, 8), 102, 103), Media: video("b", 4096)},
		{Timestamp: 30_000, InputLength: 1024, OutputLength: 2, HashIDs: []int64{200, 201}, Media: video("c", 100)}, // prefix too short
	}
	opts := DefaultOptions()
	opts.Engines, opts.Seed = 1, 1
	opts.Policies, opts.Encodings, opts.Overlaps = []string{ModalityAware}, []string{EncodeAsync}, []bool{false, true}
	opts.Encoder = SimEncoder{PerToken: time.Microsecond, PerFrame: 20 * time.Millisecond, Workers: 1}
	res, err := Run(context.Background(), recs, opts)
	require.NoError(t, err)
	off, on := res[0], res[1]
	require.False(t, off.Overlap)
	require.True(t, on.Overlap)
	require.Equal(t, [3]int{0, 0, 0}, [3]int{off.Warmups, off.WarmupsShort, off.WarmupsCached})
	require.Equal(t, [3]int{1, 1, 1}, [3]int{on.Warmups, on.WarmupsShort, on.WarmupsCached})
	t.Logf("TTFT of the uncached-prefix video request: %.1f ms without, %.1f ms with the warm-up", off.PerRequestTTFT[2], on.PerRequestTTFT[2])
	require.Greater(t, off.PerRequestTTFT[2], 600.0, "its 30 frames encode in 600 ms")
	require.Less(t, on.PerRequestTTFT[2], off.PerRequestTTFT[2]-50, "4,096 tokens prefilled while it encoded")
	for _, i := range []int{0, 1, 3} {
		require.InDelta(t, off.PerRequestTTFT[i], on.PerRequestTTFT[i], 1e-9, "request %d: no warm-up, no change", i)
	}
	require.Equal(t, []PrefixTTFT{{Min: 0, Max: 1024, Requests: 1, TTFT: on.ByPrefix[0].TTFT}, {Min: 4096, Max: 16384, Requests: 2, TTFT: on.ByPrefix[1].TTFT}}, on.ByPrefix)
	opts.Policies = []string{KVAware}
	_, err = Run(context.Background(), recs, opts)
	var oe *ErrOptions
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "Overlaps", oe.Field)
}
