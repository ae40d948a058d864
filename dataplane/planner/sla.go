package planner

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
)

// SLA mode, after Dynamo's SLA profiler and planner (benchmarks/profiler/profile_sla.py,
// components/planner/src/dynamo/planner/utils/perf_interpolation.py and planner_core.py): a
// profile of one prefill and one decode engine gives TTFT as a function of ISL (a quadratic
// fit) and ITL as a function of the decode engine's KV-cache use and context length (a
// bilinear fit); from them, for a target ISL, OSL, TTFT and ITL, the throughput one engine of
// each pool sustains, the pool sizes a load needs, and load-based thresholds.

// PrefillPoint is one prefill measurement: mean TTFT at an ISL (concurrency 1).
type PrefillPoint struct {
	ISL    int     `json:"isl"`
	TTFTms float64 `json:"ttft_ms"`
}

// DecodePoint is one decode measurement: mean ITL and output tokens/s at a concurrency and
// context length, and the KV-cache use that implies.
type DecodePoint struct {
	Concurrency int     `json:"concurrency"`
	ISL         int     `json:"isl"`
	OSL         int     `json:"osl"`
	Context     float64 `json:"context"`  // ISL + OSL/2: the mean context while decoding
	KVUsage     float64 `json:"kv_usage"` // Concurrency × Context / KVTokens
	ITLms       float64 `json:"itl_ms"`
	TokensPerS  float64 `json:"tokens_per_s"` // output tokens/s of the engine
}

// Profile is `dataplane plan profile`'s result (profile.json).
type Profile struct {
	Endpoint    string         `json:"endpoint"`
	PrefillGPUs int            `json:"prefill_gpus"`
	DecodeGPUs  int            `json:"decode_gpus"`
	KVTokens    int            `json:"kv_tokens"` // the decode engine's KV cache in tokens
	Prefill     []PrefillPoint `json:"prefill"`
	Decode      []DecodePoint  `json:"decode"`
	// TTFTFit: ttft_ms = a·isl² + b·isl + c; ITLFit: itl_ms = a + b·kv + c·ctx + d·kv·ctx.
	TTFTFit [3]float64 `json:"ttft_fit"`
	ITLFit  [4]float64 `json:"itl_fit"`
}

// Fit fits both models to the points.
func (p *Profile) Fit() error {
	if len(p.Prefill) < 3 {
		return fmt.Errorf("profile: %d prefill points, a quadratic needs 3", len(p.Prefill))
	}
	if len(p.Decode) < 4 {
		return fmt.Errorf("profile: %d decode points, the ITL fit needs 4", len(p.Decode))
	}
	var rows [][]float64
	var y []float64
	for _, pt := range p.Prefill {
		x := float64(pt.ISL)
		rows, y = append(rows, []float64{x * x, x, 1}), append(y, pt.TTFTms)
	}
	c, err := leastSquares(rows, y)
	if err != nil {
		return fmt.Errorf("profile: TTFT fit: %w", err)
	}
	copy(p.TTFTFit[:], c)
	rows, y = nil, nil
	for _, pt := range p.Decode {
		rows, y = append(rows, []float64{1, pt.KVUsage, pt.Context, pt.KVUsage * pt.Context}), append(y, pt.ITLms)
	}
	if c, err = leastSquares(rows, y); err != nil {
		return fmt.Errorf("profile: ITL fit: %w (sweep more than one context length)", err)
	}
	copy(p.ITLFit[:], c)
	return nil
}

