package features

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The model-based test: random sequences of begin / admit / complete / fail / stage /
// alloc-merged / merge / prefill / done / cancel / clock+sweep run against the store and a
// plain reference that keeps its own accounting (bytes per state, holders, cache order). After
// every step the store's numbers and every record's state must equal the reference's, the
// budgets hold, and every live buffer still holds the bytes its owner wrote (two owners of one
// byte would overwrite each other). At the end every byte must be back.

const (
	modelUnit       = 4 * kib
	modelHostBlocks = 48
	modelDevBlocks  = 24
)

type mRec struct {
	rec      *Record
	job      *Job // until Complete or Fail
	key      Key
	est      int64
	actual   int64
	state    State
	holds    int
	staged   bool
	failed   bool
	orphaned bool
	keep     time.Duration
	expires  time.Time
	lruSeq   uint64
	fill     byte
}

type mHold struct {
	rec  *mRec
	step State
}

type mReq struct {
	req       *Request
	policy    Policy
	phase     phase
	holds     []*mHold
	merged    int64 // bytes, 0 when none
	mergedDev bool
	mergedBuf View
	fill      byte
}

type model struct {
	t     *testing.T
	r     *rand.Rand
	s     *Store
	clock *fakeClock
	recs  []*mRec // live records (not DISCARDED)
	index map[Key]*mRec
	// indexed is what the store says it holds: keys of its misses, less those it told OnForget.
	indexed map[Key]bool
	reqs    []*mReq // not finished or cancelled
	sizes   map[Key]int64
	seq     uint64
	nextID  int
	hits    uint64
	misses  uint64
	evict   [numEvictReasons]uint64
}

func units(n int64) int64 { return (n + modelUnit - 1) / modelUnit }

func TestModel(t *testing.T) {
	r := newRand(t)
	for run := range 6 {
		clock := newClock()
		m := &model{t: t, r: r, s: newTestStore(t, modelHostBlocks, modelDevBlocks, clock), clock: clock,
			index: map[Key]*mRec{}, sizes: map[Key]int64{}, indexed: map[Key]bool{}}
		m.s.opts.OnForget = func(k Key) {
			require.True(t, m.indexed[k], "OnForget(%v) for a key the store did not hold", k)
			delete(m.indexed, k)
		}
		for step := range 1500 {
			what := m.step()
			m.check(fmt.Sprintf("run %d step %d (%s)", run, step, what))
		}
		st := m.s.Stats()
		t.Logf("run %d: %d hits, %d misses, evictions %v, host rejections %v, device rejections %v",
			run, st.Hits, st.Misses, st.Evictions, st.Host.Rejections, st.Device.Rejections)
		m.drain()
		requireEmpty(t, m.s)
	}
}

func (m *model) step() string {
	ops := []struct {
		weight int
		name   string
		do     func() bool
	}{
		{2, "begin", m.begin}, {6, "admit", m.admit}, {4, "complete", m.complete}, {1, "fail", m.fail},
		{2, "stage", m.stage}, {1, "alloc-merged", m.allocMerged}, {2, "merge", m.merge},
		{2, "prefill", m.prefill}, {1, "done", m.done}, {1, "cancel", m.cancel}, {1, "clock", m.tick},
	}
	total := 0
	for _, o := range ops {
		total += o.weight
	}
	for {
		k := m.r.IntN(total)
		for _, o := range ops {
			if k -= o.weight; k < 0 {
				if o.do() {
					return o.name
				}
				break
			}
		}
	}
}

func pick[T any](r *rand.Rand, s []T, ok func(T) bool) (T, bool) {
	var c []T
	for _, x := range s {
		if ok(x) {
			c = append(c, x)
		}
	}
	if len(c) == 0 {
		var zero T
		return zero, false
	}
	return c[r.IntN(len(c))], true
}

