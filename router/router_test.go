package router

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/router/index"
	"dataplane/router/internal/testrand"
)

func newTestRouter(t *testing.T, names ...string) *Router {
	opts := DefaultOptions()
	opts.Seed = 1
	r, err := New(opts)
	require.NoError(t, err)
	for _, n := range names {
		_, err := r.AddWorker(n)
		require.NoError(t, err)
	}
	return r
}

// decide is Decide into a fresh Decision.
func decide(r *Router, req Request) (Decision, error) {
	var d Decision
	err := r.Decide(req, &d)
	return d, err
}

// The cost is Dynamo's: weight × (outstanding + uncached prefill tokens) / block size + active
// blocks + this prompt's blocks not active there; each term is checked by hand.
func TestDecideCostAndExplanation(t *testing.T) {
	rnd := testrand.New(t)
	r := newTestRouter(t, "a", "b", "c")
	prompt := testrand.Tokens(rnd, 16*10+5) // 10 full blocks and a partial one
	h, _ := NewHasher(16)
	hashes, _ := h.Sequence(nil, prompt, HashSeed, nil)
	r.Index().Store(r.find("a").slot, 0, 0, hashes[:6], nil) // a caches 6 blocks
	r.Index().Store(r.find("b").slot, 0, 0, hashes[:2], nil)

	// b already serves a request sharing the first 4 blocks, not yet past prefill.
	other := append(append([]uint32(nil), prompt[:64]...), testrand.Tokens(rnd, 40)...)
	od, err := decide(r, Request{Tokens: other})
	require.NoError(t, err)
	require.NoError(t, r.Start("r1", od, "b", time.Now()))

	d, err := decide(r, Request{Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, 10, d.Blocks)
	a, b, c := d.Score("a"), d.Score("b"), d.Score("c")
	require.Equal(t, 6, a.Overlap)
	require.Equal(t, 165-96, a.Uncached)
	require.Equal(t, 11, a.NewBlocks)
	require.InDelta(t, float64(165-96)/16+11, a.Cost, 1e-9)
	// b: 2 cached; its in-flight request holds 104 tokens = 7 blocks (6 full + 1 partial), of which
	// the first 4 are this prompt's too, and still has 104-32 tokens to prefill.
	require.Equal(t, 2, b.Overlap)
	require.Equal(t, int64(7), b.ActiveBlocks)
	require.Equal(t, int64(104-32), b.PrefillTokens)
	require.Equal(t, 11-4, b.NewBlocks)
	require.InDelta(t, float64(104-32+165-32)/16+7+7, b.Cost, 1e-9)
	require.InDelta(t, float64(165)/16+11, c.Cost, 1e-9)
	require.Equal(t, "a", d.Worker)
	require.Equal(t, 1.0, a.Probability)

	// The first token clears b's prefill; finishing frees its blocks.
	r.FirstToken("r1")
	_, pre, _ := r.Slots().Load(r.find("b").slot)
	require.Zero(t, pre)
	require.True(t, r.Finish("r1"))
	require.False(t, r.Finish("r1"))
	blocks, _, reqs := r.Slots().Load(r.find("b").slot)
	require.Zero(t, blocks+reqs)
}

// A request whose features are still encoding cannot start its prefill before they are ready,
// but a worker's prefill backlog drains meanwhile: "a" holds the prompt's blocks behind a
// 14-block backlog, "b" is idle with nothing cached. Text-only, b is cheaper (a's backlog costs
// it twice, as prefill and as active blocks); once the encode outlasts a's backlog, that backlog
// is free and a's cache wins. Every term is checked by hand.
func TestEncodeWaitHidesBacklog(t *testing.T) {
	rnd := testrand.New(t)
	r := newTestRouter(t, "a", "b")
	prompt := testrand.Tokens(rnd, 16*20) // 20 blocks
	h, _ := NewHasher(16)
	hashes, _ := h.Sequence(nil, prompt, HashSeed, nil)
	r.Index().Store(r.find("a").slot, 0, 0, hashes, nil)
	busy, err := decide(r, Request{Tokens: testrand.Tokens(rnd, 16*14)})
	require.NoError(t, err)
	require.NoError(t, r.Start("busy", busy, "a", time.Now()))

	f := func(readyIn float64, want string, waitA, costA, waitB, costB float64) {
		t.Helper()
		d, err := decide(r, Request{Tokens: prompt, ReadyIn: readyIn})
		require.NoError(t, err)
		a, b := d.Score("a"), d.Score("b")
		require.Equal(t, int64(14*16), a.PrefillTokens)
		require.InDelta(t, waitA, a.EncodeWait, 1e-9)
		require.InDelta(t, costA, a.Cost, 1e-9)
		require.InDelta(t, waitB, b.EncodeWait, 1e-9)
		require.InDelta(t, costB, b.Cost, 1e-9)
		require.Equal(t, want, d.Worker, "ready in %v blocks", readyIn)
	}
	// a: prefill 14 (backlog) + 0 uncached, decode 14 active + 20 new; b: prefill 20, decode 20.
	f(0, "b", 0, 14+0+14+20, 0, 20+20)
	f(5, "b", 0, 14+0+14+20, 5, 20+5+20)    // the encode hides under a's backlog: a gains nothing
	f(14, "a", 0, 14+0+14+20, 14, 20+14+20) // the backlog is gone by the time the features are
	f(30, "a", 16, 14+16+14+20, 30, 20+30+20)
}

// Times become blocks of prefill at Options.PrefillSecondsPerToken: by default 15 µs a token,
// so a 16-token block is 0.24 ms; the option must be positive.
func TestBlocksIn(t *testing.T) {
	r := newTestRouter(t)
	require.InDelta(t, 1, r.BlocksIn(240e-6), 1e-12)
	require.InDelta(t, 2, r.BlocksIn(0.48e-3), 1e-12)
	opts := DefaultOptions()
	opts.PrefillSecondsPerToken = 1e-3
	r, err := New(opts)
	require.NoError(t, err)
	require.InDelta(t, 0.5, r.BlocksIn(8e-3), 1e-12)
	for _, bad := range []float64{0, -1, math.NaN()} {
		opts.PrefillSecondsPerToken = bad
		_, err := New(opts)
		require.ErrorContains(t, err, "prefill seconds per token", "%v", bad)
	}
}

// A decision into a reused Decision allocates nothing, media, encode wait and transfer cost
// included (README: Router.Decide).
func TestDecideAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop scratch, so Decide allocates")
	}
	r := newTestRouter(t, "a", "b", "c")
	prompt := testrand.Tokens(testrand.New(t), 4096)
	h, _ := NewHasher(16)
	hashes, _ := h.Sequence(nil, prompt, HashSeed, nil)
	r.Index().Store(r.find("b").slot, 0, 0, hashes[:100], nil) // b caches 100 blocks
	d, err := decide(r, Request{Tokens: prompt[:1000]})
	require.NoError(t, err)
	require.NoError(t, r.Start("busy", d, "c", time.Now())) // c has some of them in flight
	transfer := func(w string) float64 { return float64(len(w)) }
	f := func(req Request) {
		t.Helper()
		var d Decision
		require.NoError(t, r.Decide(req, &d))
		require.Zero(t, testing.AllocsPerRun(100, func() { _ = r.Decide(req, &d) }))
	}
	f(Request{Tokens: prompt})
	f(Request{Tokens: prompt, Media: []Media{{Hash: 7, Offset: 100, Length: 576}}, ReadyIn: 3, Transfer: transfer, Allow: []string{"a", "c"}})
	f(Request{Tokens: prompt, Media: []Media{{Hash: 7, Offset: 100, Length: 576}}, Transfer: transfer,
		Encoders: []EncoderOption{{Name: "local", Encode: 9}, {Name: "remote", Encode: 3, Return: 1}}})
}

