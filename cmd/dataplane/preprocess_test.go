package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/media/ffmpeg/ffmpegtest"
	"dataplane/native/fixtures"
	"dataplane/transfer/safetensors"
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

// A video file and the list of its frames as pictures give the same tensor and content key; the
// token budget picks the frame count (4 frames of CLIP-224's 256 fit in 1,100).
func TestPreprocessVideoAndImages(t *testing.T) {
	if _, err := exec.LookPath("ffmpeg"); err != nil {
		t.Skip("ffmpeg not installed (make test installs it)")
	}
	dir := t.TempDir()
	mkv := filepath.Join(dir, "v.mkv")
	for _, args := range [][]string{
		{"-f", "lavfi", "-i", "testsrc2=size=96x64:rate=10:duration=2", "-c:v", "ffv1", "-pix_fmt", "bgr0", mkv},
		{"-i", mkv, filepath.Join(dir, "f%03d.png")},
	} {
		ffmpegtest.Run(t, args...)
	}
	pngs, err := filepath.Glob(filepath.Join(dir, "f*.png"))
	require.NoError(t, err)
	require.Len(t, pngs, 20)
	slices.Sort(pngs)

	preprocess := func(input ...string) *safetensors.File {
		t.Helper()
		out := filepath.Join(t.TempDir(), "v.safetensors")
		var stdout, stderr bytes.Buffer
		args := append([]string{"preprocess", "--preset", "clip-224", "--budget", "1100", "--dtype", "f16", "--out", out}, input...)
		require.Equal(t, 0, run(context.Background(), args, &stdout, &stderr), stderr.String())
		require.Contains(t, stdout.String(), "tensor pixel_values_videos F16 [4 3 224 224]")
		require.Contains(t, stdout.String(), "tokens 1024")
		f, err := safetensors.Open(out)
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
		require.Equal(t, "video", f.Metadata["modality"])
		return f
	}
	a := preprocess("--video", mkv)
	b := preprocess("--images", strings.Join(pngs, ","))
	require.Equal(t, a.Metadata["content_key"], b.Metadata["content_key"])
	require.Len(t, a.Metadata["content_key"], 64)
	ta, _ := a.Tensor("pixel_values_videos")
	tb, _ := b.Tensor("pixel_values_videos")
	require.Equal(t, ta.Data, tb.Data)

	junk := filepath.Join(dir, "junk.mp4")
	require.NoError(t, os.WriteFile(junk, bytes.Repeat([]byte("not a video "), 100), 0o644))
	var stderr bytes.Buffer
	require.Equal(t, 1, run(context.Background(), []string{"preprocess", "--preset", "clip-224", "--video", junk,
		"--out", filepath.Join(dir, "x.safetensors")}, io.Discard, &stderr))
	require.Contains(t, stderr.String(), "corrupt video")
}
