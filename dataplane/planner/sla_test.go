package planner

import (
	"encoding/json"
	"math"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The SLA mode against testdata/sla_reference.py (numpy's polyfit and lstsq, Dynamo's
// profiler formulas): fits, recommendations and pool sizes.
func TestSLAMatchesReference(t *testing.T) {
	p, err := LoadProfile("testdata/sla_profile.json")
	require.NoError(t, err)
	b, err := os.ReadFile("testdata/sla_expected.json")
	require.NoError(t, err)
	var want struct {
		TTFTFit []float64 `json:"ttft_fit"`
		ITLFit  []float64 `json:"itl_fit"`
		Cases   []struct {
			ISL, OSL            int
			TTFT, ITL           float64
			TTFTms              float64 `json:"ttft_ms"`
			PrefillTokensPerGPU float64 `json:"prefill_tokens_per_gpu"`
			TTFTMet             bool    `json:"ttft_met"`
			ITLms               float64 `json:"itl_ms"`
			DecodeTokensPerGPU  float64 `json:"decode_tokens_per_gpu"`
			DecodeKV            float64 `json:"decode_kv"`
			ITLMet              bool    `json:"itl_met"`
			PrefillQueueUp      float64 `json:"prefill_queue_up"`
			PrefillQueueDown    float64 `json:"prefill_queue_down"`
			DecodeKVUp          float64 `json:"decode_kv_up"`
			DecodeKVDown        float64 `json:"decode_kv_down"`
			Needed              []struct {
				PrefillTokens  float64 `json:"prefill_tokens"`
				DecodeRequests float64 `json:"decode_requests"`
				Prefill        int
				Decode         int
			}
		}
	}
	require.NoError(t, json.Unmarshal(b, &want))
	for i, c := range want.TTFTFit {
		require.InEpsilon(t, c, p.TTFTFit[i], 1e-6, "ttft fit %d", i)
	}
	for i, c := range want.ITLFit {
		require.InEpsilon(t, c, p.ITLFit[i], 1e-6, "itl fit %d", i)
	}
	for _, c := range want.Cases {
		r := p.Recommend(c.ISL, c.OSL, c.TTFT, c.ITL)
		require.InEpsilon(t, c.TTFTms, r.TTFTms, 1e-6)
		require.InEpsilon(t, c.PrefillTokensPerGPU, r.PrefillTokensPerGPU, 1e-6)
		require.Equal(t, c.TTFTMet, r.TTFTMet)
		require.Equal(t, c.ITLMet, r.ITLMet)
		require.InDelta(t, c.DecodeKV, r.DecodeKV, 1e-9)
		require.InEpsilon(t, c.ITLms, r.ITLms, 1e-6)
		require.InEpsilon(t, c.DecodeTokensPerGPU, r.DecodeTokensPerGPU, 1e-6)
		require.InDelta(t, c.PrefillQueueUp, r.PrefillQueueUp, 1e-6)
		require.InDelta(t, c.PrefillQueueDown, r.PrefillQueueDown, 1e-6)
		require.InDelta(t, c.DecodeKVUp, r.DecodeKVUp, 1e-9)
		require.InDelta(t, c.DecodeKVDown, r.DecodeKVDown, 1e-9)
		target := &SLATarget{ISL: c.ISL, OSL: c.OSL, TTFT: c.TTFT, ITL: c.ITL, Profile: p, MinWorkers: 1}
		for _, n := range c.Needed {
			got, err := target.Needed(n.PrefillTokens, n.DecodeRequests)
			require.NoError(t, err)
			require.Equal(t, Pools{n.Prefill, n.Decode}, got, "%+v", n)
		}
		if !c.ITLMet {
			_, err := target.Needed(1, 1)
			require.ErrorContains(t, err, "no pool size does")
		}
	}
}

func TestDecideSLA(t *testing.T) {
	p, err := LoadProfile("testdata/sla_profile.json")
	require.NoError(t, err)
	target := &SLATarget{ISL: 3000, OSL: 300, TTFT: 200, ITL: 20, Profile: p, MinWorkers: 1}
	r := DefaultRules()
	r.AdjustInterval = 3 * time.Second
	iv := NewInterval(r)
	add := func(tokens, reqs float64) {
		for range 3 {
			iv.Add(Sample{PrefillQueue: math.NaN(), DecodeKV: math.NaN(), PrefillTokens: tokens, DecodeRequests: reqs})
		}
	}
	// Needs 38 prefill and 14 decode workers (the reference's third load): one step each.
	add(150000, 900)
	require.Equal(t, "hold", iv.Decide(Pools{2, 2}).Action(), "the load rules see nothing they measure")
	add(150000, 900)
	require.Equal(t, "prefill+1,decode+1", iv.DecideSLA(Pools{2, 2}, target).Action())
	// The budget: 8 GPUs, 4 + 4 in use: no add.
	add(150000, 900)
	require.Equal(t, "hold", iv.DecideSLA(Pools{4, 4}, target).Action())
	// Idle: down by one each, never under one worker.
	add(0, 0)
	require.Equal(t, "prefill-1,decode-1", iv.DecideSLA(Pools{3, 3}, target).Action())
	add(0, 0)
	require.Equal(t, "hold", iv.DecideSLA(Pools{1, 1}, target).Action())
	// Nothing measured: hold.
	require.Equal(t, "hold", iv.DecideSLA(Pools{3, 3}, target).Action())
}

func TestProfileFitNeedsPoints(t *testing.T) {
	p := &Profile{KVTokens: 100, Prefill: []PrefillPoint{{100, 1}, {200, 2}}}
	require.ErrorContains(t, p.Fit(), "a quadratic needs 3")
	p.Prefill = append(p.Prefill, PrefillPoint{300, 3})
	p.Decode = []DecodePoint{{KVUsage: 0.1, Context: 100, ITLms: 5}, {KVUsage: 0.2, Context: 100, ITLms: 6}, {KVUsage: 0.3, Context: 100, ITLms: 7}, {KVUsage: 0.4, Context: 100, ITLms: 8}}
	require.ErrorContains(t, p.Fit(), "more than one context length")
}

func FuzzParseProfile(f *testing.F) {
	b, err := os.ReadFile("testdata/sla_profile.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"kv_tokens":1,"prefill":[{"isl":1,"ttft_ms":1}]}`))
	f.Add([]byte(`{"kv_tokens":1,"ttft_fit":[1,2,3],"itl_fit":[1,2,3,4]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseProfile(b)
		if err != nil {
			return
		}
		if p.KVTokens <= 0 {
			t.Fatalf("accepted kv_tokens %d", p.KVTokens)
		}
		_ = p.Recommend(1000, 100, 200, 20) // never panics
	})
}