// leastSquares solves min |A c - y| by the normal equations (the columns are scaled first,
// ISL² and ISL differ by orders of magnitude).
func leastSquares(a [][]float64, y []float64) ([]float64, error) {
	n := len(a[0])
	scale := make([]float64, n)
	for _, r := range a {
		for j, v := range r {
			scale[j] = max(scale[j], math.Abs(v))
		}
	}
	m := make([][]float64, n)
	for i := range m {
		m[i] = make([]float64, n+1)
	}
	for k, r := range a {
		for i := range n {
			if scale[i] == 0 {
				return nil, errors.New("a column is all zero")
			}
			ri := r[i] / scale[i]
			for j := range n {
				m[i][j] += ri * r[j] / scale[j]
			}
			m[i][n] += ri * y[k]
		}
	}
	// Gaussian elimination with partial pivoting.
	for col := range n {
		piv := col
		for r := col + 1; r < n; r++ {
			if math.Abs(m[r][col]) > math.Abs(m[piv][col]) {
				piv = r
			}
		}
		if math.Abs(m[piv][col]) < 1e-12 {
			return nil, errors.New("the points do not determine the fit")
		}
		m[col], m[piv] = m[piv], m[col]
		for r := range n {
			if r == col {
				continue
			}
			f := m[r][col] / m[col][col]
			for j := col; j <= n; j++ {
				m[r][j] -= f * m[col][j]
			}
		}
	}
	out := make([]float64, n)
	for i := range n {
		out[i] = m[i][n] / m[i][i] / scale[i]
	}
	return out, nil
}

// TTFT is the fitted prefill time of an ISL, in ms.
func (p *Profile) TTFT(isl float64) float64 {
	return p.TTFTFit[0]*isl*isl + p.TTFTFit[1]*isl + p.TTFTFit[2]
}

// ITL is the fitted inter-token latency at a KV-cache use and context, in ms.
func (p *Profile) ITL(kv, ctx float64) float64 {
	return p.ITLFit[0] + p.ITLFit[1]*kv + p.ITLFit[2]*ctx + p.ITLFit[3]*kv*ctx
}

// PrefillThroughputPerGPU is prompt tokens/s per GPU at an ISL (one request at a time, as
// Dynamo's profiler measures it).
func (p *Profile) PrefillThroughputPerGPU(isl float64) float64 {
	t := p.TTFT(isl)
	if t <= 0 {
		return math.NaN()
	}
	return isl / t * 1000 / float64(max(p.PrefillGPUs, 1))
}

// DecodeAt is the best decode operating point under an ITL target at a context length: the
// highest KV-cache use (in steps of 1/100, up to 1) whose fitted ITL meets the target, and the
// output tokens/s per GPU there. ok is false when not even an empty engine meets it.
func (p *Profile) DecodeAt(itlTarget, ctx float64) (kv, tokensPerGPU float64, ok bool) {
	for i := 100; i >= 1; i-- {
		k := float64(i) / 100
		itl := p.ITL(k, ctx)
		if itl > 0 && itl <= itlTarget {
			conc := k * float64(p.KVTokens) / ctx
			return k, conc * 1000 / itl / float64(max(p.DecodeGPUs, 1)), true
		}
	}
	return 0, 0, false
}

// Recommendation is what `plan profile` prints for an ISL, OSL, TTFT and ITL.
type Recommendation struct {
	TTFTms, PrefillTokensPerGPU      float64 // at the ISL
	ITLms, DecodeTokensPerGPU        float64 // at the chosen KV use
	DecodeKV                         float64
	PrefillQueueUp, PrefillQueueDown float64
	DecodeKVUp, DecodeKVDown         float64
	TTFTMet, ITLMet                  bool
}

// Recommend applies Dynamo's profiler's rules: the prefill queue may grow until TTFT would be
// 120 % of the target (scale up) and shrink until 80 % (scale down), at least 0.1; the decode
// KV thresholds are the chosen KV use ± 0.2, within [0.1, 1].
func (p *Profile) Recommend(isl, osl int, ttft, itl float64) Recommendation {
	r := Recommendation{TTFTms: p.TTFT(float64(isl)), PrefillTokensPerGPU: p.PrefillThroughputPerGPU(float64(isl))}
	r.TTFTMet = r.TTFTms <= ttft
	r.PrefillQueueUp = max(0.1, ttft*1.2/r.TTFTms-1)
	r.PrefillQueueDown = max(0.1, ttft*0.8/r.TTFTms-1)
	ctx := float64(isl) + float64(osl)/2
	kv, tok, ok := p.DecodeAt(itl, ctx)
	r.ITLMet = ok
	if !ok { // as Dynamo: the best there is, the emptiest engine
		kv = 0.01
		tok = kv * float64(p.KVTokens) / ctx * 1000 / p.ITL(kv, ctx) / float64(max(p.DecodeGPUs, 1))
	}
	r.DecodeKV, r.DecodeTokensPerGPU, r.ITLms = kv, tok, p.ITL(kv, ctx)
	r.DecodeKVUp, r.DecodeKVDown = min(1, kv+0.2), max(0.1, kv-0.2)
	return r
}

