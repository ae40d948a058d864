package mocker

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/native"
	"dataplane/transfer"
	"dataplane/transfer/safetensors"
)

// The EC consumer reads what transfer writes, and refuses what vLLM's connector could not load:
// no file, a file that is not safetensors, no ec_cache tensor, a tensor that is not a matrix.
func TestReadECItem(t *testing.T) {
	dir := t.TempDir()
	m := native.Matrix{Data: make([]byte, 5*8*2), DType: native.BF16, Rows: 5, Cols: 8}
	_, err := transfer.WriteECCache(dir, "item-a", m)
	require.NoError(t, err)
	n, err := ReadECItem(dir, "item-a")
	require.NoError(t, err)
	require.Equal(t, 5, n)

	_, err = ReadECItem(dir, "item-b")
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "garbage"), 0o755))
	require.NoError(t, os.WriteFile(transfer.ECCacheFile(dir, "garbage"), []byte("not safetensors at all"), 0o644))
	_, err = ReadECItem(dir, "garbage")
	require.Error(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "other"), 0o755))
	require.NoError(t, safetensors.WriteFile(transfer.ECCacheFile(dir, "other"), []safetensors.Tensor{{Name: "x", DType: "F32", Shape: []int{1}, Data: make([]byte, 4)}}, nil))
	_, err = ReadECItem(dir, "other")
	require.ErrorContains(t, err, "no ec_cache")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "flat"), 0o755))
	require.NoError(t, safetensors.WriteFile(transfer.ECCacheFile(dir, "flat"), []safetensors.Tensor{{Name: "ec_cache", DType: "F32", Shape: []int{4}, Data: make([]byte, 16)}}, nil))
	_, err = ReadECItem(dir, "flat")
	require.ErrorContains(t, err, "shape")
	for _, bad := range []string{"", "..", "a/b"} {
		_, err = ReadECItem(dir, bad)
		require.Error(t, err, bad)
	}
}
