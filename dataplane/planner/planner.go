package planner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"
)

// Pool names a pool the planner scales.
type Pool string

// The two pools. A fleet of aggregated workers has only Decode.
const (
	PoolPrefill Pool = "prefill"
	PoolDecode  Pool = "decode"
)

// Source reads the load once per pull: the sample and the pools' worker counts now.
type Source interface {
	Pull(ctx context.Context) (Sample, Pools, error)
}

// Backend adds or removes one worker of a pool and returns when the change is complete (the
// new worker is serving, or the removed one has left routing and exited), or failed.
type Backend interface {
	Add(ctx context.Context, p Pool) error
	Remove(ctx context.Context, p Pool) error
}

// Manager is a Backend that scales only some pools (a statefile or a kubernetes target per
// pool): the planner holds the others, whatever their load, since no change to them can be
// made (a disaggregated fleet whose decode workers someone else runs).
type Manager interface {
	Manages(p Pool) bool
}

// Planner is the live loop: a pull every PullInterval, a decision every AdjustInterval,
// changes applied one at a time and waited for (nothing is pulled or decided meanwhile, as in
// Dynamo: a planner that adjusts while a change settles overcompensates).
type Planner struct {
	Rules   Rules
	Source  Source
	Backend Backend // nil with NoOperation
	// NoOperation only observes: decisions are logged and counted, never applied.
	NoOperation bool
	Log         *slog.Logger
	Metrics     *Metrics // nil: none
	// SLA, when set, sizes the pools by the profile instead of the load thresholds.
	SLA *SLATarget
	// Record, when set, gets every pull as an observation line `plan replay` reads.
	Record io.Writer

	iv        *Interval
	start     time.Time // the interval's start
	startPool Pools     // the pools at its first pull
	lastPool  Pools     // and at its last
	pulled    bool      // the interval has had a pull
}

