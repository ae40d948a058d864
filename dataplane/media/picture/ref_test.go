package picture

import (
	"image"
	"image/jpeg"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/native"
)

// A plain Go transcription of Pillow's resampling (the reference and benchmark baseline for the
// C kernels): per output sample, the taps and normalised weights in float64, rounded to 22-bit
// fixed point, accumulated in int from 2^21, shifted and clipped per pass.

func goFilter(f native.Filter, x float64) float64 {
	x = math.Abs(x)
	if f == native.Bilinear {
		return max(0, 1-x)
	}
	const a = -0.5
	switch {
	case x < 1:
		return ((a+2)*x-(a+3))*x*x + 1
	case x < 2:
		return (((x-5)*x+8)*x - 4) * a
	}
	return 0
}

// goWeights returns, for each output index, the first input index and fixed-point weights.
func goWeights(in, out int, f native.Filter) ([]int, [][]int32) {
	support := 1.0
	if f == native.Bicubic {
		support = 2
	}
	scale := float64(in) / float64(out)
	fs := max(scale, 1)
	support *= fs
	lo := make([]int, out)
	ws := make([][]int32, out)
	for i := range out {
		center := (float64(i) + 0.5) * scale
		xmin := max(int(center-support+0.5), 0)
		xmax := min(int(center+support+0.5), in)
		w := make([]float64, xmax-xmin)
		var total float64
		for x := range w {
			w[x] = goFilter(f, (float64(x+xmin)-center+0.5)/fs)
			total += w[x]
		}
		k := make([]int32, len(w))
		for x, v := range w {
			if total != 0 {
				v /= total
			}
			if v < 0 {
				k[x] = int32(-0.5 + v*(1<<22))
			} else {
				k[x] = int32(0.5 + v*(1<<22))
			}
		}
		lo[i], ws[i] = xmin, k
	}
	return lo, ws
}

func clip8(v int32) byte { return byte(min(max(v>>22, 0), 255)) }

// goResize resizes packed RGB w x h to ow x oh (passes skipped when a size does not change).
func goResize(src []byte, w, h, ow, oh int, f native.Filter) []byte {
	tmp, tw := src, w
	if ow != w {
		lo, ws := goWeights(w, ow, f)
		tmp, tw = make([]byte, 3*ow*h), ow
		for y := range h {
			for i := range ow {
				for c := range 3 {
					acc := int32(1 << 21)
					for t, k := range ws[i] {
						acc += int32(src[3*(y*w+lo[i]+t)+c]) * k
					}
					tmp[3*(y*ow+i)+c] = clip8(acc)
				}
			}
		}
	}
	if oh == h {
		return tmp
	}
	lo, ws := goWeights(h, oh, f)
	out := make([]byte, 3*tw*oh)
	for i := range oh {
		for x := range 3 * tw {
			acc := int32(1 << 21)
			for t, k := range ws[i] {
				acc += int32(tmp[3*tw*(lo[i]+t)+x]) * k
			}
			out[3*tw*i+x] = clip8(acc)
		}
	}
	return out
}

// goCLIP is the whole CLIP preprocessing in plain Go from a decoded image.Image: the baseline.
func goCLIP(m image.Image, n int) []float32 {
	b := m.Bounds()
	w, h := b.Dx(), b.Dy()
	rgb := make([]byte, 3*w*h)
	for y := range h {
		for x := range w {
			r, g, bl, _ := m.At(b.Min.X+x, b.Min.Y+y).RGBA()
			rgb[3*(y*w+x)], rgb[3*(y*w+x)+1], rgb[3*(y*w+x)+2] = byte(r>>8), byte(g>>8), byte(bl>>8)
		}
	}
	rw, rh := ShortestSide(w, h, n)
	res := goResize(rgb, w, h, rw, rh, native.Bicubic)
	x0, y0 := roundHalfEven(float64(rw-n)/2), roundHalfEven(float64(rh-n)/2)
	out := make([]float32, 3*n*n)
	for c := range 3 {
		for y := range n {
			for x := range n {
				v := float32(res[3*((y+y0)*rw+x+x0)+c]) / 255
				out[(c*n+y)*n+x] = (v - CLIPMean[c]) / CLIPStd[c]
			}
		}
	}
	return out
}

// The C kernels against the Go transcription on random pictures, sizes and filters.
func TestResizeAgainstGo(t *testing.T) {
	r := newRand(t)
	for range 60 {
		w, h := 1+r.IntN(120), 1+r.IntN(120)
		ow, oh := 1+r.IntN(200), 1+r.IntN(200)
		if r.IntN(4) == 0 {
			ow = w
		}
		f := native.Filter(r.IntN(2))
		src := make([]byte, 3*w*h)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		want := goResize(src, w, h, ow, oh, f)
		for _, isa := range native.SupportedISAs() {
			got := make([]byte, 3*ow*oh)
			require.NoError(t, native.Resize(&native.ResizeJob{Src: src, SrcW: w, SrcH: h, Channels: 3, OutW: ow, OutH: oh,
				Crop: native.Rect{W: ow, H: oh}, Dst: got, Filter: f, ISA: isa}))
			require.Equal(t, want, got, "%dx%d -> %dx%d %v %v", w, h, ow, oh, f, isa)
		}
	}
}

// The baseline computes what the fast path computes (it only differs in the JPEG decoder's
// chroma upsampling: Go's image/jpeg is not libjpeg's), so check it on a PNG.
func TestGoCLIPBaselineMatches(t *testing.T) {
	img, _ := decodeFile(t, "testdata/noise_83x57.png", Options{})
	m := image.NewRGBA(image.Rect(0, 0, img.W, img.H))
	for i := range img.W * img.H {
		copy(m.Pix[4*i:], img.Pix[3*i:3*i+3])
		m.Pix[4*i+3] = 255
	}
	out, err := CLIP224.Apply(img, native.F32)
	require.NoError(t, err)
	want := goCLIP(m, 224)
	require.Equal(t, native.AsBytes(want), out.PixelValues.Data)
	_ = jpeg.Decode // the benchmark's baseline decoder
}
