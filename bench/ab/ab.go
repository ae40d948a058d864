// Package ab replays one trace against a fleet of mock engines under several routing policies
// (and encoding modes) in virtual time, and reports each run's latencies side by side: the same
// requests, the same engines, one thing changed.
package ab

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"dataplane/bench/mocker"
	"dataplane/bench/plot"
	"dataplane/bench/synth"
	"dataplane/router"
	"dataplane/router/kvevents"
	"dataplane/router/topology"
)

// Policies the harness knows.
const (
	RoundRobin = "round-robin"
	Random     = "random"
	KVAware    = "kv" // router.Router: KV-event-fed index + slot tracker, Dynamo's cost
	// ModalityAware routes a request with media when it arrives, with the time until its
	// features are ready in the router's cost (the daemon's order: route, then await the
	// encoder), and sends it to the engine when they are; text-only requests are routed as by
	// kv. kv routes media requests only once their features are ready, on fresher state.
	ModalityAware = "kv-modality"
)

// Encoding modes: how requests with media wait for their encoder before they are routed.
const (
	EncodeNone  = "none"  // media cost nothing (the text-only baseline)
	EncodeSync  = "sync"  // one front-end queue encodes every request's media in arrival order: text waits behind media
	EncodeAsync = "async" // media go to an encoder pool; text-only requests are routed at once
	// WithoutMedia labels Options.Baseline's runs: the trace with its media taken out.
	WithoutMedia = "without-media"
)

// Encoder is the encode backend the encoding modes run against: how long items take to encode
// once a slot starts them. SimEncoder models one; the daemon's encoder pool (its ETA) is the
// real one to plug in.
type Encoder interface {
	Encode(items []synth.Media) time.Duration
	Slots() int // items encoded at once (async mode's pool width)
}

// SimEncoder costs PerToken for every media token (default: CLIP ViT-L/14 @336 at batch 1 on
// an A100, 5.36 ms per 577 tokens, from FasterTransformer) and PerFrame for every frame of a
// video that says its frames (default: one such image a frame: the vision tower sees every
// sampled frame before any temporal merge shrinks its tokens), with Workers slots.
type SimEncoder struct {
	PerToken, PerFrame time.Duration
	Workers            int
}

// DefaultSimEncoder is about one A100's ViT-L at batch 1, two encodes at once.
func DefaultSimEncoder() SimEncoder {
	return SimEncoder{PerToken: 5360 * time.Microsecond / 577, PerFrame: 5360 * time.Microsecond, Workers: 2}
}

func (s SimEncoder) Encode(items []synth.Media) time.Duration {
	var d time.Duration
	for _, m := range items {
		if m.Frames > 0 && s.PerFrame > 0 {
			d += time.Duration(m.Frames) * s.PerFrame
		} else {
			d += time.Duration(m.Tokens) * s.PerToken
		}
	}
	return d
}

func (s SimEncoder) Slots() int { return max(s.Workers, 1) }

// Calibrate measures a real encoder: run encodes one batch of tokens media tokens (one picture);
// the median of runs timed calls becomes PerFrame (a video frame is one such picture) and, per
// token, PerToken, with slots encodes at once.
func Calibrate(run func() error, tokens, runs, slots int) (SimEncoder, error) {
	if tokens <= 0 || runs <= 0 || slots <= 0 {
		return SimEncoder{}, &ErrOptions{"Encoder", fmt.Sprintf("calibration with %d tokens, %d runs, %d slots", tokens, runs, slots)}
	}
	times := make([]time.Duration, runs)
	for i := range times {
		t0 := time.Now()
		if err := run(); err != nil {
			return SimEncoder{}, fmt.Errorf("calibrating the encoder: %w", err)
		}
		times[i] = time.Since(t0)
	}
	slices.Sort(times)
	return SimEncoder{PerToken: times[runs/2] / time.Duration(tokens), PerFrame: times[runs/2], Workers: slots}, nil
}

