package transfer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/features"
	"dataplane/native"
	"dataplane/transfer/safetensors"
)

// vllmVectors is testdata/vllm/vectors.json, written by vllm_ref.py (an implementation of
// vLLM's code in Python: see testdata/vllm/README.md).
type vllmVectors struct {
	Embeds struct {
		Rows      int `json:"rows"`
		Cols      int `json:"cols"`
		BlockSize int `json:"block_size"`
		Cases     []struct {
			DType   string   `json:"dtype"`
			Digests []string `json:"digests"`
		} `json:"cases"`
	} `json:"embeds"`
	ECNames []struct {
		Salt, Content, Model, Preprocess string
		Name, Identifier, File           string
	} `json:"ec_names"`
}

func loadVLLMVectors(t *testing.T) vllmVectors {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "vllm", "vectors.json"))
	require.NoError(t, err)
	var v vllmVectors
	require.NoError(t, json.Unmarshal(raw, &v))
	require.NotEmpty(t, v.Embeds.Cases)
	return v
}

// vectorTensor is the script's tensor: ((i*7) % 61 - 30) * 0.25, cast to dt (exact in all three).
func vectorTensor(t *testing.T, dt native.DType, rows, cols int) native.Matrix {
	f := make([]float32, rows*cols)
	for i := range f {
		f[i] = float32((i*7)%61-30) * 0.25
	}
	data := make([]byte, rows*cols*dt.Size())
	require.NoError(t, native.Convert(data, dt, native.AsBytes(f), native.F32))
	return native.Matrix{Data: data, DType: dt, Rows: rows, Cols: cols}
}

// The per-block digests are vLLM's (sha256 of tensor_data of the block's slice, computed by
// torch in vllm_ref.py), in every dtype, whichever way they are computed here.
func TestBlockDigestsMatchVLLM(t *testing.T) {
	v := loadVLLMVectors(t)
	e := v.Embeds
	for _, c := range e.Cases {
		dt, err := native.ParseDType(c.DType)
		require.NoError(t, err)
		m := vectorTensor(t, dt, e.Rows, e.Cols)
		require.Len(t, c.Digests, e.Rows/e.BlockSize)
		for _, threads := range []int{1, 3} {
			got := make([]Digest, e.Rows/e.BlockSize)
			require.NoError(t, BlockDigests(m, e.BlockSize, threads, nil, got))
			for b, want := range c.Digests {
				require.Equal(t, want, hex.EncodeToString(got[b][:]), "%s block %d", c.DType, b)
			}
		}
		row := m.Cols * dt.Size()
		for b, want := range c.Digests {
			d, err := BlockDigest(m, b*e.BlockSize, (b+1)*e.BlockSize)
			require.NoError(t, err)
			require.Equal(t, want, hex.EncodeToString(d[:]))
			rows := make([][]byte, e.BlockSize)
			for r := range rows {
				at := (b*e.BlockSize + r) * row
				rows[r] = m.Data[at : at+row]
			}
			d = RowsDigest(sha256.New(), rows)
			require.Equal(t, want, hex.EncodeToString(d[:]), "row by row")
		}
		only := make([]Digest, e.Rows/e.BlockSize)
		require.NoError(t, BlockDigests(m, e.BlockSize, 2, func(b int) bool { return b == 1 }, only))
		require.Equal(t, Digest{}, only[0], "blocks not wanted are left alone")
		require.Equal(t, c.Digests[1], hex.EncodeToString(only[1][:]))
	}
	m := vectorTensor(t, native.BF16, 4, 2)
	_, err := BlockDigest(m, 3, 5)
	require.Error(t, err)
	require.Error(t, BlockDigests(m, 0, 1, nil, nil))
	require.Error(t, BlockDigests(m, 2, 1, nil, make([]Digest, 1)))
}

