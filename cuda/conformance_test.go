package cuda_test

// The backend conformance suite: the same checks against every backend this machine has. The
// CPU backend always; the plugin named by $DATAPLANE_TEST_PLUGIN, loaded through cuda.Open,
// when set (`make test` sets it to the CPU backend built as a plugin, so the loading path is
// exercised here; on a GPU machine point it at libdataplane_cuda.so). Each kernel's result is
// compared with the host-side native kernels, which their own tests check against independent
// references: conversions and merges bit for bit, encoders within a per-backend tolerance of
// the openai/CLIP and openai/whisper fixtures.

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/cuda"
	"dataplane/dataplane/encoder"
	"dataplane/native"
	"dataplane/native/fixtures"
)

type backendCase struct {
	b *native.Backend
	// encoderTol is the allowed error of encoder outputs, relative to max|ref|.
	encoderTol float64
}

func backends(t *testing.T) map[string]backendCase {
	out := map[string]backendCase{"cpu": {native.CPU(), 1e-5}}
	if path := os.Getenv("DATAPLANE_TEST_PLUGIN"); path != "" {
		b, err := cuda.Open(path)
		require.NoError(t, err, "DATAPLANE_TEST_PLUGIN=%s", path)
		tol := 1e-5
		if b.Name() != "cpu" {
			tol = 1e-4 // the fp32 path of a GPU backend (TF32 off); see issue 9
		}
		out["plugin:"+filepath.Base(path)] = backendCase{b, tol}
	} else {
		t.Log("DATAPLANE_TEST_PLUGIN unset: the plugin loading path is not exercised (make test sets it)")
	}
	return out
}

func forEachBackend(t *testing.T, f func(t *testing.T, b backendCase)) {
	for name, b := range backends(t) {
		t.Run(name, func(t *testing.T) { f(t, b) })
	}
}

func newRand(t *testing.T) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("random seed %#x", seed)
	return rand.New(rand.NewPCG(seed, 5))
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// upload copies host bytes into a new device buffer.
func upload(t *testing.T, s *native.Stream, b *native.Backend, data []byte) *native.DeviceBuffer {
	buf, err := b.DeviceAlloc(0, int64(len(data)))
	require.NoError(t, err)
	t.Cleanup(buf.Free)
	require.NoError(t, s.Upload(buf, 0, data))
	return buf
}

func download(t *testing.T, s *native.Stream, buf *native.DeviceBuffer) []byte {
	out := make([]byte, buf.Len())
	require.NoError(t, s.Download(out, buf, 0))
	return out
}

func TestDevicesAndMemory(t *testing.T) {
	r := newRand(t)
	forEachBackend(t, func(t *testing.T, c backendCase) {
		require.GreaterOrEqual(t, c.b.DeviceCount(), 1)
		info, err := c.b.DeviceInfo(0)
		require.NoError(t, err)
		require.NotEmpty(t, info.Name)
		require.Positive(t, info.TotalBytes)
		_, err = c.b.DeviceInfo(c.b.DeviceCount())
		require.ErrorIs(t, err, native.ErrInvalid)

		s, err := c.b.NewStream(0, 2)
		require.NoError(t, err)
		defer s.Close()
		for _, n := range []int{1, 4097, 5 << 20} {
			data := randomBytes(r, n)
			buf := upload(t, s, c.b, data)
			require.Equal(t, data, download(t, s, buf), "%d bytes", n)
			require.ErrorIs(t, s.Download(make([]byte, n+1), buf, 0), native.ErrInvalid)
		}
		host, free, err := c.b.HostAlloc(1 << 20)
		require.NoError(t, err)
		host[0], host[len(host)-1] = 1, 2
		free()
	})
}

// Conversions on the device give the host kernels' bits (round to nearest even, NaNs alike).
func TestConvertConforms(t *testing.T) {
	r := newRand(t)
	dtypes := []native.DType{native.F32, native.F16, native.BF16}
	forEachBackend(t, func(t *testing.T, c backendCase) {
		s, err := c.b.NewStream(0, 1)
		require.NoError(t, err)
		defer s.Close()
		const n = 1<<16 + 3
		for _, st := range dtypes {
			for _, dt := range dtypes {
				src := randomBytes(r, n*st.Size())
				want := make([]byte, n*dt.Size())
				require.NoError(t, native.Convert(want, dt, src, st))
				in := upload(t, s, c.b, src)
				out, err := c.b.DeviceAlloc(0, int64(len(want)))
				require.NoError(t, err)
				require.NoError(t, s.Convert(native.DeviceMatrix{Buf: out, DType: dt, Rows: 1, Cols: n},
					native.DeviceMatrix{Buf: in, DType: st, Rows: 1, Cols: n}))
				require.True(t, bytes.Equal(want, download(t, s, out)), "%v -> %v", st, dt)
				out.Free()
			}
		}
	})
}

