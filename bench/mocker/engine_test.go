package mocker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/router"
)

// arrival is a request submitted at a time.
type arrival struct {
	at time.Duration
	r  *Request
}

// outputs records every request's outputs.
type outputs map[string][]Output

func (o outputs) sink(id string) func(Output) {
	return func(out Output) { o[id] = append(o[id], out) }
}

// drive runs one engine over arrivals (sorted by time) in virtual time, calling check after
// every step, until every request is done.
func drive(t *testing.T, e *Engine, arrivals []arrival, check func()) {
	t.Helper()
	driveWith(t, e, arrivals, nil, check)
}

// driveWith is drive with a hook called before every step too.
func driveWith(t *testing.T, e *Engine, arrivals []arrival, before, check func()) {
	t.Helper()
	now, i := time.Duration(0), 0
	submitUpTo := func(until time.Duration) {
		for i < len(arrivals) && arrivals[i].at <= until {
			_, err := e.Submit(arrivals[i].r, max(arrivals[i].at, now))
			require.NoError(t, err)
			i++
		}
	}
	for steps := 0; ; steps++ {
		require.Less(t, steps, 1_000_000, "engine does not finish")
		submitUpTo(now)
		if before != nil {
			before()
		}
		next, busy := e.Step(now)
		if check != nil {
			check()
		}
		if !busy {
			if i == len(arrivals) {
				return
			}
			now = arrivals[i].at
			continue
		}
		submitUpTo(next - 1)
		now = next
	}
}

// checkOutputs: every request got MaxTokens tokens, the first marked First, the last Done
// with its prompt length.
func checkOutputs(t *testing.T, arrivals []arrival, got outputs) {
	t.Helper()
	for _, a := range arrivals {
		outs := got[a.r.ID]
		require.Len(t, outs, a.r.MaxTokens, "request %s", a.r.ID)
		require.True(t, outs[0].First, "request %s", a.r.ID)
		for i, o := range outs {
			require.Equal(t, i == len(outs)-1, o.Done, "request %s output %d", a.r.ID, i)
			require.NoError(t, o.Err)
			if i > 0 {
				require.False(t, o.First)
				require.Greater(t, o.At, outs[i-1].At)
			}
		}
		last := outs[len(outs)-1]
		require.Equal(t, "length", last.FinishReason)
		require.Equal(t, len(a.r.Tokens), last.PromptTokens)
		require.GreaterOrEqual(t, last.CachedTokens, 0)
		require.Less(t, last.CachedTokens, len(a.r.Tokens))
	}
}

// checkBlocks: the KV cache's reference counts are exactly the blocks the engine's requests
// hold, partial blocks are one per request that has one, and nothing exceeds the capacity.
func checkBlocks(t *testing.T, e *Engine) {
	t.Helper()
	kv := e.KV()
	require.LessOrEqual(t, kv.Used(), kv.Capacity())
	want := map[uint64]int{}
	partial := 0
	for _, s := range slices.Concat(e.running, e.waiting) {
		require.LessOrEqual(t, s.held, len(s.hashes))
		for _, h := range s.hashes[:s.held] {
			want[h]++
		}
		if s.partial {
			partial++
		}
		if !s.running {
			require.Zero(t, s.held, "a waiting request holds blocks")
			require.False(t, s.partial)
		}
	}
	require.Equal(t, partial, kv.partial)
	got := map[uint64]int{}
	kv.Hashes(func(h uint64, refs int) {
		if refs > 0 {
			got[h] = refs
		}
	})
	require.Equal(t, want, got)
	require.Equal(t, kv.Used()-kv.Inactive(), kv.Active())
}

// checkLimits: the step just planned keeps the scheduler's limits: at most MaxSeqs running, at
// most MaxBatchedTokens scheduled (without chunked prefill a longer prompt runs alone), and a
// request admitted next to others left the watermark's blocks free. before is the running set
// as the step began: the last running request is the plan's last admission when it was not
// running then (admissions are appended after the requests already running), and that
// admission's check bounds what is free once the plan is done, as its allocation takes no
// more than the blocks the check counted.
func checkLimits(t *testing.T, e *Engine, before map[*seq]bool) {
	t.Helper()
	o := e.opts
	require.LessOrEqual(t, len(e.running), o.MaxSeqs, "running requests")
	tokens := 0
	for _, b := range e.batch {
		tokens += b.n
	}
	if tokens > o.MaxBatchedTokens {
		require.False(t, o.ChunkedPrefill, "%d tokens scheduled, budget %d", tokens, o.MaxBatchedTokens)
		require.Len(t, e.batch, 1, "an over-budget prompt runs alone")
	}
	if n := len(e.running); n > 1 && !before[e.running[n-1]] {
		watermark := int(o.Watermark * float64(o.Blocks))
		require.GreaterOrEqual(t, e.kv.Free(), watermark, "admitted next to %d running requests under the watermark", n-1)
	}
}

