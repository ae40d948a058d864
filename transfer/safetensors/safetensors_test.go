package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/native/fixtures"
)

// The fixture checkpoints were written by PyTorch's safetensors; their configs say the shapes.
func TestOpenFixtureCheckpoints(t *testing.T) {
	f, err := Open(fixtures.Path(t, "clip_vit_tiny_random.safetensors"))
	require.NoError(t, err)
	defer f.Close()
	var cfg struct {
		HiddenSize      int `json:"hidden_size"`
		PatchSize       int `json:"patch_size"`
		ImageSize       int `json:"image_size"`
		NumHiddenLayers int `json:"num_hidden_layers"`
	}
	raw, err := os.ReadFile(fixtures.Path(t, "clip_vit_tiny_random_config.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &cfg))
	require.Equal(t, "pt", f.Metadata["format"])

	pe, ok := f.Tensor("vision_model.embeddings.patch_embedding.weight")
	require.True(t, ok)
	require.Equal(t, []int{cfg.HiddenSize, 3, cfg.PatchSize, cfg.PatchSize}, pe.Shape)
	require.Equal(t, "F32", pe.DType)
	pos, ok := f.Tensor("vision_model.embeddings.position_embedding.weight")
	require.True(t, ok)
	n := cfg.ImageSize / cfg.PatchSize
	require.Equal(t, []int{n*n + 1, cfg.HiddenSize}, pos.Shape)
	_, ok = f.Tensor(fmtLayer(cfg.NumHiddenLayers-1) + "mlp.fc2.weight")
	require.True(t, ok)
	_, ok = f.Tensor(fmtLayer(cfg.NumHiddenLayers) + "mlp.fc2.weight")
	require.False(t, ok)

	vals, err := pe.Float32()
	require.NoError(t, err)
	require.Len(t, vals, pe.Elements())
	require.Equal(t, math.Float32frombits(binary.LittleEndian.Uint32(pe.Data)), vals[0])

	w, err := Open(fixtures.Path(t, "whisper_enc_tiny_random.safetensors"))
	require.NoError(t, err)
	defer w.Close()
	_, ok = w.Tensor("model.encoder.conv1.weight")
	require.True(t, ok)
}

func fmtLayer(i int) string { return "vision_model.encoder.layers." + strconv.Itoa(i) + "." }

func randomTensors(r *rand.Rand) []Tensor {
	dtypes := []string{"F32", "F16", "BF16", "I64", "U8", "BOOL"}
	var ts []Tensor
	for i := range r.IntN(6) {
		dt := dtypes[r.IntN(len(dtypes))]
		shape := make([]int, r.IntN(4))
		for j := range shape {
			shape[j] = r.IntN(5)
		}
		t := Tensor{Name: "t" + string(rune('a'+i)), DType: dt, Shape: shape}
		t.Data = make([]byte, t.Elements()*DTypeSize(dt))
		for k := range t.Data {
			t.Data[k] = byte(r.Uint32())
		}
		ts = append(ts, t)
	}
	return ts
}

func TestWriteParseRoundTrip(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("random seed %#x", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	for range 200 {
		ts := randomTensors(r)
		var buf bytes.Buffer
		require.NoError(t, Write(&buf, ts, map[string]string{"source": "test"}))
		require.Zero(t, binary.LittleEndian.Uint64(buf.Bytes())%8, "header padded to 8 bytes")
		f, err := Parse(buf.Bytes())
		require.NoError(t, err)
		require.Equal(t, "test", f.Metadata["source"])
		require.Len(t, f.Tensors, len(ts))
		for _, want := range ts {
			got, ok := f.Tensor(want.Name)
			require.True(t, ok)
			require.Equal(t, want.DType, got.DType)
			require.Equal(t, len(want.Shape), len(got.Shape))
			if len(want.Shape) > 0 {
				require.Equal(t, want.Shape, got.Shape)
			}
			require.Equal(t, want.Data, got.Data[:len(got.Data):len(got.Data)])
		}
	}
}

func TestWriteFileIsAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ec_cache.safetensors")
	data := make([]byte, 12)
	require.NoError(t, WriteFile(path, []Tensor{{Name: "ec_cache", DType: "BF16", Shape: []int{2, 3}, Data: data}}, nil))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left behind")
	f, err := Open(path)
	require.NoError(t, err)
	defer f.Close()
	got, ok := f.Tensor("ec_cache")
	require.True(t, ok)
	require.Equal(t, []int{2, 3}, got.Shape)

	err = WriteFile(path, []Tensor{{Name: "x", DType: "F32", Shape: []int{2}, Data: data}}, nil)
	require.ErrorContains(t, err, `tensor "x": shape [2] of F32 needs 8 bytes, data has 12`)
	f2, err := Open(path)
	require.NoError(t, err, "a failed write leaves the old file")
	f2.Close()
}

// file builds a safetensors file from a raw header string and data.
func file(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), data...)
}

