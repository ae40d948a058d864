package encoder

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/native/fixtures"
)

// fixtureModel lays a fixture checkpoint out as a model directory.
func fixtureModel(t testing.TB, name string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Symlink(fixtures.Path(t, name+"_config.json"), filepath.Join(dir, "config.json")))
	require.NoError(t, os.Symlink(fixtures.Path(t, name+".safetensors"), filepath.Join(dir, "model.safetensors")))
	return dir
}

func readF32(t testing.TB, name string) ([]float32, []int) { return fixtures.ReadF32(t, name) }

func requireClose(t testing.TB, want, got []float32, tol float64, what string) {
	t.Helper()
	fixtures.RequireClose(t, want, got, tol, what)
}

func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("random seed %#x", seed)
	return rand.New(rand.NewPCG(seed, 11))
}
