package media

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zeebo/blake3"

	"dataplane/dataplane/media/ffmpeg/ffmpegtest"
	"dataplane/dataplane/media/hfproc"
	"dataplane/dataplane/media/picture"
	"dataplane/dataplane/media/video"
	"dataplane/native"
)

// clip is a lossless (FFV1 RGB) video of an ffmpeg test source, 96x64, 10 fps, 4 s, and every
// frame of it as a PNG, in order: the same frames as a container and as a picture list.
func clip(t testing.TB, src string) (mkv []byte, pngs [][]byte) {
	dir := t.TempDir()
	path := filepath.Join(dir, "v.mkv")
	ffmpegtest.Run(t, "-f", "lavfi", "-i", src+"=size=96x64:rate=10:duration=4", "-c:v", "ffv1", "-pix_fmt", "bgr0", path)
	mkv, err := os.ReadFile(path)
	require.NoError(t, err)
	pngs = ffmpegtest.PNGFrames(t, path)
	require.Len(t, pngs, 40)
	return mkv, pngs
}

// The video key is over the chosen frames' pixels, not the container: a video and the list of
// its frames as pictures, sampled alike, give the same key and tensors; other frames, another
// order or other content give other keys.
func TestVideoEndToEnd(t *testing.T) {
	ctx := context.Background()
	clip224, err := Lookup("clip-224")
	require.NoError(t, err)
	mkv, pngs := clip(t, "testsrc2")
	opts := Options{DType: native.BF16, Video: video.Options{Sampling: video.Uniform, Frames: 8}}

	a, err := Video(ctx, mkv, nil, clip224, opts)
	require.NoError(t, err)
	require.Equal(t, 8*256, a.Tokens)
	require.Zero(t, a.Grid) // pixel_values_videos alone, no grid
	require.Equal(t, native.BF16, a.Input.DType)
	require.Equal(t, []int{8, 3, 224, 224}, a.Input.Shape)
	require.Len(t, a.Input.Data, 8*3*224*224*2)
	require.Contains(t, a.Detail, "96x64, 40 frames at 10 fps; took 8 (uniform): [0 5 11 16 22 27 33 39]")

	b, err := Video(ctx, nil, pngs, clip224, opts)
	require.NoError(t, err)
	require.Equal(t, a.Key, b.Key)
	require.Equal(t, a.Tokens, b.Tokens)
	require.Equal(t, a.Input.Data, b.Input.Data)

	// The key is the documented layout over the chosen frames, and each frame's slice of the
	// tensor is that picture preprocessed alone.
	var frames []*picture.Image
	for _, i := range []int{0, 5, 11, 16, 22, 27, 33, 39} {
		img, _, err := picture.Decode(pngs[i], picture.Options{})
		require.NoError(t, err)
		frames = append(frames, img)
	}
	h := blake3.New()
	hdr := []byte{1, 2, 0, 3}
	for _, v := range []int{8, 64, 96} {
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(v))
	}
	h.Write(hdr)
	for _, f := range frames {
		h.Write(f.Pix)
	}
	var want Key
	h.Sum(want[:0])
	require.Equal(t, want, a.Key)
	one, err := Image(pngs[22], clip224, Options{DType: native.BF16})
	require.NoError(t, err)
	n := len(one.Input.Data)
	require.Equal(t, one.Input.Data, a.Input.Data[4*n:5*n])
	require.NotEqual(t, one.Key, VideoKey(frames[4:5]), "a one-frame video is not the picture")

	other := func(name string, k Key) {
		t.Helper()
		require.NotEqual(t, a.Key, k, name)
	}
	c, err := Video(ctx, mkv, nil, clip224, Options{Video: video.Options{Sampling: video.Uniform, Frames: 7}})
	require.NoError(t, err)
	other("7 frames", c.Key)
	reversed := slices.Clone(pngs)
	slices.Reverse(reversed)
	c, err = Video(ctx, nil, reversed, clip224, opts)
	require.NoError(t, err)
	other("frames reversed", c.Key)
	mkv2, _ := clip(t, "testsrc")
	c, err = Video(ctx, mkv2, nil, clip224, opts)
	require.NoError(t, err)
	other("other content", c.Key)
	// The same bytes in other shapes.
	f := &picture.Image{W: 4, H: 2, Pix: bytes.Repeat([]byte{7, 8, 9}, 8)}
	tall := &picture.Image{W: 2, H: 4, Pix: f.Pix}
	half := &picture.Image{W: 4, H: 1, Pix: f.Pix[:12]}
	rest := &picture.Image{W: 4, H: 1, Pix: f.Pix[12:]}
	keys := []Key{VideoKey([]*picture.Image{f}), VideoKey([]*picture.Image{tall}), VideoKey([]*picture.Image{half, rest}),
		VideoKey([]*picture.Image{f, f}), ImageKey(f)}
	for i := range keys {
		for j := range i {
			require.NotEqual(t, keys[i], keys[j], "%d vs %d", i, j)
		}
	}
}

