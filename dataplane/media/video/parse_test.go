package video

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/media/ffmpeg/ffmpegtest"
	"dataplane/dataplane/media/picture"
	"dataplane/native"
)

// What ffprobe prints for losslessVideo (ffmpeg 5.1), and variants of it.
const probeMKV = `{"programs": [], "streams": [{"width": 96, "height": 64, "r_frame_rate": "10/1", "avg_frame_rate": "10/1",
	"nb_read_packets": "40", "tags": {}}], "format": {"duration": "4.000000"}}`

func probeJSON(stream, format string) []byte {
	return []byte(`{"streams": [{` + stream + `}], "format": {` + format + `}}`)
}

func TestParseProbe(t *testing.T) {
	ok := func(name string, raw []byte, want Info) {
		t.Helper()
		info, err := parseProbe(raw)
		require.NoError(t, err, name)
		require.Equal(t, want, info, name)
	}
	base := `"width": 96, "height": 64, "avg_frame_rate": "10/1", "nb_read_packets": "40"`
	ok("mkv", []byte(probeMKV), Info{W: 96, H: 64, FPS: 10, Frames: 40, Duration: 4})
	ok("stream duration first", probeJSON(base+`, "duration": "3.5"`, `"duration": "4.0"`), Info{W: 96, H: 64, FPS: 10, Frames: 40, Duration: 3.5})
	ok("no duration", probeJSON(base, ""), Info{W: 96, H: 64, FPS: 10, Frames: 40, Duration: 4})
	ok("NaN duration falls back", probeJSON(base+`, "duration": "NaN"`, `"duration": "nan"`), Info{W: 96, H: 64, FPS: 10, Frames: 40, Duration: 4})
	ok("infinite duration falls back", probeJSON(base+`, "duration": "inf"`, `"duration": "-3"`), Info{W: 96, H: 64, FPS: 10, Frames: 40, Duration: 4})
	ntsc := 30000.0 / 1001
	ok("r_frame_rate when avg is 0/0", probeJSON(`"width": 96, "height": 64, "avg_frame_rate": "0/0", "r_frame_rate": "30000/1001", "nb_read_packets": "30"`, ""),
		Info{W: 96, H: 64, FPS: ntsc, Frames: 30, Duration: 30 / ntsc})
	ok("display matrix -90", probeJSON(base+`, "side_data_list": [{"rotation": -90}]`, `"duration": "4"`), Info{W: 64, H: 96, FPS: 10, Frames: 40, Duration: 4})
	ok("rotate tag 270", probeJSON(base+`, "tags": {"rotate": "270"}`, `"duration": "4"`), Info{W: 64, H: 96, FPS: 10, Frames: 40, Duration: 4})
	ok("rotate tag 180", probeJSON(base+`, "tags": {"rotate": "180"}`, `"duration": "4"`), Info{W: 96, H: 64, FPS: 10, Frames: 40, Duration: 4})

	bad := func(name string, raw []byte, words string) {
		t.Helper()
		_, err := parseProbe(raw)
		require.ErrorIs(t, err, ErrCorrupt, name)
		require.ErrorContains(t, err, words, name)
	}
	bad("not JSON", []byte("Invalid data found when processing input"), "ffprobe output")
	bad("empty", nil, "ffprobe output")
	bad("no stream", []byte(`{"streams": []}`), "no video stream")
	bad("zero width", probeJSON(`"width": 0, "height": 64, "avg_frame_rate": "10/1", "nb_read_packets": "40"`, ""), "0x64")
	bad("no packets", probeJSON(`"width": 96, "height": 64, "avg_frame_rate": "10/1"`, ""), "0 frames")
	bad("no frame rate", probeJSON(`"width": 96, "height": 64, "avg_frame_rate": "0/0", "r_frame_rate": "1/0", "nb_read_packets": "4"`, ""), "fps")
	bad("infinite frame rate", probeJSON(`"width": 96, "height": 64, "avg_frame_rate": "inf", "nb_read_packets": "4"`, ""), "fps")
	// Sides whose product overflows int would slip past the pixel limit.
	bad("giant sides", probeJSON(`"width": 4294967296, "height": 4294967296, "avg_frame_rate": "10/1", "nb_read_packets": "4"`, ""), "4294967296x4294967296")
	bad("side over the limit", probeJSON(`"width": 70000, "height": 1, "avg_frame_rate": "10/1", "nb_read_packets": "4"`, ""), "70000x1")
}