// EC names are what vllm_ref.py computes, and vLLM's connector would look for them where the
// daemon writes them (the uuid is the identifier; the folder is the identifier).
func TestECNamesMatchReference(t *testing.T) {
	v := loadVLLMVectors(t)
	require.NotEmpty(t, v.ECNames)
	for _, c := range v.ECNames {
		name := ECName(features.Key{Salt: c.Salt, Content: c.Content, Model: c.Model, Preprocess: c.Preprocess})
		require.Equal(t, c.Name, name)
		require.True(t, isECName(name))
		require.Equal(t, c.Identifier, name, "vLLM keeps a uuid as the identifier")
		require.Equal(t, c.File, ECCacheFile("/ec", name))
	}
	require.NotEqual(t, ECName(features.Key{Salt: "a", Content: "x"}), ECName(features.Key{Salt: "", Content: "ax"}), "fields are length-prefixed")
	for _, bad := range []string{"", "ABCD", "../x", fmt.Sprintf("%063x", 1)} {
		require.False(t, isECName(bad), bad)
	}
}

func readEC(t *testing.T, dir, name string) safetensors.Tensor {
	t.Helper()
	f, err := safetensors.Open(ECCacheFile(dir, name))
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	ts, ok := f.Tensor("ec_cache")
	require.True(t, ok)
	return ts
}

func testName(i int) string { return ECName(features.Key{Content: fmt.Sprint(i), Model: "m"}) }

func TestECDirPutForget(t *testing.T) {
	root := filepath.Join(t.TempDir(), "ec")
	// Leftovers of an earlier run go; anything not named like ours stays.
	require.NoError(t, os.MkdirAll(filepath.Join(root, testName(99)), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, testName(99), ECFileName), []byte("old"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "keep-me"), 0o755))
	d, err := OpenECDir(root, 1<<20)
	require.NoError(t, err)
	defer d.Close()
	_, err = os.Stat(filepath.Join(root, testName(99)))
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = os.Stat(filepath.Join(root, "keep-me"))
	require.NoError(t, err)

	m := known(t, native.BF16, 3, 5)
	ok, err := d.Put(testName(1), m)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, m.Data, readEC(t, root, testName(1)).Data)
	ok, err = d.Put(testName(1), m)
	require.NoError(t, err)
	require.True(t, ok)
	st := d.Stats()
	require.Equal(t, int64(1), st.Writes)
	require.Equal(t, int64(1), st.Reused)
	require.Equal(t, 1, st.Files)
	fi, err := os.Stat(ECCacheFile(root, testName(1)))
	require.NoError(t, err)
	require.Equal(t, fi.Size(), st.Bytes)

	d.Forget(testName(1))
	d.Forget(testName(2)) // unknown: nothing
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(root, testName(1)))
		return os.IsNotExist(err)
	}, 5*time.Second, time.Millisecond, "a forgotten item's folder goes")
	st = d.Stats()
	require.Equal(t, 0, st.Files)
	require.Zero(t, st.Bytes)
	require.Equal(t, int64(1), st.Removed)

	_, err = d.Put("not-a-name", m)
	require.Error(t, err)
}

// The directory never holds more than its capacity: a file that would pass it is not written
// (the engine encodes that item itself), and room comes back when the store forgets items.
func TestECDirCapacity(t *testing.T) {
	root := t.TempDir()
	m := known(t, native.F32, 64, 64) // 16 KiB
	d, err := OpenECDir(root, 40<<10)
	require.NoError(t, err)
	defer d.Close()
	for i := range 2 {
		ok, err := d.Put(testName(i), m)
		require.NoError(t, err)
		require.True(t, ok)
	}
	ok, err := d.Put(testName(2), m)
	require.NoError(t, err)
	require.False(t, ok, "a third file would pass 40 KiB")
	_, err = os.Stat(filepath.Join(root, testName(2)))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Equal(t, int64(1), d.Stats().Refused)
	d.Forget(testName(0))
	ok, err = d.Put(testName(2), m)
	require.NoError(t, err)
	require.True(t, ok)
	require.LessOrEqual(t, d.Stats().Bytes, int64(40<<10))
}

