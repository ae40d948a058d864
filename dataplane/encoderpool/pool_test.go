package encoderpool

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/encoder"
	"dataplane/dataplane/sequence"
	"dataplane/native"
)

// fakeModel records its batches, takes perToken of time per token, writes each input's first
// value into every output element, and fails any batch holding an input with Frames < 0.
type fakeModel struct {
	perToken time.Duration
	mu       sync.Mutex
	batches  [][]float32 // first value of each input, per batch
	running  atomic.Int32
	overlap  atomic.Bool
}

var errBadInput = errors.New("bad input")

func (m *fakeModel) Run(inputs []encoder.Input, outs []native.Matrix) error {
	if m.running.Add(1) > 1 {
		m.overlap.Store(true)
	}
	defer m.running.Add(-1)
	var ids []float32
	tokens := 0
	for _, in := range inputs {
		ids = append(ids, in.Data[0])
		if in.Frames < 0 {
			return errBadInput
		}
	}
	for i := range outs {
		tokens += outs[i].Rows
		f := make([]float32, outs[i].Rows*outs[i].Cols)
		for k := range f {
			f[k] = inputs[i].Data[0]
		}
		copy(outs[i].Data, native.AsBytes(f))
	}
	m.mu.Lock()
	m.batches = append(m.batches, ids)
	m.mu.Unlock()
	time.Sleep(m.perToken * time.Duration(tokens))
	return nil
}

func (m *fakeModel) sizes() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int
	for _, b := range m.batches {
		out = append(out, len(b))
	}
	return out
}

// job makes a job whose input is the value id and whose result lands in done.
func job(m Model, id float32, tokens int, pri Priority, done chan<- result) *Job {
	out := native.Matrix{Data: make([]byte, tokens*4*4), DType: native.F32, Rows: tokens, Cols: 4}
	return &Job{Model: m, Modality: sequence.Image, Input: encoder.Input{Data: []float32{id}}, Out: out, Tokens: tokens,
		Priority: pri, Done: func(err error) { done <- result{id, out, err} }}
}

type result struct {
	id  float32
	out native.Matrix
	err error
}

func collect(t *testing.T, done <-chan result, n int) []result {
	t.Helper()
	var out []result
	for range n {
		select {
		case r := <-done:
			out = append(out, r)
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of %d jobs finished", len(out), n)
		}
	}
	return out
}

func TestBatchesCloseOnSizeWaitAndTokens(t *testing.T) {
	m := &fakeModel{}
	p := New(Options{MaxBatch: 4, MaxWait: 100 * time.Millisecond, MaxBatchTokens: 100})
	defer p.Close()
	done := make(chan result, 64)
	for i := range 8 { // two full batches at once
		require.NoError(t, p.Submit(job(m, float32(i), 10, Interactive, done)))
	}
	collect(t, done, 8)
	require.Equal(t, []int{4, 4}, m.sizes())

	start := time.Now()
	require.NoError(t, p.Submit(job(m, 9, 10, Interactive, done))) // alone: waits MaxWait for company
	collect(t, done, 1)
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)

	for i := range 3 { // 60 tokens each, budget 100: one per batch
		require.NoError(t, p.Submit(job(m, float32(20+i), 60, Interactive, done)))
	}
	collect(t, done, 3)
	require.Equal(t, []int{4, 4, 1, 1, 1, 1}, m.sizes())
}

func TestInteractiveBeforeBatch(t *testing.T) {
	m := &fakeModel{perToken: time.Millisecond}
	p := New(Options{MaxBatch: 1, MaxWait: time.Millisecond})
	defer p.Close()
	done := make(chan result, 16)
	require.NoError(t, p.Submit(job(m, 0, 50, Interactive, done))) // keeps the worker busy 50 ms
	time.Sleep(10 * time.Millisecond)
	for i := 1; i <= 3; i++ {
		require.NoError(t, p.Submit(job(m, float32(i), 1, Batch, done)))
	}
	for i := 4; i <= 6; i++ {
		require.NoError(t, p.Submit(job(m, float32(i), 1, Interactive, done)))
	}
	collect(t, done, 7)
	var order []float32
	for _, b := range m.batches {
		order = append(order, b...)
	}
	require.Equal(t, []float32{0, 4, 5, 6, 1, 2, 3}, order)
}

// A batch that fails is retried item by item: only the bad input fails, the rest are encoded.
func TestFailureIsContained(t *testing.T) {
	m := &fakeModel{}
	p := New(Options{MaxBatch: 4, MaxWait: 50 * time.Millisecond})
	defer p.Close()
	done := make(chan result, 8)
	for i := range 4 {
		j := job(m, float32(i), 2, Interactive, done)
		if i == 2 {
			j.Input.Frames = -1
		}
		require.NoError(t, p.Submit(j))
	}
	for _, r := range collect(t, done, 4) {
		if r.id == 2 {
			require.ErrorIs(t, r.err, errBadInput)
			continue
		}
		require.NoError(t, r.err)
		require.Equal(t, r.id, native.AsFloat32(r.out.Data)[7], "output written")
	}
}

