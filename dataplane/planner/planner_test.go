package planner

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// fakeSource serves a scripted series; fakeBackend applies changes to its pools and logs them.
type fakeSource struct {
	s     []Sample
	pools *Pools
	fail  bool
}

func (f *fakeSource) Pull(context.Context) (Sample, Pools, error) {
	if f.fail {
		return Sample{}, Pools{}, errors.New("no fleet")
	}
	s := f.s[0]
	if len(f.s) > 1 {
		f.s = f.s[1:]
	}
	return s, *f.pools, nil
}

type fakeBackend struct {
	pools   *Pools
	log     []string
	onApply func()
}

func (b *fakeBackend) Add(_ context.Context, p Pool) error {
	b.log = append(b.log, "add "+string(p))
	if p == PoolPrefill {
		b.pools.Prefill++
	} else {
		b.pools.Decode++
	}
	if b.onApply != nil {
		b.onApply()
	}
	return nil
}

func (b *fakeBackend) Remove(_ context.Context, p Pool) error {
	b.log = append(b.log, "remove "+string(p))
	if p == PoolPrefill {
		b.pools.Prefill--
	} else {
		b.pools.Decode--
	}
	return nil
}

func steady(q, kv float64) []Sample { return []Sample{{PrefillQueue: q, DecodeKV: kv}} }

func newTestPlanner(src *fakeSource, be *fakeBackend) *Planner {
	r := DefaultRules()
	r.AdjustInterval = 3 * time.Second
	return &Planner{Rules: r, Source: src, Backend: be, Metrics: NewMetrics()}
}

func TestPlannerLoop(t *testing.T) {
	pools := &Pools{2, 1}
	src := &fakeSource{s: steady(0.1, 0.95), pools: pools}
	be := &fakeBackend{pools: pools}
	p := newTestPlanner(src, be)
	t0 := time.Unix(1000, 0)
	ctx := context.Background()
	for i := range 4 { // pulls at 0, 1, 2; the adjustment at 3
		p.Step(ctx, t0.Add(time.Duration(i)*time.Second))
	}
	// Scale-down before scale-up.
	require.Equal(t, []string{"remove prefill", "add decode"}, be.log)
	require.Equal(t, Pools{1, 2}, *pools)
	require.Equal(t, 1.0, value(p.Metrics.decisions.WithLabelValues("decode", "add")))
	require.Equal(t, 1.0, value(p.Metrics.changes.WithLabelValues("prefill", "remove", "ok")))

	// The pools another hand changes during an interval: no decision on it.
	src.s = steady(0.3, 0.7)
	p.Step(ctx, t0.Add(4*time.Second))
	pools.Decode++
	for i := 5; i <= 7; i++ { // the interval began when the changes were complete, just after 3 s
		p.Step(ctx, t0.Add(time.Duration(i)*time.Second))
	}
	require.Equal(t, 1.0, value(p.Metrics.decisions.WithLabelValues("decode", "skipped")))
	require.Len(t, be.log, 2)
}

// managedBackend scales only the pools it names (a statefile with only a prefill entry).
type managedBackend struct {
	fakeBackend
	pools map[Pool]bool
}

func (b *managedBackend) Manages(p Pool) bool { return b.pools[p] }

// A backend that scales only the prefill pool (the decode workers are someone else's): the
// planner holds the decode pool whatever its load and says why, and still scales prefill.
func TestPlannerHoldsPoolsItsBackendDoesNotScale(t *testing.T) {
	pools := &Pools{2, 2}
	src := &fakeSource{s: steady(0.1, 0.1), pools: pools} // both pools idle: both would shrink
	be := &managedBackend{fakeBackend: fakeBackend{pools: pools}, pools: map[Pool]bool{PoolPrefill: true}}
	r := DefaultRules()
	r.AdjustInterval = 3 * time.Second
	var logs strings.Builder
	p := &Planner{Rules: r, Source: src, Backend: be, Metrics: NewMetrics(), Log: slog.New(slog.NewTextHandler(&logs, nil))}
	t0 := time.Unix(1000, 0)
	for i := range 4 {
		p.Step(context.Background(), t0.Add(time.Duration(i)*time.Second))
	}
	require.Equal(t, []string{"remove prefill"}, be.log)
	require.Equal(t, Pools{1, 2}, *pools)
	require.Contains(t, logs.String(), "action=prefill-1")
	require.Contains(t, logs.String(), "decode: -1 held: the backend does not scale this pool")
}

