// Package planner scales the prefill and decode pools of a fleet by their load: it pulls the
// prefill queue and the decode workers' KV-cache use every pulling interval, and at the end of
// every adjustment interval compares the interval's averages with thresholds and adds or
// removes at most one worker per pool, through a backend (local processes, Kubernetes). The
// rules follow Dynamo's load-based planner (seed 003; see README.md for the source).
package planner

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Rules are the planner's thresholds, budgets and intervals.
type Rules struct {
	PullInterval   time.Duration // --metric-pulling-interval
	AdjustInterval time.Duration // --adjustment-interval

	DecodeKVUp, DecodeKVDown         float64 // mean KV-cache use of decode workers, 0..1
	PrefillQueueUp, PrefillQueueDown float64 // requests waiting for prefill per prefill worker

	MinGPU, MaxGPU           int // GPU budget of both pools together (MinGPU 0: none)
	PrefillGPUs, DecodeGPUs  int // GPUs one worker of each pool uses
	MinEndpoint              int // the fewest workers a non-empty pool keeps
	DecodeGrace, TrendBuffer int // intervals: no decode scale-down after an add; prefill trend horizon
}

// Seed 003's grace periods (Dynamo: NEW_DECODE_WORKER_GRACE_PERIOD and
// NEW_PREFILL_WORKER_QUEUE_BUFFER_PERIOD).
const (
	DefaultDecodeGrace = 3
	DefaultTrendBuffer = 3
)

// DefaultRules are issue 25's defaults (the prefill-queue thresholds as seed 003 has them).
func DefaultRules() Rules {
	return Rules{
		PullInterval: time.Second, AdjustInterval: 30 * time.Second,
		DecodeKVUp: 0.9, DecodeKVDown: 0.5, PrefillQueueUp: 0.5, PrefillQueueDown: 0.2,
		MaxGPU: 8, PrefillGPUs: 1, DecodeGPUs: 1, MinEndpoint: 1,
		DecodeGrace: DefaultDecodeGrace, TrendBuffer: DefaultTrendBuffer,
	}
}

// Check validates the rules; errors name the flag.
func (r Rules) Check() error {
	switch {
	case r.PullInterval <= 0 || r.AdjustInterval < r.PullInterval:
		return fmt.Errorf("--metric-pulling-interval %v, --adjustment-interval %v: want 0 < pulling <= adjustment", r.PullInterval, r.AdjustInterval)
	case !(r.DecodeKVDown >= 0 && r.DecodeKVDown < r.DecodeKVUp):
		return fmt.Errorf("--decode-kv-scale-down-threshold %v, --decode-kv-scale-up-threshold %v: want 0 <= down < up", r.DecodeKVDown, r.DecodeKVUp)
	case !(r.PrefillQueueDown >= 0 && r.PrefillQueueDown < r.PrefillQueueUp):
		return fmt.Errorf("--prefill-queue-scale-down-threshold %v, --prefill-queue-scale-up-threshold %v: want 0 <= down < up", r.PrefillQueueDown, r.PrefillQueueUp)
	case r.PrefillGPUs < 1 || r.DecodeGPUs < 1:
		return fmt.Errorf("--prefill-engine-num-gpu %d, --decode-engine-num-gpu %d: at least 1", r.PrefillGPUs, r.DecodeGPUs)
	case r.MinGPU < 0 || r.MaxGPU < r.MinGPU || r.MaxGPU < 1:
		return fmt.Errorf("--min-gpu-budget %d, --max-gpu-budget %d: want 0 <= min <= max, max >= 1", r.MinGPU, r.MaxGPU)
	case r.MinEndpoint < 1:
		return fmt.Errorf("--min-endpoint %d: at least 1", r.MinEndpoint)
	case r.DecodeGrace < 0 || r.TrendBuffer < 0:
		return errors.New("grace and trend periods: at least 0")
	}
	return nil
}

