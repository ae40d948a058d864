package mocker

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// PerfModel says how long an engine step takes.
type PerfModel interface {
	// Prefill is the time to compute tokens new prompt tokens in one batch (0 for none).
	Prefill(tokens int) time.Duration
	// Decode is the time of one decode step: batch sequences, activeKV tokens in their
	// contexts, usage the fraction of the KV cache in use.
	Decode(batch, activeKV int, usage float64) time.Duration
}

// Polynomial is Dynamo's default mocker perf model (fitted on an H100):
//
//	prefill ms = 4.209989e-7·T² + 1.518344e-2·T + 1.650142e1   (T new tokens in the batch)
//	decode ms  = −25.74·u² + 54.01·u + 5.74                    (u KV usage fraction), at least 1 ms
type Polynomial struct{}

func (Polynomial) Prefill(tokens int) time.Duration {
	if tokens <= 0 {
		return 0
	}
	t := float64(tokens)
	return msDuration(4.209989e-7*t*t + 1.518344e-2*t + 16.50142)
}

func (Polynomial) Decode(batch, _ int, u float64) time.Duration {
	if batch <= 0 {
		return 0
	}
	return msDuration(max(-25.74*u*u+54.01*u+5.74, 1))
}

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// Interpolated is a perf model measured on a real engine (Dynamo's profile format): prefill
// time linear in the batch's new tokens between measured points, decode time bilinear over
// (active KV tokens, mean context length); both extrapolate linearly past the grid's edges.
type Interpolated struct {
	PrefillTokens []float64   // increasing
	PrefillMS     []float64   // same length
	DecodeKV      []float64   // increasing: active KV tokens
	DecodeContext []float64   // increasing: context length
	DecodeMS      [][]float64 // [len(DecodeKV)][len(DecodeContext)]
}

// ErrProfile reports a profile that cannot be interpolated; Field names the array.
type ErrProfile struct{ Field, Problem string }

func (e *ErrProfile) Error() string { return "perf profile: " + e.Field + ": " + e.Problem }

// Check verifies the grid: at least two points per axis, increasing axes, matching shapes,
// finite values.
func (m *Interpolated) Check() error {
	axis := func(name string, xs []float64) error {
		if len(xs) < 2 {
			return &ErrProfile{name, fmt.Sprintf("%d points, need at least 2", len(xs))}
		}
		for i, x := range xs {
			if math.IsNaN(x) || math.IsInf(x, 0) || (i > 0 && x <= xs[i-1]) {
				return &ErrProfile{name, fmt.Sprintf("point %d (%v) is not finite and increasing", i, x)}
			}
		}
		return nil
	}
	finite := func(name string, ys []float64) error {
		for i, y := range ys {
			if math.IsNaN(y) || math.IsInf(y, 0) {
				return &ErrProfile{name, fmt.Sprintf("value %d is %v", i, y)}
			}
		}
		return nil
	}
	if err := axis("prefill_isl", m.PrefillTokens); err != nil {
		return err
	}
	if len(m.PrefillMS) != len(m.PrefillTokens) {
		return &ErrProfile{"prefill_ttft_ms", fmt.Sprintf("%d values for %d prefill_isl points", len(m.PrefillMS), len(m.PrefillTokens))}
	}
	if err := finite("prefill_ttft_ms", m.PrefillMS); err != nil {
		return err
	}
	if err := axis("decode_active_kv_tokens", m.DecodeKV); err != nil {
		return err
	}
	if err := axis("decode_context_length", m.DecodeContext); err != nil {
		return err
	}
	if len(m.DecodeMS) != len(m.DecodeKV) {
		return &ErrProfile{"decode_itl", fmt.Sprintf("%d rows for %d decode_active_kv_tokens points", len(m.DecodeMS), len(m.DecodeKV))}
	}
	for i, row := range m.DecodeMS {
		if len(row) != len(m.DecodeContext) {
			return &ErrProfile{"decode_itl", fmt.Sprintf("row %d has %d values for %d decode_context_length points", i, len(row), len(m.DecodeContext))}
		}
		if err := finite("decode_itl", row); err != nil {
			return err
		}
	}
	return nil
}

func (m *Interpolated) Prefill(tokens int) time.Duration {
	if tokens <= 0 {
		return 0
	}
	i, f := locate(m.PrefillTokens, float64(tokens))
	return msDuration(max(lerp(m.PrefillMS[i], m.PrefillMS[i+1], f), 0))
}

func (m *Interpolated) Decode(batch, activeKV int, _ float64) time.Duration {
	if batch <= 0 {
		return 0
	}
	i, fx := locate(m.DecodeKV, float64(activeKV))
	j, fy := locate(m.DecodeContext, float64(activeKV)/float64(batch))
	lo := lerp(m.DecodeMS[i][j], m.DecodeMS[i][j+1], fy)
	hi := lerp(m.DecodeMS[i+1][j], m.DecodeMS[i+1][j+1], fy)
	return msDuration(max(lerp(lo, hi, fx), 1))
}

// locate finds the grid cell [xs[i], xs[i+1]] for x and the fraction of the way through it
// (below 0 or above 1 when x is outside the grid: linear extrapolation).
func locate(xs []float64, x float64) (int, float64) {
	i, _ := slices.BinarySearch(xs, x)
	i = min(max(i-1, 0), len(xs)-2)
	return i, (x - xs[i]) / (xs[i+1] - xs[i])
}

func lerp(a, b, f float64) float64 { return a + (b-a)*f }