// Qwen2-VL takes frames in temporal patches of two: the count is rounded down to a multiple,
// and the tokens are per patch.
func TestVideoQwen2VL(t *testing.T) {
	ctx := context.Background()
	q, err := Lookup("qwen2-vl")
	require.NoError(t, err)
	mkv, pngs := clip(t, "testsrc2")
	a, err := Video(ctx, mkv, nil, q, Options{Video: video.Options{Frames: 5}})
	require.NoError(t, err)
	// 4 frames (5 floored to 2s); 96x64 -> smart_resize 84x56 -> 6x4 patches of 14, merged 2x2.
	require.Equal(t, 2*(4/2)*(6/2), a.Tokens)
	require.Equal(t, []int{2 * 4 * 6, 3 * 2 * 14 * 14}, a.Input.Shape)
	require.Equal(t, [3]int{2, 4, 6}, a.Grid) // video_grid_thw
	b, err := Video(ctx, nil, pngs, q, Options{Video: video.Options{Frames: 5}})
	require.NoError(t, err)
	require.Equal(t, a.Key, b.Key)
	require.Equal(t, a.Input.Data, b.Input.Data)
}

// A checkpoint's video processor: its frames' pixel bounds (not the image processor's) and its
// frame count when the options leave it unset.
func TestVideoProcessorSettings(t *testing.T) {
	s, err := hfproc.Parse(map[string][]byte{
		hfproc.PreprocessorFile: []byte(`{"image_processor_type": "Qwen2VLImageProcessor", "max_pixels": 12845056}`),
		hfproc.VideoFile:        []byte(`{"video_processor_type": "Qwen2VLVideoProcessor", "min_pixels": 784, "max_pixels": 1568, "min_frames": 2, "max_frames": 2}`),
	})
	require.NoError(t, err)
	q, _ := FromProcessor(s)
	_, pngs := clip(t, "testsrc2")
	v, err := Video(context.Background(), nil, pngs, *q, Options{})
	require.NoError(t, err)
	// 2 frames (max_frames), one temporal patch; 96x64 in at most 1,568 px: smart_resize gives
	// 28x28 (84x56 is too many; floor(64/1.98/28) = floor(96/1.98/28) = 1), 2x2 patches, one
	// token. The image processor's bounds would give 84x56 (6 tokens a patch).
	require.Equal(t, [3]int{1, 2, 2}, v.Grid)
	require.Equal(t, 1, v.Tokens)
}

func TestVideoBadInputs(t *testing.T) {
	ctx := context.Background()
	clip224, _ := Lookup("clip-224")
	whisper, _ := Lookup("whisper-80")
	_, err := Video(ctx, []byte("x"), nil, whisper, Options{})
	require.ErrorContains(t, err, "not for video")
	_, err = Video(ctx, bytes.Repeat([]byte("not a video "), 50), nil, clip224, Options{})
	require.ErrorIs(t, err, video.ErrCorrupt)
	_, err = Video(ctx, nil, nil, clip224, Options{})
	require.ErrorIs(t, err, video.ErrEmpty)
	_, err = Video(ctx, nil, [][]byte{{0x89, 'P', 'N', 'G'}}, clip224, Options{})
	require.ErrorIs(t, err, video.ErrFrame)
}

// When ffmpeg outputs fewer frames than were chosen, the key is over the frames it output,
// counted as such (as when every frame was held).
func TestVideoKeyFewerFrames(t *testing.T) {
	mkv, pngs := clip(t, "testsrc2")
	bin := filepath.Join(t.TempDir(), "ffmpeg")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\nffmpeg \"$@\" | head -c 55296\n"), 0o755)) // 3 frames of 96x64
	for _, q := range []string{"clip-224", "qwen2-vl"} {
		p, _ := Lookup(q)
		a, err := Video(context.Background(), mkv, nil, p, Options{Video: video.Options{Frames: 6, FFmpeg: bin}})
		require.NoError(t, err)
		require.Contains(t, a.Detail, "took 3 (uniform): [0 7 15]", q) // of linspace(0, 39, 6)
		var frames []*picture.Image
		for _, i := range []int{0, 7, 15} {
			img, _, err := picture.Decode(pngs[i], picture.Options{})
			require.NoError(t, err)
			frames = append(frames, img)
		}
		require.Equal(t, VideoKey(frames), a.Key, q)
		b, err := Video(context.Background(), nil, [][]byte{pngs[0], pngs[7], pngs[15]}, p, Options{Video: video.Options{Frames: 3, FrameMultiple: 1}})
		require.NoError(t, err)
		require.Equal(t, b.Input.Data, a.Input.Data, q)
	}
}