// Sample is one metric pull. A NaN field was not measured (no such workers, or the pull of it
// failed); it is left out of the interval's mean.
type Sample struct {
	T            float64 // seconds, any origin
	PrefillQueue float64 // requests waiting for prefill per prefill worker
	DecodeKV     float64 // mean KV-cache use of decode (or aggregated) workers, 0..1
	// For SLA mode: prompt tokens waiting for prefill on prefill workers, and requests
	// running or waiting on decode workers (NaN: not measured; replay leaves them so).
	PrefillTokens, DecodeRequests float64
}

// Pools are the worker counts of the two pools. Prefill 0 is an aggregated fleet: its one
// pool is Decode and the prefill rules do not apply.
type Pools struct{ Prefill, Decode int }

func (p Pools) gpus(r Rules) int { return p.Prefill*r.PrefillGPUs + p.Decode*r.DecodeGPUs }

// Decision is the outcome of one adjustment interval: the change per pool (-1, 0 or +1), the
// interval's inputs, and why, one reason a pool.
type Decision struct {
	Prefill, Decode int // the change
	AvgPrefillQueue float64
	AvgDecodeKV     float64
	Predicted       float64 // the prefill queue the trend predicts TrendBuffer intervals on; NaN: not computed
	Samples         int
	Reasons         []string
}

// Action is the decision as a short word list: "prefill+1,decode-1", or "hold".
func (d Decision) Action() string {
	var parts []string
	if d.Prefill != 0 {
		parts = append(parts, fmt.Sprintf("prefill%+d", d.Prefill))
	}
	if d.Decode != 0 {
		parts = append(parts, fmt.Sprintf("decode%+d", d.Decode))
	}
	if len(parts) == 0 {
		return "hold"
	}
	return strings.Join(parts, ",")
}

// Interval collects one adjustment interval's samples and decides at its end. It keeps the
// decode grace period across intervals. Not safe for concurrent use.
type Interval struct {
	rules   Rules
	samples []Sample
	grace   int // intervals left in which decode does not scale down
}

// NewInterval starts the first interval; rules must have passed Check.
func NewInterval(r Rules) *Interval {
	// A bounded buffer: one sample a pull, twice over for late ticks.
	return &Interval{rules: r, samples: make([]Sample, 0, 2*r.samplesPerInterval())}
}

func (r Rules) samplesPerInterval() int {
	return int(min(r.AdjustInterval/r.PullInterval+1, 1<<16))
}

// Add records a pull; past twice the interval's worth of pulls the oldest are dropped.
func (iv *Interval) Add(s Sample) {
	if len(iv.samples) == cap(iv.samples) {
		iv.samples = append(iv.samples[:0], iv.samples[1:]...)
	}
	iv.samples = append(iv.samples, s)
}

// Len is the number of samples so far.
func (iv *Interval) Len() int { return len(iv.samples) }

// Grace is the number of coming intervals in which decode does not scale down.
func (iv *Interval) Grace() int { return iv.grace }