func TestPlannerNoOperation(t *testing.T) {
	pools := &Pools{1, 1}
	src := &fakeSource{s: steady(3, 0.95), pools: pools}
	p := newTestPlanner(src, nil)
	p.Backend, p.NoOperation = nil, true
	var logs strings.Builder
	p.Log = testLogger(&logs)
	t0 := time.Unix(1000, 0)
	for i := range 7 {
		p.Step(context.Background(), t0.Add(time.Duration(i)*time.Second))
	}
	require.Equal(t, Pools{1, 1}, *pools, "nothing applied")
	require.Equal(t, 2.0, value(p.Metrics.decisions.WithLabelValues("prefill", "add")), "but decided and counted")
	require.Contains(t, logs.String(), "action=prefill+1,decode+1 operate=false")
	require.Equal(t, 3.0, value(p.Metrics.prefillQueue))
	require.Equal(t, 2.0, value(p.Metrics.gpus))
	reg := prometheus.NewPedanticRegistry()
	for _, c := range p.Metrics.Collectors() {
		require.NoError(t, reg.Register(c))
	}
	fams, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, fams, len(p.Metrics.Collectors())-2, "all but the change counter and histogram (no change) have values")
}

func TestPlannerBlocksDuringAChange(t *testing.T) {
	pools := &Pools{0, 1}
	src := &fakeSource{s: steady(math.NaN(), 0.95), pools: pools}
	be := &fakeBackend{pools: pools}
	p := newTestPlanner(src, be)
	t0 := time.Unix(1000, 0)
	pulls := 0
	src2 := &countingSource{fakeSource: src, n: &pulls}
	p.Source = src2
	// The interval ends at the tick of t=3, before its pull; the change runs then, and the
	// next pull waits for it.
	be.onApply = func() { require.Equal(t, 3, pulls, "no pull while a change is in progress") }
	for i := range 4 {
		p.Step(context.Background(), t0.Add(time.Duration(i)*time.Second))
	}
	require.Equal(t, []string{"add decode"}, be.log)
	// A failing source: [3+, 7) had the pull at 3 and decides (another add); [7+, 11) has no
	// pull and holds.
	be.onApply = nil
	src.fail = true
	for i := 4; i <= 11; i++ {
		p.Step(context.Background(), t0.Add(time.Duration(i)*time.Second))
	}
	require.Equal(t, 1.0, value(p.Metrics.decisions.WithLabelValues("decode", "skipped")))
	require.Equal(t, 8.0, value(p.Metrics.pulls.WithLabelValues("error")))
	require.Equal(t, []string{"add decode", "add decode"}, be.log)
}

type countingSource struct {
	*fakeSource
	n *int
}

func (c *countingSource) Pull(ctx context.Context) (Sample, Pools, error) {
	*c.n++
	return c.fakeSource.Pull(ctx)
}

func testLogger(w *strings.Builder) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, nil))
}

func value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		panic(err)
	}
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	panic("not a gauge or counter")
}

// A live planner's record replays to the same decisions.
func TestPlannerRecordReplays(t *testing.T) {
	pools := &Pools{2, 1}
	var series []Sample
	for i := range 12 {
		series = append(series, Sample{T: 1000 + float64(i), PrefillQueue: 0.1 * float64(i%4), DecodeKV: 0.5 + 0.04*float64(i)})
	}
	src := &fakeSource{s: series, pools: pools}
	p := newTestPlanner(src, &fakeBackend{pools: pools})
	var rec strings.Builder
	p.Record = &rec
	var logs strings.Builder
	p.Log = testLogger(&logs)
	for i := range 12 {
		p.Step(context.Background(), time.Unix(1000+int64(i), 0))
	}
	var live []string
	for _, m := range regexp.MustCompile(`action=(\S+)`).FindAllStringSubmatch(logs.String(), -1) {
		live = append(live, m[1])
	}
	var replayed []string
	require.NoError(t, Replay(strings.NewReader(rec.String()), p.Rules, Pools{2, 1}, func(s ReplayStep) error {
		replayed = append(replayed, s.Action)
		return nil
	}))
	// Live: adjustments at the ticks of 1003, 1006 and 1009; replay also decides [1009, 1012).
	require.Equal(t, []string{"prefill-1", "hold", "hold"}, live)
	require.Equal(t, live, replayed[:len(live)])
}