// A Put of a name the store forgot but the janitor has not removed yet takes the file back;
// one that comes while it is being removed waits and writes it again. Either way the file is
// there afterwards.
func TestECDirPutAfterForget(t *testing.T) {
	root := t.TempDir()
	d, err := OpenECDir(root, 1<<20)
	require.NoError(t, err)
	defer d.Close()
	m := known(t, native.BF16, 3, 5)
	for range 200 {
		ok, err := d.Put(testName(7), m)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, m.Data, readEC(t, root, testName(7)).Data)
		d.Forget(testName(7))
	}
}

// Many goroutines putting and forgetting a few names (-race): every successful Put leaves a
// readable file until its Forget, and once everything is forgotten the directory is empty.
func TestECDirConcurrent(t *testing.T) {
	root := t.TempDir()
	d, err := OpenECDir(root, 1<<20)
	require.NoError(t, err)
	m := known(t, native.BF16, 3, 5)
	var mu [4]sync.Mutex // one holder per name at a time, as the store holds one record per key
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 100 {
				i := r.IntN(len(mu))
				mu[i].Lock()
				ok, err := d.Put(testName(i), m)
				if err == nil && ok {
					f, oerr := safetensors.Open(ECCacheFile(root, testName(i)))
					if oerr == nil {
						f.Close()
					}
					err = oerr
				}
				d.Forget(testName(i))
				mu[i].Unlock()
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		ents, err := os.ReadDir(root)
		return err == nil && len(ents) == 0
	}, 5*time.Second, time.Millisecond)
	require.Zero(t, d.Stats().Bytes)
	require.NoError(t, d.Close())
	_, err = d.Put(testName(1), m)
	require.Error(t, err, "closed")
}

// Close removes what the directory holds; a directory the daemon creates is group-writable
// (vLLM creates folders for items it looks up and does not find).
func TestECDirCloseAndModes(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	root := filepath.Join(t.TempDir(), "ec")
	d, err := OpenECDir(root, 1<<20)
	require.NoError(t, err)
	fi, err := os.Stat(root)
	require.NoError(t, err)
	require.Equal(t, ECDirMode, fi.Mode().Perm())
	_, err = d.Put(testName(3), known(t, native.BF16, 3, 5))
	require.NoError(t, err)
	require.NoError(t, d.Close())
	ents, err := os.ReadDir(root)
	require.NoError(t, err)
	require.Empty(t, ents)
	_, err = OpenECDir(root, 0)
	require.Error(t, err)
}

// What hashing a prompt_embeds request's blocks costs, beside the ceiling: SHA-256 of the same
// bytes in one call. A merged sequence of 1,024 rows of 4,096 bf16 (8 MiB, 64 blocks of 16).
//
//	go test -run '^$' -bench BlockDigests -count 6 ./transfer | go tool benchstat -col /how -
func BenchmarkBlockDigests(b *testing.B) {
	const rows, cols, bs = 1024, 4096, 16
	m := native.Matrix{Data: make([]byte, rows*cols*2), DType: native.BF16, Rows: rows, Cols: cols}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range m.Data {
		m.Data[i] = byte(r.Uint32())
	}
	dst := make([]Digest, rows/bs)
	b.Run("how=blocks", func(b *testing.B) {
		b.SetBytes(int64(len(m.Data)))
		for b.Loop() {
			if err := BlockDigests(m, bs, 1, nil, dst); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("how=blocks-4-threads", func(b *testing.B) {
		b.SetBytes(int64(len(m.Data)))
		for b.Loop() {
			if err := BlockDigests(m, bs, 4, nil, dst); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("how=x-sha256", func(b *testing.B) {
		b.SetBytes(int64(len(m.Data)))
		for b.Loop() {
			dst[0] = sha256.Sum256(m.Data)
		}
	})
}
