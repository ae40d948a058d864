package media

import (
	"encoding/binary"
	"encoding/hex"
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
	h := blake3.New()
	var hdr [16]byte
	hdr[0], hdr[1], hdr[2], hdr[3] = keyVersion, kindVideo, dtypeU8, 3
	binary.LittleEndian.PutUint32(hdr[4:], uint32(len(frames)))
	for i, f := range frames {
		if i == 0 || f.W != frames[i-1].W || f.H != frames[i-1].H {
			binary.LittleEndian.PutUint32(hdr[8:], uint32(f.H))
			binary.LittleEndian.PutUint32(hdr[12:], uint32(f.W))
			if i == 0 {
				h.Write(hdr[:])
			} else {
				h.Write(hdr[8:])
			}
		}
		h.Write(f.Pix[:3*f.W*f.H])
	}
	var k Key
	h.Sum(k[:0])
	return k
}
