package dataplane

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"dataplane/dataplane/worker"
)

// Worker health. One goroutine, the prober (started by NewService, stopped and waited for by
// Close), asks every worker that is a worker.Prober how it is every HealthInterval, each probe
// bounded by HealthTimeout, all of a round's probes at once (up to maxProbesInFlight). After
// HealthFailures failures in a row a worker leaves routing (router.SetHealthy) and its blocks
// leave the index (kvevents.Feed.Forget: its engine replays them from 0 at its next batch); the
// first probe that succeeds brings it back into routing. A request that finds a worker
// unavailable (worker.ErrUnavailable) takes it out of routing at once (markDown), but requests
// never bring a worker back: only the prober does, so no client request is spent finding out
// whether a dead worker came back.

// maxProbesInFlight bounds a round's concurrent probes: every HTTP engine of a node at once, a
// large mock fleet (trivial probes) by a pool.
const maxProbesInFlight = 256

// workerEntry is one LLM worker and its health.
type workerEntry struct {
	w     worker.Worker
	name  string        // the router's name for it (an HTTP worker's address)
	label string        // what clients read (worker.Label): never an address
	probe worker.Prober // nil: always healthy

	// s.healthMu guards these.
	healthy   bool // in routing
	failures  int  // failed probes in a row
	forgotten bool // its blocks were dropped from the index since it last was healthy
	removed   bool // RemoveWorker took it out: probes and failures no longer apply

	probeOK, probeFailed prometheus.Counter
}

// healthMetrics count probes; whether a worker is in routing is the router's
// dataplane_router_worker_healthy.
type healthMetrics struct {
	probes *prometheus.CounterVec
}

func newHealthMetrics() *healthMetrics {
	return &healthMetrics{
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dataplane_worker_probes_total",
			Help: "Health probes of LLM workers, by result (ok, failed)."}, []string{"worker", "result"}),
	}
}

// newEntry is w, healthy, with its metrics.
func (s *Service) newEntry(w worker.Worker) *workerEntry {
	e := &workerEntry{w: w, name: w.Name(), label: worker.Label(w), healthy: true,
		probeOK:     s.health.probes.WithLabelValues(w.Name(), "ok"),
		probeFailed: s.health.probes.WithLabelValues(w.Name(), "failed")}
	e.probe, _ = w.(worker.Prober)
	s.healthy.Add(1)
	return e
}

// startProber starts the prober goroutine; Close stops it.
func (s *Service) startProber() {
	ctx, cancel := context.WithCancel(context.Background())
	s.stopProber = cancel
	s.prober.Go(func() {
		tick := time.NewTicker(s.opts.HealthInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			s.probeRound(ctx)
		}
	})
}

// probeRound probes every worker at once and applies the results.
func (s *Service) probeRound(ctx context.Context) {
	entries := s.entries()
	errs := make([]error, len(entries))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(len(entries), maxProbesInFlight) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(entries); i = int(next.Add(1) - 1) {
				if p := entries[i].probe; p != nil {
					pctx, cancel := context.WithTimeout(ctx, s.opts.HealthTimeout)
					errs[i] = p.Health(pctx)
					cancel()
				}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // closing: a probe cut short says nothing
	}
	for i, e := range entries {
		s.probed(e, errs[i])
	}
}

// probed applies one probe's result to its worker.
func (s *Service) probed(e *workerEntry, err error) {
	s.healthMu.Lock()
	if e.removed { // probed before RemoveWorker took it out
		s.healthMu.Unlock()
		return
	}
	back, down, forget := false, false, false
	if err == nil {
		if e.probe != nil {
			e.probeOK.Inc()
		}
		e.failures = 0
		if !e.healthy {
			s.setHealthy(e, true)
			e.forgotten, back = false, true
		}
	} else {
		e.probeFailed.Inc()
		e.failures++
		if e.failures >= s.opts.HealthFailures {
			if e.healthy {
				s.setHealthy(e, false)
				down = true
			}
			if !e.forgotten {
				e.forgotten, forget = true, true
			}
		}
	}
	failures := e.failures
	s.healthMu.Unlock()
	switch {
	case back:
		s.log.Info("LLM worker healthy again: back in routing", "worker", e.name, "label", e.label)
	case down:
		s.log.Warn("LLM worker failed its health probes: out of routing", "worker", e.name, "label", e.label, "failures", failures, "err", err)
	}
	if forget { // only this goroutine brings a worker back, so this runs before any return
		if ferr := s.feed.Forget(e.name); ferr != nil {
			s.log.Warn("dropping a worker's blocks from the index", "worker", e.name, "err", ferr)
		}
	}
}

// markDown takes a worker a request found unavailable out of routing until a probe succeeds.
func (s *Service) markDown(e *workerEntry, cause error) {
	s.healthMu.Lock()
	was := e.healthy && !e.removed
	if was {
		s.setHealthy(e, false)
	}
	s.healthMu.Unlock()
	if was {
		s.log.Warn("LLM worker unavailable: out of routing until a health probe succeeds", "worker", e.name, "label", e.label, "err", cause)
	}
}

// setHealthy puts a worker in or out of routing. s.healthMu must be held.
func (s *Service) setHealthy(e *workerEntry, healthy bool) {
	e.healthy = healthy
	s.router.SetHealthy(e.name, healthy) //nolint:errcheck // every entry is registered with the router
	if healthy {
		s.healthy.Add(1)
	} else {
		s.healthy.Add(-1)
	}
}

// isHealthy says whether a worker is in routing now.
func (s *Service) isHealthy(e *workerEntry) bool {
	s.healthMu.Lock()
	defer s.healthMu.Unlock()
	return e.healthy
}

// retryAfter is what a client that found no worker to take its request is told to wait: about
// one probe round, at least a second.
func (s *Service) retryAfter() time.Duration { return max(s.opts.HealthInterval, time.Second) }

// unavailable says whether a worker's failure means it cannot take requests now.
func unavailable(err error) bool { return errors.Is(err, worker.ErrUnavailable) }
