package video

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/media/ffmpeg/ffmpegtest"
	"dataplane/dataplane/media/picture"
	"dataplane/native"
)

// losslessVideo is 4 s of ffmpeg's test pattern at 10 fps, 96x64, in lossless FFV1 RGB: every
// frame decodes to known bytes.
func losslessVideo(t testing.TB) (string, []byte) {
	path := filepath.Join(t.TempDir(), "v.mkv")
	ffmpegtest.Run(t, "-f", "lavfi", "-i", "testsrc2=size=96x64:rate=10:duration=4", "-c:v", "ffv1", "-pix_fmt", "bgr0", path)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return path, data
}

// frames is a Sink keeping a copy of every frame it is shown.
type frames struct {
	n      int // the count Begin was given last
	begins int
	got    []*picture.Image
}

func (f *frames) Begin(n int) { f.n, f.got = n, nil; f.begins++ }

func (f *frames) Frame(img *picture.Image) error {
	f.got = append(f.got, &picture.Image{W: img.W, H: img.H, Pix: bytes.Clone(img.Pix)})
	return nil
}

// allFrames is ffmpeg's own decode of every frame, as RGB.
func allFrames(t testing.TB, path string, w, h int) [][]byte {
	raw := ffmpegtest.Run(t, "-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "-")
	var out [][]byte
	for len(raw) >= 3*w*h {
		out = append(out, raw[:3*w*h])
		raw = raw[3*w*h:]
	}
	return out
}

func TestUniformAndFPSSampling(t *testing.T) {
	path, data := losslessVideo(t)
	all := allFrames(t, path, 96, 64)
	require.Len(t, all, 40)
	f := func(opts Options, want []int) {
		t.Helper()
		var sink frames
		opts.Sink = &sink
		v, err := Decode(context.Background(), data, opts, picture.CLIP224, native.F32)
		require.NoError(t, err)
		require.Equal(t, Info{W: 96, H: 64, FPS: 10, Frames: 40, Duration: 4}, v.Info)
		require.Equal(t, want, v.Indices, "%+v", opts)
		require.Equal(t, len(want), sink.n)
		require.Len(t, sink.got, len(want))
		for k, i := range v.Indices {
			require.Equal(t, all[i], sink.got[k].Pix, "frame %d", i)
			require.Equal(t, [2]int{96, 64}, v.Sizes[k])
			require.InDelta(t, float64(i)/10, v.Times[k], 1e-9)
		}
	}
	f(Options{Sampling: Uniform, Frames: 8}, []int{0, 5, 11, 16, 22, 27, 33, 39})          // np.linspace(0, 39, 8, dtype=int)
	f(Options{Sampling: FPS, FPS: 2, MaxFrames: 100}, []int{0, 6, 11, 17, 22, 28, 33, 39}) // 8 frames, rounded half to even
	f(Options{Sampling: FPS, FPS: 1, FrameMultiple: 2, MaxFrames: 100}, []int{0, 13, 26, 39})
	f(Options{Sampling: MaxFrames, MaxFrames: 3}, []int{0, 19, 39})
	f(Options{Sampling: Uniform, Frames: 1}, []int{0})
	// The budget caps the count: 3 x 256 tokens at CLIP-224 fit 3 frames.
	f(Options{Sampling: MaxFrames, MaxFrames: 40, Budget: Budget{Tokens: 3*256 + 100}}, []int{0, 19, 39})
}

// A video of four flat colours, a second each: keyframes are the four cuts.
func TestKeyframeSampling(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cuts.mkv")
	ffmpegtest.Run(t, "-f", "lavfi", "-i", "color=c=red:s=64x48:r=10:d=1", "-f", "lavfi", "-i", "color=c=blue:s=64x48:r=10:d=1",
		"-f", "lavfi", "-i", "color=c=white:s=64x48:r=10:d=1", "-f", "lavfi", "-i", "color=c=green:s=64x48:r=10:d=1",
		"-filter_complex", "[0][1][2][3]concat=n=4:v=1", "-c:v", "ffv1", path)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	v, err := Decode(context.Background(), data, Options{Sampling: Keyframe, Frames: 4, CandidateFPS: 10}, picture.SigLIP384, native.F32)
	require.NoError(t, err)
	require.Equal(t, []int{0, 10, 20, 30}, v.Indices)
}

func TestImagesAsVideo(t *testing.T) {
	path, _ := losslessVideo(t)
	all := allFrames(t, path, 96, 64)
	pngs := ffmpegtest.PNGFrames(t, path)
	require.Len(t, pngs, 40)
	var sink frames
	v, err := FromImages(pngs, Options{Sampling: FPS, FPS: 0.5, ImageFPS: 10, MaxFrames: 10, Sink: &sink}, picture.CLIP224, native.F32)
	require.NoError(t, err)
	require.Equal(t, []int{0, 39}, v.Indices)
	require.Equal(t, all[39], sink.got[1].Pix)
	v, err = FromImages(pngs, Options{Sampling: Keyframe, Frames: 3}, picture.CLIP224, native.F32)
	require.NoError(t, err)
	require.Len(t, v.Indices, 3)
	require.Equal(t, 0, v.Indices[0])
	_, err = FromImages([][]byte{pngs[0], []byte("not a picture")}, Options{Frames: 2}, picture.CLIP224, native.F32)
	require.ErrorIs(t, err, ErrFrame)
	require.Contains(t, err.Error(), "picture 1")
}

func TestPreprocessAndTokens(t *testing.T) {
	_, data := losslessVideo(t)
	var sink frames
	v, err := Decode(context.Background(), data, Options{Frames: 5, Sink: &sink}, picture.CLIP224, native.BF16)
	require.NoError(t, err)
	out := v.Output
	require.Equal(t, 5*256, out.Tokens)
	require.Equal(t, []int{5, 3, 224, 224}, out.PixelValuesVideos.Shape)
	// Each frame's slice is the frame preprocessed alone.
	one, err := picture.CLIP224.Apply(sink.got[3], native.BF16)
	require.NoError(t, err)
	n := len(one.PixelValues.Data)
	require.Equal(t, one.PixelValues.Data, out.PixelValuesVideos.Data[3*n:4*n])

	q := picture.Qwen2VLImage
	v, err = Decode(context.Background(), data, Options{Frames: 5}, q, native.F32)
	require.NoError(t, err)
	out = v.Output
	// 96x64 -> smart_resize 84x56 -> grid 6x4 patches of 14; 5 frames -> 3 temporal patches.
	require.Equal(t, [3]int{3, 4, 6}, out.Grid) // video_grid_thw
	require.Equal(t, []int{3 * 4 * 6, 1176}, out.PixelValuesVideos.Shape)
	require.Equal(t, 3*(4/2)*(6/2), out.Tokens)
	require.Equal(t, 18, TokenCount(5, 6, 2))
}

func TestBudget(t *testing.T) {
	require.Equal(t, 5, Budget{Tokens: 576 * 5}.Frames(576))
	require.Equal(t, 10, Budget{Tokens: 1225 * 5, Pool: 2}.Frames(1225))
	require.Equal(t, 0, Budget{Tokens: 100}.Frames(576))
	o := Options{Sampling: MaxFrames, MinFrames: 2, Budget: Budget{Tokens: 576}}
	_, err := o.choose(100, 10, 576)
	require.ErrorIs(t, err, ErrBudget)
	require.Contains(t, err.Error(), "fewer than the minimum 2")
}

func TestBadInputs(t *testing.T) {
	_, data := losslessVideo(t)
	f := func(name string, data []byte, opts Options, kind error, words string) {
		t.Helper()
		_, err := Decode(context.Background(), data, opts, picture.CLIP224, native.F32)
		require.Error(t, err, name)
		require.ErrorIs(t, err, kind, "%s: %v", name, err)
		require.Contains(t, err.Error(), words, name)
	}
	f("empty", nil, Options{}, ErrEmpty, "empty input")
	f("garbage", bytes.Repeat([]byte("not a video "), 100), Options{}, ErrCorrupt, "probe")
	f("truncated", data[:200], Options{}, ErrCorrupt, "")
	f("frames too large", data, Options{MaxPixels: 1000}, ErrTooLarge, "96x64")
	f("too long", data, Options{MaxSeconds: 1}, ErrTooLong, "4.0 s")
	f("no ffprobe", data, Options{FFprobe: "/nonexistent/ffprobe"}, ErrFFmpeg, "not found")
	f("over budget", data, Options{Budget: Budget{Tokens: 10}}, ErrBudget, "10 tokens")
	f("negative frames", data, Options{Frames: -1}, ErrSampling, "negative option")
	_, err := FromImages(nil, Options{}, picture.CLIP224, native.F32)
	require.ErrorIs(t, err, ErrEmpty)
}

// Index selection on arbitrary counts: in range, ascending, the requested size.
func FuzzSampling(f *testing.F) {
	f.Add(40, 8, 10.0, 2.0, uint8(0))
	f.Add(1, 1, 30.0, 0.5, uint8(1))
	f.Fuzz(func(t *testing.T, total, frames int, srcFPS, fps float64, s uint8) {
		if total < 1 || total > 100000 || frames < 0 || frames > 5000 || !(srcFPS > 0.01 && srcFPS < 1000) || !(fps > 0.001 && fps < 1000) {
			return
		}
		o := Options{Sampling: Sampling(s % 4), Frames: frames, FPS: fps}
		n, err := o.choose(total, srcFPS, 1)
		require.NoError(t, err)
		require.True(t, n >= 1 && n <= min(total, o.maxFrames()), "n = %d", n)
		idx := o.indices(total, n)
		require.Len(t, idx, n)
		for i, v := range idx {
			require.True(t, v >= 0 && v < total)
			if i > 0 {
				require.GreaterOrEqual(t, v, idx[i-1])
			}
		}
		require.Equal(t, rate("30000/1001"), 30000.0/1001)
	})
}

// fewerFrames is an ffmpeg that outputs at most n frames of 96x64 RGB and then stops, as
// ffmpeg does when it decodes fewer frames than the container has packets.
func fewerFrames(t testing.TB, n int) string {
	ffmpegtest.Need(t)
	path := filepath.Join(t.TempDir(), "ffmpeg")
	script := fmt.Sprintf("#!/bin/sh\nffmpeg \"$@\" | head -c %d\n", n*3*96*64)
	require.NoError(t, os.WriteFile(path, []byte(script), 0o755))
	return path
}

// ffmpeg outputs 3 of the 5 frames chosen: the video is those 3, and the sink, told 5 at
// first, is shown them again under their true count (the key's header counts the frames).
func TestFewerFramesThanChosen(t *testing.T) {
	path, data := losslessVideo(t)
	all := allFrames(t, path, 96, 64)
	var sink frames
	v, err := Decode(context.Background(), data, Options{Frames: 5, FFmpeg: fewerFrames(t, 3), Sink: &sink}, picture.CLIP224, native.F32)
	require.NoError(t, err)
	require.Equal(t, []int{0, 9, 19}, v.Indices) // of linspace(0, 39, 5)
	require.Equal(t, []int{3, 3, 224, 224}, v.Output.PixelValuesVideos.Shape)
	require.Equal(t, 3*256, v.Output.Tokens)
	require.Equal(t, 2, sink.begins)
	require.Equal(t, 3, sink.n)
	require.Len(t, sink.got, 3)
	for k, i := range v.Indices {
		require.Equal(t, all[i], sink.got[k].Pix)
	}
}
