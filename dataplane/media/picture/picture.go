// Package picture turns image bytes into vision-encoder inputs: JPEG (libjpeg-turbo, through
// native) and PNG (image/png) decoded to 8-bit RGB with the EXIF orientation applied, the pixel
// count checked from the header before any pixel is decoded, then Pillow-exact resizing,
// cropping and normalisation into the CHW tensors of each model family (see Preset).
package picture

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"

	"dataplane/native"
)

// Image is 8-bit RGB, row-major, 3 bytes a pixel, rows packed (len(Pix) == 3*W*H).
type Image struct {
	W, H int
	Pix  []byte
}

// Format is an image container this package decodes.
type Format string

const (
	JPEG Format = "jpeg"
	PNG  Format = "png"
)

// Info is what the header says, before decoding: the stored size, the EXIF orientation (1..8,
// 1 when absent), the size the picture has once oriented (W and H swap for 5..8), and the
// layout facts that decide how much memory decoding takes (DecodeBytes).
type Info struct {
	Format      Format
	StoredW     int
	StoredH     int
	Orientation int
	W, H        int

	// PNG only, from the IHDR: colour type (0 grey, 2 RGB, 3 palette, 4 grey + alpha, 6 RGBA),
	// bit depth, Adam7 interlacing, and Transparent when a tRNS chunk comes before the pixels
	// (image/png then decodes grey and RGB into an image with alpha).
	ColorType, BitDepth     int
	Interlaced, Transparent bool
	// JPEG only: a progressive frame (libjpeg keeps every DCT coefficient until the last scan)
	// and the TurboJPEG subsampling code (TJSAMP_*).
	Progressive bool
	Subsampling int
}

// Options bound and shape decoding. The zero value means the defaults below.
type Options struct {
	// MaxPixels refuses pictures with more pixels (from the header, before decoding: a
	// decompression bomb never allocates). 0: DefaultMaxPixels.
	MaxPixels int
	// IgnoreOrientation keeps the stored pixel order. By default the EXIF orientation is
	// applied, as Pillow's ImageOps.exif_transpose does (openai/CLIP's own loader does not).
	IgnoreOrientation bool
}

// DefaultMaxPixels is Pillow's MAX_IMAGE_PIXELS (1024 * 1024 * 1024 // 4 // 3), above which it
// warns of a decompression bomb: about 9,459 x 9,459.
const DefaultMaxPixels = 89_478_485

func (o Options) maxPixels() int {
	if o.MaxPixels > 0 {
		return o.MaxPixels
	}
	return DefaultMaxPixels
}

var pngMagic = []byte("\x89PNG\r\n\x1a\n")

// sniff names the container from the first bytes.
func sniff(data []byte) (Format, error) {
	switch {
	case len(data) >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff:
		return JPEG, nil
	case bytes.HasPrefix(data, pngMagic):
		return PNG, nil
	case len(data) == 0:
		return "", errorf(ErrFormat, "header", "", "empty input")
	}
	what := "unknown data"
	switch {
	case bytes.HasPrefix(data, []byte("GIF8")):
		what = "GIF"
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WEBP":
		what = "WebP"
	case bytes.HasPrefix(data, []byte("BM")):
		what = "BMP"
	case len(data) >= 12 && string(data[4:8]) == "ftyp":
		what = "HEIF/AVIF"
	case bytes.HasPrefix(data, []byte("II*\x00")) || bytes.HasPrefix(data, []byte("MM\x00*")):
		what = "TIFF"
	}
	head := data[:min(len(data), 8)]
	return "", errorf(ErrFormat, "header", "", "%s (first bytes % x); want JPEG or PNG", what, head)
}