func (m *model) begin() bool {
	if len(m.reqs) >= 6 {
		return false
	}
	p := []Policy{{}, {Kind: KeepForReuse, TTL: time.Duration(1+m.r.IntN(5)) * time.Minute}, {Kind: KeepUntilDone}}[m.r.IntN(3)]
	m.nextID++
	req, err := m.s.Begin(fmt.Sprintf("req-%d", m.nextID), p)
	require.NoError(m.t, err)
	m.reqs = append(m.reqs, &mReq{req: req, policy: p, fill: byte(m.r.IntN(256))})
	return true
}

// cachedBefore is the idle cache as the reference orders it (least recently released first)
// and which of it has expired.
func (m *model) cachedBefore() (lru []*mRec, expired map[*mRec]bool) {
	expired = map[*mRec]bool{}
	now := m.clock.Now()
	for _, x := range m.recs {
		if x.state == StateCached {
			lru = append(lru, x)
			if !now.Before(x.expires) {
				expired[x] = true
			}
		}
	}
	slices.SortFunc(lru, func(a, b *mRec) int { return int(a.lruSeq) - int(b.lruSeq) })
	return lru, expired
}

// allocated checks what the store evicted while allocating n host bytes (cached entries the
// reference sees gone): expired ones at any time, others only in LRU order and only when the
// allocation did not fit and evicting could make it fit. It applies the evictions.
func (m *model) allocated(what string, n int64, lru []*mRec, expired map[*mRec]bool, pre Stats, err error) {
	var lruEvicted []*mRec
	ttl := 0
	for _, x := range lru {
		if x.rec.State() != StateDiscarded {
			continue
		}
		if expired[x] {
			ttl++
		} else {
			lruEvicted = append(lruEvicted, x)
		}
		m.gone(x)
	}
	var live []*mRec
	for _, x := range lru {
		if !expired[x] {
			live = append(live, x)
		}
	}
	for i, x := range lruEvicted {
		require.Same(m.t, live[i], x, "%s: evictions are not the least recently used entries", what)
	}
	block := units(n) * modelUnit
	if len(lruEvicted) > 0 {
		require.Less(m.t, pre.Host.LargestFree, block, "%s: evicted though %d bytes fitted", what, n)
		// The store sweeps expired entries before it evicts, so their bytes count as free too.
		idle := int64(0)
		for _, x := range lru {
			idle += units(x.actual) * modelUnit
		}
		require.LessOrEqual(m.t, block, pre.Host.Free+idle, "%s: evicted though eviction could not make room", what)
	}
	m.evict[evictTTL] += uint64(ttl)
	m.evict[evictLRU] += uint64(len(lruEvicted))
	if err != nil {
		require.ErrorIs(m.t, err, ErrBudget, what)
		require.Less(m.t, m.s.Stats().Host.LargestFree, block, "%s: refused though it fits", what)
	}
}

// gone marks a record discarded in the reference.
func (m *model) gone(x *mRec) {
	x.state = StateDiscarded
	x.staged = false
	if m.index[x.key] == x {
		delete(m.index, x.key)
	}
	m.recs = slices.DeleteFunc(m.recs, func(y *mRec) bool { return y == x })
}

func (m *model) admit() bool {
	q, ok := pick(m.r, m.reqs, func(q *mReq) bool { return q.phase == phaseOpen })
	if !ok {
		return false
	}
	k := Key{Salt: []string{"a", "b"}[m.r.IntN(2)], Content: fmt.Sprintf("img-%d", m.r.IntN(8)), Model: "m", Preprocess: "p"}
	n, ok := m.sizes[k]
	if !ok {
		n = 1 + m.r.Int64N(10*modelUnit)
		m.sizes[k] = n
	}
	lru, expired := m.cachedBefore()
	pre := m.s.Stats()
	rec, job, err := q.req.Admit(context.Background(), Item{Key: k, MediaID: k.Content, Bytes: n})
	if x := m.index[k]; x != nil && !expired[x] { // a hit
		require.NoError(m.t, err)
		require.Nil(m.t, job)
		require.Same(m.t, x.rec, rec)
		m.hits++
		if x.state == StateCached {
			x.state = StateEncodedHost
		}
		x.holds++
		q.holds = append(q.holds, &mHold{rec: x, step: StateEncodedHost})
		return true
	}
	if x := m.index[k]; x != nil { // expired: the lookup drops it
		require.Equal(m.t, StateDiscarded, x.rec.State())
	}
	m.allocated("admit", n, lru, expired, pre, err)
	if err != nil {
		return true
	}
	require.NotNil(m.t, job)
	m.misses++
	require.False(m.t, m.indexed[k], "a miss for a key the store still holds")
	m.indexed[k] = true
	x := &mRec{rec: rec, job: job, key: k, est: n, state: StateEncoding, holds: 1, fill: byte(m.r.IntN(256))}
	m.recs = append(m.recs, x)
	m.index[k] = x
	q.holds = append(q.holds, &mHold{rec: x, step: StateEncodedHost})
	return true
}

