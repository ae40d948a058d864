package router

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/router/internal/testrand"
)

// The encoder whose features are ready first is chosen, named, and its ready time is the encode
// wait every worker is charged; every option's terms are in the decision.
func TestJointRoutingPicksTheEarliestEncoder(t *testing.T) {
	r := newTestRouter(t, "a", "b")
	prompt := testrand.Tokens(testrand.New(t), 16*10)
	opts := []EncoderOption{
		{Name: "local", Link: "local", Queue: 12, Encode: 5},
		{Name: "far", Link: "zone", Queue: 0, Encode: 5, Return: 4},
		{Name: "near", Link: "rack", Queue: 1, Encode: 5, Return: 1},
	}
	d, err := decide(r, Request{Tokens: prompt, Encoders: opts, ReadyIn: 99}) // ReadyIn is replaced
	require.NoError(t, err)
	require.Equal(t, "near", d.Encoder)
	require.Len(t, d.Encoders, 3)
	for i, want := range []float64{17, 9, 7} {
		require.InDelta(t, want, d.Encoders[i].Ready, 1e-12)
		require.Equal(t, i == 2, d.Encoders[i].Chosen)
	}
	a := d.Score("a")
	require.InDelta(t, 7, a.EncodeWait, 1e-12)
	require.InDelta(t, 10+7+10, a.Cost, 1e-12) // prefill 10 + wait 7 + decode 10
	// TTFT: (10 prefill + 7 wait) blocks of 16 tokens at 15 µs a token.
	require.InDelta(t, 17*16*15e-3, a.TTFT, 1e-9)
	require.Equal(t, "rack", d.Encoders[2].Link)

	// Equal ready times: the earlier option (the caller lists its own encoder first).
	d, err = decide(r, Request{Tokens: prompt, Encoders: []EncoderOption{{Name: "local", Encode: 3}, {Name: "remote", Encode: 2, Return: 1}}})
	require.NoError(t, err)
	require.Equal(t, "local", d.Encoder)

	// No options: ReadyIn as before, nothing named.
	d, err = decide(r, Request{Tokens: prompt, ReadyIn: 4})
	require.NoError(t, err)
	require.Empty(t, d.Encoder)
	require.Empty(t, d.Encoders)
	require.InDelta(t, 4, d.Score("a").EncodeWait, 1e-12)
}

// Bad terms exclude an option; no usable option, or too many, is an error.
func TestJointRoutingBadOptions(t *testing.T) {
	r := newTestRouter(t, "a")
	prompt := testrand.Tokens(testrand.New(t), 64)
	d, err := decide(r, Request{Tokens: prompt, Encoders: []EncoderOption{{Name: "nan", Encode: math.NaN()}, {Name: "neg", Queue: -1}, {Name: "inf", Return: math.Inf(1)}, {Name: "ok", Encode: 2}}})
	require.NoError(t, err)
	require.Equal(t, "ok", d.Encoder)
	for _, e := range d.Encoders[:3] {
		require.NotEmpty(t, e.Excluded, e.Name)
	}
	_, err = decide(r, Request{Tokens: prompt, Encoders: []EncoderOption{{Name: "nan", Encode: math.NaN()}}})
	_, none := errors.AsType[*ErrNoEncoder](err)
	require.True(t, none, "%v", err)
	_, err = decide(r, Request{Tokens: prompt, Encoders: make([]EncoderOption, MaxEncoderOptions+1)})
	require.ErrorContains(t, err, "encoder options")
}

// The claim in encoders.go, checked by brute force: over random workers (caches, backlogs,
// hand-off costs) and random encoders, the decision's (encoder, worker) pair costs no more than
// any other pair, each pair's cost computed from the seed's model directly.
func TestJointRoutingIsTheCheapestPair(t *testing.T) {
	rnd := testrand.New(t)
	names := []string{"w0", "w1", "w2", "w3", "w4", "w5"}
	for round := range 30 {
		r := newTestRouter(t, names...)
		prompt := testrand.Tokens(rnd, 16*(4+rnd.IntN(40)))
		h, _ := NewHasher(16)
		hashes, _ := h.Sequence(nil, prompt, HashSeed, nil)
		for i, w := range names {
			if n := rnd.IntN(len(hashes) + 1); n > 0 {
				r.Index().Store(r.find(w).slot, 0, 0, hashes[:n], nil)
			}
			if rnd.IntN(2) == 0 { // a backlog
				busy, err := decide(r, Request{Tokens: testrand.Tokens(rnd, 16*(1+rnd.IntN(60)))})
				require.NoError(t, err)
				require.NoError(t, r.Start(fmt.Sprintf("busy-%d-%d", round, i), busy, w, time.Now()))
			}
		}
		handoff := map[string]float64{}
		for _, w := range names {
			handoff[w] = float64(rnd.IntN(8))
		}
		var encs []EncoderOption
		for i := range 1 + rnd.IntN(5) {
			encs = append(encs, EncoderOption{Name: fmt.Sprint("e", i), Queue: float64(rnd.IntN(40)), Encode: float64(1 + rnd.IntN(20)), Return: float64(rnd.IntN(6))})
		}
		req := Request{Tokens: prompt, Encoders: encs, Transfer: func(w string) float64 { return handoff[w] }}
		d, err := decide(r, req)
		require.NoError(t, err)

		// Each pair from the terms alone: prefill and decode blocks from the plain decision (no
		// media), the wait from the encoder's ready time and the worker's backlog.
		plain, err := decide(r, Request{Tokens: prompt})
		require.NoError(t, err)
		pairCost := func(e EncoderOption, w string) float64 {
			s := plain.Score(w)
			ready := e.Queue + e.Encode + e.Return
			wait := max(ready-float64(s.PrefillTokens)/16, 0)
			return s.PrefillBlocks + wait + s.DecodeBlocks + handoff[w]
		}
		chosen := encs[0]
		for _, e := range d.Encoders {
			if e.Chosen {
				chosen = EncoderOption{Name: e.Name, Queue: e.Queue, Encode: e.Encode, Return: e.Return}
			}
		}
		got := pairCost(chosen, d.Worker)
		require.InDelta(t, got, d.Score(d.Worker).Cost, 1e-9)
		for _, e := range encs {
			for _, w := range names {
				require.LessOrEqual(t, got, pairCost(e, w)+1e-9, "round %d: (%s, %s) costs %v, the pair chosen (%s, %s) %v", round, e.Name, w, pairCost(e, w), d.Encoder, d.Worker, got)
			}
		}
	}
}

// A disaggregated decision chooses the encoder too: the prefill step waits for it.
func TestJointRoutingDisaggregated(t *testing.T) {
	r := newTestRouter(t, "p", "d")
	require.NoError(t, r.SetWorkerInfo("p", WorkerInfo{Role: RolePrefill}))
	require.NoError(t, r.SetWorkerInfo("d", WorkerInfo{Role: RoleDecode}))
	prompt := testrand.Tokens(testrand.New(t), 16*8)
	var d Decision
	require.NoError(t, r.Route(Request{Tokens: prompt, Encoders: []EncoderOption{{Name: "slow", Encode: 30}, {Name: "fast", Encode: 3}}}, &d))
	require.Equal(t, "fast", d.Encoder)
	require.Equal(t, "p", d.Prefill)
	require.InDelta(t, 3, d.PrefillScores[0].EncodeWait, 1e-12)
}