// Options configure a comparison. DefaultOptions has the defaults.
type Options struct {
	Engines   int            // mock engines; 4
	Engine    mocker.Options // each engine; DefaultOptions with 512-token blocks (Mooncake's), 2,048 blocks (1M tokens)
	Policies  []string       // run in order; round-robin, random, kv (kv-modality also known)
	Encodings []string       // none
	Encoder   Encoder        // DefaultSimEncoder
	Router    router.Options // for kv; DefaultOptions with the engines' block size and prefill speed
	Vocab     int            // token ids in synthesized prompts; 32,000
	Seed      uint64         // engines' and the random policy's; 0: random
	// Baseline also runs each policy on the trace without its media (synth.WithoutMedia:
	// Encoding WithoutMedia; its ByClass classes each request as the trace does, so a class
	// compares the same requests) and sets each media run's TextVsBaseline.
	Baseline bool
	// Overlaps: run each (policy, encoding) once per value; true warms the chosen engine's
	// prefix cache while a media request encodes (overlap.go; with kv-modality only, which
	// picks the engine while encoding; the other policies run without). OverlapMinTokens: the least text before the first item worth a
	// warm-up. nil: {false}; 1,024.
	Overlaps         []bool
	OverlapMinTokens int
	// The disaggregated policies' fleet (disagg.go): prefill and decode engines (Engines is
	// unused), laid over Layout, the KV cache's move timed by Transfer; their router's mismatch
	// policy and transfer weight. 0, 0, no zones, instant, fail, 1.
	Prefill, Decode int
	Layout          topology.Layout
	Transfer        mocker.KVTransfer
	MismatchPolicy  topology.Policy
	TransferWeight  float64
}

// DefaultOptions: 4 engines as above, the three policies, no encoding.
func DefaultOptions() Options {
	e := mocker.DefaultOptions()
	e.BlockSize, e.Blocks = 512, 2048
	r := router.DefaultOptions()
	r.BlockSize = e.BlockSize
	r.PrefillSecondsPerToken = 15.18e-6 // the mocker's linear prefill term (bench/mocker/perf.go)
	return Options{Engines: 4, Engine: e, Policies: []string{RoundRobin, Random, KVAware}, Encodings: []string{EncodeNone},
		Encoder: DefaultSimEncoder(), Router: r, Vocab: 32000, OverlapMinTokens: 1024, MismatchPolicy: topology.Fail, TransferWeight: 1,
		Transfer: mocker.KVTransfer{BytesPerToken: r.Disagg.KVBytesPerToken}}
}

// Latency summarises one metric in milliseconds.
type Latency struct{ P50, P90, P99, Mean float64 }

// Result is one run.
type Result struct {
	Policy, Encoding  string
	Overlap           bool // prefix warm-ups while media encode (Options.Overlaps)
	Requests          int
	Rejected          int     // requests an engine refused (queue full, too long for its cache)
	TTFT, ITL, E2E    Latency // ms; TTFT and E2E from arrival, encode wait included
	CacheHit          float64 // prompt tokens the engines found cached / prompt tokens
	OutputTokensPerS  float64 // generated tokens / makespan
	Preemptions       int64
	Makespan          time.Duration // first arrival to last token
	PerRequestTTFT    []float64     // ms, in trace order (NaN for rejected)
	SimulatedDuration time.Duration
	ByClass           []ClassTTFT // TTFT per request class (synth.Class), the classes present, in synth.Classes order
	// With Options.Baseline: the text-only requests' TTFT p99 here ÷ the same requests' TTFT
	// p99 in the policy's WithoutMedia run (what the media cost them); 0 otherwise.
	TextVsBaseline float64
	// Media requests' TTFT by the length of the text before their first item (PrefixBuckets),
	// and the warm-ups sent and skipped (prefix too short, already cached there) with Overlap.
	ByPrefix              []PrefixTTFT
	Warmups, WarmupsShort int
	WarmupsCached         int
	// Disaggregated policies: the KV cache's move from the prefill to the decode engine (ms),
	// and the share of requests whose move crossed the QoS table's broadest level (zones).
	KVMove  Latency
	Crossed float64
}

// ClassTTFT is one request class's TTFT (ms; rejected requests left out).
type ClassTTFT struct {
	Class    string
	Requests int
	TTFT     Latency
}

// ErrOptions names an unusable option.
type ErrOptions struct{ Field, Problem string }

func (e *ErrOptions) Error() string { return "ab: " + e.Field + " " + e.Problem }