func (m *model) complete() bool {
	x, ok := pick(m.r, m.recs, func(x *mRec) bool { return x.job != nil })
	if !ok {
		return false
	}
	if m.r.IntN(8) == 0 {
		require.ErrorIs(m.t, x.job.Complete(x.est+1), ErrOverEstimate)
		return true
	}
	n := 1 + m.r.Int64N(x.est)
	b := x.job.Buffer().Bytes()
	for i := range n {
		b[i] = x.fill
	}
	err := x.job.Complete(n)
	x.job, x.actual = nil, n
	if x.orphaned {
		require.ErrorIs(m.t, err, ErrAbandoned)
		m.gone(x)
		return true
	}
	require.NoError(m.t, err)
	x.state = StateEncodedHost
	return true
}

func (m *model) fail() bool {
	x, ok := pick(m.r, m.recs, func(x *mRec) bool { return x.job != nil })
	if !ok {
		return false
	}
	require.NoError(m.t, x.job.Fail(fmt.Errorf("model failure")))
	x.job, x.failed = nil, true
	m.gone(x)
	return true
}

// stepError is the error the reference expects for moving q's holds of x to step.
func stepError(q *mReq, x *mRec, step State) error {
	if x.failed {
		return ErrEncodeFailed
	}
	if x.state == StateEncoding {
		return ErrIllegalTransition
	}
	for _, h := range q.holds {
		if h.rec == x && !Legal(h.step, step) {
			return ErrIllegalTransition
		}
	}
	return nil
}

func (m *model) stage() bool {
	q, ok := pick(m.r, m.reqs, func(q *mReq) bool { return q.phase == phaseOpen && len(q.holds) > 0 })
	if !ok {
		return false
	}
	x := q.holds[m.r.IntN(len(q.holds))].rec
	want := stepError(q, x, StateStagedDevice)
	v, err := q.req.Stage(context.Background(), x.rec)
	if want != nil {
		require.ErrorIs(m.t, err, want)
		return true
	}
	if !x.staged && err != nil {
		require.ErrorIs(m.t, err, ErrBudget)
		require.Less(m.t, m.s.Stats().Device.LargestFree, units(x.actual)*modelUnit, "stage refused though it fits")
		return true
	}
	require.NoError(m.t, err)
	if !x.staged {
		host, err := x.rec.Host()
		require.NoError(m.t, err)
		copy(v.Bytes(), host.Bytes()) // what the plugin's copy does
		x.staged = true
	}
	for _, h := range q.holds {
		if h.rec == x {
			h.step = StateStagedDevice
		}
	}
	x.state = max(x.state, StateStagedDevice)
	return true
}

func (m *model) allocMerged() bool {
	q, ok := pick(m.r, m.reqs, func(q *mReq) bool { return q.phase == phaseOpen && q.merged == 0 })
	if !ok {
		return false
	}
	n := 1 + m.r.Int64N(12*modelUnit)
	dev := m.r.IntN(2) == 0
	lru, expired := m.cachedBefore()
	pre := m.s.Stats()
	v, err := q.req.AllocMerged(context.Background(), dev, n)
	if dev {
		if err != nil {
			require.ErrorIs(m.t, err, ErrBudget)
			require.Less(m.t, m.s.Stats().Device.LargestFree, units(n)*modelUnit)
			return true
		}
	} else {
		m.allocated("alloc-merged", n, lru, expired, pre, err)
		if err != nil {
			return true
		}
	}
	require.Equal(m.t, n, v.Len())
	b := v.Bytes()
	for i := range b {
		b[i] = q.fill
	}
	q.merged, q.mergedDev, q.mergedBuf = n, dev, v
	return true
}