// ffprobe's output is parsed into a usable Info or refused as corrupt, whatever it says.
func FuzzParseProbe(f *testing.F) {
	f.Add([]byte(probeMKV))
	f.Add(probeJSON(`"width": 96, "height": 64, "avg_frame_rate": "0/0", "r_frame_rate": "30000/1001", "nb_read_packets": "30", "duration": "1.0"`, `"duration": "1.0"`))
	f.Add(probeJSON(`"width": 64, "height": 48, "avg_frame_rate": "25", "nb_read_packets": "9", "side_data_list": [{"rotation": 90}], "tags": {"rotate": "90"}`, ""))
	f.Add([]byte(`{"streams": []}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		info, err := parseProbe(raw)
		if err != nil {
			var ve *Error
			require.ErrorAs(t, err, &ve)
			require.ErrorIs(t, err, ErrCorrupt)
			return
		}
		require.True(t, info.W >= 1 && info.W <= native.MaxImageSide && info.H >= 1 && info.H <= native.MaxImageSide, "%+v", info)
		require.GreaterOrEqual(t, info.Frames, 1)
		for _, v := range []float64{info.FPS, info.Duration} {
			require.True(t, v > 0 && !math.IsInf(v, 0), "%+v", info)
		}
	})
}

// readAll is readFrames keeping a copy of every frame.
func readAll(r io.Reader, n, w, h int) ([]*picture.Image, error) {
	var frames []*picture.Image
	k, err := readFrames(r, n, w, h, func(k int, img *picture.Image) error {
		if k != len(frames) {
			return fmt.Errorf("frame %d after %d", k, len(frames))
		}
		frames = append(frames, &picture.Image{W: img.W, H: img.H, Pix: bytes.Clone(img.Pix)})
		return nil
	})
	if err == nil && k != len(frames) {
		err = fmt.Errorf("%d frames read, %d seen", k, len(frames))
	}
	return frames, err
}

func TestReadFrames(t *testing.T) {
	data := make([]byte, 3*2*2*3+5) // three 2x2 frames and part of a fourth
	for i := range data {
		data[i] = byte(i)
	}
	frames, err := readAll(bytes.NewReader(data[:36]), 5, 2, 2)
	require.NoError(t, err) // fewer frames than asked: keep what came
	require.Len(t, frames, 3)
	require.Equal(t, data[12:24], frames[1].Pix)
	_, err = readAll(bytes.NewReader(data), 5, 2, 2)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.ErrorContains(t, err, "frame 3 of 5")
	r := bytes.NewReader(data)
	frames, err = readAll(r, 2, 2, 2)
	require.NoError(t, err)
	require.Len(t, frames, 2)
	require.Equal(t, len(data)-24, r.Len()) // nothing read past the frames asked for
}

// Raw RGB from the pipe, cut anywhere and read in any chunk sizes: whole frames in order, or
// a partial last frame refused; never more than asked for.
func FuzzReadFrames(f *testing.F) {
	f.Add(make([]byte, 48), uint8(4), uint8(2), uint8(2), false)
	f.Add(make([]byte, 50), uint8(3), uint8(2), uint8(2), true)
	f.Add([]byte{}, uint8(1), uint8(1), uint8(1), false)
	f.Fuzz(func(t *testing.T, data []byte, n, w, h uint8, oneByte bool) {
		fn, fw, fh := int(n%9), int(w%16)+1, int(h%16)+1
		size := 3 * fw * fh
		var r io.Reader = bytes.NewReader(data)
		if oneByte {
			r = iotest.OneByteReader(r)
		}
		frames, err := readAll(r, fn, fw, fh)
		whole := min(fn, len(data)/size)
		if whole < fn && len(data)%size != 0 {
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			return
		}
		require.NoError(t, err)
		require.Len(t, frames, whole)
		for i, fr := range frames {
			require.Equal(t, [2]int{fw, fh}, [2]int{fr.W, fr.H})
			require.Equal(t, data[i*size:(i+1)*size], fr.Pix)
		}
	})
}

func pngOf(t testing.TB, w, h int, seed byte) []byte {
	m := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range m.Pix {
		m.Pix[i] = seed + byte(i*7)
		if i%4 == 3 {
			m.Pix[i] = 255
		}
	}
	var b bytes.Buffer
	require.NoError(t, png.Encode(&b, m))
	return b.Bytes()
}

// Any bytes as pictures of a video: frames and tensors, or a typed error.
func FuzzFromImages(f *testing.F) {
	a, b := pngOf(f, 8, 6, 0), pngOf(f, 8, 6, 100)
	f.Add(a, b, uint8(0))
	f.Add(a, pngOf(f, 5, 9, 3), uint8(2))
	f.Add(a, []byte("not a picture"), uint8(6))
	for _, name := range []string{"orient6.jpg", "png_palette.png", "cmyk.jpg"} {
		data, err := os.ReadFile(filepath.Join("..", "picture", "testdata", name))
		require.NoError(f, err)
		f.Add(data, a, uint8(3))
	}
	f.Fuzz(func(t *testing.T, a, b []byte, s uint8) {
		preset := picture.CLIP224
		if s&4 != 0 {
			preset = picture.Qwen2VLImage
		}
		opts := Options{Sampling: Sampling(s % 4), Frames: 2, MaxFrames: 3, MaxPixels: 1 << 14}
		var sink frames
		opts.Sink = &sink
		v, err := FromImages([][]byte{a, b, a}, opts, preset, native.F16)
		if err != nil {
			var ve *Error
			var pe *picture.Error
			require.True(t, errors.As(err, &ve) || errors.As(err, &pe), "%v", err)
			return
		}
		require.NotEmpty(t, sink.got)
		require.Equal(t, len(sink.got), len(v.Indices))
		require.Equal(t, len(sink.got), sink.n)
		for _, fr := range sink.got {
			require.Len(t, fr.Pix, 3*fr.W*fr.H)
			require.LessOrEqual(t, fr.W*fr.H, 1<<14)
		}
		require.Positive(t, v.Output.Tokens)
	})
}

// tinyVideo is 5 frames of 16x16 in lossless FFV1: small enough to mutate and decode per input.
func tinyVideo(t testing.TB) []byte {
	path := filepath.Join(t.TempDir(), "t.mkv")
	ffmpegtest.Run(t, "-f", "lavfi", "-i", "testsrc2=size=16x16:rate=5:duration=1", "-c:v", "ffv1", "-pix_fmt", "bgr0", path)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}

// Container bytes through ffprobe and ffmpeg themselves (two short runs per input, 5 s at most
// each): whatever they make of the bytes is frames of the probed size or a typed error.
func FuzzDecode(f *testing.F) {
	data := tinyVideo(f)
	f.Add(data, uint8(0))
	f.Add(data[:len(data)/2], uint8(2))
	f.Add(bytes.Repeat([]byte{0x1a, 0x45, 0xdf, 0xa3}, 8), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, s uint8) {
		if len(data) > 64<<10 {
			return
		}
		opts := Options{Sampling: Sampling(s % 4), Frames: 3, MaxFrames: 4, MaxPixels: 1 << 14, MaxSeconds: 60, Timeout: 5 * time.Second}
		var sink frames
		opts.Sink = &sink
		v, err := Decode(context.Background(), data, opts, picture.CLIP224, native.F32)
		if err != nil {
			var ve *Error
			require.ErrorAs(t, err, &ve)
			require.True(t, errors.Is(err, ErrCorrupt) || errors.Is(err, ErrEmpty) || errors.Is(err, ErrTooLarge) ||
				errors.Is(err, ErrTooLong), "%v", err)
			require.False(t, strings.Contains(err.Error(), "timed out"), "%v", err)
			return
		}
		require.NotEmpty(t, sink.got)
		require.Equal(t, len(sink.got), sink.n)
		require.LessOrEqual(t, len(sink.got), 4)
		require.Equal(t, []int{len(sink.got), 3, 224, 224}, v.Output.PixelValuesVideos.Shape)
		for k, fr := range sink.got {
			require.Equal(t, [2]int{v.Info.W, v.Info.H}, [2]int{fr.W, fr.H})
			require.Len(t, fr.Pix, 3*fr.W*fr.H)
			require.True(t, v.Indices[k] >= 0 && v.Indices[k] < v.Info.Frames)
			if k > 0 {
				require.Greater(t, v.Indices[k], v.Indices[k-1])
			}
		}
	})
}