// DecodeConfig reads the header only: format, size and orientation. It does not check limits.
func DecodeConfig(data []byte) (Info, error) {
	f, err := sniff(data)
	if err != nil {
		return Info{}, err
	}
	// A zero side is refused from the header itself: the decoders would report it only as a
	// malformed file, and no decoder should see such a header.
	if w, h, ok := headerSize(data, f); ok {
		if err := checkSize(f, w, h); err != nil {
			return Info{}, err
		}
	}
	info := Info{Format: f, Orientation: 1}
	switch f {
	case JPEG:
		h, err := native.JPEGHeader(data)
		if err != nil {
			return Info{}, errorf(ErrCorrupt, "header", "jpeg", "%v", err)
		}
		info.StoredW, info.StoredH = h.Width, h.Height
		info.Orientation = jpegOrientation(data)
		info.Subsampling = h.Subsampling
		info.Progressive = jpegProgressive(data)
	case PNG:
		c, err := png.DecodeConfig(bytes.NewReader(data))
		if err != nil {
			return Info{}, errorf(ErrCorrupt, "header", "png", "%v", err)
		}
		info.StoredW, info.StoredH = c.Width, c.Height
		info.Orientation = pngOrientation(data)
		pngLayout(data, &info)
	}
	if err := checkSize(f, info.StoredW, info.StoredH); err != nil {
		return Info{}, err
	}
	info.W, info.H = info.StoredW, info.StoredH
	if info.Orientation >= 5 {
		info.W, info.H = info.H, info.W
	}
	return info, nil
}

func checkSize(f Format, w, h int) error {
	if w < 1 || h < 1 || w > native.MaxImageSide || h > native.MaxImageSide {
		return errorf(ErrDimensions, "header", string(f), "%dx%d (each side 1..%d)", w, h, native.MaxImageSide)
	}
	return nil
}

// headerSize reads the stored size straight from the PNG IHDR (first chunk, fixed offset) or
// the first JPEG frame header (SOF0..SOF15, not DHT, JPG or DAC); ok is false when not found.
func headerSize(data []byte, f Format) (w, h int, ok bool) {
	if f == PNG {
		if len(data) < 24 || string(data[12:16]) != "IHDR" {
			return 0, 0, false
		}
		return int(binary.BigEndian.Uint32(data[16:])), int(binary.BigEndian.Uint32(data[20:])), true
	}
	jpegSegments(data, func(marker byte, seg []byte) bool {
		if marker < 0xc0 || marker > 0xcf || marker == 0xc4 || marker == 0xc8 || marker == 0xcc || len(seg) < 5 {
			return true
		}
		h, w, ok = int(binary.BigEndian.Uint16(seg[1:])), int(binary.BigEndian.Uint16(seg[3:])), true
		return false
	})
	return w, h, ok
}

// Check applies the limits to a header: the pixel limit (ErrTooLarge). Decode checks before
// it allocates; a caller that admits memory first (DecodeBytes) checks before asking.
func (o Options) Check(info Info) error {
	if px := info.StoredW * info.StoredH; px > o.maxPixels() {
		return errorf(ErrTooLarge, "decode", string(info.Format), "%dx%d = %d pixels, limit %d", info.StoredW, info.StoredH, px, o.maxPixels())
	}
	return nil
}

// Decode decodes a JPEG or PNG to RGB, upright unless opts.IgnoreOrientation. The pixel limit is
// checked from the header first. The returned Image is the caller's.
func Decode(data []byte, opts Options) (*Image, Info, error) {
	img := new(Image)
	info, err := DecodeInto(img, data, opts)
	if err != nil {
		return nil, info, err
	}
	return img, info, nil
}

// DecodeInto is Decode into img, reusing img.Pix when it has the capacity (a worker decoding
// many pictures keeps one Image). On error img is left empty.
func DecodeInto(img *Image, data []byte, opts Options) (Info, error) {
	*img = Image{Pix: img.Pix[:0]}
	info, err := DecodeConfig(data)
	if err != nil {
		return Info{}, err
	}
	if err := opts.Check(info); err != nil {
		return info, err
	}
	n := 3 * info.StoredW * info.StoredH
	pix := img.Pix[:0]
	if cap(pix) < n {
		pix = make([]byte, n)
	}
	stored := Image{W: info.StoredW, H: info.StoredH, Pix: pix[:n]}
	switch info.Format {
	case JPEG:
		if err := native.DecodeJPEG(stored.Pix, data, stored.W, stored.H); err != nil {
			kind := ErrCorrupt
			if errors.Is(err, native.ErrUnsupported) {
				kind = ErrUnsupported
			}
			return info, errorf(kind, "decode", "jpeg", "%v", err)
		}
	case PNG:
		if err := decodePNG(data, &stored); err != nil {
			return info, err
		}
	}
	if opts.IgnoreOrientation || info.Orientation == 1 {
		info.W, info.H = info.StoredW, info.StoredH
		*img = stored
		return info, nil
	}
	out := Image{W: info.W, H: info.H, Pix: make([]byte, n)}
	if err := native.Orient(out.Pix, stored.Pix, stored.W, stored.H, 3, info.Orientation); err != nil {
		return info, errorf(ErrCorrupt, "decode", string(info.Format), "orientation %d: %v", info.Orientation, err)
	}
	*img = out
	return info, nil
}