func (m *model) merge() bool {
	q, ok := pick(m.r, m.reqs, func(q *mReq) bool { return q.phase == phaseOpen })
	if !ok {
		return false
	}
	var want error
	for _, h := range q.holds {
		if want = stepError(q, h.rec, StateMerged); want != nil {
			break
		}
	}
	err := q.req.Merged()
	if want != nil {
		require.ErrorIs(m.t, err, want)
		return true
	}
	require.NoError(m.t, err)
	for _, h := range q.holds {
		h.step = StateMerged
		h.rec.state = max(h.rec.state, StateMerged)
	}
	q.phase = phaseMerged
	return true
}

func (m *model) prefill() bool {
	q, ok := pick(m.r, m.reqs, func(q *mReq) bool { return q.phase == phaseMerged || m.r.IntN(10) == 0 })
	if !ok {
		return false
	}
	err := q.req.Prefilled()
	if q.phase != phaseMerged {
		require.ErrorIs(m.t, err, ErrIllegalTransition)
		return true
	}
	require.NoError(m.t, err)
	for _, h := range q.holds {
		h.step = StatePrefilled
		h.rec.state = max(h.rec.state, StatePrefilled)
	}
	q.merged = 0
	if q.policy.Kind == KeepUntilDone {
		q.phase = phasePrefilled
		return true
	}
	m.releaseAll(q, q.policy.TTL)
	m.finish(q)
	return true
}

func (m *model) done() bool {
	q, ok := pick(m.r, m.reqs, func(*mReq) bool { return true })
	if !ok {
		return false
	}
	err := q.req.Done()
	if q.phase != phasePrefilled {
		require.ErrorIs(m.t, err, ErrIllegalTransition)
		return true
	}
	require.NoError(m.t, err)
	m.releaseAll(q, 0)
	m.finish(q)
	return true
}

func (m *model) cancel() bool {
	q, ok := pick(m.r, m.reqs, func(*mReq) bool { return true })
	if !ok {
		return false
	}
	q.req.Cancel()
	q.merged = 0
	m.releaseAll(q, 0)
	m.finish(q)
	return true
}

func (m *model) tick() bool {
	m.clock.Advance(time.Duration(m.r.IntN(180)) * time.Second)
	if m.r.IntN(2) == 0 {
		return true
	}
	lru, expired := m.cachedBefore()
	require.Equal(m.t, len(expired), m.s.Sweep())
	for _, x := range lru {
		if expired[x] {
			m.gone(x)
		}
	}
	m.evict[evictTTL] += uint64(len(expired))
	return true
}

func (m *model) finish(q *mReq) {
	m.reqs = slices.DeleteFunc(m.reqs, func(y *mReq) bool { return y == q })
}

// releaseAll is the reference's release: the last holder caches (if anyone asked to keep and
// the TTL runs) or discards; a record still encoding is orphaned.
func (m *model) releaseAll(q *mReq, keep time.Duration) {
	now := m.clock.Now()
	for _, h := range q.holds {
		x := h.rec
		x.holds--
		x.keep = max(x.keep, keep)
		if x.holds > 0 || x.failed {
			continue
		}
		if x.state == StateEncoding {
			x.orphaned = true
			delete(m.index, x.key)
			continue
		}
		exp := x.expires
		if x.keep > 0 {
			exp = later(exp, now.Add(x.keep))
		}
		x.keep = 0
		if !now.Before(exp) {
			m.gone(x)
			continue
		}
		x.staged, x.expires, x.state = false, exp, StateCached
		m.seq++
		x.lruSeq = m.seq
	}
	q.holds = nil
}

