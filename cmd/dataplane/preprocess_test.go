package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"image"
	"image/png"
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
	"dataplane/native"
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

// preprocess writes the same files as before media preprocessing handed back native tensors.
// Each sum, size and tensor line is what `go run ./cmd/dataplane preprocess ARGS --out
// x.safetensors` wrote and printed at 83a4bc9 (the old code, run in an unmodified checkout on
// the development VM, an AVX2 machine), so tensor names, dtypes (the I64 *_grid_thw included),
// shapes, bytes, metadata and the header's layout are all pinned. Log-mel bits differ between
// kernel variants, so the audio files are made with the AVX2 variant (native.SetAudioISA),
// wherever the CPU runs it.
func TestPreprocessWritesPinnedFiles(t *testing.T) {
	png, jpg, wav := fixtures.Path(t, "image_200x150.png"), fixtures.Path(t, "image_200x150.jpg"), fixtures.Path(t, "audio_7s3.wav")
	f := func(name, sum string, size int, tensors string, args ...string) {
		t.Run(name, func(t *testing.T) {
			if slices.Contains(args, "--audio") {
				// The sums are of the AVX2 variant's bits: pin it where a wider one is the best.
				if !native.ISAAVX2.Supported() {
					t.Skipf("the sums are of the AVX2 log-mel variant's bits, which this CPU cannot run")
				}
				defer native.SetAudioISA(native.SetAudioISA(native.ISAAVX2))
			}
			out := filepath.Join(t.TempDir(), "x.safetensors")
			var stdout, stderr bytes.Buffer
			require.Equal(t, 0, run(context.Background(), append(append([]string{"preprocess"}, args...), "--out", out), &stdout, &stderr), stderr.String())
			var lines []string
			for _, l := range strings.Split(stdout.String(), "\n") {
				if strings.HasPrefix(l, "tensor ") {
					lines = append(lines, l)
				}
			}
			require.Equal(t, tensors, strings.Join(lines, "\n"))
			b, err := os.ReadFile(out)
			require.NoError(t, err)
			got := sha256.Sum256(b)
			n := binary.LittleEndian.Uint64(b)
			require.Equal(t, sum, hex.EncodeToString(got[:]), "header: %s", b[8:8+n])
			require.Len(t, b, size)
		})
	}
	f("clip-224 png", "fad26fdcb808e5792347d2a48ee98b41c0d5301901b0ca8fd4fddb78e7462b1f", 602408,
		"tensor pixel_values F32 [1 3 224 224]", "--preset", "clip-224", "--image", png)
	f("siglip-384 jpeg f16", "58ea6cb55910e96515eab2a3f8b0c50eec26d3e6ff964bae026bd2254d5166d5", 885040,
		"tensor pixel_values F16 [1 3 384 384]", "--preset", "siglip-384", "--image", jpg, "--dtype", "f16")
	f("internvl png bf16", "4dac00bd500aff4ff99e3a15cba8d166fd54cd3cb760ad99755a16868eacad10", 15655216,
		"tensor pixel_values BF16 [13 3 448 448]", "--preset", "internvl", "--image", png, "--dtype", "bf16")
	f("qwen2-vl jpeg", "635ecbb9ba1fc836df77de68eeb179f109deb8ba9691c412d42046f91fa331d8", 658960,
		"tensor pixel_values F32 [140 1176]\ntensor image_grid_thw I64 [1 3]", "--preset", "qwen2-vl", "--image", jpg)
	f("qwen2-vl pictures as video bf16", "1bdd6c741a556234beb4145e0fef85dcc78b7d87ac28b63449e0c3abccf051d8", 658976,
		"tensor pixel_values_videos BF16 [280 1176]\ntensor video_grid_thw I64 [1 3]",
		"--preset", "qwen2-vl", "--images", strings.Join([]string{png, jpg, png, jpg}, ","), "--dtype", "bf16")
	f("clip-224 pictures as video f16", "5308b7732a51a110fd4e07e6d83c2f8ced07593d9b9d05b5a35a68b8e96e5e5e", 602424,
		"tensor pixel_values_videos F16 [2 3 224 224]", "--preset", "clip-224", "--images", png+","+jpg, "--dtype", "f16")
	f("whisper-80", "a78a630bd2c7ca51037eb02d81b5d11fe4bad6177c6b5d3b9b748c1bef71990a", 960344,
		"tensor input_features F32 [1 80 3000]", "--preset", "whisper-80", "--audio", wav)
	f("whisper-128 hf bf16", "66c2a06bad6288ff939d22e22678d2b8b86e4c1cc619182166af6762bf9939b4", 768336,
		"tensor input_features BF16 [1 128 3000]", "--preset", "whisper-128", "--audio", wav, "--mel", "hf", "--dtype", "bf16")
	f("qwen2-audio f16", "bece9d06ec9b036fe5d237a1db82ced1afbd3f9f375a89c50c42b15a004ab13e", 768336,
		"tensor input_features F16 [1 128 3000]", "--preset", "qwen2-audio", "--audio", wav, "--dtype", "f16")
}

// --processor: a checkpoint's files decide the preprocessing. Qwen2-VL-7B's max_pixels makes a
// 1920x1080 picture 2,691 tokens (its class default, 1,222); LLaVA-NeXT writes image_sizes.
func TestPreprocessProcessor(t *testing.T) {
	dir := t.TempDir()
	pic := filepath.Join(dir, "wide.png")
	img := image.NewRGBA(image.Rect(0, 0, 1920, 1080))
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))
	require.NoError(t, os.WriteFile(pic, buf.Bytes(), 0o644))
	configs := "../../dataplane/media/hfproc/testdata/configs/"
	for _, c := range []struct {
		config, want, tensor string
	}{
		{"qwen2-vl-7b-instruct", "tokens 2691", "tensor image_grid_thw I64 [1 3]"},
		{"llava-v1.6-mistral-7b-hf", "tokens 1948", "tensor image_sizes I64 [1 2]"},
		{"siglip-so400m-patch14-384", "tokens 729", "tensor pixel_values F32 [1 3 384 384]"},
	} {
		var stdout, stderr bytes.Buffer
		out := filepath.Join(dir, c.config+".safetensors")
		code := run(context.Background(), []string{"preprocess", "--processor", configs + c.config, "--image", pic, "--out", out}, &stdout, &stderr)
		require.Equal(t, 0, code, stderr.String())
		require.Contains(t, stdout.String(), c.want, c.config)
		require.Contains(t, stdout.String(), c.tensor, c.config)
		require.Contains(t, stdout.String(), "processor: "+configs+c.config, c.config)
	}
	var stderr bytes.Buffer
	require.Equal(t, 1, run(context.Background(), []string{"preprocess", "--processor", configs + "whisper-base", "--image", pic,
		"--out", filepath.Join(dir, "x")}, io.Discard, &stderr))
	require.Contains(t, stderr.String(), "have no image processor")
	require.Equal(t, 2, run(context.Background(), []string{"preprocess", "--processor", dir, "--preset", "clip-224", "--image", pic,
		"--out", filepath.Join(dir, "x")}, io.Discard, io.Discard))
}
