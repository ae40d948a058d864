package loadgen

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"dataplane/bench/mocker"
	"dataplane/bench/synth"
	"dataplane/router"
)

// RunInProcess replays recs open-loop against a running real-time fleet without HTTP: request
// i goes at its (scaled) trace time to the engine opts.Route picks (engine i mod N without
// one), and its outputs are timed on the wall clock as the engines deliver them, so a fleet
// that cannot keep up shows it in the latencies. This is how fleets too large for a socket
// each (10,000 engines) are measured. Only Speedup, MaxInFlight, BlockSize, Vocab, Progress
// and Route apply. If ctx ends first, only the error is returned (the fleet may have stopped
// with requests in flight).
func RunInProcess(ctx context.Context, f *mocker.Fleet, recs []synth.Record, opts Options) (*Report, error) {
	if !(opts.Speedup > 0) {
		return nil, &ErrOptions{"Speedup", "must be positive"}
	}
	if opts.MaxInFlight <= 0 {
		return nil, &ErrOptions{"MaxInFlight", "must be positive"}
	}
	rep := &Report{Samples: make([]Sample, len(recs))}
	var wg sync.WaitGroup
	var inFlight, done, failed atomic.Int64
	start := time.Now()
	prog := newProgress(opts.Progress, len(recs))
	stop := prog.run(start, &done, &failed, func() int { return int(inFlight.Load()) })
	var t0 float64
	if len(recs) > 0 {
		t0 = recs[0].Timestamp
	}
	for i := range recs {
		s := &rep.Samples[i]
		eng := i % f.Len()
		s.Index, s.PromptTokens, s.Class = i, recs[i].InputLength, synth.Class(&recs[i])
		if !s.waitTurn(ctx, start, recs[i].Timestamp-t0, opts.Speedup) {
			continue
		}
		if inFlight.Load() >= int64(opts.MaxInFlight) {
			s.Skipped = true
			done.Add(1)
			continue
		}
		req, err := inprocRequest(&recs[i], opts)
		if err != nil {
			s.Err = err.Error()
			continue
		}
		req.ID = strconv.Itoa(i)
		route := opts.Route
		if route != nil {
			// Routed when it is sent, as a front end would: the router sees the fleet as it is now.
			if eng, err = route.Pick(req.ID, req); err != nil {
				s.Err = err.Error()
				failed.Add(1)
				done.Add(1)
				continue
			}
		}
		s.Endpoint = f.Engine(eng).Name()
		s.Sent = time.Since(start)
		var last time.Duration
		req.Sink = func(o mocker.Output) { // on the engine's loop goroutine
			now := time.Since(start)
			if route != nil {
				switch {
				case o.Done:
					route.Done(req.ID)
				case o.First:
					route.FirstToken(req.ID)
				}
			}
			if o.Err == nil {
				if s.OutputTokens == 0 {
					s.TTFT = now - s.Sent
				} else {
					s.ITL = append(s.ITL, now-last)
				}
				s.OutputTokens++
				last = now
			}
			if o.Done {
				s.E2E, s.CachedTokens = now-s.Sent, o.CachedTokens
				if o.Err != nil {
					s.Err = o.Err.Error()
					failed.Add(1)
				}
				inFlight.Add(-1)
				done.Add(1)
				wg.Done()
			}
		}
		inFlight.Add(1)
		wg.Add(1)
		l, e := f.Loop(eng), f.Engine(eng)
		l.Do(func(now time.Duration) {
			wake, err := e.Submit(req, now)
			if err != nil {
				if route != nil {
					route.Done(req.ID)
				}
				s.Err = err.Error()
				failed.Add(1)
				inFlight.Add(-1)
				done.Add(1)
				wg.Done()
				return
			}
			if wake {
				l.Wake(e)
			}
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done(): // the fleet may have stopped: outputs in flight will never come
		stop()
		return nil, ctx.Err()
	}
	stop()
	rep.Duration = time.Since(start)
	return rep, nil
}

// inprocRequest makes a record's prompt for an engine.
func inprocRequest(rec *synth.Record, opts Options) (*mocker.Request, error) {
	toks, spans := synth.PromptTokens(rec, opts.BlockSize, opts.Vocab)
	r := &mocker.Request{Tokens: make([]uint32, len(toks)), MaxTokens: max(rec.OutputLength, 1)}
	for i, t := range toks {
		r.Tokens[i] = uint32(t)
	}
	for _, m := range spans {
		r.Media = append(r.Media, router.Media{Hash: router.MediaHash(m.ID), Offset: m.Start, Length: m.End - m.Start})
		r.MediaIDs = append(r.MediaIDs, m.ID)
	}
	return r, nil
}
