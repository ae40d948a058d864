package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/native/fixtures"
	"dataplane/transfer/safetensors"
)

// modelDir lays a fixture checkpoint out as a model directory.
func modelDir(t *testing.T, name string) string {
	dir := t.TempDir()
	require.NoError(t, os.Symlink(fixtures.Path(t, name+"_config.json"), filepath.Join(dir, "config.json")))
	require.NoError(t, os.Symlink(fixtures.Path(t, name+".safetensors"), filepath.Join(dir, "model.safetensors")))
	return dir
}

// encode runs `dataplane encode` and returns the tensors it wrote, as f32.
func encode(t *testing.T, args ...string) map[string][]float32 {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out.safetensors")
	var stderr bytes.Buffer
	code := run(context.Background(), append([]string{"encode", "--out", out}, args...), &bytes.Buffer{}, &stderr)
	require.Equal(t, 0, code, stderr.String())
	f, err := safetensors.Open(out)
	require.NoError(t, err)
	defer f.Close()
	res := map[string][]float32{}
	for _, ts := range f.Tensors {
		v, err := ts.Float32()
		require.NoError(t, err)
		res[ts.Name] = v
	}
	return res
}

// The encoders against the fixtures computed by openai/CLIP and openai/whisper, through the
// CLI: within 1e-5 of the largest reference value (the fixtures' suggested tolerance).
func TestEncodeFixtures(t *testing.T) {
	clip := modelDir(t, "clip_vit_tiny_random")
	in := []string{"--raw", fixtures.Path(t, "clip_in_random.f32"), "--shape", "3,64,64",
		"--raw", fixtures.Path(t, "image_200x150_clip64.f32"), "--shape", "3,64,64"}
	for _, c := range []struct{ features, fixture string }{
		{"last", "last_hidden"}, {"hidden:-2", "penultimate"}, {"pooled", "pooled_proj"},
	} {
		for _, batch := range []string{"1", "2"} {
			got := encode(t, append([]string{"--model", clip, "--features", c.features, "--batch", batch}, in...)...)
			for i, name := range []string{"random", "image"} {
				want, _ := fixtures.ReadF32(t, "clip_out_"+name+"_"+c.fixture)
				fixtures.RequireClose(t, want, got["raw."+strconv.Itoa(i)], 1e-5, "clip "+name+" "+c.features+" batch "+batch)
			}
		}
	}

	whisper := modelDir(t, "whisper_enc_tiny_random")
	got := encode(t, "--model", whisper,
		"--raw", fixtures.Path(t, "whisper_enc_in_audio.f32"), "--shape", "80,200",
		"--raw", fixtures.Path(t, "whisper_enc_in_random.f32"), "--shape", "80,200")
	for i, name := range []string{"audio", "random"} {
		want, _ := fixtures.ReadF32(t, "whisper_enc_out_"+name)
		fixtures.RequireClose(t, want, got["raw."+strconv.Itoa(i)], 1e-5, "whisper "+name)
	}
}

func TestEncodeOutputDType(t *testing.T) {
	clip := modelDir(t, "clip_vit_tiny_random")
	out := filepath.Join(t.TempDir(), "out.safetensors")
	code := run(context.Background(), []string{"encode", "--model", clip, "--out", out, "--dtype", "bf16", "--features", "last",
		"--drop-cls", "--raw", fixtures.Path(t, "clip_in_random.f32"), "--shape", "3,64,64"}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Equal(t, 0, code)
	f, err := safetensors.Open(out)
	require.NoError(t, err)
	defer f.Close()
	ts, ok := f.Tensor("raw.0")
	require.True(t, ok)
	require.Equal(t, "BF16", ts.DType)
	require.Equal(t, []int{16, 64}, ts.Shape)
	require.Equal(t, "last_hidden_state without CLS", f.Metadata["features"])
	got, err := ts.Float32()
	require.NoError(t, err)
	want, _ := fixtures.ReadF32(t, "clip_out_random_last_hidden")
	fixtures.RequireClose(t, want[64:], got, 1.0/256, "bf16 output") // bf16 keeps 8 significant bits
}

func TestEncodeErrors(t *testing.T) {
	clip := modelDir(t, "clip_vit_tiny_random")
	short := filepath.Join(t.TempDir(), "short.f32")
	require.NoError(t, os.WriteFile(short, make([]byte, 100), 0o644))
	out := filepath.Join(t.TempDir(), "o.safetensors")
	f := func(code int, want string, args ...string) {
		t.Helper()
		var stderr bytes.Buffer
		require.Equal(t, code, run(context.Background(), append([]string{"encode"}, args...), &bytes.Buffer{}, &stderr), stderr.String())
		require.Contains(t, stderr.String(), want)
	}
	f(2, "--model and --out are required", "--raw", short, "--shape", "1")
	f(2, "no inputs", "--model", clip, "--out", out)
	f(2, "--shape must follow the --raw", "--shape", "3,64,64")
	f(2, "has no --shape", "--model", clip, "--out", out, "--raw", short)
	f(2, `bad dimension "x"`, "--model", clip, "--out", out, "--raw", short, "--shape", "3,x")
	f(2, "--drop-cls and --project go with an explicit --features", "--model", clip, "--out", out, "--raw", short, "--shape", "3", "--drop-cls")
	f(2, `--features "hidden:x"`, "--model", clip, "--out", out, "--raw", short, "--shape", "3", "--features", "hidden:x")
	f(1, "shape [3 32 32], the model takes [3 64 64]", "--model", clip, "--out", out, "--raw", short, "--shape", "3,32,32")
	f(1, "100 bytes, shape [3 64 64] of float32 needs 49152", "--model", clip, "--out", out, "--raw", short, "--shape", "3,64,64")
	f(1, "hidden state 7 outside", "--model", clip, "--out", out, "--raw", short, "--shape", "3,64,64", "--features", "hidden:7")
	f(1, "no such file", "--model", filepath.Join(clip, "nope"), "--out", out, "--raw", short, "--shape", "3,64,64")
	_, err := os.Stat(out)
	require.True(t, os.IsNotExist(err), "no output after a failure")
	require.True(t, strings.HasPrefix(usage(), "dataplane:"))
}
