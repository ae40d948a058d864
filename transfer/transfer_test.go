package transfer

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/native"
	"dataplane/transfer/safetensors"
)

// known is the tensor make_torch_vectors.py saved: arange(n)*0.25 - 1 in dt, [rows, cols].
func known(t *testing.T, dt native.DType, rows, cols int) native.Matrix {
	f := make([]float32, rows*cols)
	for i := range f {
		f[i] = float32(i)*0.25 - 1
	}
	data := make([]byte, rows*cols*dt.Size())
	require.NoError(t, native.Convert(data, dt, native.AsBytes(f), native.F32))
	return native.Matrix{Data: data, DType: dt, Rows: rows, Cols: cols}
}

// The writer's output reads back, with the independent reader, exactly as the file PyTorch
// wrote for the same tensor does: storage class, shape, stride, offset and bytes.
func TestPromptEmbedsMatchesTorch(t *testing.T) {
	for _, c := range []struct {
		name       string
		dt         native.DType
		rows, cols int
	}{{"bf16", native.BF16, 3, 5}, {"f32", native.F32, 2, 4}, {"f16", native.F16, 4, 2}} {
		ref, err := os.ReadFile(filepath.Join("testdata", "torch_"+c.name+".pt"))
		require.NoError(t, err)
		want, _, err := readTorch(ref)
		require.NoError(t, err, "reading PyTorch's file")

		var buf bytes.Buffer
		require.NoError(t, PromptEmbeds(&buf, known(t, c.dt, c.rows, c.cols)))
		got, offsets, err := readTorch(buf.Bytes())
		require.NoError(t, err)
		require.Equal(t, want, got, c.name)
		for name, off := range offsets {
			require.Zero(t, off%alignment, "record %s starts at %d", name, off)
		}
	}
}

func TestPromptEmbedsBase64AndErrors(t *testing.T) {
	m := known(t, native.BF16, 3, 5)
	s, err := PromptEmbedsBase64(m)
	require.NoError(t, err)
	raw, err := base64.StdEncoding.DecodeString(s)
	require.NoError(t, err)
	got, _, err := readTorch(raw)
	require.NoError(t, err)
	require.Equal(t, []int64{3, 5}, got.shape)

	require.ErrorContains(t, PromptEmbeds(&bytes.Buffer{}, native.Matrix{Data: make([]byte, 8), DType: native.DType(9), Rows: 1, Cols: 2}), "dtype")
	require.ErrorContains(t, PromptEmbeds(&bytes.Buffer{}, native.Matrix{Data: make([]byte, 2), DType: native.F32, Rows: 1, Cols: 2}), "shape [1, 2] with 2 bytes")
	// Shapes whose sizes need the wider pickle integers.
	for _, rows := range []int{300, 70000} {
		big := native.Matrix{Data: make([]byte, rows*2*2), DType: native.F16, Rows: rows, Cols: 2}
		var buf bytes.Buffer
		require.NoError(t, PromptEmbeds(&buf, big))
		got, _, err := readTorch(buf.Bytes())
		require.NoError(t, err)
		require.Equal(t, []int64{int64(rows), 2}, got.shape)
	}
}

// The file is where vLLM's EC connector looks, one ec_cache tensor, readable by an engine
// running as another user (0644 in a 0755 folder) whatever the daemon's umask.
func TestWriteECCache(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	m := known(t, native.BF16, 3, 5)
	size, err := WriteECCache(dir, "abc123", m)
	require.NoError(t, err)
	path := filepath.Join(dir, "abc123", "encoder_cache.safetensors")
	require.Equal(t, ECCacheFile(dir, "abc123"), path)
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, st.Size(), size)
	require.Equal(t, ECFileMode, st.Mode().Perm())
	st, err = os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	require.Equal(t, ECItemMode, st.Mode().Perm())
	f, err := safetensors.Open(path)
	require.NoError(t, err)
	defer f.Close()
	require.Len(t, f.Tensors, 1)
	ts := f.Tensors[0]
	require.Equal(t, "ec_cache", ts.Name)
	require.Equal(t, "BF16", ts.DType)
	require.Equal(t, []int{3, 5}, ts.Shape)
	require.Equal(t, m.Data, ts.Data)
	for _, bad := range []string{"", "..", "a/b", `a\b`} {
		_, err := WriteECCache(dir, bad, m)
		require.Error(t, err, bad)
	}
	ents, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, ents, 1, "no temporary file left behind")
}
