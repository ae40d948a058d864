package ab

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strconv"
	"time"

	"dataplane/bench/mocker"
	"dataplane/router"
	"dataplane/router/kvevents"
	"dataplane/router/topology"
)

// Disaggregated policies: a fleet of Options.Prefill prefill engines and Options.Decode decode
// engines laid over Options.Layout's zones and racks; each request's prefill step (max_tokens 1)
// runs on a prefill engine, its KV cache then moves to a decode engine (Options.Transfer: the
// link between the two engines' domains), which generates with the prompt received
// (mocker.Request.RemotePrefill). The policies differ only in how the two engines are chosen.
const (
	DisaggRandom = "disagg-random" // prefill and decode engines drawn uniformly (seeded)
	Disagg       = "disagg"        // router.DecideDisagg, topology-unaware: no level, no QoS table
	// DisaggTopology filters decode engines to the prefill engine's zone (seed 004's hard
	// filter, Options.MismatchPolicy).
	DisaggTopology = "disagg-topology"
	// DisaggSoft adds the KV move to the decode cost (Options.Transfer's table as the router's
	// QoS, Options.TransferWeight), with no filter.
	DisaggSoft = "disagg-soft"
	// DisaggTopologySoft is both.
	DisaggTopologySoft = "disagg-topology-soft"
)

func isDisagg(policy string) bool {
	switch policy {
	case DisaggRandom, Disagg, DisaggTopology, DisaggSoft, DisaggTopologySoft:
		return true
	}
	return false
}

// disaggReq is one request's two steps.
type disaggReq struct {
	prefill, decode int           // engines
	prefillDone     time.Duration // the prefill engine's answer
	move            time.Duration // the KV cache's move
	crossed         string        // the level it crossed ("" within every level)
}