func TestMalformedFiles(t *testing.T) {
	eight := make([]byte, 8)
	f := func(b []byte, want string) {
		t.Helper()
		_, err := Parse(b)
		require.ErrorIs(t, err, ErrFormat)
		require.ErrorContains(t, err, want)
	}
	f(nil, "0 bytes is shorter than the 8-byte header length")
	f([]byte{1, 2, 3}, "shorter than the 8-byte header length")
	f(binary.LittleEndian.AppendUint64(nil, 1<<40), "header length 1099511627776 exceeds")
	f(binary.LittleEndian.AppendUint64(nil, 50), "header length 50 runs past the end of the 8-byte file")
	f(file(`[1,2]`, nil), "header is not a JSON object")
	f(file(``, nil), "header is not a JSON object")
	f(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`, eight), "header:")
	f(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} junk`, eight), "bytes after the header's JSON object")
	f(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, eight),
		`tensor "a": appears twice`)
	f(file(`{"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}}`, eight), `tensor "a": unknown dtype "Q4"`)
	f(file(`{"a":{"dtype":"F32","data_offsets":[0,8]}}`, eight), `tensor "a": no shape`)
	f(file(`{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, eight), `tensor "a": negative dimension -2`)
	f(file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}}`, eight), `tensor "a": shape [1] of F32 needs 4 bytes, data_offsets give 8`)
	f(file(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, eight), `tensor "a": shape [3] needs more bytes than the file has`)
	f(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}`, eight), `tensor "a": data_offsets [0, 16] outside the 8-byte data section`)
	f(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}`, eight), `data_offsets [8, 0] outside`)
	f(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}}`, eight), `data_offsets has 1 numbers, want 2`)
	f(file(`{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, eight), "needs more bytes than the file has")
	f(file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, eight),
		`bytes [0, 4) overlap tensor`)
	f(file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), `tensor "a": starts at byte 4, leaving bytes [0, 4) of the data section unused`)
	f(file(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, eight), "tensors cover 4 bytes of a 8-byte data section")
	f(file(`{"__metadata__":{"n":1}}`, nil), "__metadata__ must map strings to strings")
	f(file(`{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}`, eight[:4]), "rank 17 exceeds 16")

	// A well-formed file with an empty tensor and metadata parses; truncating it anywhere fails.
	good := file(`{"__metadata__":{"format":"pt"},"e":{"dtype":"F16","shape":[0,3],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, eight)
	parsed, err := Parse(good)
	require.NoError(t, err)
	require.Len(t, parsed.Tensors, 2)
	for n := range len(good) {
		_, err := Parse(good[:n])
		require.ErrorIs(t, err, ErrFormat, "truncated to %d bytes", n)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(filepath.Join(dir, "missing.safetensors"))
	require.ErrorIs(t, err, os.ErrNotExist)
	short := filepath.Join(dir, "short.safetensors")
	require.NoError(t, os.WriteFile(short, []byte{1, 2}, 0o644))
	_, err = Open(short)
	require.ErrorIs(t, err, ErrFormat)
	require.ErrorContains(t, err, "short.safetensors")
}

// Any bytes: Parse never panics; what it accepts tiles the data and survives a rewrite.
func FuzzParse(f *testing.F) {
	f.Add(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(file(`{"__metadata__":{"k":"v"},"e":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, nil))
	f.Add(file(`{"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"b":{"dtype":"I8","shape":[2],"data_offsets":[2,4]}}`, make([]byte, 4)))
	f.Fuzz(func(t *testing.T, b []byte) {
		parsed, err := Parse(b)
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := Write(&buf, parsed.Tensors, parsed.Metadata); err != nil {
			t.Fatalf("rewrite of an accepted file: %v", err)
		}
		again, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("reparse: %v", err)
		}
		if len(again.Tensors) != len(parsed.Tensors) {
			t.Fatalf("%d tensors, then %d", len(parsed.Tensors), len(again.Tensors))
		}
		for i, want := range parsed.Tensors {
			if got := again.Tensors[i]; got.Name != want.Name || !bytes.Equal(got.Data, want.Data) {
				t.Fatalf("tensor %d changed in the rewrite", i)
			}
		}
	})
}