func TestDecideFiltersAndTies(t *testing.T) {
	rnd := testrand.New(t)
	r := newTestRouter(t, "x", "y", "z")
	prompt := testrand.Tokens(rnd, 64)
	d, err := decide(r, Request{Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, "x", d.Worker, "equal costs and overlaps: the smallest name")

	require.NoError(t, r.SetHealthy("x", false))
	d, err = decide(r, Request{Tokens: prompt, Allow: []string{"x", "z"}})
	require.NoError(t, err)
	require.Equal(t, "z", d.Worker)
	require.Equal(t, "unhealthy", d.Score("x").Excluded)
	require.Equal(t, "not in allow-list", d.Score("y").Excluded)
	_, err = decide(r, Request{Tokens: prompt, Allow: []string{"x"}})
	var none *ErrNoWorker
	require.True(t, errors.As(err, &none))

	// A transfer cost moves the choice.
	require.NoError(t, r.SetHealthy("x", true))
	d, err = decide(r, Request{Tokens: prompt, Transfer: func(w string) float64 {
		if w == "x" {
			return 1
		}
		return 0.5
	}})
	require.NoError(t, err)
	require.Equal(t, "y", d.Worker)
	require.Equal(t, 1.0, d.Score("x").Transfer)

	_, err = decide(r, Request{Tokens: prompt, Media: []Media{{Offset: 60, Length: 10}}})
	var bad *ErrBadMedia
	require.True(t, errors.As(err, &bad))
	require.Error(t, r.SetHealthy("nobody", true))
	require.NoError(t, r.RemoveWorker("y"))
	require.Equal(t, []string{"x", "z"}, r.Workers())
}

// With T > 0 the probabilities are Dynamo's softmax over costs normalised to [0, 1].
func TestChooseSoftmax(t *testing.T) {
	scores := []WorkerScore{{Worker: "a", Cost: 0, Eligible: true}, {Worker: "b", Cost: 3, Eligible: true},
		{Worker: "c", Cost: 9, Eligible: true}, {Worker: "d", Cost: 1, Eligible: false}}
	const temp = 0.5
	pick := Choose(scores, temp, 0.99)
	z := 1 + math.Exp(-(3.0/9)/temp) + math.Exp(-1/temp)
	require.InDelta(t, 1/z, scores[0].Probability, 1e-12)
	require.InDelta(t, math.Exp(-(3.0/9)/temp)/z, scores[1].Probability, 1e-12)
	require.InDelta(t, math.Exp(-1/temp)/z, scores[2].Probability, 1e-12)
	require.Zero(t, scores[3].Probability)
	require.Equal(t, 2, pick, "u = 0.99 falls in the last bucket")
	require.Equal(t, 0, Choose(scores, temp, 0.1))

	// Empirically, draws follow the probabilities.
	rnd := testrand.New(t)
	counts := make([]int, 4)
	for range 20000 {
		counts[Choose(scores, temp, rnd.Float64())]++
	}
	for i := range 3 {
		require.InDelta(t, scores[i].Probability, float64(counts[i])/20000, 0.02)
	}
	eq := []WorkerScore{{Cost: 2, Eligible: true}, {Cost: 2, Eligible: true}}
	require.Equal(t, 1, Choose(eq, 1, 0.7))
	require.Equal(t, 0.5, eq[0].Probability)
}

// Shared prefixes count once per worker; expiry drops lost requests; the oldest goes first when
// the tracker is full.
func TestSlotsRefCountsAndExpiry(t *testing.T) {
	s, err := NewSlots(64, 16, time.Minute, 3)
	require.NoError(t, err)
	t0 := time.Now()
	h := testrand.Hashes(testrand.New(t), 4)
	a, b := h[:3], []uint64{h[0], h[1], h[3]}
	require.NoError(t, s.Start("a", 1, a, 48, 48, t0))
	require.NoError(t, s.Start("b", 1, b, 50, 20, t0.Add(time.Second)))
	var dup *ErrDuplicateRequest
	require.True(t, errors.As(s.Start("a", 1, nil, 0, 0, t0), &dup))
	blocks, prefill, reqs := s.Load(1)
	require.Equal(t, int64(4+1), blocks, "blocks 1-4 once, plus b's partial block")
	require.Equal(t, int64(68), prefill)
	require.Equal(t, int64(2), reqs)
	var m index.Match
	s.ActiveMatch(a, &m)
	require.Equal(t, 3, m.Blocks(1, 0))
	require.True(t, s.Finish("a"))
	s.ActiveMatch(a, &m)
	require.Equal(t, 2, m.Blocks(1, 0), "block 3 was only a's")
	require.Equal(t, 0, s.Expire(t0.Add(time.Minute)))
	require.Equal(t, 1, s.Expire(t0.Add(time.Minute+time.Second)))
	blocks, prefill, reqs = s.Load(1)
	require.Zero(t, blocks+prefill+reqs)

	for i, id := range []string{"p", "q", "r", "s"} {
		require.NoError(t, s.Start(id, 2, []uint64{uint64(10 + i)}, 16, 0, t0))
	}
	require.Equal(t, 3, s.InFlight())
	require.False(t, s.Finish("p"), "the oldest made room")
	s.ForgetWorker(2)
	require.Zero(t, s.InFlight())
}

// One long request at the front of the start order (a stream, alive up to the TTL) does not
// keep the ids of the many that finished after it: after a start the order holds at most twice
// the tracked requests plus 1024, and the long one still expires first.
func TestSlotsOrderBoundedBehindALongRequest(t *testing.T) {
	s, err := NewSlots(64, 16, time.Minute, 1<<20)
	require.NoError(t, err)
	t0 := time.Now()
	require.NoError(t, s.Start("long", 1, []uint64{1}, 16, 0, t0))
	for i := range 100_000 {
		id := strconv.Itoa(i)
		require.NoError(t, s.Start(id, 2, []uint64{2}, 16, 0, t0))
		require.LessOrEqual(t, len(s.order), 2*s.InFlight()+1024)
		if i%10 != 0 { // a tenth still running
			require.True(t, s.Finish(id))
		}
	}
	require.Equal(t, 10_001, s.InFlight())
	require.Equal(t, "long", s.order[0].id)
	require.Equal(t, 10_001, s.Expire(t0.Add(time.Minute)))
	require.Zero(t, s.InFlight())
}

// An id started again once finished (a client reusing its request id) leaves one live start:
// its earlier starts neither keep the order long, nor stop Expire at the front while the new
// start is young, nor are taken for it when the oldest request makes room.
func TestSlotsReusedIDs(t *testing.T) {
	s, err := NewSlots(64, 16, time.Minute, 4)
	require.NoError(t, err)
	t0 := time.Now()
	for i := range 50_000 {
		now := t0.Add(time.Duration(i) * time.Millisecond)
		require.NoError(t, s.Start("same", 1, []uint64{1}, 16, 0, now))
		require.LessOrEqual(t, len(s.order), 2*s.InFlight()+1024)
		if i%1000 == 999 {
			s.Expire(now)
		}
		require.True(t, s.Finish("same"))
	}
	// Expire: a stale start of "young" at the front does not hold back "old" behind it.
	s, err = NewSlots(64, 16, time.Minute, 4)
	require.NoError(t, err)
	require.NoError(t, s.Start("young", 1, []uint64{1}, 16, 0, t0))
	require.True(t, s.Finish("young"))
	require.NoError(t, s.Start("old", 1, []uint64{2}, 16, 0, t0))
	require.NoError(t, s.Start("young", 1, []uint64{1}, 16, 0, t0.Add(2*time.Minute)))
	require.Equal(t, 1, s.Expire(t0.Add(90*time.Second)), "old expired")
	require.Equal(t, 1, s.InFlight())
	// Making room finishes the oldest live request, not the newest start of a reused id.
	s, err = NewSlots(64, 16, time.Minute, 2)
	require.NoError(t, err)
	require.NoError(t, s.Start("a", 1, []uint64{1}, 16, 0, t0))
	require.True(t, s.Finish("a"))
	require.NoError(t, s.Start("b", 1, []uint64{2}, 16, 0, t0))
	require.NoError(t, s.Start("a", 1, []uint64{1}, 16, 0, t0))
	require.NoError(t, s.Start("c", 1, []uint64{3}, 16, 0, t0))
	require.False(t, s.Finish("b"), "b, the oldest, made room")
	require.True(t, s.Finish("a"))
	require.True(t, s.Finish("c"))
}

// The tracked requests' blocks are bounded: a start that would pass MaxTrackedBlocks finishes
// the oldest first, and one longer than the bound alone is refused.
func TestSlotsBlocksBounded(t *testing.T) {
	s, err := NewSlots(64, 16, time.Minute, 1<<20)
	require.NoError(t, err)
	s.maxBlocks = 10
	t0 := time.Now()
	blocks := func(first, n int) []uint64 {
		h := make([]uint64, n)
		for i := range h {
			h[i] = uint64(first + i)
		}
		return h
	}
	require.NoError(t, s.Start("a", 1, blocks(100, 4), 64, 64, t0))
	require.NoError(t, s.Start("b", 1, blocks(200, 4), 64, 64, t0))
	require.NoError(t, s.Start("c", 2, blocks(300, 4), 64, 64, t0))
	require.False(t, s.Finish("a"), "a, the oldest, made room for c")
	require.Equal(t, 8, s.held)
	require.ErrorContains(t, s.Start("d", 1, blocks(400, 11), 176, 176, t0), "11 blocks, more than the 10 tracked in all")
	require.Equal(t, 2, s.InFlight())
	require.True(t, s.Finish("b"))
	s.ForgetWorker(2)
	require.Zero(t, s.held)
	blocksNow, _, _ := s.Load(1)
	require.Zero(t, blocksNow)
}

// Slots against a plain model under random starts and finishes on a few workers, with prompts
// that share prefixes: each worker's distinct active blocks and its leading active overlap with
// a prompt agree with the model throughout (through the ref-count table's growth and shrinking),
// and nothing is left once every request has finished.
func TestSlotsAgainstModel(t *testing.T) {
	r := testrand.New(t)
	s, err := NewSlots(128, 16, time.Hour, 10_000)
	require.NoError(t, err)
	prefixes := make([][]uint64, 8)
	for i := range prefixes {
		prefixes[i] = testrand.Hashes(r, 1+r.IntN(300))
	}
	type req struct {
		w    index.Worker
		seqs []uint64
	}
	reqs := map[string]req{}
	refs := map[index.Worker]map[uint64]int{}
	now := time.Now()
	check := func(probe []uint64) {
		t.Helper()
		var m index.Match
		s.ActiveMatch(probe, &m)
		for w, counts := range refs {
			blocks, _, _ := s.Load(w)
			require.Equal(t, int64(len(counts)), blocks, "worker %d's distinct blocks", w)
			lead := 0
			for lead < len(probe) && counts[probe[lead]] > 0 {
				lead++
			}
			require.Equal(t, lead, m.Blocks(w, 0), "worker %d's active overlap", w)
		}
	}
	for step := range 3000 {
		if len(reqs) == 0 || r.IntN(5) < 3 {
			w := index.Worker([]int{0, 5, 64, 127}[r.IntN(4)])
			p := prefixes[r.IntN(len(prefixes))]
			seqs := append(slices.Clone(p[:1+r.IntN(len(p))]), testrand.Hashes(r, r.IntN(200))...)
			id := fmt.Sprint("r", step)
			require.NoError(t, s.Start(id, w, seqs, len(seqs)*16, 0, now))
			reqs[id] = req{w, seqs}
			if refs[w] == nil {
				refs[w] = map[uint64]int{}
			}
			for _, h := range seqs {
				refs[w][h]++
			}
		} else {
			for id, q := range reqs { // a random one: map order
				require.True(t, s.Finish(id))
				delete(reqs, id)
				for _, h := range q.seqs {
					if refs[q.w][h]--; refs[q.w][h] == 0 {
						delete(refs[q.w], h)
					}
				}
				break
			}
		}
		if step%50 == 0 {
			p := prefixes[r.IntN(len(prefixes))]
			check(p)
		}
	}
	for id := range reqs {
		require.True(t, s.Finish(id))
	}
	require.Zero(t, s.refs.Len())
	require.Zero(t, s.active.Blocks())
	for w := range refs {
		blocks, _, reqs := s.Load(w)
		require.Zero(t, blocks+reqs)
	}
}

// A worker's own load report counts with this router's counts: reported + what this router
// started since, never below its own count, not twice what it sent, only while fresh; unknown
// (negative) counts and forgotten workers fall back to the local count.
func TestLoadReports(t *testing.T) {
	rnd := testrand.New(t)
	r := newTestRouter(t, "a", "b")
	prompt := testrand.Tokens(rnd, 64) // 4 blocks
	d, err := decide(r, Request{Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, "a", d.Worker, "a tie goes to the smaller name")

	// Another replica loaded a: 100 blocks, 2,000 prompt tokens to go.
	require.NoError(t, r.ReportLoad("a", LoadReport{ActiveBlocks: 100, PrefillTokens: 2000, Requests: 5}))
	d, err = decide(r, Request{Tokens: prompt})
	require.NoError(t, err)
	require.Equal(t, "b", d.Worker)
	require.Equal(t, int64(100), d.Score("a").ActiveBlocks)
	require.True(t, d.Score("a").Reported)
	require.False(t, d.Score("b").Reported)

	// This router sends two requests to b; b's report then counts them, and they are not counted
	// twice; one more request after the report is added to it.
	sa := r.Slots()
	wb := index.Worker(1)
	now := time.Now()
	for i := range 2 {
		h, _ := NewHasher(16)
		hs, _ := h.Sequence(nil, testrand.Tokens(rnd, 64), HashSeed, nil)
		require.NoError(t, sa.Start(fmt.Sprint("r", i), wb, hs, 64, 64, now))
	}
	lb, lp, lr := sa.Load(wb)
	require.Equal(t, []int64{8, 128, 2}, []int64{lb, lp, lr})
	sa.Report(wb, LoadReport{ActiveBlocks: 8 + 10, PrefillTokens: 128, Requests: 2 + 1}, now) // 10 blocks, 1 request from elsewhere
	b, p, q, fresh := sa.LoadAt(wb, now, time.Second)
	require.True(t, fresh)
	require.Equal(t, []int64{18, 128, 3}, []int64{b, p, q})
	h, _ := NewHasher(16)
	hs, _ := h.Sequence(nil, testrand.Tokens(rnd, 32), HashSeed, nil)
	require.NoError(t, sa.Start("r2", wb, hs, 32, 32, now))
	b, p, q, _ = sa.LoadAt(wb, now, time.Second)
	require.Equal(t, []int64{20, 160, 4}, []int64{b, p, q}, "the report plus what started since")
	sa.FirstToken("r0")
	_, p, _, _ = sa.LoadAt(wb, now, time.Second)
	require.Equal(t, int64(96), p, "prefill done here comes off the report too")

	// A report that says less than this router has in flight (its requests still on their way):
	// the local count stands.
	sa.Report(wb, LoadReport{ActiveBlocks: 0, PrefillTokens: 0, Requests: 0}, now)
	b, _, q, _ = sa.LoadAt(wb, now, time.Second)
	require.Equal(t, []int64{10, 3}, []int64{b, q})
	// Unknown counts, and a stale report, fall back to the local ones.
	sa.Report(wb, LoadReport{ActiveBlocks: 500, PrefillTokens: -1, Requests: -1}, now)
	b, p, q, _ = sa.LoadAt(wb, now, time.Second)
	require.Equal(t, []int64{500, 96, 3}, []int64{b, p, q})
	b, _, _, fresh = sa.LoadAt(wb, now.Add(2*time.Second), time.Second)
	require.False(t, fresh)
	require.Equal(t, int64(10), b)

	snap := r.Snapshot()
	require.NotNil(t, snap[1].Reported)
	require.Equal(t, int64(500), snap[1].Effective.ActiveBlocks)
	require.NoError(t, r.RemoveWorker("b"))
	_, _, _, fresh = sa.LoadAt(wb, now, time.Second)
	require.False(t, fresh, "a removed worker's report goes with it")
	var unknown *ErrUnknownWorker
	require.ErrorAs(t, r.ReportLoad("b", LoadReport{}), &unknown)
}