// runningSet is the running queue as a set.
func runningSet(e *Engine) map[*seq]bool {
	m := make(map[*seq]bool, len(e.running))
	for _, s := range e.running {
		m[s] = true
	}
	return m
}

// workload makes n requests over a few shared prefixes (so blocks are shared and reused),
// arriving over span.
func workload(r *rand.Rand, n, maxPrompt, maxGen int, span time.Duration, got outputs) []arrival {
	prefixes := make([][]uint32, 4)
	for i := range prefixes {
		prefixes[i] = randomTokens(r, 16+r.IntN(maxPrompt/2))
	}
	var out []arrival
	for i := range n {
		p := prefixes[r.IntN(len(prefixes))]
		toks := slices.Concat(p, randomTokens(r, 1+r.IntN(maxPrompt/2)))
		id := fmt.Sprintf("r%d", i)
		out = append(out, arrival{at: time.Duration(r.Int64N(int64(span))),
			r: &Request{ID: id, Tokens: toks, MaxTokens: 1 + r.IntN(maxGen), Sink: got.sink(id)}})
	}
	slices.SortFunc(out, func(a, b arrival) int { return int(a.at - b.at) })
	return out
}

func randomTokens(r *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = r.Uint32N(32000)
	}
	return t
}

// Random workloads on caches from tight to roomy, watermarks from none to a quarter of the
// cache: after every step the block accounting is exact and the scheduler's limits hold; every
// request completes with the right outputs; at the end nothing is active.
func TestEngineRandomWorkloads(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	for round := range 12 {
		opts := DefaultOptions()
		opts.Name = "e"
		opts.Seed = seed + uint64(round)
		opts.Blocks = 40 + r.IntN(400)
		opts.MaxBatchedTokens = 64 + r.IntN(512)
		opts.MaxSeqs = 1 + r.IntN(32)
		opts.ChunkedPrefill = round%3 != 0
		opts.Watermark = []float64{0, 0.01, 0.1, 0.25}[round%4]
		e, err := NewEngine(opts, nil)
		require.NoError(t, err)
		got := outputs{}
		arrivals := workload(r, 60, 300, 120, 2*time.Second, got)
		var before map[*seq]bool
		driveWith(t, e, arrivals, func() { before = runningSet(e) }, func() {
			checkBlocks(t, e)
			checkLimits(t, e, before)
		})
		checkOutputs(t, arrivals, got)
		require.Zero(t, e.KV().Active(), "round %d", round)
		require.True(t, e.Idle())
		st := e.Stats()
		require.EqualValues(t, len(arrivals), st.Finished)
		t.Logf("round %d: %d blocks, watermark %v, budget %d, max seqs %d, chunked %v: %d steps, %d preemptions, %d of %d prompt tokens cached",
			round, opts.Blocks, opts.Watermark, opts.MaxBatchedTokens, opts.MaxSeqs, opts.ChunkedPrefill, st.Steps, st.Preemptions, st.CachedTokens, st.PromptTokens)
	}
}

// Two requests that cannot both grow in a cache of 8 blocks: the oldest decoding request is
// preempted, recomputed later, and both still produce every token.
func TestEnginePreemptsOldestDecode(t *testing.T) {
	opts := DefaultOptions()
	opts.Blocks, opts.Watermark, opts.Seed = 8, 0, 1
	e, err := NewEngine(opts, nil)
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(3, 3))
	got := outputs{}
	a := &Request{ID: "a", Tokens: randomTokens(r, 40), MaxTokens: 60, Sink: got.sink("a")}
	b := &Request{ID: "b", Tokens: randomTokens(r, 40), MaxTokens: 60, Sink: got.sink("b")}
	arrivals := []arrival{{0, a}, {0, b}}
	preemptedFirst := ""
	drive(t, e, arrivals, func() {
		checkBlocks(t, e)
		if preemptedFirst == "" && e.Stats().Preemptions > 0 {
			require.NotEmpty(t, e.waiting)
			preemptedFirst = e.waiting[0].req.ID
		}
	})
	checkOutputs(t, arrivals, got)
	require.Positive(t, e.Stats().Preemptions)
	require.Equal(t, "a", preemptedFirst, "the oldest decode is preempted first")
	// a's recompute: after the preemption it re-prefills prompt + generated tokens, so its
	// tokens keep coming, later than b's.
	require.Greater(t, got["a"][59].At, got["b"][59].At)
}

