package features

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Many goroutines admit, encode, stage, merge, prefill and cancel against small budgets, sharing
// a few keys, while a sampler checks that no budget is ever exceeded. Every goroutine must
// finish well before the deadline (no deadlock), every buffer must hold what its writer put
// there, and every byte must be back at the end. Run it with -race.
func TestConcurrentAdmission(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("random seed %#x", seed)
	clock := newClock()
	s, err := New(Options{
		Host:       PoolOptions{Capacity: 40 * 4 * kib, BlockBytes: 4 * kib, Allocator: &MmapAllocator{}},
		Device:     PoolOptions{Capacity: 16 * 4 * kib, BlockBytes: 4 * kib, Allocator: &MmapAllocator{}},
		MaxWait:    50 * time.Millisecond,
		MaxWaiters: 8,
		Now:        clock.Now,
	})
	require.NoError(t, err)

	const workers, requests = 12, 150
	stop := make(chan struct{})
	var samples atomic.Int64
	var overshoot atomic.Value
	sampler := make(chan struct{})
	go func() {
		defer close(sampler)
		for {
			select {
			case <-stop:
				return
			default:
			}
			st := s.Stats()
			for _, p := range []PoolStats{st.Host, *st.Device} {
				if p.Used+p.Reserved > p.Capacity || p.Free != p.Capacity-p.Used-p.Reserved || p.Idle > p.Used {
					overshoot.Store(fmt.Sprintf("%+v", p))
				}
			}
			samples.Add(1)
			runtime.Gosched()
		}
	}()

	var wg sync.WaitGroup
	var outcomes [4]atomic.Int64 // finished, refused, cancelled, encode failed
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := range requests {
				if err := runRequest(s, r, fmt.Sprintf("w%d-%d", w, i), &outcomes); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(60 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("deadlock: workers still running after 60s\n%s", buf[:runtime.Stack(buf, true)])
	}
	close(stop)
	<-sampler
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if o := overshoot.Load(); o != nil {
		t.Fatalf("sampler saw a budget exceeded: %v", o)
	}
	st := s.Stats()
	t.Logf("%d samples; finished %d, refused %d, cancelled %d, encode failed %d; hits %d misses %d; waits %d; rejections %v",
		samples.Load(), outcomes[0].Load(), outcomes[1].Load(), outcomes[2].Load(), outcomes[3].Load(),
		st.Hits, st.Misses, st.Host.Waits, st.Host.Rejections)
	require.Positive(t, outcomes[0].Load(), "nothing finished")
	require.Positive(t, st.Hits, "no sharing happened")
	clock.Advance(25 * time.Hour)
	s.Sweep()
	requireEmpty(t, s)
}

// fillFor is the byte every encoder of a key writes, so any reader can check it.
func fillFor(k Key) byte { return byte(len(k.Salt)*31 + int(k.Content[len(k.Content)-1])) }

// runRequest plays one request's life with random choices; budget refusals and cancellations
// are normal outcomes, anything else is an error.
func runRequest(s *Store, r *rand.Rand, id string, outcomes *[4]atomic.Int64) error {
	p := []Policy{{}, {Kind: KeepForReuse, TTL: time.Minute}, {Kind: KeepUntilDone}}[r.IntN(3)]
	req, err := s.Begin(id, p)
	if err != nil {
		return err
	}
	// A client that disconnects at a random moment, from another goroutine. Like the daemon,
	// it cancels only while no view of the request is being read (views die with the request).
	var disconnect sync.WaitGroup
	var reading sync.RWMutex
	if r.IntN(6) == 0 {
		delay := time.Duration(r.IntN(500)) * time.Microsecond
		disconnect.Go(func() {
			time.Sleep(delay)
			reading.Lock()
			defer reading.Unlock()
			req.Cancel()
		})
	}
	defer disconnect.Wait()
	normal := func(err error) bool {
		switch {
		case errors.Is(err, ErrBudget):
			outcomes[1].Add(1)
		case errors.Is(err, ErrIllegalTransition): // the disconnect came first
			outcomes[2].Add(1)
		case errors.Is(err, ErrEncodeFailed):
			outcomes[3].Add(1)
		default:
			return false
		}
		req.Cancel()
		return true
	}
	var recs []*Record
	for range 1 + r.IntN(3) {
		k := Key{Salt: []string{"a", "bb"}[r.IntN(2)], Content: fmt.Sprintf("media-%d", r.IntN(10)), Model: "m"}
		n := int64(1+int(k.Content[len(k.Content)-1]-'0')) * 3 * kib // the same size for every admission of a key
		rec, job, err := req.Admit(context.Background(), Item{Key: k, MediaID: k.Content, Bytes: n})
		if err != nil {
			if normal(err) {
				return nil
			}
			return fmt.Errorf("%s: admit: %w", id, err)
		}
		if job != nil { // the encoder's part, done inline
			b := job.Buffer().Bytes()
			for i := range b {
				b[i] = fillFor(k)
			}
			if r.IntN(12) == 0 {
				err = job.Fail(errors.New("injected"))
			} else if err = job.Complete(n); errors.Is(err, ErrAbandoned) {
				err = nil
			}
			if err != nil {
				return fmt.Errorf("%s: encoder: %w", id, err)
			}
		}
		recs = append(recs, rec)
	}
	for _, rec := range recs {
		select {
		case <-rec.Ready():
		case <-time.After(10 * time.Second):
			return fmt.Errorf("%s: record %d never became ready", id, rec.ID())
		}
		if err := rec.Err(); err != nil {
			normal(err)
			return nil
		}
		if err := checkRecordBytes(req, rec, &reading); err != nil {
			if normal(err) {
				return nil
			}
			return fmt.Errorf("%s: %w", id, err)
		}
		if r.IntN(2) == 0 {
			if _, err := req.Stage(context.Background(), rec); err != nil && !errors.Is(err, ErrIllegalTransition) {
				if normal(err) {
					return nil
				}
				return fmt.Errorf("%s: stage: %w", id, err)
			}
		}
	}
	if r.IntN(2) == 0 {
		if _, err := req.AllocMerged(context.Background(), r.IntN(3) == 0, int64(1+r.IntN(8))*4*kib); err != nil {
			if normal(err) {
				return nil
			}
			return fmt.Errorf("%s: alloc merged: %w", id, err)
		}
	}
	for _, step := range []func() error{req.Merged, req.Prefilled, req.Done} {
		if err := step(); err != nil {
			if normal(err) {
				return nil
			}
			return fmt.Errorf("%s: %w", id, err)
		}
	}
	outcomes[0].Add(1)
	return nil
}

// checkRecordBytes reads a held record's bytes (under the request's reading lock). A request
// the disconnect cancelled holds nothing any more: the record may live on, cached or held by
// another request, but its memory is no longer this request's to read (eviction may hand it
// to another encoder at any moment), so it is not read.
func checkRecordBytes(req *Request, rec *Record, reading *sync.RWMutex) error {
	reading.RLock()
	defer reading.RUnlock()
	if !slices.Contains(req.Records(), rec) {
		return fmt.Errorf("request %q no longer holds record %d: %w", req.ID(), rec.ID(), ErrIllegalTransition)
	}
	v, err := rec.Host()
	if err != nil {
		return err
	}
	for i, c := range v.Bytes() {
		if c != fillFor(rec.Key()) {
			return fmt.Errorf("record %d byte %d is %#x, want %#x: memory shared by two owners", rec.ID(), i, c, fillFor(rec.Key()))
		}
	}
	return nil
}