// SLATarget is what `plan --sla` holds the pools to.
type SLATarget struct {
	ISL, OSL   int
	TTFT, ITL  float64 // ms
	Profile    *Profile
	MinWorkers int
}

// Needed is the pool sizes a measured load needs: the prompt tokens waiting for prefill must
// be computed within the TTFT target (tokens ÷ TTFT ÷ one engine's prefill rate), and the
// requests in decode must fit at the KV use that meets the ITL target (requests × context ÷
// the KV tokens one engine holds there). Dynamo's SLA planner predicts request rates from its
// frontend's metrics; a fleet's workers report these counts, so we size by them.
func (t *SLATarget) Needed(prefillTokens, decodeRequests float64) (Pools, error) {
	p := t.Profile
	rate := p.PrefillThroughputPerGPU(float64(t.ISL)) * float64(max(p.PrefillGPUs, 1))
	ctx := float64(t.ISL) + float64(t.OSL)/2
	kv, _, ok := p.DecodeAt(t.ITL, ctx)
	if !ok || !(rate > 0) {
		return Pools{}, fmt.Errorf("the profile meets neither the TTFT %v ms at ISL %d nor the ITL %v ms: no pool size does", t.TTFT, t.ISL, t.ITL)
	}
	perDecode := kv * float64(p.KVTokens) / ctx // requests one decode engine holds at the target
	need := Pools{
		Prefill: int(math.Ceil(prefillTokens / (t.TTFT / 1000) / rate)),
		Decode:  int(math.Ceil(decodeRequests / perDecode)),
	}
	need.Prefill, need.Decode = max(need.Prefill, t.MinWorkers), max(need.Decode, t.MinWorkers)
	return need, nil
}

// LoadProfile reads profile.json (ParseProfile).
func LoadProfile(path string) (*Profile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := ParseProfile(b)
	if err != nil {
		return nil, fmt.Errorf("profile %s: %w", path, err)
	}
	return p, nil
}

// ParseProfile reads a profile and fits it again if its fit is missing; the points must be
// finite and in range.
func ParseProfile(b []byte) (*Profile, error) {
	if len(b) > 16<<20 {
		return nil, errors.New("larger than 16 MiB")
	}
	var p Profile
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	switch {
	case p.KVTokens <= 0:
		return nil, fmt.Errorf("kv_tokens %d: want a positive count", p.KVTokens)
	case p.PrefillGPUs < 0 || p.DecodeGPUs < 0 || p.PrefillGPUs > 1<<16 || p.DecodeGPUs > 1<<16:
		return nil, fmt.Errorf("prefill_gpus %d, decode_gpus %d: out of range", p.PrefillGPUs, p.DecodeGPUs)
	case len(p.Prefill) > 1<<16 || len(p.Decode) > 1<<16:
		return nil, errors.New("more than 65,536 points")
	}
	for i, pt := range p.Prefill {
		if pt.ISL < 1 || !(pt.TTFTms > 0 && pt.TTFTms < 1e9) {
			return nil, fmt.Errorf("prefill[%d]: isl %d, ttft_ms %v: out of range", i, pt.ISL, pt.TTFTms)
		}
	}
	for i, pt := range p.Decode {
		if !(pt.Context > 0 && pt.Context < 1e9) || !(pt.KVUsage >= 0 && pt.KVUsage <= 10) || !(pt.ITLms > 0 && pt.ITLms < 1e9) {
			return nil, fmt.Errorf("decode[%d]: context %v, kv_usage %v, itl_ms %v: out of range", i, pt.Context, pt.KVUsage, pt.ITLms)
		}
	}
	for _, c := range append(p.TTFTFit[:], p.ITLFit[:]...) {
		if math.IsNaN(c) || math.IsInf(c, 0) {
			return nil, errors.New("a fit coefficient is not finite")
		}
	}
	if p.TTFTFit == [3]float64{} || p.ITLFit == [4]float64{} {
		if err := p.Fit(); err != nil {
			return nil, err
		}
	}
	return &p, nil
}
