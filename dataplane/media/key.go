package media

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"

	"github.com/zeebo/blake3"

	"dataplane/dataplane/media/picture"
)

// Key is a content key: blake3 over decoded content with a small header of its shape and
// format, so the same picture sent as PNG or as a JPEG that decodes to the same pixels (or the
// same sound in two containers) gets the same key. The reuse cache adds tenant, model and
// preprocessing to it (features.Key).
type Key [32]byte

// Hex is the key in lowercase hex.
func (k Key) Hex() string { return hex.EncodeToString(k[:]) }

// Uint64 is the first 8 bytes, little-endian: the multimodal hash the router mixes into block
// hashes.
func (k Key) Uint64() uint64 { return binary.LittleEndian.Uint64(k[:8]) }

func (k Key) String() string { return k.Hex() }

// Header fields: version, then (kind/colour, dtype, channels).
const (
	keyVersion = 1
	kindRGB    = 0 // Dynamo's colour code for RGB
	kindAudio  = 1
	kindVideo  = 2
	dtypeU8    = 0
	dtypeF32   = 2
)

// ImageKey is Dynamo's image key: blake3(pack("<BBBBII", 1, 0 (RGB), 0 (u8), 3, H, W) || the
// RGB bytes, rows top to bottom). The picture is the upright one (EXIF orientation applied).
func ImageKey(img *picture.Image) Key {
	h := blake3.New()
	var hdr [12]byte
	hdr[0], hdr[1], hdr[2], hdr[3] = keyVersion, kindRGB, dtypeU8, 3
	binary.LittleEndian.PutUint32(hdr[4:], uint32(img.H))
	binary.LittleEndian.PutUint32(hdr[8:], uint32(img.W))
	h.Write(hdr[:])
	h.Write(img.Pix[:3*img.W*img.H])
	var k Key
	h.Sum(k[:0])
	return k
}

// AudioKey keys mono float32 samples at rate Hz: blake3(pack("<BBBBII", 1, 1 (audio),
// 2 (f32), 1, rate, n) || the samples as little-endian float32). Keyed after decoding, mixing
// down and resampling, so it names exactly what the encoder sees.
func AudioKey(samples []float32, rate int) Key {
	h := blake3.New()
	var hdr [12]byte
	hdr[0], hdr[1], hdr[2], hdr[3] = keyVersion, kindAudio, dtypeF32, 1
	binary.LittleEndian.PutUint32(hdr[4:], uint32(rate))
	binary.LittleEndian.PutUint32(hdr[8:], uint32(len(samples)))
	h.Write(hdr[:])
	buf := make([]byte, 0, 64<<10)
	for i := 0; i < len(samples); {
		buf = buf[:0]
		for ; i < len(samples) && len(buf) < cap(buf); i++ {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(samples[i]))
		}
		h.Write(buf)
	}
	var k Key
	h.Sum(k[:0])
	return k
}

// VideoKey keys the chosen frames: blake3(pack("<BBBBIII", 1, 2 (video), 0 (u8), 3, T, H, W)
// || each frame's RGB bytes). Frames of different sizes key each frame's size before it.
func VideoKey(frames []*picture.Image) Key {
	k := newVideoKeyer()
	k.Begin(len(frames))
	for _, f := range frames {
		_ = k.Frame(f) // fails only past the count given to Begin
	}
	return k.Sum()
}

// videoKeyer computes VideoKey one frame at a time (a video.Sink): the frames are hashed as
// they are decoded and need not be held. Begin starts over.
type videoKeyer struct {
	hash *blake3.Hasher
	t, i int // frames announced, frames seen
	w, h int // the last frame's size
}

func newVideoKeyer() *videoKeyer { return &videoKeyer{hash: blake3.New()} }

// Begin starts the key of t frames.
func (k *videoKeyer) Begin(t int) {
	k.hash.Reset()
	k.t, k.i = t, 0
}

// Frame folds in the next frame; img is not kept.
func (k *videoKeyer) Frame(img *picture.Image) error {
	if k.i >= k.t {
		return fmt.Errorf("media: video key: frame %d of %d", k.i, k.t)
	}
	var hdr [16]byte
	hdr[0], hdr[1], hdr[2], hdr[3] = keyVersion, kindVideo, dtypeU8, 3
	binary.LittleEndian.PutUint32(hdr[4:], uint32(k.t))
	if k.i == 0 || img.W != k.w || img.H != k.h {
		binary.LittleEndian.PutUint32(hdr[8:], uint32(img.H))
		binary.LittleEndian.PutUint32(hdr[12:], uint32(img.W))
		if k.i == 0 {
			k.hash.Write(hdr[:])
		} else {
			k.hash.Write(hdr[8:])
		}
		k.w, k.h = img.W, img.H
	}
	k.hash.Write(img.Pix[:3*img.W*img.H])
	k.i++
	return nil
}

// Sum is the key of the frames so far.
func (k *videoKeyer) Sum() Key {
	var out Key
	k.hash.Sum(out[:0])
	return out
}