// Run replays recs once per (policy, encoding), in that nesting order.
func Run(ctx context.Context, recs []synth.Record, opts Options) ([]Result, error) {
	if opts.Engines <= 0 {
		return nil, &ErrOptions{"Engines", fmt.Sprintf("%d: must be positive", opts.Engines)}
	}
	if opts.Router.BlockSize != opts.Engine.BlockSize {
		return nil, &ErrOptions{"Router.BlockSize", fmt.Sprintf("%d differs from the engines' %d: nothing would match", opts.Router.BlockSize, opts.Engine.BlockSize)}
	}
	if len(recs) == 0 {
		return nil, &ErrOptions{"trace", "is empty"}
	}
	for _, p := range opts.Policies {
		if p != RoundRobin && p != Random && p != KVAware && p != ModalityAware && !isDisagg(p) {
			return nil, &ErrOptions{"Policies", fmt.Sprintf("%q (want %s, %s, %s, %s, or disaggregated: %s, %s, %s, %s, %s)", p, RoundRobin, Random, KVAware, ModalityAware,
				DisaggRandom, Disagg, DisaggTopology, DisaggSoft, DisaggTopologySoft)}
		}
		if isDisagg(p) && (len(opts.Encodings) != 1 || opts.Encodings[0] != EncodeNone) {
			return nil, &ErrOptions{"Encodings", fmt.Sprintf("%v: the disaggregated policies run with %s only", opts.Encodings, EncodeNone)}
		}
	}
	overlaps := opts.Overlaps
	if len(overlaps) == 0 {
		overlaps = []bool{false}
	}
	for _, o := range overlaps {
		if o && !slices.Contains(opts.Policies, ModalityAware) {
			return nil, &ErrOptions{"Overlaps", fmt.Sprintf("warm-ups need the engine picked while media encode: policy %s (got %v)", ModalityAware, opts.Policies)}
		}
	}
	for _, e := range opts.Encodings {
		if e != EncodeNone && e != EncodeSync && e != EncodeAsync {
			return nil, &ErrOptions{"Encodings", fmt.Sprintf("%q (want %s, %s or %s)", e, EncodeNone, EncodeSync, EncodeAsync)}
		}
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	prompts := makePrompts(recs, opts)
	var out []Result
	for _, pol := range opts.Policies {
		var base *Result
		if opts.Baseline && !isDisagg(pol) {
			plain := makePrompts(synth.WithoutMedia(recs, opts.Engine.BlockSize), opts)
			for i := range plain { // classed as in the trace: the same requests compared class by class
				plain[i].class = prompts[i].class
			}
			res, err := runOne(ctx, plain, opts, pol, EncodeNone, seed, false)
			if err != nil {
				return out, err
			}
			res.Encoding = WithoutMedia
			out = append(out, res)
			base = &out[len(out)-1]
		}
		for _, enc := range opts.Encodings {
			for _, ov := range overlaps {
				if ov && pol != ModalityAware {
					continue // the other policies pick engines once features are ready: nothing to warm meanwhile
				}
				var res Result
				var err error
				if isDisagg(pol) {
					res, err = runDisagg(ctx, prompts, opts, pol, seed)
				} else {
					res, err = runOne(ctx, prompts, opts, pol, enc, seed, ov)
				}
				if err != nil {
					return out, err
				}
				if base != nil {
					res.TextVsBaseline = textVsBaseline(prompts, res.PerRequestTTFT, base.PerRequestTTFT)
				}
				out = append(out, res)
			}
		}
	}
	return out, nil
}

func makePrompts(recs []synth.Record, opts Options) []prompt {
	prompts := make([]prompt, len(recs))
	for i := range recs {
		toks, spans := synth.PromptTokens(&recs[i], opts.Engine.BlockSize, opts.Vocab)
		p := prompt{rec: &recs[i], tokens: make([]uint32, len(toks)), class: synth.Class(&recs[i])}
		for j, t := range toks {
			p.tokens[j] = uint32(t)
		}
		for _, s := range spans {
			p.media = append(p.media, router.Media{Hash: router.MediaHash(s.ID), Offset: s.Start, Length: s.End - s.Start})
			p.mediaIDs = append(p.mediaIDs, s.ID)
		}
		prompts[i] = p
	}
	return prompts
}

// textVsBaseline is the TTFT p99 of the requests that are text-only in prompts, in ttft ÷ in
// base (both per request, in trace order; rejected requests, NaN, left out).
func textVsBaseline(prompts []prompt, ttft, base []float64) float64 {
	var a, b []float64
	for i := range prompts {
		if prompts[i].class != synth.ClassText {
			continue
		}
		if !math.IsNaN(ttft[i]) {
			a = append(a, ttft[i])
		}
		if !math.IsNaN(base[i]) {
			b = append(b, base[i])
		}
	}
	if len(a) == 0 || len(b) == 0 {
		return 0
	}
	return synth.Summarize(a).P99 / synth.Summarize(b).P99
}

type prompt struct {
	class    string
	rec      *synth.Record
	tokens   []uint32
	media    []router.Media
	mediaIDs []string
}

// reqState records one request's timeline (engine time).
type reqState struct {
	arrival, first, last time.Duration
	gaps                 []float64
	cached, promptToks   int
	done, rejected       bool
}

func runOne(ctx context.Context, prompts []prompt, opts Options, policy, encoding string, seed uint64, overlap bool) (Result, error) {
	rt, err := router.New(opts.Router)
	if err != nil {
		return Result{}, err
	}
	feed, err := kvevents.NewFeed(rt, kvevents.DefaultOptions())
	if err != nil {
		return Result{}, err
	}
	feeds := map[string]*kvevents.Engine{}
	fo := mocker.FleetOptions{Engines: opts.Engines, Prefix: "engine-", Engine: opts.Engine, Clock: mocker.Clock{Virtual: true}}
	fo.Engine.Seed = seed
	kv := policy == KVAware || policy == ModalityAware
	if kv {
		fo.Publisher = mocker.FeedRouter(feeds)
	}
	fleet, err := mocker.NewFleet(fo)
	if err != nil {
		return Result{}, err
	}
	index := map[string]int{}
	for i := range fleet.Len() {
		name := fleet.Engine(i).Name()
		index[name] = i
		if feeds[name], err = feed.AddWorker(name); err != nil {
			return Result{}, err
		}
		if err := rt.SetCapacity(name, int64(opts.Engine.Blocks)); err != nil {
			return Result{}, err
		}
	}
	loop := fleet.Loop(0)
	states := make([]reqState, len(prompts))
	rnd := rand.New(rand.NewPCG(seed, 0xab))
	next := 0
	var decision router.Decision
	w := warmer{prompts: prompts, fleet: fleet, decision: &decision, minTokens: opts.OverlapMinTokens, blockSize: opts.Engine.BlockSize}
	epoch := time.Unix(0, 0)
	// pick chooses request i's engine at the loop's time now; wait is how long until its
	// features are ready (modality-aware only). -1: rejected.
	pick := func(i int, now, wait time.Duration) int {
		p := &prompts[i]
		switch policy {
		case RoundRobin:
			eng := next
			next = (next + 1) % fleet.Len()
			return eng
		case Random:
			return rnd.IntN(fleet.Len())
		}
		req := router.Request{Tokens: p.tokens, Media: p.media, ReadyIn: rt.BlocksIn(wait.Seconds())}
		if err := rt.Decide(req, &decision); err != nil {
			states[i].rejected = true
			return -1
		}
		_ = rt.Start(strconv.Itoa(i), decision, decision.Worker, epoch.Add(now))
		return index[decision.Worker]
	}
	// submit sends request i to engine eng at the loop's time now.
	submit := func(i, eng int, now time.Duration) {
		p := &prompts[i]
		st := &states[i]
		id := strconv.Itoa(i)
		req := &mocker.Request{ID: id, Tokens: p.tokens, Media: p.media, MediaIDs: p.mediaIDs, MaxTokens: max(p.rec.OutputLength, 1)}
		req.Sink = func(o mocker.Output) {
			if o.First {
				st.first = o.At
				if kv {
					rt.FirstToken(id)
				}
			} else if !o.Done || o.Err == nil {
				st.gaps = append(st.gaps, float64(o.At-st.last)/1e6)
			}
			st.last = o.At
			if o.Done {
				st.done, st.cached, st.promptToks = true, o.CachedTokens, o.PromptTokens
				if kv {
					rt.Finish(id)
				}
			}
		}
		if err := fleet.SubmitAt(eng, req, now); err != nil {
			st.rejected = true
			if kv {
				rt.Finish(id)
			}
		}
	}
	route := func(i int, now time.Duration) {
		if eng := pick(i, now, 0); eng >= 0 {
			submit(i, eng, now)
		}
	}
	// Arrivals, through the encoding mode.
	frontFree := time.Duration(0)                        // sync: when the front-end encoder is next free
	slots := make([]time.Duration, opts.Encoder.Slots()) // async: when each encoder slot is next free
	for i := range prompts {
		p := &prompts[i]
		at := time.Duration(p.rec.Timestamp * float64(time.Millisecond))
		states[i].arrival = at
		ready := at
		switch {
		case encoding == EncodeSync:
			ready = max(at, frontFree) + opts.Encoder.Encode(p.rec.Media)
			frontFree = ready
		case encoding == EncodeAsync && len(p.rec.Media) > 0:
			s := slices.Index(slots, slices.Min(slots))
			ready = max(at, slots[s]) + opts.Encoder.Encode(p.rec.Media)
			slots[s] = ready
		}
		if policy == ModalityAware && ready > at {
			loop.At(at, func(now time.Duration) {
				if eng := pick(i, now, ready-now); eng >= 0 {
					if overlap {
						w.maybe(i, eng, fleet.Engine(eng).Name(), now)
					}
					loop.At(ready, func(now time.Duration) { submit(i, eng, now) })
				}
			})
			continue
		}
		loop.At(ready, func(now time.Duration) { route(i, now) })
	}
	if err := fleet.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	res := summarizeRun(prompts, states, policy, encoding)
	res.Overlap, res.Warmups, res.WarmupsShort, res.WarmupsCached = overlap, w.sent, w.short, w.cached
	for i := range fleet.Len() {
		res.Preemptions += fleet.Engine(i).Stats().Preemptions
	}
	return res, nil
}

// summarizeRun is a run's Result from its requests' timelines (Preemptions left to the caller).
func summarizeRun(prompts []prompt, states []reqState, policy, encoding string) Result {
	res := Result{Policy: policy, Encoding: encoding, Requests: len(prompts)}
	var ttft, itl, e2e []float64
	cached, total, tokens := 0, 0, 0
	first, last := states[0].arrival, time.Duration(0)
	for i := range states {
		st := &states[i]
		if st.rejected || !st.done {
			res.Rejected++
			res.PerRequestTTFT = append(res.PerRequestTTFT, nanF())
			continue
		}
		t := float64(st.first-st.arrival) / 1e6
		ttft = append(ttft, t)
		res.PerRequestTTFT = append(res.PerRequestTTFT, t)
		e2e = append(e2e, float64(st.last-st.arrival)/1e6)
		itl = append(itl, st.gaps...)
		cached += st.cached
		total += st.promptToks
		tokens += prompts[i].rec.OutputLength
		last = max(last, st.last)
	}
	res.TTFT, res.ITL, res.E2E = summarize(ttft), summarize(itl), summarize(e2e)
	res.ByClass = byClass(prompts, res.PerRequestTTFT)
	res.ByPrefix = byPrefix(prompts, res.PerRequestTTFT)
	if total > 0 {
		res.CacheHit = float64(cached) / float64(total)
	}
	res.Makespan = last - first
	if res.Makespan > 0 {
		res.OutputTokensPerS = float64(tokens) / res.Makespan.Seconds()
	}
	res.SimulatedDuration = last
	return res
}

// byClass summarises per-request TTFTs (NaN: rejected) by the requests' classes.
func byClass(prompts []prompt, ttft []float64) []ClassTTFT {
	per := map[string][]float64{}
	count := map[string]int{}
	for i := range prompts {
		c := prompts[i].class
		count[c]++
		if !math.IsNaN(ttft[i]) {
			per[c] = append(per[c], ttft[i])
		}
	}
	var out []ClassTTFT
	for _, c := range synth.Classes {
		if count[c] > 0 {
			out = append(out, ClassTTFT{Class: c, Requests: count[c], TTFT: summarize(per[c])})
		}
	}
	return out
}

func nanF() float64 { return math.NaN() }

func summarize(v []float64) Latency {
	s := synth.Summarize(v)
	return Latency{P50: s.P50, P90: s.P90, P99: s.P99, Mean: s.Mean}
}

// Chart plots each run's TTFT distribution (rejected requests left out) on a log-scaled
// latency axis: policies differ most in their tails.
func Chart(res []Result) plot.Chart {
	var series []plot.Series
	for _, r := range res {
		name := r.Policy + "/" + r.Encoding
		if r.Overlap {
			name += "+overlap"
		}
		series = append(series, plot.CDF(name, r.PerRequestTTFT))
	}
	return plot.Chart{Title: "time to first token by routing policy", XLabel: "TTFT ms (log scale)", YLabel: "fraction of requests",
		XScale: plot.Log10, Series: series}
}