// check compares the store with the reference.
func (m *model) check(what string) {
	t := m.t
	var hostUsed, hostRes, hostReq, idle, devUsed, devReq int64
	var states [numStates]int
	for _, x := range m.recs {
		states[x.state]++
		if x.state == StateEncoding {
			hostRes += units(x.est) * modelUnit
			hostReq += x.est
		} else {
			hostUsed += units(x.actual) * modelUnit
			hostReq += x.actual
		}
		if x.state == StateCached {
			idle += units(x.actual) * modelUnit
		}
		if x.staged {
			devUsed += units(x.actual) * modelUnit
			devReq += x.actual
		}
	}
	for _, q := range m.reqs {
		if q.merged > 0 && q.mergedDev {
			devUsed += units(q.merged) * modelUnit
			devReq += q.merged
		} else if q.merged > 0 {
			hostUsed += units(q.merged) * modelUnit
			hostReq += q.merged
		}
	}
	st := m.s.Stats()
	require.Equal(t, [4]int64{hostUsed, hostRes, hostReq, idle}, [4]int64{st.Host.Used, st.Host.Reserved, st.Host.Requested, st.Host.Idle}, "%s: host used, reserved, requested, idle", what)
	require.Equal(t, [3]int64{devUsed, 0, devReq}, [3]int64{st.Device.Used, st.Device.Reserved, st.Device.Requested}, "%s: device used, reserved, requested", what)
	for _, p := range []PoolStats{st.Host, *st.Device} {
		require.LessOrEqual(t, p.Used+p.Reserved, p.Capacity, "%s: %s budget exceeded", what, p.Name)
		require.Equal(t, p.Capacity-p.Used-p.Reserved, p.Free, "%s: %s free", what, p.Name)
	}
	require.Equal(t, states, st.Records, "%s: records per state", what)
	require.Equal(t, [2]uint64{m.hits, m.misses}, [2]uint64{st.Hits, st.Misses}, "%s: hits, misses", what)
	require.Equal(t, m.evict, st.Evictions, "%s: evictions", what)
	require.Len(t, m.indexed, len(m.index), "%s: OnForget told of exactly the keys the store let go", what)
	for k := range m.index {
		require.True(t, m.indexed[k], "%s: key %v", what, k)
	}
	for _, x := range m.recs {
		require.Equal(t, x.state, x.rec.State(), "%s: record %d (%s)", what, x.rec.ID(), x.key.Content)
		require.Equal(t, x.holds, x.rec.Refs(), "%s: record %d refs", what, x.rec.ID())
		if x.state == StateEncoding {
			continue
		}
		v, err := x.rec.Host()
		require.NoError(t, err)
		require.Equal(t, x.actual, v.Len())
		requireFilled(t, v.Bytes(), x.fill, "%s: record %d host bytes", what, x.rec.ID())
		d, staged := x.rec.Device()
		require.Equal(t, x.staged, staged, "%s: record %d staged", what, x.rec.ID())
		if staged {
			requireFilled(t, d.Bytes(), x.fill, "%s: record %d device bytes", what, x.rec.ID())
		}
	}
	for _, q := range m.reqs {
		if q.merged > 0 {
			requireFilled(t, q.mergedBuf.Bytes(), q.fill, "%s: %s merged buffer", what, q.req.ID())
		}
	}
}

func requireFilled(t *testing.T, b []byte, fill byte, format string, args ...any) {
	t.Helper()
	for i, c := range b {
		if c != fill {
			require.Failf(t, "overwritten", "%s: byte %d is %#x, want %#x", fmt.Sprintf(format, args...), i, c, fill)
		}
	}
}

// drain ends every request and encoding and lets every TTL pass.
func (m *model) drain() {
	for _, q := range slices.Clone(m.reqs) {
		q.req.Cancel()
		q.merged = 0
		m.releaseAll(q, 0)
		m.finish(q)
	}
	for _, x := range slices.Clone(m.recs) {
		if x.job != nil {
			require.ErrorIs(m.t, x.job.Complete(x.est), ErrAbandoned)
			m.gone(x)
		}
	}
	m.clock.Advance(25 * time.Hour)
	m.s.Sweep()
}