// Decide applies the rules to the interval's samples for a fleet of pools and starts the next
// interval. Scale-downs are decided first, then scale-ups against the GPU budget that is left,
// prefill before decode (a prefill queue also fills decode workers' caches), as Dynamo's
// make_adjustments does. The caller applies the decision (or, without operation, records it).
func (iv *Interval) Decide(p Pools) Decision {
	r := iv.rules
	d := Decision{AvgPrefillQueue: math.NaN(), AvgDecodeKV: math.NaN(), Predicted: math.NaN(), Samples: len(iv.samples)}
	var queue []float64
	var kvSum float64
	kvN := 0
	for _, s := range iv.samples {
		if !math.IsNaN(s.PrefillQueue) {
			queue = append(queue, s.PrefillQueue)
		}
		if !math.IsNaN(s.DecodeKV) {
			kvSum += s.DecodeKV
			kvN++
		}
	}
	iv.samples = iv.samples[:0]
	if len(queue) > 0 {
		var sum float64
		for _, q := range queue {
			sum += q
		}
		d.AvgPrefillQueue = sum / float64(len(queue))
	}
	if kvN > 0 {
		d.AvgDecodeKV = kvSum / float64(kvN)
	}
	gpus := p.gpus(r)
	// Scale-downs: comparisons with NaN are false, so an unmeasured pool holds.
	if p.Prefill > 0 && d.AvgPrefillQueue < r.PrefillQueueDown {
		switch {
		case p.Prefill <= r.MinEndpoint:
			d.why("prefill: queue %.3f < %.3f but at the minimum of %d workers", d.AvgPrefillQueue, r.PrefillQueueDown, r.MinEndpoint)
		case gpus-r.PrefillGPUs < r.MinGPU:
			d.why("prefill: queue %.3f < %.3f but %d GPUs would fall under the budget's minimum %d", d.AvgPrefillQueue, r.PrefillQueueDown, gpus-r.PrefillGPUs, r.MinGPU)
		default:
			d.Prefill = -1
			gpus -= r.PrefillGPUs
			d.why("prefill: queue %.3f < %.3f: remove one", d.AvgPrefillQueue, r.PrefillQueueDown)
		}
	}
	if d.AvgDecodeKV < r.DecodeKVDown {
		switch {
		case p.Decode <= r.MinEndpoint:
			d.why("decode: kv %.3f < %.3f but at the minimum of %d workers", d.AvgDecodeKV, r.DecodeKVDown, r.MinEndpoint)
		case iv.grace > 0:
			d.why("decode: kv %.3f < %.3f but in the grace period of a new worker (%d intervals left)", d.AvgDecodeKV, r.DecodeKVDown, iv.grace)
		case gpus-r.DecodeGPUs < r.MinGPU:
			d.why("decode: kv %.3f < %.3f but %d GPUs would fall under the budget's minimum %d", d.AvgDecodeKV, r.DecodeKVDown, gpus-r.DecodeGPUs, r.MinGPU)
		default:
			d.Decode = -1
			gpus -= r.DecodeGPUs
			d.why("decode: kv %.3f < %.3f: remove one", d.AvgDecodeKV, r.DecodeKVDown)
		}
	}
	if p.Prefill > 0 && d.AvgPrefillQueue > r.PrefillQueueUp {
		// The trend: the interval's change, continued for TrendBuffer intervals (a new worker
		// takes about that long to start).
		d.Predicted = queue[len(queue)-1] + (queue[len(queue)-1]-queue[0])*float64(r.TrendBuffer)
		switch {
		case gpus+r.PrefillGPUs > r.MaxGPU:
			d.why("prefill: queue %.3f > %.3f but %d GPUs would exceed the budget %d", d.AvgPrefillQueue, r.PrefillQueueUp, gpus+r.PrefillGPUs, r.MaxGPU)
		case d.Predicted <= r.PrefillQueueUp:
			d.why("prefill: queue %.3f > %.3f but the trend predicts %.3f within %d intervals: hold", d.AvgPrefillQueue, r.PrefillQueueUp, d.Predicted, r.TrendBuffer)
		default:
			d.Prefill = 1
			gpus += r.PrefillGPUs
			d.why("prefill: queue %.3f > %.3f, predicted %.3f: add one", d.AvgPrefillQueue, r.PrefillQueueUp, d.Predicted)
		}
	}
	if d.AvgDecodeKV > r.DecodeKVUp {
		if gpus+r.DecodeGPUs > r.MaxGPU {
			d.why("decode: kv %.3f > %.3f but %d GPUs would exceed the budget %d", d.AvgDecodeKV, r.DecodeKVUp, gpus+r.DecodeGPUs, r.MaxGPU)
		} else {
			d.Decode = 1
			d.why("decode: kv %.3f > %.3f: add one", d.AvgDecodeKV, r.DecodeKVUp)
		}
	}
	// The grace period counts the intervals after the one that added a decode worker.
	if d.Decode == 1 {
		iv.grace = r.DecodeGrace
	} else if iv.grace > 0 {
		iv.grace--
	}
	if len(d.Reasons) == 0 {
		d.why("within thresholds (queue %.3f, kv %.3f)", d.AvgPrefillQueue, d.AvgDecodeKV)
	}
	return d
}

