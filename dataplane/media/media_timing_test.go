package media

import (
	"bytes"
	"image"
	"image/jpeg"
	"math/rand/v2"
	"testing"
)

// BenchmarkImageCountOnly: what --handoff tokens saves per picture (a 1280x960 JPEG under the
// Qwen2-VL preset, 1,564 tokens): the full pipeline (decode, resize, normalise, patches) beside
// CountOnly (decode and key), in the same run.
func BenchmarkImageCountOnly(b *testing.B) {
	img := image.NewRGBA(image.Rect(0, 0, 1280, 960))
	r := rand.New(rand.NewPCG(1, 2))
	for y := range 960 { // smooth gradients with some noise: a photo's entropy, roughly
		for x := range 1280 {
			i := img.PixOffset(x, y)
			img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = byte(x/5+r.IntN(16)), byte(y/4+r.IntN(16)), byte((x+y)/9), 255
		}
	}
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: 90}); err != nil {
		b.Fatal(err)
	}
	p, err := Lookup("qwen2-vl")
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		opts Options
	}{{"full", Options{}}, {"count", Options{CountOnly: true}}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(buf.Len()))
			for b.Loop() {
				if _, err := Image(buf.Bytes(), p, c.opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
