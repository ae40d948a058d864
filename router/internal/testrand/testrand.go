// Package testrand gives the router's tests random inputs that a failing run can reproduce:
// each run draws a fresh seed and logs it, and ROUTER_SEED replays one. It imports only the
// standard library, so the index's tests can use it too.
package testrand

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
)

// Seed is a fresh random seed, or ROUTER_SEED (as a failing run logged it) to reproduce one.
func Seed(t testing.TB) uint64 {
	seed := rand.Uint64()
	if v := os.Getenv("ROUTER_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 0, 64); err != nil {
			t.Fatalf("ROUTER_SEED: %v", err)
		}
	}
	t.Logf("random seed %#x", seed)
	return seed
}

// New is a generator seeded with Seed.
func New(t testing.TB) *rand.Rand {
	return rand.New(rand.NewPCG(Seed(t), 11))
}

// Hashes draws n random 64-bit hashes: sequence hashes for tests that need no real ones (what
// xxh3 gives looks the same to the index).
func Hashes(r *rand.Rand, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = r.Uint64()
	}
	return out
}

// Tokens draws n token ids below 100,000.
func Tokens(r interface{ Uint32N(uint32) uint32 }, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = r.Uint32N(100_000)
	}
	return out
}