func TestCancelQueueFullAndClose(t *testing.T) {
	m := &fakeModel{perToken: time.Millisecond}
	p := New(Options{MaxBatch: 1, MaxWait: time.Millisecond, MaxQueued: 3})
	done := make(chan result, 16)
	require.NoError(t, p.Submit(job(m, 0, 100, Interactive, done))) // runs for 100 ms
	for m.running.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	j := job(m, 1, 1, Interactive, done)
	j.Ctx = ctx
	require.NoError(t, p.Submit(j))
	require.NoError(t, p.Submit(job(m, 2, 1, Interactive, done)))
	require.NoError(t, p.Submit(job(m, 3, 1, Interactive, done)))
	require.ErrorIs(t, p.Submit(job(m, 4, 1, Interactive, done)), ErrQueueFull)
	cancel()
	got := map[float32]error{}
	for _, r := range collect(t, done, 4) {
		got[r.id] = r.err
	}
	require.ErrorIs(t, got[1], context.Canceled, "cancelled while queued")
	require.NoError(t, got[2])
	for _, b := range m.batches {
		require.NotContains(t, b, float32(1), "a cancelled job never runs")
	}

	require.NoError(t, p.Submit(job(m, 5, 30, Interactive, done)))
	require.NoError(t, p.Submit(job(m, 6, 30, Batch, done)))
	p.Close() // drains
	collect(t, done, 2)
	require.ErrorIs(t, p.Submit(job(m, 7, 1, Interactive, done)), ErrClosed)
}

// Work spreads over workers by estimated cost, and the estimate follows measured times.
func TestDispatchAndCalibration(t *testing.T) {
	m := &fakeModel{perToken: 200 * time.Microsecond}
	workers := make(chan int, 4)
	p := New(Options{Workers: 2, MaxBatch: 1, MaxWait: time.Millisecond, SecondsPerToken: 1,
		Observe: func(b BatchStats) { workers <- b.Worker }})
	defer p.Close()
	done := make(chan result, 16)
	require.NoError(t, p.Submit(job(m, 0, 100, Interactive, done)))
	require.NoError(t, p.Submit(job(m, 1, 100, Interactive, done)))
	collect(t, done, 2)
	require.ElementsMatch(t, []int{0, 1}, []int{<-workers, <-workers}, "the second job went to the idle worker")
	spt := p.SecondsPerToken(m)
	require.InDelta(t, 200e-6, spt, 150e-6, "calibrated from measurements, not the 1 s seed")
	require.Less(t, p.ETA(m, 100), time.Second)
}

func TestConcurrentSubmitters(t *testing.T) {
	m := &fakeModel{}
	p := New(Options{Workers: 2, MaxBatch: 5, MaxWait: time.Millisecond, MaxQueued: 100000})
	var calls atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				ctx, cancel := context.WithCancel(context.Background())
				var once atomic.Bool
				j := &Job{Model: m, Input: encoder.Input{Data: []float32{1}}, Tokens: 1 + r.IntN(8), Ctx: ctx,
					Priority: Priority(r.IntN(2)), Done: func(error) {
						if !once.CompareAndSwap(false, true) {
							panic("Done called twice")
						}
						calls.Add(1)
					}}
				j.Out = native.Matrix{Data: make([]byte, j.Tokens*4), DType: native.F32, Rows: j.Tokens, Cols: 1}
				if err := p.Submit(j); err != nil {
					t.Error(err)
				}
				if r.IntN(4) == 0 {
					cancel()
				} else {
					defer cancel()
				}
			}
		}()
	}
	wg.Wait()
	p.Close()
	require.Equal(t, int64(8*200), calls.Load(), "every job reported exactly once")
	require.Zero(t, p.Queued())
}

// With a real encoder, pooled results equal running the model directly.
func TestRealEncoder(t *testing.T) {
	cfg := native.EncoderConfig{Arch: native.ArchCLIP, Hidden: 32, Intermediate: 64, Layers: 2, Heads: 2,
		Act: native.ActQuickGELU, LNEps: 1e-5, ImageSize: 32, PatchSize: 8, Channels: 3}
	model, err := encoder.Random(cfg, 3, nil, 1)
	require.NoError(t, err)
	defer model.Close()
	p := New(Options{MaxBatch: 4, MaxWait: 20 * time.Millisecond})
	defer p.Close()
	r := rand.New(rand.NewPCG(1, 2))
	done := make(chan result, 8)
	var want [][]float32
	for i := range 6 {
		in := encoder.Input{Data: make([]float32, 3*32*32)}
		for k := range in.Data {
			in.Data[k] = float32(r.NormFloat64())
		}
		tokens, err := model.Tokens(in)
		require.NoError(t, err)
		direct := make([]float32, tokens*model.Width())
		require.NoError(t, model.Run([]encoder.Input{in}, []native.Matrix{{Data: native.AsBytes(direct), DType: native.F32, Rows: tokens, Cols: model.Width()}}))
		want = append(want, direct)
		out := native.Matrix{Data: make([]byte, len(direct)*4), DType: native.F32, Rows: tokens, Cols: model.Width()}
		id := float32(i)
		require.NoError(t, p.Submit(&Job{Model: model, Input: in, Out: out, Tokens: tokens, Done: func(err error) { done <- result{id, out, err} }}))
	}
	for _, res := range collect(t, done, 6) {
		require.NoError(t, res.err)
		require.Equal(t, want[int(res.id)], native.AsFloat32(res.out.Data))
	}
}
