package tokenizer

import (
	"math/rand/v2"
	"testing"
)

// newRand returns a generator freshly seeded for each run, with the seed logged.
func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("random seed %#x", seed)
	return rand.New(rand.NewPCG(seed, 11))
}