// A merge on the device equals the host merge bit for bit; a bad token id is refused.
func TestMergeConforms(t *testing.T) {
	r := newRand(t)
	forEachBackend(t, func(t *testing.T, c backendCase) {
		s, err := c.b.NewStream(0, 2)
		require.NoError(t, err)
		defer s.Close()
		const d, vocab = 256, 500
		for _, dt := range []native.DType{native.F16, native.BF16, native.F32} {
			table := native.Matrix{Data: randomBytes(r, vocab*d*dt.Size()), DType: dt, Rows: vocab, Cols: d}
			var ids []int32
			var spans []native.Span
			row := 0
			for k := range 6 { // text, media, text, media, media, text: adjacent spans and both ends
				if k%3 == 0 || k == 5 {
					for range 1 + r.IntN(40) {
						ids = append(ids, int32(r.IntN(vocab)))
						row++
					}
					continue
				}
				n := 1 + r.IntN(300)
				spans = append(spans, native.Span{Row: row, Src: native.Matrix{Data: randomBytes(r, n*d*dt.Size()), DType: dt, Rows: n, Cols: d}})
				row += n
			}
			want := native.Matrix{Data: make([]byte, row*d*dt.Size()), DType: dt, Rows: row, Cols: d}
			require.NoError(t, native.Merge(&native.MergeInput{Dst: want, Table: table, TextIDs: ids, Spans: spans}))

			dev := func(m native.Matrix) native.DeviceMatrix {
				return native.DeviceMatrix{Buf: upload(t, s, c.b, m.Data), DType: m.DType, Rows: m.Rows, Cols: m.Cols}
			}
			in := native.DeviceMergeInput{Table: dev(table), TextIDs: upload(t, s, c.b, native.AsBytes(ids)), NText: len(ids)}
			for _, sp := range spans {
				in.Spans = append(in.Spans, native.DeviceSpan{Row: sp.Row, Src: dev(sp.Src)})
			}
			out, err := c.b.DeviceAlloc(0, int64(len(want.Data)))
			require.NoError(t, err)
			in.Dst = native.DeviceMatrix{Buf: out, DType: dt, Rows: row, Cols: d}
			require.NoError(t, s.Merge(in))
			require.True(t, bytes.Equal(want.Data, download(t, s, out)), "%v merge differs from the host merge", dt)

			bad := append([]int32(nil), ids...)
			bad[len(bad)-1] = vocab
			in.TextIDs = upload(t, s, c.b, native.AsBytes(bad))
			require.ErrorIs(t, s.Merge(in), native.ErrBounds)
			out.Free()
		}
	})
}

// Encoders built on the backend from the fixture checkpoints reproduce the fixtures.
func TestEncodersConform(t *testing.T) {
	forEachBackend(t, func(t *testing.T, c backendCase) {
		s, err := c.b.NewStream(0, 2)
		require.NoError(t, err)
		defer s.Close()
		for _, fx := range []struct {
			model, input, output string
			frames               int
			sel                  native.OutputSelection
		}{
			{"clip_vit_tiny_random", "clip_in_random", "clip_out_random_last_hidden", 0, native.OutputSelection{Kind: native.OutputLastHidden}},
			{"clip_vit_tiny_random", "image_200x150_clip64", "clip_out_image_penultimate", 0, native.OutputSelection{Kind: native.OutputHiddenState, Layer: -2}},
			{"clip_vit_tiny_random", "clip_in_random", "clip_out_random_pooled_proj", 0, native.OutputSelection{Kind: native.OutputPooled}},
			{"whisper_enc_tiny_random", "whisper_enc_in_audio", "whisper_enc_out_audio", 200, native.OutputSelection{Kind: native.OutputLastHidden}},
		} {
			dir := t.TempDir()
			require.NoError(t, os.Symlink(fixtures.Path(t, fx.model+"_config.json"), filepath.Join(dir, "config.json")))
			require.NoError(t, os.Symlink(fixtures.Path(t, fx.model+".safetensors"), filepath.Join(dir, "model.safetensors")))
			spec, weights, closeFiles, err := encoder.LoadWeights(dir)
			require.NoError(t, err)
			e, err := c.b.NewEncoder(0, spec.Config, weights)
			closeFiles()
			require.NoError(t, err)
			x, _ := fixtures.ReadF32(t, fx.input)
			want, _ := fixtures.ReadF32(t, fx.output)
			tokens, width := e.Tokens(fx.sel, fx.frames), e.Width(fx.sel)
			require.Equal(t, len(want), tokens*width)
			in := native.DeviceMatrix{Buf: upload(t, s, c.b, native.AsBytes(x)), DType: native.F32, Rows: 1, Cols: len(x)}
			out, err := c.b.DeviceAlloc(0, int64(tokens*width*4))
			require.NoError(t, err)
			require.NoError(t, e.Forward(s, fx.sel, []native.DeviceEncoderItem{{Input: in, Frames: fx.frames,
				Out: native.DeviceMatrix{Buf: out, DType: native.F32, Rows: tokens, Cols: width}}}))
			got := make([]float32, tokens*width)
			require.NoError(t, s.Download(native.AsBytes(got), out, 0))
			fixtures.RequireClose(t, want, got, c.encoderTol, fx.output)
			out.Free()
			e.Close()
		}
	})
}