// Skip ends an interval without a decision (the workers changed under it, or a change was
// still in progress): its samples are dropped and the grace period still counts it.
func (iv *Interval) Skip() {
	iv.samples = iv.samples[:0]
	if iv.grace > 0 {
		iv.grace--
	}
}

// DecideSLA ends the interval in SLA mode: the pool sizes the interval's mean load needs
// (target.Needed), approached by at most one worker per pool, within the budgets.
func (iv *Interval) DecideSLA(p Pools, target *SLATarget) Decision {
	r := iv.rules
	d := Decision{AvgPrefillQueue: math.NaN(), AvgDecodeKV: math.NaN(), Predicted: math.NaN(), Samples: len(iv.samples)}
	var tok, req, q, kv float64
	var nTok, nReq, nQ, nKV int
	for _, s := range iv.samples {
		if !math.IsNaN(s.PrefillTokens) {
			tok, nTok = tok+s.PrefillTokens, nTok+1
		}
		if !math.IsNaN(s.DecodeRequests) {
			req, nReq = req+s.DecodeRequests, nReq+1
		}
		if !math.IsNaN(s.PrefillQueue) {
			q, nQ = q+s.PrefillQueue, nQ+1
		}
		if !math.IsNaN(s.DecodeKV) {
			kv, nKV = kv+s.DecodeKV, nKV+1
		}
	}
	iv.samples = iv.samples[:0]
	if nQ > 0 {
		d.AvgPrefillQueue = q / float64(nQ)
	}
	if nKV > 0 {
		d.AvgDecodeKV = kv / float64(nKV)
	}
	if nReq == 0 {
		d.why("sla: no decode load measured: hold")
		return d
	}
	need, err := target.Needed(tok/float64(max(nTok, 1)), req/float64(nReq))
	if err != nil {
		d.why("sla: %v", err)
		return d
	}
	gpus := p.gpus(r)
	step := func(pool string, have, want, gpu int) int {
		switch {
		case want < have && have > r.MinEndpoint && gpus-gpu >= r.MinGPU:
			gpus -= gpu
			d.why("sla: %s needs %d, has %d: remove one", pool, want, have)
			return -1
		case want > have && gpus+gpu <= r.MaxGPU:
			gpus += gpu
			d.why("sla: %s needs %d, has %d: add one", pool, want, have)
			return 1
		case want != have:
			d.why("sla: %s needs %d, has %d, but the budgets hold it", pool, want, have)
		}
		return 0
	}
	// Scale-downs first, as the load-based rules do.
	if p.Prefill > 0 && nTok > 0 && need.Prefill < p.Prefill {
		d.Prefill = step("prefill", p.Prefill, need.Prefill, r.PrefillGPUs)
	}
	if need.Decode < p.Decode {
		d.Decode = step("decode", p.Decode, need.Decode, r.DecodeGPUs)
	}
	if p.Prefill > 0 && nTok > 0 && need.Prefill > p.Prefill {
		d.Prefill = step("prefill", p.Prefill, need.Prefill, r.PrefillGPUs)
	}
	if need.Decode > p.Decode {
		d.Decode = step("decode", p.Decode, need.Decode, r.DecodeGPUs)
	}
	if len(d.Reasons) == 0 {
		d.why("sla: the pools are the size the load needs (prefill %d, decode %d)", need.Prefill, need.Decode)
	}
	return d
}

func (d *Decision) why(format string, a ...any) {
	d.Reasons = append(d.Reasons, fmt.Sprintf(format, a...))
}