// Run pulls and adjusts until ctx ends.
func (p *Planner) Run(ctx context.Context) error {
	if err := p.Rules.Check(); err != nil {
		return err
	}
	if p.Backend == nil && !p.NoOperation {
		return errors.New("planner: no backend (and not --no-operation)")
	}
	t := time.NewTicker(p.Rules.PullInterval)
	defer t.Stop()
	for {
		p.Step(ctx, time.Now())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Step is one tick of the loop at now: a pull, and at the interval's end a decision and its
// changes. Run calls it; tests call it with their own clock.
func (p *Planner) Step(ctx context.Context, now time.Time) {
	if p.iv == nil {
		p.iv, p.start = NewInterval(p.Rules), now
		if p.Log == nil {
			p.Log = slog.New(slog.DiscardHandler)
		}
	}
	// The interval [start, start + AdjustInterval) is decided before this tick's pull, which
	// belongs to the next one: replay draws the same boundaries.
	if now.Sub(p.start) >= p.Rules.AdjustInterval {
		now = p.adjust(ctx, now)
	}
	s, pools, err := p.Source.Pull(ctx)
	if err != nil {
		p.Log.Warn("planner: pull failed", "err", err)
		p.Metrics.pullFailed()
		return
	}
	p.iv.Add(s)
	if !p.pulled {
		p.startPool, p.pulled = pools, true
	}
	p.lastPool = pools
	p.Log.Debug("planner: pulled", "prefill_queue", s.PrefillQueue, "decode_kv", s.DecodeKV, "prefill", pools.Prefill, "decode", pools.Decode)
	p.Metrics.pulled(s, pools, p.Rules)
	if p.Record != nil {
		if _, err := p.Record.Write(ObservationLine(s)); err != nil {
			p.Log.Warn("planner: recording a pull failed", "err", err)
		}
	}
}

// adjust ends the interval at now: a decision (applied and waited for, unless NoOperation)
// or a skip; it returns when the next interval starts.
func (p *Planner) adjust(ctx context.Context, now time.Time) time.Time {
	began := time.Now()
	switch {
	case !p.pulled:
		p.Log.Warn("planner: no pull succeeded in the interval: holding")
		p.iv.Skip()
		p.Metrics.decided("skipped")
	case p.lastPool != p.startPool:
		// As Dynamo: someone else changed the fleet during the interval; its means describe
		// neither fleet.
		p.Log.Info("planner: workers changed during the interval: no adjustment", "prefill", p.lastPool.Prefill, "decode", p.lastPool.Decode,
			"prefill_at_start", p.startPool.Prefill, "decode_at_start", p.startPool.Decode)
		p.iv.Skip()
		p.Metrics.decided("skipped")
	default:
		var d Decision
		if p.SLA != nil {
			d = p.iv.DecideSLA(p.startPool, p.SLA)
		} else {
			d = p.iv.Decide(p.startPool)
		}
		p.unmanaged(&d)
		p.Log.Info("planner: decision", "action", d.Action(), "operate", !p.NoOperation, "samples", d.Samples,
			"avg_prefill_queue", nanNil(d.AvgPrefillQueue), "avg_decode_kv", nanNil(d.AvgDecodeKV), "predicted_prefill_queue", nanNil(d.Predicted),
			"prefill", p.startPool.Prefill, "decode", p.startPool.Decode, "grace", p.iv.Grace(), "why", d.Reasons)
		p.Metrics.decision(d)
		if !p.NoOperation && d.Action() != "hold" {
			p.apply(ctx, d)
			// The next interval starts when the changes are complete.
			now = now.Add(time.Since(began))
		}
	}
	p.start, p.pulled = now, false
	return now
}

// unmanaged holds the pools the backend does not scale, saying so in the decision's reasons.
func (p *Planner) unmanaged(d *Decision) {
	m, ok := p.Backend.(Manager)
	if !ok {
		return
	}
	for _, c := range []struct {
		pool  Pool
		delta *int
	}{{PoolPrefill, &d.Prefill}, {PoolDecode, &d.Decode}} {
		if *c.delta != 0 && !m.Manages(c.pool) {
			d.Reasons = append(d.Reasons, fmt.Sprintf("%s: %+d held: the backend does not scale this pool", c.pool, *c.delta))
			*c.delta = 0
		}
	}
}

// apply makes the decision's changes, scale-downs first (they free the GPUs the scale-ups use).
func (p *Planner) apply(ctx context.Context, d Decision) {
	type change struct {
		pool  Pool
		delta int
	}
	var changes []change
	for _, c := range []change{{PoolPrefill, d.Prefill}, {PoolDecode, d.Decode}} {
		if c.delta < 0 {
			changes = append(changes, c)
		}
	}
	for _, c := range []change{{PoolPrefill, d.Prefill}, {PoolDecode, d.Decode}} {
		if c.delta > 0 {
			changes = append(changes, c)
		}
	}
	for _, c := range changes {
		began := time.Now()
		var err error
		dir := "add"
		if c.delta > 0 {
			err = p.Backend.Add(ctx, c.pool)
		} else {
			dir = "remove"
			err = p.Backend.Remove(ctx, c.pool)
		}
		took := time.Since(began)
		p.Metrics.changed(c.pool, dir, err, took)
		if err != nil {
			p.Log.Error("planner: change failed", "pool", c.pool, "change", dir, "took", took, "err", err)
			continue
		}
		p.Log.Info("planner: change complete", "pool", c.pool, "change", dir, "took", took)
	}
}

func nanNil(v float64) any {
	if math.IsNaN(v) {
		return nil
	}
	return v
}

// ErrNoWorker is a Remove with no worker of the pool left to remove.
var ErrNoWorker = errors.New("no worker of the pool to remove")

func poolCheck(p Pool) error {
	if p != PoolPrefill && p != PoolDecode {
		return fmt.Errorf("pool %q: want prefill or decode", p)
	}
	return nil
}
