package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/features/safetensors"
	"dataplane/native/fixtures"
)

// The CLI writes the fixture's exact CLIP-224 tensor and its token count.
func TestPreprocessImage(t *testing.T) {
	out := filepath.Join(t.TempDir(), "x.safetensors")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"preprocess", "--preset", "clip-224", "--image", fixtures.Path(t, "image_200x150.png"), "--out", out}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stdout.String(), "tokens 256")
	f, err := safetensors.Open(out)
	require.NoError(t, err)
	defer f.Close()
	tn, ok := f.Tensor("pixel_values")
	require.True(t, ok)
	require.Equal(t, []int{1, 3, 224, 224}, tn.Shape)
	want, _ := fixtures.ReadF32(t, "image_200x150_clip224")
	for i, w := range want {
		require.Equal(t, w, math.Float32frombits(binary.LittleEndian.Uint32(tn.Data[4*i:])), "element %d", i)
	}
	require.Equal(t, "256", f.Metadata["tokens"])
	require.Len(t, f.Metadata["content_key"], 64)
}

// Audio from a data: URL, the Hugging Face convention, bf16.
func TestPreprocessAudioDataURL(t *testing.T) {
	wav, err := os.ReadFile(fixtures.Path(t, "audio_7s3.wav"))
	require.NoError(t, err)
	out := filepath.Join(t.TempDir(), "a.safetensors")
	url := "data:audio/wav;base64," + base64.StdEncoding.EncodeToString(wav)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"preprocess", "--preset", "whisper-128", "--audio", url, "--mel", "hf", "--dtype", "bf16", "--out", out}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stdout.String(), "tensor input_features BF16 [1 128 3000]")
	require.Contains(t, stdout.String(), "tokens 1500")
}

func TestPreprocessUsage(t *testing.T) {
	var stderr bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"preprocess", "-h"}, io.Discard, &stderr))
	for _, name := range []string{"clip-224", "clip-336", "siglip-384", "whisper-80", "whisper-128", "qwen2-vl", "internvl"} {
		require.Contains(t, stderr.String(), name)
	}
	stderr.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"preprocess", "--preset", "clip-224"}, io.Discard, &stderr))
	require.Contains(t, stderr.String(), "exactly one of")
	require.Equal(t, 2, run(context.Background(), []string{"preprocess", "--preset", "nope", "--image", "x", "--out", "y"}, io.Discard, io.Discard))
	stderr.Reset()
	require.Equal(t, 1, run(context.Background(), []string{"preprocess", "--preset", "clip-224", "--image", fixtures.Path(t, "audio_7s3.wav"),
		"--out", filepath.Join(t.TempDir(), "z")}, io.Discard, &stderr))
	require.Contains(t, stderr.String(), "unsupported image format")
}
