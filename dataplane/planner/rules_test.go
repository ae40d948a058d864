package planner

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The rules as table tests over synthetic series: pulls at t = 0, 1, 2, ... s, an adjustment
// every 3 s (3 pulls), replayed with changes completing at once.

func testRules() Rules {
	r := DefaultRules()
	r.AdjustInterval = 3 * time.Second
	return r
}

// series writes one observation a second; NaN leaves a field out.
func series(queue, kv []float64) string {
	var b strings.Builder
	for i := range max(len(queue), len(kv)) {
		fmt.Fprintf(&b, `{"t": %d`, i)
		if i < len(queue) && !math.IsNaN(queue[i]) {
			fmt.Fprintf(&b, `, "prefill_queue": %g`, queue[i])
		}
		if i < len(kv) && !math.IsNaN(kv[i]) {
			fmt.Fprintf(&b, `, "decode_kv": %g`, kv[i])
		}
		b.WriteString("}\n")
	}
	return b.String()
}

func rep(v float64, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func cat(parts ...[]float64) []float64 {
	var out []float64
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func replayAll(t *testing.T, in string, r Rules, start Pools) []ReplayStep {
	t.Helper()
	var steps []ReplayStep
	require.NoError(t, Replay(strings.NewReader(in), r, start, func(s ReplayStep) error {
		steps = append(steps, s)
		return nil
	}))
	return steps
}

func actions(steps []ReplayStep) []string {
	var out []string
	for _, s := range steps {
		out = append(out, fmt.Sprintf("%s %d/%d", s.Action, s.Prefill, s.Decode))
	}
	return out
}

func TestRules(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name      string
		rules     func(*Rules)
		start     Pools
		queue, kv []float64
		want      []string // "action prefill/decode" after each interval
	}{
		{name: "decode kv above 0.9 adds one", start: Pools{1, 1}, queue: rep(0.3, 3), kv: rep(0.95, 3),
			want: []string{"decode+1 1/2"}},
		{name: "decode kv at 0.9 holds", start: Pools{1, 1}, queue: rep(0.3, 3), kv: rep(0.9, 3),
			want: []string{"hold 1/1"}},
		{name: "decode kv mean decides, not the last pull", start: Pools{1, 1}, queue: rep(0.3, 3), kv: []float64{0.99, 0.99, 0.7},
			want: []string{"hold 1/1"}},
		{name: "decode kv under 0.5 removes one", start: Pools{1, 2}, queue: rep(0.3, 3), kv: rep(0.4, 3),
			want: []string{"decode-1 1/1"}},
		{name: "decode kv at 0.5 holds", start: Pools{1, 2}, queue: rep(0.3, 3), kv: rep(0.5, 3),
			want: []string{"hold 1/2"}},
		{name: "decode keeps its minimum", start: Pools{1, 1}, queue: rep(0.3, 3), kv: rep(0.1, 3),
			want: []string{"hold 1/1"}},
		{name: "prefill queue above 0.5 and rising adds one", start: Pools{1, 1}, queue: []float64{0.6, 0.7, 0.8}, kv: rep(0.7, 3),
			want: []string{"prefill+1 2/1"}},
		{name: "prefill queue at 0.5 holds", start: Pools{1, 1}, queue: rep(0.5, 3), kv: rep(0.7, 3),
			want: []string{"hold 1/1"}},
		{name: "prefill queue under 0.2 removes one", start: Pools{2, 1}, queue: rep(0.1, 3), kv: rep(0.7, 3),
			want: []string{"prefill-1 1/1"}},
		{name: "prefill queue at 0.2 holds", start: Pools{2, 1}, queue: rep(0.2, 3), kv: rep(0.7, 3),
			want: []string{"hold 2/1"}},
		{name: "prefill keeps its minimum", start: Pools{1, 1}, queue: rep(0, 3), kv: rep(0.7, 3),
			want: []string{"hold 1/1"}},
		{name: "min endpoint 2", rules: func(r *Rules) { r.MinEndpoint = 2 }, start: Pools{2, 2}, queue: rep(0, 3), kv: rep(0.1, 3),
			want: []string{"hold 2/2"}},
		// 0.9 average, last 0.6, change -0.6: 0.6 - 3×0.6 < 0.5 within the trend buffer.
		{name: "a falling prefill queue does not add", start: Pools{1, 1}, queue: []float64{1.2, 0.9, 0.6}, kv: rep(0.7, 3),
			want: []string{"hold 1/1"}},
		// 0.6 average, last 0.55, change -0.1: 0.55 - 0.3 = 0.25.
		{name: "a slowly falling queue does not add either", start: Pools{1, 1}, queue: []float64{0.65, 0.6, 0.55}, kv: rep(0.7, 3),
			want: []string{"hold 1/1"}},
		// Flat at 0.6: the prediction is 0.6, still above.
		{name: "a flat queue above the threshold adds", start: Pools{1, 1}, queue: rep(0.6, 3), kv: rep(0.7, 3),
			want: []string{"prefill+1 2/1"}},
		{name: "trend buffer 0 ignores the trend", rules: func(r *Rules) { r.TrendBuffer = 0 }, start: Pools{1, 1}, queue: []float64{1.2, 0.9, 0.6}, kv: rep(0.7, 3),
			want: []string{"prefill+1 2/1"}},
		{name: "one worker per interval however high", start: Pools{1, 1}, queue: rep(50, 9), kv: rep(1, 9),
			want: []string{"prefill+1,decode+1 2/2", "prefill+1,decode+1 3/3", "prefill+1,decode+1 4/4"}},
		{name: "decode grace: 3 intervals without scale-down after an add", start: Pools{1, 1}, queue: rep(0.3, 18),
			kv:   cat(rep(0.95, 3), rep(0.1, 15)),
			want: []string{"decode+1 1/2", "hold 1/2", "hold 1/2", "hold 1/2", "decode-1 1/1", "hold 1/1"}},
		{name: "grace 0", rules: func(r *Rules) { r.DecodeGrace = 0 }, start: Pools{1, 1}, queue: rep(0.3, 6),
			kv: cat(rep(0.95, 3), rep(0.1, 3)), want: []string{"decode+1 1/2", "decode-1 1/1"}},
		{name: "a second add restarts the grace", start: Pools{1, 1}, queue: rep(0.3, 15),
			kv:   cat(rep(0.95, 3), rep(0.1, 3), rep(0.95, 3), rep(0.1, 6)),
			want: []string{"decode+1 1/2", "hold 1/2", "decode+1 1/3", "hold 1/3", "hold 1/3"}},
		{name: "max budget stops decode", rules: func(r *Rules) { r.MaxGPU = 2 }, start: Pools{1, 1}, queue: rep(0.3, 3), kv: rep(0.95, 3),
			want: []string{"hold 1/1"}},
		{name: "max budget counts GPUs per engine", rules: func(r *Rules) { r.MaxGPU = 6; r.DecodeGPUs = 2 }, start: Pools{1, 2}, queue: rep(0.3, 3), kv: rep(0.95, 3),
			want: []string{"hold 1/2"}},
		{name: "prefill takes the budget before decode", rules: func(r *Rules) { r.MaxGPU = 3 }, start: Pools{1, 1}, queue: rep(0.8, 3), kv: rep(0.95, 3),
			want: []string{"prefill+1 2/1"}},
		{name: "a scale-down frees budget for a scale-up", rules: func(r *Rules) { r.MaxGPU = 3 }, start: Pools{2, 1}, queue: rep(0.1, 3), kv: rep(0.95, 3),
			want: []string{"prefill-1,decode+1 1/2"}},
		{name: "min budget stops a scale-down", rules: func(r *Rules) { r.MinGPU = 3 }, start: Pools{1, 2}, queue: rep(0.3, 3), kv: rep(0.1, 3),
			want: []string{"hold 1/2"}},
		{name: "min budget allows what stays above it", rules: func(r *Rules) { r.MinGPU = 3 }, start: Pools{1, 3}, queue: rep(0.3, 3), kv: rep(0.1, 3),
			want: []string{"decode-1 1/2"}},
		{name: "min budget counts both scale-downs", rules: func(r *Rules) { r.MinGPU = 3 }, start: Pools{2, 2}, queue: rep(0, 3), kv: rep(0.1, 3),
			want: []string{"prefill-1 1/2"}},
		{name: "aggregated fleet: no prefill pool", start: Pools{0, 1}, queue: rep(5, 3), kv: rep(0.95, 3),
			want: []string{"decode+1 0/2"}},
		{name: "unmeasured pools hold", start: Pools{2, 2}, queue: rep(nan, 3), kv: rep(nan, 3),
			want: []string{"hold 2/2"}},
		{name: "a partial last interval is not decided", start: Pools{1, 1}, queue: rep(0.3, 5), kv: rep(0.95, 5),
			want: []string{"decode+1 1/2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRules()
			if tc.rules != nil {
				tc.rules(&r)
			}
			got := actions(replayAll(t, series(tc.queue, tc.kv), r, tc.start))
			require.Equal(t, tc.want, got)
		})
	}
}

func TestReplayTimes(t *testing.T) {
	r := testRules()
	// A gap: pulls at 0..2, then at 10..12; the intervals [3,6) and [6,9) are empty and hold.
	in := `{"t":0,"decode_kv":0.95}` + "\n" + `{"t":1,"decode_kv":0.95}` + "\n" + `{"t":2,"decode_kv":0.95}` + "\n\n" +
		`{"t":10,"decode_kv":0.1}` + "\n" + `{"t":11,"decode_kv":0.1}` + "\n"
	steps := replayAll(t, in, r, Pools{0, 1})
	require.Equal(t, []string{"decode+1 0/2", "hold 0/2", "hold 0/2", "hold 0/2"}, actions(steps))
	require.Equal(t, []float64{3, 6, 9, 12}, []float64{steps[0].T, steps[1].T, steps[2].T, steps[3].T})
	require.Equal(t, 0, steps[1].Samples)
	require.Nil(t, steps[1].AvgDecodeKV)
	require.InDelta(t, 0.95, *steps[0].AvgDecodeKV, 1e-9)
	require.Nil(t, steps[0].AvgPrefillQueue)
}

func TestReplayRejects(t *testing.T) {
	r := testRules()
	for in, want := range map[string]string{
		`{"t":0}` + "\n" + `{"t":-1}`:                     "line 2: \"t\": -1",
		`{"t":1}` + "\n" + `{"t":0.5}`:                    "line 2: t 0.5 goes back from 1",
		`{"decode_kv":0.5}`:                               `line 1: "t": missing`,
		`{"t":0,"decode_kv":11}`:                          `"decode_kv": 11 out of range`,
		`{"t":0,"prefill_queue":-2}`:                      `"prefill_queue": -2 out of range`,
		`{"t":0,"kv":0.5}`:                                `unknown field "kv"`,
		`[1,2]`:                                           "not an observation object",
		`{"t":0} {"t":1}`:                                 "more than one JSON value",
		`{"t":0}` + "\n" + `{"t":1e9}`:                    "adjustment intervals past the last",
		`{"t":0,"x":"` + strings.Repeat("a", 5000) + `"}`: "longer than 4096 bytes",
	} {
		err := Replay(strings.NewReader(in), r, Pools{1, 1}, func(ReplayStep) error { return nil })
		require.ErrorContains(t, err, want, in[:min(len(in), 40)])
	}
	bad := r
	bad.DecodeKVDown = 0.95
	require.ErrorContains(t, Replay(strings.NewReader(""), bad, Pools{1, 1}, nil), "--decode-kv-scale-down-threshold")
	require.ErrorContains(t, Replay(strings.NewReader(""), r, Pools{-1, 1}, nil), "at least 0")
}

func TestRulesCheck(t *testing.T) {
	require.NoError(t, DefaultRules().Check())
	for _, f := range []func(*Rules){
		func(r *Rules) { r.PullInterval = 0 },
		func(r *Rules) { r.AdjustInterval = r.PullInterval / 2 },
		func(r *Rules) { r.PrefillQueueUp = r.PrefillQueueDown },
		func(r *Rules) { r.DecodeKVDown = -0.1 },
		func(r *Rules) { r.PrefillGPUs = 0 },
		func(r *Rules) { r.MinGPU = 9 },
		func(r *Rules) { r.MinEndpoint = 0 },
		func(r *Rules) { r.DecodeGrace = -1 },
	} {
		r := DefaultRules()
		f(&r)
		require.Error(t, r.Check(), "%+v", r)
	}
}

func TestIntervalBounded(t *testing.T) {
	iv := NewInterval(testRules()) // 4 samples an interval: a buffer of 8
	for i := range 100 {
		iv.Add(Sample{T: float64(i), DecodeKV: 0.1, PrefillQueue: math.NaN()})
	}
	require.Equal(t, 8, iv.Len())
	iv.Skip()
	require.Equal(t, 0, iv.Len())
}

func FuzzParseObservation(f *testing.F) {
	for _, s := range []string{`{"t":0,"prefill_queue":0.3,"decode_kv":0.5}`, `{"t":1}`, `{"t":null}`, `{}`, `[`, `{"t":1e400}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		s, err := ParseObservation(line)
		if err != nil {
			return
		}
		if s.T < 0 || !(math.IsNaN(s.PrefillQueue) || s.PrefillQueue >= 0) || !(math.IsNaN(s.DecodeKV) || (s.DecodeKV >= 0 && s.DecodeKV <= 10)) {
			t.Fatalf("accepted %q as %+v", line, s)
		}
	})
}

// TestReplayMatchesReference replays a 20-minute ramp up and down against the decisions of
// testdata/reference.py, an independent implementation of Dynamo's rules (see its header).
func TestReplayMatchesReference(t *testing.T) {
	r := DefaultRules()
	r.MinGPU = 2 // as the reference sets it
	in, err := os.ReadFile("testdata/ramp.jsonl")
	require.NoError(t, err)
	want, err := os.ReadFile("testdata/ramp.expected.jsonl")
	require.NoError(t, err)
	got := replayAll(t, string(in), r, Pools{1, 1})
	lines := strings.Split(strings.TrimSpace(string(want)), "\n")
	require.Len(t, got, len(lines))
	for i, line := range lines {
		var w ReplayStep
		require.NoError(t, json.Unmarshal([]byte(line), &w))
		g := got[i]
		require.Equal(t, []any{w.T, w.Prefill, w.Decode, w.Action, w.Samples}, []any{g.T, g.Prefill, g.Decode, g.Action, g.Samples}, "interval %d", i)
		require.InDelta(t, *w.AvgPrefillQueue, *g.AvgPrefillQueue, 1e-9, "interval %d", i)
		require.InDelta(t, *w.AvgDecodeKV, *g.AvgDecodeKV, 1e-9, "interval %d", i)
	}
}
