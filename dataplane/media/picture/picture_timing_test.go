package picture

import (
	"bytes"
	"image"
	"image/color"
	"image/jpeg"
	"math"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"dataplane/native"
)

// photoJPEG is testdata/photo_1024x768.jpg: a procedural scene with a photo's entropy (186 KB at
// quality 90, 4:2:0; testdata/gen_photo.py).
func photoJPEG(b testing.TB) []byte {
	data, err := os.ReadFile("testdata/photo_1024x768.jpg")
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// testJPEG is a 1024 x 768 synthetic JPEG (smooth gradients, edges and texture; quality 90,
// 4:2:0, 55 KB), made with image/jpeg: half the entropy of a photo.
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
// resize and crop, normalisation), beside the same in plain Go (image/jpeg and the Go
// transcription of Pillow's resize) in the same loop. x-go is how many times faster; ms/item is
// what bench/peers/clip_preprocess.py's Pillow + torchvision figure compares with.
// photo and synthetic: ApplyBytes (only the window the crop reads is decoded); photo-full: Decode
// + Apply (the whole picture decoded, as media.Image does for the content key).
func BenchmarkJPEGToCLIP336(b *testing.B) {
	b.Run("photo", func(b *testing.B) { benchCLIP336(b, photoJPEG(b), true) })
	b.Run("photo-full", func(b *testing.B) { benchCLIP336(b, photoJPEG(b), false) })
	b.Run("synthetic", func(b *testing.B) { benchCLIP336(b, testJPEG(b), true) })
}

func benchCLIP336(b *testing.B, data []byte, window bool) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one thread: no Go-side parallelism either
	var refTime time.Duration
	refs := 0
	var img Image // reused across pictures, as a worker would
	var cpu time.Duration
	for i := 0; b.Loop(); i++ {
		c0 := cpuTime()
		if window {
			if _, _, err := CLIP336.ApplyBytes(data, native.F32, Options{}); err != nil {
				b.Fatal(err)
			}
		} else {
			if _, err := DecodeInto(&img, data, Options{}); err != nil {
				b.Fatal(err)
			}
			if _, err := CLIP336.Apply(&img, native.F32); err != nil {
				b.Fatal(err)
			}
		}
		cpu += cpuTime() - c0
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
	b.ReportMetric(op*1e3, "ms/item")
	b.ReportMetric(cpu.Seconds()*1e3/float64(b.N), "cpu-ms/item")
	b.ReportMetric(refTime.Seconds()/float64(refs)/op, "x-go")
}

// The stages of the fast path, for the README's breakdown: decode alone, resize + crop alone.
func BenchmarkJPEGStages(b *testing.B) {
	data := photoJPEG(b)
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

// cpuTime is the process's user + system CPU time: on a shared machine, CPU time per item is
// far steadier than wall time (bench/peers report the same, cpu_ms_per_item).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
