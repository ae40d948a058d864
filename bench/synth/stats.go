package synth

import (
	"math"
	"slices"
)

// HitRatio is the fraction of prompt blocks (hash ids) that an earlier request already had: the
// prefix-cache hit ratio of an infinite cache serving the trace in order.
func HitRatio(recs []Record) float64 {
	seen := map[int64]bool{}
	hits, total := 0, 0
	for _, r := range recs {
		for _, id := range r.HashIDs {
			if seen[id] {
				hits++
			}
			seen[id] = true
			total++
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hits) / float64(total)
}

// Summary is a distribution's mean and quantiles.
type Summary struct {
	N                  int
	Mean               float64
	P10, P50, P90, P99 float64
}

// Summarize describes values (nearest-rank quantiles).
func Summarize(values []float64) Summary {
	if len(values) == 0 {
		return Summary{}
	}
	v := slices.Clone(values)
	slices.Sort(v)
	sum := 0.0
	for _, x := range v {
		sum += x
	}
	return Summary{N: len(v), Mean: sum / float64(len(v)), P10: Quantile(v, 0.1), P50: Quantile(v, 0.5), P90: Quantile(v, 0.9), P99: Quantile(v, 0.99)}
}

// Quantile of sorted values, nearest rank.
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Lengths returns the traces' input and output lengths.
func Lengths(recs []Record) (isl, osl []float64) {
	for _, r := range recs {
		isl = append(isl, float64(r.InputLength))
		osl = append(osl, float64(r.OutputLength))
	}
	return isl, osl
}
