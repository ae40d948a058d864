package native

import (
	"bytes"
	"fmt"
	"image"
	"image/jpeg"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// Normalisation against Go's float32 arithmetic (the same IEEE operations torchvision does),
// every dtype and variant, sizes around the kernels' steps of 8, 16 and 256 pixels.
func TestNormalizeAgainstGo(t *testing.T) {
	r := newRand(t)
	mean, std := [3]float32{0.48145466, 0.4578275, 0.40821073}, [3]float32{0.26862954, 0.26130258, 0.27577711}
	for _, size := range [][2]int{{1, 1}, {7, 1}, {8, 1}, {9, 3}, {15, 1}, {17, 1}, {33, 1}, {16, 16}, {257, 3}, {336, 336}} {
		w, h := size[0], size[1]
		src := randomBytes(r, 3*w*h)
		want := make([]float32, 3*w*h)
		for c := range 3 {
			for i := range w * h {
				x := float32(src[3*i+c]) / 255
				want[c*w*h+i] = (x - mean[c]) / std[c]
			}
		}
		for _, dt := range allDTypes {
			wantBytes := make([]byte, 3*w*h*dt.Size())
			require.NoError(t, Convert(wantBytes, dt, AsBytes(want), F32))
			forEachISA(t, func(t *testing.T, isa ISA) {
				got := make([]byte, len(wantBytes))
				require.NoError(t, NormalizeISA(got, dt, src, w, h, mean, std, 255, isa))
				require.Equal(t, wantBytes, got, "%dx%d %v", w, h, dt)
			})
		}
	}
}

// Orientation against the EXIF definitions written out per case: output pixel (x, y) of an
// ow x oh result comes from source (sx, sy).
func TestOrientAgainstDefinitions(t *testing.T) {
	r := newRand(t)
	w, h := 5, 3
	from := map[int]func(x, y int) (int, int){
		1: func(x, y int) (int, int) { return x, y },
		2: func(x, y int) (int, int) { return w - 1 - x, y },         // mirror
		3: func(x, y int) (int, int) { return w - 1 - x, h - 1 - y }, // rotate 180
		4: func(x, y int) (int, int) { return x, h - 1 - y },         // flip
		5: func(x, y int) (int, int) { return y, x },                 // transpose
		6: func(x, y int) (int, int) { return y, h - 1 - x },         // rotate 90 clockwise
		7: func(x, y int) (int, int) { return w - 1 - y, h - 1 - x }, // transverse
		8: func(x, y int) (int, int) { return w - 1 - y, x },         // rotate 90 counter-clockwise
	}
	for _, ch := range []int{1, 3, 4} {
		src := randomBytes(r, w*h*ch)
		for o := 1; o <= 8; o++ {
			ow, oh := w, h
			if o >= 5 {
				ow, oh = h, w
			}
			dst := make([]byte, len(src))
			require.NoError(t, Orient(dst, src, w, h, ch, o))
			for y := range oh {
				for x := range ow {
					sx, sy := from[o](x, y)
					require.Equal(t, src[(sy*w+sx)*ch:(sy*w+sx+1)*ch], dst[(y*ow+x)*ch:(y*ow+x+1)*ch], "orientation %d (%d, %d)", o, x, y)
				}
			}
		}
	}
	require.ErrorIs(t, Orient(make([]byte, 45), make([]byte, 45), 5, 3, 3, 9), ErrInvalid)
}

func TestImageKernelsRefuseBadInput(t *testing.T) {
	f := func(err error, kind error, words string) {
		t.Helper()
		require.ErrorIs(t, err, kind)
		require.Contains(t, err.Error(), words)
	}
	_, err := JPEGHeader([]byte("not a jpeg"))
	f(err, ErrInvalid, "jpeg header")
	_, err = JPEGHeader(nil)
	f(err, ErrInvalid, "empty input")
	f(DecodeJPEG(make([]byte, 10), []byte{0xff, 0xd8}, 2, 2), ErrInvalid, "needs 12")
	f(Resize(&ResizeJob{Src: make([]byte, 12), SrcW: 2, SrcH: 2, Channels: 3, OutW: 1, OutH: 1, Crop: Rect{X: 1, W: 1, H: 1}, Dst: make([]byte, 3)}),
		ErrBounds, "outside")
	f(Resize(&ResizeJob{Src: make([]byte, 12), SrcW: 2, SrcH: 2, Channels: 3, OutW: 0, OutH: 1, Crop: Rect{W: 1, H: 1}, Dst: make([]byte, 3)}),
		ErrInvalid, "bad size")
	f(Normalize(make([]byte, 12), F32, make([]byte, 3), 1, 1, [3]float32{}, [3]float32{1, 0, 1}, 255), ErrInvalid, "channel 1")
	for _, d := range []int{0, 70000} {
		err := Resize(&ResizeJob{Src: make([]byte, 12), SrcW: 2, SrcH: 2, Channels: 3, OutW: d, OutH: 1, Crop: Rect{W: 1, H: 1}, Dst: make([]byte, 3)})
		f(err, ErrInvalid, fmt.Sprint(d))
	}
}

// JPEGResize (only the window the crop needs decoded) against DecodeJPEG + Resize: the same
// bytes for crops at the corners and centre, portrait and landscape, down- and upscaling, 4:2:0
// colour and greyscale, every variant.
func TestJPEGResizeMatchesFullDecode(t *testing.T) {
	r := newRand(t)
	for _, c := range []struct {
		w, h, ow, oh int
		gray         bool
	}{
		{640, 480, 299, 224, false}, {517, 333, 347, 224, false}, {333, 517, 224, 347, false},
		{300, 1000, 336, 1120, false}, {200, 150, 299, 224, true}, {61, 93, 37, 41, false},
	} {
		data := testJPEGBytes(t, r, c.w, c.h, c.gray)
		full := make([]byte, 3*c.w*c.h)
		require.NoError(t, DecodeJPEG(full, data, c.w, c.h))
		cw, ch := min(c.ow, 224), min(c.oh, 224)
		for _, crop := range []Rect{
			{X: (c.ow - cw) / 2, Y: (c.oh - ch) / 2, W: cw, H: ch}, {W: cw, H: ch}, {X: c.ow - cw, Y: c.oh - ch, W: cw, H: ch},
			{X: c.ow / 3, Y: c.oh / 4, W: 5, H: 3},
		} {
			for _, f := range []Filter{Bicubic, Bilinear} {
				forEachISA(t, func(t *testing.T, isa ISA) {
					job := ResizeJob{Src: full, SrcW: c.w, SrcH: c.h, Channels: 3, OutW: c.ow, OutH: c.oh, Crop: crop, Filter: f, ISA: isa}
					want := make([]byte, 3*crop.W*crop.H)
					job.Dst = want
					require.NoError(t, Resize(&job))
					got := make([]byte, len(want))
					job.Src, job.Dst = nil, got
					require.NoError(t, JPEGResize(data, &job))
					require.Equal(t, want, got, "%dx%d -> %dx%d crop %+v %v", c.w, c.h, c.ow, c.oh, crop, f)
				})
			}
		}
	}
	// A wrong size, a truncated stream and garbage are refused.
	data := testJPEGBytes(t, r, 64, 48, false)
	job := ResizeJob{SrcW: 64, SrcH: 48, Channels: 3, OutW: 32, OutH: 24, Crop: Rect{W: 32, H: 24}, Dst: make([]byte, 3*32*24)}
	require.NoError(t, JPEGResize(data, &job))
	job.SrcW = 65
	require.Error(t, JPEGResize(data, &job))
	job.SrcW = 64
	require.Error(t, JPEGResize(data[:len(data)/2], &job))
	require.Error(t, JPEGResize([]byte("not a jpeg"), &job))
}

// testJPEGBytes encodes a w x h picture of gradients and noise (chroma changing everywhere, so
// that upsampling at a window's edge would show) with image/jpeg: 4:2:0, or greyscale.
func testJPEGBytes(t *testing.T, r *rand.Rand, w, h int, gray bool) []byte {
	noise := randomBytes(r, 3*w*h)
	var m image.Image
	if gray {
		g := image.NewGray(image.Rect(0, 0, w, h))
		for i := range g.Pix {
			g.Pix[i] = byte(i%w*255/w)/2 + noise[i]/2
		}
		m = g
	} else {
		c := image.NewRGBA(image.Rect(0, 0, w, h))
		for i := range w * h {
			x, y := i%w, i/w
			c.Pix[4*i] = byte(x*255/w)/2 + noise[3*i]/2
			c.Pix[4*i+1] = byte(y*255/h)/2 + noise[3*i+1]/2
			c.Pix[4*i+2] = noise[3*i+2]
			c.Pix[4*i+3] = 255
		}
		m = c
	}
	var buf bytes.Buffer
	require.NoError(t, jpeg.Encode(&buf, m, &jpeg.Options{Quality: 90}))
	return buf.Bytes()
}