// runDisagg replays prompts under a disaggregated policy.
func runDisagg(ctx context.Context, prompts []prompt, opts Options, policy string, seed uint64) (Result, error) {
	if opts.Prefill <= 0 || opts.Decode <= 0 {
		return Result{}, &ErrOptions{"Prefill, Decode", fmt.Sprintf("%d and %d: a disaggregated policy needs both", opts.Prefill, opts.Decode)}
	}
	ro := opts.Router
	ro.Index.MaxWorkers = max(ro.Index.MaxWorkers, opts.Prefill+opts.Decode)
	ro.Disagg.Level, ro.Disagg.QoS = "", topology.QoS{}
	ro.Disagg.Policy, ro.Disagg.TransferWeight, ro.Disagg.KVBytesPerToken = opts.MismatchPolicy, opts.TransferWeight, opts.Transfer.BytesPerToken
	if policy == DisaggTopology || policy == DisaggTopologySoft {
		ro.Disagg.Level = "zone"
	}
	if policy == DisaggSoft || policy == DisaggTopologySoft {
		ro.Disagg.QoS = opts.Transfer.QoS
	}
	rt, err := router.New(ro)
	if err != nil {
		return Result{}, err
	}
	feed, err := kvevents.NewFeed(rt, kvevents.DefaultOptions())
	if err != nil {
		return Result{}, err
	}
	feeds := map[string]*kvevents.Engine{}
	fo := mocker.FleetOptions{Engines: opts.Prefill + opts.Decode, Prefix: "engine-", Engine: opts.Engine, Clock: mocker.Clock{Virtual: true}}
	fo.Engine.Seed = seed
	routed := policy != DisaggRandom
	rnd := rand.New(rand.NewPCG(seed, 0xd15a))
	if routed {
		fo.Publisher = mocker.FeedRouter(feeds)
	}
	fleet, err := mocker.NewFleet(fo)
	if err != nil {
		return Result{}, err
	}
	// Engines 0..Prefill-1 prefill, the rest decode; each role spread over the layout alike.
	labels := make([]map[string]string, fleet.Len())
	index := map[string]int{}
	for i := range fleet.Len() {
		name := fleet.Engine(i).Name()
		role, j := router.RolePrefill, i
		if i >= opts.Prefill {
			role, j = router.RoleDecode, i-opts.Prefill
		}
		labels[i], index[name] = opts.Layout.Labels(j), i
		if feeds[name], err = feed.AddWorker(name); err != nil {
			return Result{}, err
		}
		if err := rt.SetWorkerInfo(name, router.WorkerInfo{Role: role, Labels: maps.Clone(labels[i])}); err != nil {
			return Result{}, err
		}
		if err := rt.SetCapacity(name, int64(opts.Engine.Blocks)); err != nil {
			return Result{}, err
		}
	}
	loop := fleet.Loop(0)
	states := make([]reqState, len(prompts))
	steps := make([]disaggReq, len(prompts))
	var decision router.Decision
	epoch := time.Unix(0, 0)
	reject := func(i int) {
		states[i].rejected = true
		if routed {
			rt.Finish(strconv.Itoa(i))
		}
	}
	// decode sends request i's decode step to its decode engine at now (its KV cache arrived).
	decode := func(i int, now time.Duration) {
		p, st, id := &prompts[i], &states[i], strconv.Itoa(i)
		req := &mocker.Request{ID: id, Tokens: p.tokens, Media: p.media, MediaIDs: p.mediaIDs, MaxTokens: max(p.rec.OutputLength, 1),
			RemotePrefill: true}
		req.Sink = func(o mocker.Output) {
			if o.First {
				st.first = o.At
				if routed {
					rt.FirstToken(id)
				}
			} else if !o.Done || o.Err == nil {
				st.gaps = append(st.gaps, float64(o.At-st.last)/1e6)
			}
			st.last = o.At
			if o.Done {
				st.done = true
				if routed {
					rt.Finish(id)
				}
			}
		}
		if err := fleet.SubmitAt(steps[i].decode, req, now); err != nil {
			reject(i)
		}
	}
	// prefill routes request i at now and sends its prefill step.
	prefill := func(i int, now time.Duration) {
		p, st, sp, id := &prompts[i], &states[i], &steps[i], strconv.Itoa(i)
		if routed {
			if err := rt.Route(router.Request{Tokens: p.tokens, Media: p.media}, &decision); err != nil {
				st.rejected = true
				return
			}
			_ = rt.Start(id, decision, decision.Decode, epoch.Add(now))
			sp.prefill, sp.decode = index[decision.Prefill], index[decision.Decode]
		} else {
			sp.prefill, sp.decode = rnd.IntN(opts.Prefill), opts.Prefill+rnd.IntN(opts.Decode)
		}
		req := &mocker.Request{ID: id + "/prefill", Tokens: p.tokens, Media: p.media, MediaIDs: p.mediaIDs, MaxTokens: 1}
		req.Sink = func(o mocker.Output) {
			if !o.Done {
				return
			}
			if o.Err != nil {
				reject(i)
				return
			}
			st.cached, st.promptToks = o.CachedTokens, o.PromptTokens
			sp.prefillDone = o.At
			if routed {
				rt.PrefillDone(id)
			}
			link, level := opts.Transfer.QoS.Between(labels[sp.prefill], labels[sp.decode])
			sp.crossed = level
			if !opts.Transfer.QoS.Empty() {
				sp.move = time.Duration(link.Seconds(float64(len(p.tokens))*opts.Transfer.BytesPerToken) * float64(time.Second))
			}
			loop.At(o.At+sp.move, func(now time.Duration) { decode(i, now) })
		}
		if err := fleet.SubmitAt(sp.prefill, req, now); err != nil {
			reject(i)
		}
	}
	for i := range prompts {
		at := time.Duration(prompts[i].rec.Timestamp * float64(time.Millisecond))
		states[i].arrival = at
		loop.At(at, func(now time.Duration) { prefill(i, now) })
	}
	if err := fleet.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	res := summarizeRun(prompts, states, policy, EncodeNone)
	var moves []float64
	crossed := 0
	for i := range steps {
		if st := &states[i]; st.rejected || !st.done {
			continue
		}
		moves = append(moves, float64(steps[i].move)/1e6)
		if steps[i].crossed != "" && len(opts.Transfer.QoS.Levels) > 0 && steps[i].crossed == opts.Transfer.QoS.Levels[0].Level {
			crossed++
		}
	}
	res.KVMove = summarize(moves)
	if len(moves) > 0 {
		res.Crossed = float64(crossed) / float64(len(moves))
	}
	for i := range fleet.Len() {
		res.Preemptions += fleet.Engine(i).Stats().Preemptions
	}
	return res, nil
}