// decodePNG decodes into img (sized from the header) as Pillow's convert("RGB") would: alpha
// dropped (not composited), palettes looked up, grey replicated, 16-bit samples to their high
// byte (Pillow does the same for 16-bit colour; for 16-bit grey it clips instead, which we do
// not copy).
func decodePNG(data []byte, img *Image) error {
	m, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		return errorf(ErrCorrupt, "decode", "png", "%v", err)
	}
	b := m.Bounds()
	if b.Dx() != img.W || b.Dy() != img.H {
		return errorf(ErrCorrupt, "decode", "png", "decoded %dx%d, header said %dx%d", b.Dx(), b.Dy(), img.W, img.H)
	}
	px := img.Pix
	for y := range img.H {
		row := px[3*img.W*y : 3*img.W*(y+1)]
		switch m := m.(type) {
		case *image.RGBA: // PNG colour type 2 (opaque: premultiplied == straight)
			copyRGB(row, m.Pix[y*m.Stride:], img.W, 4, 1)
		case *image.NRGBA: // colour types 4 and 6
			copyRGB(row, m.Pix[y*m.Stride:], img.W, 4, 1)
		case *image.RGBA64:
			copyRGB(row, m.Pix[y*m.Stride:], img.W, 8, 2)
		case *image.NRGBA64:
			copyRGB(row, m.Pix[y*m.Stride:], img.W, 8, 2)
		case *image.Gray:
			for x := range img.W {
				v := m.Pix[y*m.Stride+x]
				row[3*x], row[3*x+1], row[3*x+2] = v, v, v
			}
		case *image.Gray16:
			for x := range img.W {
				v := m.Pix[y*m.Stride+2*x] // big-endian: the high byte
				row[3*x], row[3*x+1], row[3*x+2] = v, v, v
			}
		case *image.Paletted:
			for x := range img.W {
				r, g, bl := paletteRGB(m.Palette, m.Pix[y*m.Stride+x])
				row[3*x], row[3*x+1], row[3*x+2] = r, g, bl
			}
		default:
			return errorf(ErrUnsupported, "decode", "png", "pixel layout %T", m)
		}
	}
	return nil
}

// copyRGB copies w pixels of a row with step bytes a pixel and channel width cw (1 or 2: the
// high byte of big-endian 16-bit samples comes first) into packed RGB.
func copyRGB(dst, src []byte, w, step, cw int) {
	for x := range w {
		s := src[x*step:]
		dst[3*x], dst[3*x+1], dst[3*x+2] = s[0], s[cw], s[2*cw]
	}
}

// paletteRGB is the straight (not premultiplied) colour of palette entry i; an index past the
// palette is black, as in Pillow.
func paletteRGB(p color.Palette, i uint8) (r, g, b uint8) {
	if int(i) >= len(p) {
		return 0, 0, 0
	}
	switch c := p[i].(type) {
	case color.NRGBA:
		return c.R, c.G, c.B
	case color.RGBA:
		return c.R, c.G, c.B
	}
	r32, g32, b32, _ := p[i].RGBA()
	return uint8(r32 >> 8), uint8(g32 >> 8), uint8(b32 >> 8)
}

func (i Info) String() string {
	return fmt.Sprintf("%s %dx%d (stored %dx%d, orientation %d)", i.Format, i.W, i.H, i.StoredW, i.StoredH, i.Orientation)
}
