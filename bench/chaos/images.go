package chaos

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/png"
	"math/rand/v2"
	"sync"
)

// Pictures the scenarios send, made once per run and shared (read-only) by every trial.
type pictures struct {
	hugeOnce sync.Once
	huge     []byte // a zero-filled 9400 x 9400 RGBA PNG at BestCompression (~360 KB)

	noiseMu sync.Mutex
	noise   [][]byte // random-noise PNGs of about 4 MB, stored (incompressible anyway)
}

// hugeSide is the side of the huge-frames pictures: 88.4 Mpx, just under the decoders'
// decompression-bomb limit (Pillow's 89,478,485 px), 265 MB as decoded RGB.
const hugeSide = 9400

// hugePNG returns the zero-filled picture (made on first use: ~1 s, 350 MB transiently).
func (p *pictures) hugePNG() []byte {
	p.hugeOnce.Do(func() {
		img := image.NewNRGBA(image.Rect(0, 0, hugeSide, hugeSide))
		var b bytes.Buffer
		enc := png.Encoder{CompressionLevel: png.BestCompression}
		if err := enc.Encode(&b, img); err != nil {
			panic(err) // an in-memory image always encodes
		}
		p.huge = b.Bytes()
	})
	return p.huge
}

// noiseSide makes a noise picture of ~4 MB: 1155 x 1155 RGB.
const noiseSide = 1155

// noisePNGs returns n distinct random-noise pictures (seeded, so every run sends the same).
func (p *pictures) noisePNGs(n int) [][]byte {
	p.noiseMu.Lock()
	defer p.noiseMu.Unlock()
	for len(p.noise) < n {
		p.noise = append(p.noise, noisePNG(noiseSide, noiseSide, uint64(len(p.noise))+1, png.NoCompression))
	}
	return p.noise[:n]
}

// noisePNG is a w x h opaque picture of random pixels.
func noisePNG(w, h int, seed uint64, level png.CompressionLevel) []byte {
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	for i := 0; i < len(img.Pix); i += 4 {
		v := r.Uint32()
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = byte(v), byte(v>>8), byte(v>>16), 0xff
	}
	var b bytes.Buffer
	enc := png.Encoder{CompressionLevel: level}
	if err := enc.Encode(&b, img); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// smallPNG is a 64 x 64 noise picture: the "normal" request's image.
func smallPNG(seed uint64) []byte { return squarePNG(64, seed) }

// squarePNG is a side x side noise picture, compressed as usual.
func squarePNG(side int, seed uint64) []byte {
	return noisePNG(side, side, seed, png.DefaultCompression)
}

// dataURL is a PNG as a data: URL.
func dataURL(pngBytes []byte) string {
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(pngBytes)
}
