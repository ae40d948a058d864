package picture

import (
	"bytes"
	"image"
	"image/color"
	"image/jpeg"
	"math"
	"runtime"
	"testing"
	"time"

	"dataplane/native"
)

// testJPEG is a 1024 x 768 photo-like JPEG (smooth gradients, edges and texture; quality 90,
// 4:2:0), made with image/jpeg.
func testJPEG(b testing.TB) []byte {
	const w, h = 1024, 768
	m := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			fx, fy := float64(x)/w, float64(y)/h
			r := 128 + 100*math.Sin(6*fx+2*fy)
			g := 128 + 90*math.Cos(9*fy-3*fx*fy)
			bl := 128 + 60*math.Sin(40*fx*fy) + float64((x*7^y*13)&31)
			if (x/64+y/48)%5 == 0 {
				r, g = 250, 30
			}
			m.Set(x, y, color.RGBA{byte(r), byte(g), byte(min(bl, 255)), 255})
		}
	}
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, m, &jpeg.Options{Quality: 90}); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// JPEG 1024x768 -> the CLIP-336 float32 tensor on one thread (libjpeg-turbo decode, Pillow-exact
// resize and crop, normalisation; the goal is <= 5 ms), beside the same in plain Go (image/jpeg
// and the Go transcription of Pillow's resize) in the same loop. x-go is how many times faster.
func BenchmarkJPEGToCLIP336(b *testing.B) {
	data := testJPEG(b)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one thread: no Go-side parallelism either
	var refTime time.Duration
	refs := 0
	var img Image // reused across pictures, as a worker would
	for i := 0; b.Loop(); i++ {
		if _, err := DecodeInto(&img, data, Options{}); err != nil {
			b.Fatal(err)
		}
		if _, err := CLIP336.Apply(&img, native.F32); err != nil {
			b.Fatal(err)
		}
		if i%8 == 0 {
			b.StopTimer()
			t0 := time.Now()
			m, err := jpeg.Decode(bytes.NewReader(data))
			if err != nil {
				b.Fatal(err)
			}
			goCLIP(m, 336)
			refTime += time.Since(t0)
			refs++
			b.StartTimer()
		}
	}
	op := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(op*1e3, "ms/image")
	b.ReportMetric(refTime.Seconds()/float64(refs)/op, "x-go")
}

// The stages of the fast path, for the README's breakdown: decode alone, resize + crop alone.
func BenchmarkJPEGStages(b *testing.B) {
	data := testJPEG(b)
	img, _, err := Decode(data, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("decode", func(b *testing.B) {
		var img Image
		for b.Loop() {
			if _, err := DecodeInto(&img, data, Options{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, isa := range native.SupportedISAs() {
		b.Run("resize-crop-normalize/"+isa.String(), func(b *testing.B) {
			dst := make([]byte, 3*336*336)
			out := make([]byte, 3*336*336*4)
			rw, rh := ShortestSide(img.W, img.H, 336)
			for b.Loop() {
				job := native.ResizeJob{Src: img.Pix, SrcW: img.W, SrcH: img.H, Channels: 3, OutW: rw, OutH: rh,
					Crop: native.Rect{X: (rw - 336) / 2, W: 336, H: 336}, Dst: dst, Filter: native.Bicubic, ISA: isa}
				if err := native.Resize(&job); err != nil {
					b.Fatal(err)
				}
				if err := native.Normalize(out, native.F32, dst, 336, 336, CLIPMean, CLIPStd, 255); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
