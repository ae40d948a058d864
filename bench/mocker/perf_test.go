package mocker

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func readProfile(t *testing.T, path string) *Interpolated {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	m, err := ReadProfile(bytes.NewReader(raw), int64(len(raw)))
	require.NoError(t, err)
	return m
}

// Profiles numpy wrote (testdata/gen_profile.py: int64, float32, int32 and float64 arrays;
// stored, and deflated with a big-endian array and decode_itl in Fortran order) read back,
// and interpolate to the values numpy.interp gives.
func TestProfileFromNumpy(t *testing.T) {
	f := func(path string) {
		t.Helper()
		m := readProfile(t, path)
		require.Equal(t, []float64{128, 1024, 4096, 16384}, m.PrefillTokens)
		require.Equal(t, []float64{20, 35, 110, 600}, m.PrefillMS)
		require.Equal(t, [][]float64{{6, 7}, {12, 20}, {30, 45}}, m.DecodeMS)
		require.Equal(t, 72500*time.Microsecond, m.Prefill(2560))
		// numpy: decode(43520 KV tokens, 2176 context) = 10.580202020 ms (a batch of 20).
		require.InDelta(t, 10.580202020, float64(m.Decode(20, 43520, 0))/1e6, 1e-6)
		// Past the grid: linear extrapolation from the last cell.
		require.InDelta(t, 600+(600-110)/(16384.0-4096)*(20000-16384), float64(m.Prefill(20000))/1e6, 1e-6)
		require.Zero(t, m.Prefill(0))
	}
	f("testdata/profile.npz")
	f("testdata/profile_compressed.npz")
}

// Broken profiles are errors naming the array.
func TestProfileErrors(t *testing.T) {
	write := func(files map[string][]byte) []byte {
		var buf bytes.Buffer
		zw := zip.NewWriter(&buf)
		for name, data := range files {
			w, err := zw.Create(name)
			require.NoError(t, err)
			_, err = w.Write(data)
			require.NoError(t, err)
		}
		require.NoError(t, zw.Close())
		return buf.Bytes()
	}
	npy := func(descr, shape string, data []byte) []byte {
		h := "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }"
		for (10+len(h)+1)%64 != 0 {
			h += " "
		}
		h += "\n"
		out := append([]byte("\x93NUMPY\x01\x00"), byte(len(h)), byte(len(h)>>8))
		return append(append(out, h...), data...)
	}
	f64 := func(vs ...float64) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		}
		return b
	}
	good := map[string][]byte{
		"prefill_isl.npy":             npy("<f8", "(2,)", f64(1, 2)),
		"prefill_ttft_ms.npy":         npy("<f8", "(2,)", f64(10, 20)),
		"decode_active_kv_tokens.npy": npy("<f8", "(2,)", f64(1, 2)),
		"decode_context_length.npy":   npy("<f8", "(2,)", f64(1, 2)),
		"decode_itl.npy":              npy("<f8", "(2, 2)", f64(1, 2, 3, 4)),
	}
	read := func(files map[string][]byte) error {
		raw := write(files)
		_, err := ReadProfile(bytes.NewReader(raw), int64(len(raw)))
		return err
	}
	require.NoError(t, read(good))
	f := func(name string, data []byte, want string) {
		t.Helper()
		files := map[string][]byte{}
		for k, v := range good {
			files[k] = v
		}
		if data == nil {
			delete(files, name)
		} else {
			files[name] = data
		}
		err := read(files)
		require.Error(t, err)
		require.Contains(t, err.Error(), want)
	}
	f("decode_itl.npy", nil, "decode_itl: missing")
	f("decode_itl.npy", npy("<f8", "(4,)", f64(1, 2, 3, 4)), "decode_itl: shape [4], want 2 dimensions")
	f("decode_itl.npy", npy("<f8", "(2, 3)", f64(1, 2, 3, 4, 5, 6)), "decode_itl: row 0 has 3 values")
	f("prefill_isl.npy", npy("<f8", "(2,)", f64(2, 1)), "prefill_isl: point 1")
	// Big-endian arrays read (testdata/profile_compressed.npz); complex and object (pickled)
	// ones do not.
	f("prefill_isl.npy", npy("<c16", "(1,)", f64(1, 2)), "prefill_isl: dtype <c16 not supported")
	f("prefill_isl.npy", npy("|O", "(2,)", f64(1, 2)), "prefill_isl: dtype |O not supported")
	f("prefill_isl.npy", npy("<f8", "(3,)", f64(1, 2)), "16 data bytes")
	f("prefill_ttft_ms.npy", npy("<f8", "(3,)", f64(1, 2, 3)), "3 values for 2 prefill_isl points")
	f("prefill_isl.npy", []byte("not numpy"), "magic")
	// What npyio alone would allocate for, panic on, or not read.
	f("prefill_isl.npy", []byte("\x93NUMPY\x02\x00\xff\xff\xff\xff{}"), "prefill_isl: header of 4294967295 bytes runs past the end")
	f("prefill_isl.npy", []byte("\x93NUMPY\x01\x00\x04\x00{}}}"), "prefill_isl: malformed header")
	f("prefill_isl.npy", npy("<f8", "(-2,)", nil), "prefill_isl: bad shape [-2]")
	fortran := strings.Replace(string(npy("<f8", "(1, 2, 2)", f64(1, 2, 3, 4))), "False", "True", 1)
	fortran = strings.Replace(fortran, "\n", " \n", 1) // the header keeps its length
	f("decode_itl.npy", []byte(fortran), "decode_itl: fortran_order with 3 dimensions not supported")
	f("decode_itl.npy", append([]byte("\x93NUMPY\x03"), npy("<f8", "(2, 2)", f64(1, 2, 3, 4))[7:]...), "decode_itl: npy: invalid major version number (3)")
	_, err := ReadProfile(bytes.NewReader([]byte("junk")), 4)
	require.ErrorContains(t, err, "archive")
}

// The .npy parser never panics (npyio would, on some headers) and always answers an error or
// a consistent array.
func FuzzParseNPY(f *testing.F) {
	for _, path := range []string{"testdata/profile.npz", "testdata/profile_compressed.npz"} {
		raw, err := os.ReadFile(path)
		require.NoError(f, err)
		zr, err := zip.NewReader(bytes.NewReader(raw), int64(len(raw)))
		require.NoError(f, err)
		for _, file := range zr.File {
			rc, err := file.Open()
			require.NoError(f, err)
			var b bytes.Buffer
			_, _ = b.ReadFrom(rc)
			rc.Close()
			f.Add(b.Bytes())
		}
	}
	f.Add([]byte("\x93NUMPY\x02\x00\x10\x00\x00\x00{'shape': (,), }"))
	f.Add([]byte("\x93NUMPY\x01\x00\x04\x00{}}}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParseNPY(data)
		if err != nil {
			return
		}
		n := 1
		for _, d := range a.Shape {
			n *= d
		}
		if n != len(a.Data) {
			t.Fatalf("shape %v with %d values", a.Shape, len(a.Data))
		}
	})
}