// A request whose prompt fits in the free blocks but would leave fewer than the watermark's
// waits while another runs, and is admitted in the step after that one finishes; without the
// watermark the two run together.
func TestEngineWatermarkHoldsAdmission(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	a, b := randomTokens(r, 50*16), randomTokens(r, 40*16) // 50 and 40 blocks
	for _, watermark := range []float64{0.2, 0} {
		opts := DefaultOptions()
		opts.Blocks, opts.Watermark, opts.Seed = 100, watermark, 1 // 20 blocks; a leaves 49 free
		e, err := NewEngine(opts, nil)
		require.NoError(t, err)
		got := outputs{}
		ra := &Request{ID: "a", Tokens: a, MaxTokens: 10, Sink: got.sink("a")}
		rb := &Request{ID: "b", Tokens: b, MaxTokens: 2, Sink: got.sink("b")}
		held := 0
		drive(t, e, []arrival{{0, ra}, {0, rb}}, func() {
			if len(e.waiting) == 1 && e.waiting[0].req == rb && len(e.running) == 1 {
				held++
				require.Less(t, e.kv.Free()-40, 20, "b would have fit above the watermark")
			}
		})
		checkOutputs(t, []arrival{{0, ra}, {0, rb}}, got)
		aDone, bFirst := got["a"][9].At, got["b"][0].At
		if watermark == 0 {
			require.Zero(t, held)
			require.Less(t, bFirst, aDone, "without a watermark b runs beside a")
			continue
		}
		require.Equal(t, 10, held, "b waits through a's prefill and nine decode steps")
		n := 640.0 // b's prompt: nothing of it cached
		prefill := time.Duration((4.209989e-7*n*n + 1.518344e-2*n + 16.50142) * float64(time.Millisecond))
		require.Equal(t, aDone+prefill, bFirst, "b is admitted in the step after a finished")
	}
}

// Chunked prefill splits a 1,000-token prompt into 256-token steps; the first token comes at
// the end of the last chunk, each chunk timed by Dynamo's prefill polynomial. Without chunking
// the prompt runs in one step.
func TestEngineChunkedPrefill(t *testing.T) {
	prefillMS := func(n float64) float64 { return 4.209989e-7*n*n + 1.518344e-2*n + 16.50142 }
	ms := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
	for _, chunked := range []bool{true, false} {
		opts := DefaultOptions()
		opts.MaxBatchedTokens, opts.ChunkedPrefill, opts.Seed = 256, chunked, 1
		e, err := NewEngine(opts, nil)
		require.NoError(t, err)
		got := outputs{}
		req := &Request{ID: "x", Tokens: randomTokens(rand.New(rand.NewPCG(4, 4)), 1000), MaxTokens: 2, Sink: got.sink("x")}
		drive(t, e, []arrival{{0, req}}, nil)
		require.Len(t, got["x"], 2)
		want := ms(prefillMS(1000))
		steps := int64(2)
		if chunked {
			want = 3*ms(prefillMS(256)) + ms(prefillMS(232))
			steps = 5
		}
		require.Equal(t, want, got["x"][0].At, "chunked %v: time to first token", chunked)
		require.Equal(t, steps, e.Stats().Steps)
		// One decode step over 1,001 tokens: u = 63 blocks in use (62 full + 1 partial) / capacity.
		u := 63.0 / float64(opts.Blocks)
		decode := ms(-25.74*u*u + 54.01*u + 5.74)
		require.Equal(t, want+decode, got["x"][1].At)
	}
}

// A prompt seen before is served from the prefix cache: all its full blocks but the last
// token's are reused, and only the rest is prefilled.
func TestEnginePrefixCache(t *testing.T) {
	opts := DefaultOptions()
	opts.Seed = 1
	e, err := NewEngine(opts, nil)
	require.NoError(t, err)
	got := outputs{}
	toks := randomTokens(rand.New(rand.NewPCG(5, 5)), 100)
	first := &Request{ID: "a", Tokens: toks, MaxTokens: 1, Sink: got.sink("a")}
	again := &Request{ID: "b", Tokens: toks, MaxTokens: 1, Sink: got.sink("b")}
	salted := &Request{ID: "c", Tokens: toks, MaxTokens: 1, Salt: "tenant-2", Sink: got.sink("c")}
	drive(t, e, []arrival{{0, first}, {time.Second, again}, {2 * time.Second, salted}}, nil)
	require.Equal(t, 0, got["a"][0].CachedTokens)
	require.Equal(t, 96, got["b"][0].CachedTokens, "6 of the 100 tokens' full blocks")
	require.Equal(t, 0, got["c"][0].CachedTokens, "another salt shares nothing")
	n := 4.0 // tokens to prefill
	prefill4 := time.Duration((4.209989e-7*n*n + 1.518344e-2*n + 16.50142) * float64(time.Millisecond))
	require.Equal(t, time.Second+prefill4, got["b"][0].At)
}

