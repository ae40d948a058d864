package router

import (
	"math"
	"strings"
)

// Scoring, as Dynamo's default selector does it (lib/kv-router scheduling/selector.rs):
//
//	cost = overlap weight × (prefill blocks + encode wait) + decode blocks + transfer
//	prefill blocks = (the worker's outstanding prefill tokens + this prompt's uncached tokens) / block size
//	encode wait    = max(0, blocks until the features are ready − the worker's prefill backlog)
//	decode blocks  = the worker's active blocks + this prompt's blocks not already active there
//
// Prefill blocks and encode wait together are max(backlog, ready in) + uncached: when the
// request's prefill can end on that worker. Text-only requests have no wait.
//
// Temperature 0 picks the cheapest worker (ties: more cached blocks, then the smaller name);
// above 0, costs are normalised to [0, 1] and a worker is drawn with p ∝ exp(−norm / T).

// WorkerScore is one worker's line in a decision's explanation.
type WorkerScore struct {
	Worker   string `json:"worker"`
	Eligible bool   `json:"eligible"`
	Excluded string `json:"excluded,omitempty"` // why not eligible: "unhealthy", "not in allow-list", a role, a topology rule

	Overlap       int     `json:"overlap_blocks"`          // leading prompt blocks cached on the device tier
	OverlapAny    int     `json:"overlap_any_blocks"`      // ... on any tracked tier
	ActiveBlocks  int64   `json:"active_blocks"`           // blocks in use by requests in flight
	PrefillTokens int64   `json:"prefill_tokens"`          // prompt tokens in flight not yet computed
	Reported      bool    `json:"load_reported,omitempty"` // the two above include the worker's own report (Slots.LoadAt)
	NewBlocks     int     `json:"new_blocks"`              // this prompt's blocks not active there yet
	Uncached      int     `json:"uncached_tokens"`         // this prompt's tokens to compute there
	PrefillBlocks float64 `json:"prefill_blocks"`          // (PrefillTokens + Uncached) / block size
	DecodeBlocks  float64 `json:"decode_blocks"`           // ActiveBlocks + NewBlocks
	EncodeWait    float64 `json:"encode_wait,omitempty"`   // Request.ReadyIn beyond the prefill backlog, blocks
	Transfer      float64 `json:"transfer,omitempty"`      // Request.Transfer, blocks
	// TTFT is the predicted time to the first token there, ms: (PrefillBlocks + EncodeWait +
	// Transfer) blocks of prefill time (a decode worker's, in two steps: the prefill worker's).
	TTFT float64 `json:"ttft_ms,omitempty"`
	// A disaggregated decision's (disagg.go): the worker's domain at the topology level, and on
	// a decode worker the KV cache's move from the prefill worker (the soft cost's term, blocks)
	// and the level that move crosses ("local": none of the QoS table's).
	Domain      string  `json:"domain,omitempty"`
	KVTransfer  float64 `json:"kv_transfer,omitempty"`
	Link        string  `json:"link,omitempty"`
	Cost        float64 `json:"cost"`
	Probability float64 `json:"probability"` // of being chosen (1 for the argmin at T = 0)
}

// Choose picks a worker among the eligible scores and fills in their probabilities: the
// selector alone, without side effects. u is a uniform draw in [0, 1), used only when
// temperature > 0. It returns the index of the chosen score, or -1 if none is eligible.
func Choose(scores []WorkerScore, temperature, u float64) int {
	best := -1
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range scores {
		s := &scores[i]
		if !s.Eligible {
			continue
		}
		lo, hi = min(lo, s.Cost), max(hi, s.Cost) // the builtins: math.Min and Max are calls here
		if best < 0 || better(s, &scores[best]) {
			best = i
		}
	}
	if best < 0 {
		return -1
	}
	if temperature <= 0 || hi == lo {
		if temperature > 0 { // all equal: uniform
			return drawUniform(scores, u)
		}
		scores[best].Probability = 1
		return best
	}
	sum := 0.0
	for i := range scores {
		if s := &scores[i]; s.Eligible {
			s.Probability = math.Exp(-(s.Cost - lo) / (hi - lo) / temperature)
			sum += s.Probability
		}
	}
	pick, acc := -1, 0.0
	for i := range scores {
		if s := &scores[i]; s.Eligible {
			s.Probability /= sum
			acc += s.Probability
			if pick < 0 && u < acc {
				pick = i
			}
		}
	}
	if pick < 0 { // rounding left u above the last sum
		pick = lastEligible(scores)
	}
	return pick
}

// better orders by cost, then more cached blocks, then name: a deterministic argmin.
func better(a, b *WorkerScore) bool {
	if a.Cost != b.Cost {
		return a.Cost < b.Cost
	}
	if a.Overlap != b.Overlap {
		return a.Overlap > b.Overlap
	}
	return strings.Compare(a.Worker, b.Worker) < 0
}

func drawUniform(scores []WorkerScore, u float64) int {
	n := 0
	for i := range scores {
		if scores[i].Eligible {
			n++
		}
	}
	k := min(int(u*float64(n)), n-1)
	for i := range scores {
		if scores[i].Eligible {
			scores[i].Probability = 1 / float64(n)
		}
	}
	for i := range scores {
		if scores[i].Eligible {
			if k == 0 {
				return i
			}
			k--
		}
	}
	return -1
}

func lastEligible(scores []WorkerScore) int {
	for i := len(scores) - 1; i >= 0; i-- {
		if scores[i].Eligible {
			return i
		}
	}
	return -1
}