// Bad requests are typed errors naming the request.
func TestEngineRejects(t *testing.T) {
	opts := DefaultOptions()
	opts.Blocks = 4
	e, err := NewEngine(opts, nil)
	require.NoError(t, err)
	var bad *ErrBadRequest
	_, err = e.Submit(&Request{ID: "empty", MaxTokens: 1, Sink: func(Output) {}}, 0)
	require.ErrorAs(t, err, &bad)
	require.Equal(t, "empty", bad.ID)
	_, err = e.Submit(&Request{ID: "huge", Tokens: make([]uint32, 60), MaxTokens: 10, Sink: func(Output) {}}, 0)
	require.ErrorAs(t, err, &bad)
	_, err = e.Submit(&Request{ID: "media", Tokens: make([]uint32, 10), MaxTokens: 1, Media: []router.Media{{Offset: 8, Length: 5}}, MediaIDs: []string{"x"}, Sink: func(Output) {}}, 0)
	require.ErrorAs(t, err, &bad)
	require.Contains(t, bad.Error(), "media item 0")
	_, err = NewEngine(Options{}, nil)
	var oe *ErrOptions
	require.ErrorAs(t, err, &oe)
}

// An aborted request ends with an abort and gives its blocks back.
func TestEngineAbort(t *testing.T) {
	opts := DefaultOptions()
	e, err := NewEngine(opts, nil)
	require.NoError(t, err)
	got := outputs{}
	req := &Request{ID: "a", Tokens: randomTokens(rand.New(rand.NewPCG(6, 6)), 50), MaxTokens: 1000, Sink: got.sink("a")}
	_, err = e.Submit(req, 0)
	require.NoError(t, err)
	now := time.Duration(0)
	for range 10 {
		now, _ = e.Step(now)
	}
	e.Abort("a", now)
	_, busy := e.Step(now)
	require.False(t, busy)
	outs := got["a"]
	last := outs[len(outs)-1]
	require.True(t, last.Done)
	require.Equal(t, "abort", last.FinishReason)
	require.Error(t, last.Err)
	require.Zero(t, e.KV().Active())
}

// A 1-token warm-up with the text before a media item fills the prefix cache: the media
// request after it finds that text's full blocks cached and prefills only the rest (the
// encode/prefill overlap's premise).
func TestEngineWarmUpPrefix(t *testing.T) {
	opts := DefaultOptions()
	opts.Seed = 1
	e, err := NewEngine(opts, nil)
	require.NoError(t, err)
	got := outputs{}
	toks := randomTokens(rand.New(rand.NewPCG(6, 6)), 170)
	for i := 100; i < 150; i++ {
		toks[i] = 7 // an image's placeholder run
	}
	media := []router.Media{{Hash: router.MediaHash("cat"), Offset: 100, Length: 50}}
	warm := &Request{ID: "warm", Tokens: toks[:100], MaxTokens: 1, Sink: got.sink("warm")}
	req := &Request{ID: "req", Tokens: toks, Media: media, MediaIDs: []string{"cat"}, MaxTokens: 1, Sink: got.sink("req")}
	cold := &Request{ID: "cold", Tokens: toks, Media: []router.Media{{Hash: router.MediaHash("dog"), Offset: 100, Length: 50}}, MediaIDs: []string{"dog"}, MaxTokens: 1, Salt: "other", Sink: got.sink("cold")}
	drive(t, e, []arrival{{0, warm}, {time.Second, req}, {2 * time.Second, cold}}, nil)
	require.Equal(t, 96, got["req"][0].CachedTokens, "the warm-up's 6 full blocks of 16")
	require.Equal(t, 0, got["cold"][0].CachedTokens)
	prefill := func(n float64) time.Duration {
		return time.Duration((4.209989e-7*n*n + 1.518344e-2*n + 16.50142) * float64(time.Millisecond))
	}
	require.Equal(t, time.Second+prefill(170-96), got["req"][0].At)
	require.Equal(t, 2*time.Second+prefill(170), got["cold"][0].At)
}
