package picture

import "encoding/binary"

// Fixed costs of one decode besides the pixel buffers, measured with runtime.MemStats on
// go1.26 (TestDecodeBytes keeps them honest): image/png's zlib and flate state, its chunk
// buffer and palette; libjpeg-turbo's decompressor, Huffman tables and sample rows (C memory,
// not on the Go heap).
const (
	pngOverhead  = 96 << 10
	jpegOverhead = 256 << 10
)

// DecodeBytes is what Decode holds at its peak for a picture with this header, in bytes,
// counting every buffer it allocates (the Go heap and libjpeg-turbo's C memory alike) as held
// until the decode returns:
//   - the stored pixels as RGB, 3·W·H, and as many again for the orientation copy when one is
//     made (an EXIF orientation other than 1 and not opts.IgnoreOrientation);
//   - PNG: image/png's own image, W·H times 1 (grey ≤ 8 bits, palette), 2 (grey 16), 4 (8-bit
//     RGB, grey + alpha, RGBA, or grey ≤ 8 bits with tRNS) or 8 (the 16-bit ones with colour
//     or alpha, or 16-bit grey with tRNS) bytes, twice for Adam7 (it decodes each pass into an
//     image of its own, then merges), two filter rows a pass, and pngOverhead;
//   - JPEG: for a progressive or multi-scan frame the DCT coefficients libjpeg keeps for the
//     whole picture (2 bytes a sample, each component at its own sampling), and jpegOverhead.
//
// A caller with a memory budget admits this much before decoding (media.Options.Admit).
func DecodeBytes(info Info, opts Options) int64 {
	w, h := int64(info.StoredW), int64(info.StoredH)
	if w < 1 || h < 1 {
		return 0
	}
	px := w * h
	n := 3 * px
	if info.Orientation != 1 && info.Orientation != 0 && !opts.IgnoreOrientation {
		n += 3 * px
	}
	switch info.Format {
	case PNG:
		img := px * pngDecodedBytes(info)
		rows := 2 * (1 + (int64(pngBitsPerPixel(info))*w+7)/8)
		if info.Interlaced {
			img, rows = 2*img, 7*rows
		}
		n += img + rows + pngOverhead
	case JPEG:
		if info.Progressive {
			// Samples padded to whole 16x16 MCUs, in luma planes: 4:4:4 keeps 3, 4:2:2 and
			// 4:4:0 keep 2, 4:2:0, 4:1:1 and 4:4:1 keep 1.5, grey 1; unknown (CMYK) 4.
			pw, ph := (w+15)&^15, (h+15)&^15
			halves := int64(8)
			switch info.Subsampling {
			case 0:
				halves = 6
			case 1, 4:
				halves = 4
			case 2, 5, 6:
				halves = 3
			case 3:
				halves = 2
			}
			n += pw * ph * halves // halves/2 planes of 2-byte coefficients
		}
		n += jpegOverhead
	}
	return n
}

// pngDecodedBytes is bytes a pixel of the image image/png decodes into (see its
// readImagePass): *image.Gray, Gray16, RGBA, RGBA64, NRGBA, NRGBA64 or Paletted.
func pngDecodedBytes(info Info) int64 {
	deep := info.BitDepth == 16
	switch info.ColorType {
	case 0:
		switch {
		case info.Transparent && deep:
			return 8
		case info.Transparent:
			return 4
		case deep:
			return 2
		}
		return 1
	case 3:
		return 1
	case 2, 4, 6:
		if deep {
			return 8
		}
		return 4
	}
	return 8 // not a valid PNG colour type: the decoder refuses it, the estimate stays an upper bound
}

// pngBitsPerPixel is the bits of one stored pixel: depth times the channels of the colour type.
func pngBitsPerPixel(info Info) int {
	ch := 4
	switch info.ColorType {
	case 0, 3:
		ch = 1
	case 2:
		ch = 3
	case 4:
		ch = 2
	}
	return max(info.BitDepth, 1) * ch
}

// pngLayout fills the PNG layout fields of info from the IHDR and the chunks before the first
// IDAT (the decoder looks at tRNS only there). Malformed chunks end the walk: the decoder
// reports them.
func pngLayout(data []byte, info *Info) {
	if len(data) < 33 || string(data[12:16]) != "IHDR" {
		return
	}
	info.BitDepth, info.ColorType = int(data[24]), int(data[25])
	info.Interlaced = data[28] == 1
	for i := 8; i+8 <= len(data); {
		n := int64(binary.BigEndian.Uint32(data[i:]))
		switch string(data[i+4 : i+8]) {
		case "tRNS":
			info.Transparent = true
			return
		case "IDAT", "IEND":
			return
		}
		end := int64(i) + 12 + n
		if n > 1<<31 || end > int64(len(data)) {
			return
		}
		i = int(end)
	}
}

// jpegProgressive reports whether libjpeg will buffer the whole picture's coefficients: a
// progressive frame (SOF2, 6, 10, 14), or a sequential one whose first scan holds fewer
// components than the frame (the others come in later scans).
func jpegProgressive(data []byte) bool {
	comps := 0
	for i := 2; i+4 <= len(data); { // after SOI
		if data[i] != 0xff {
			return false
		}
		marker := data[i+1]
		switch {
		case marker == 0xff:
			i++
			continue
		case marker == 0xd9:
			return false
		case marker == 0x01 || (marker >= 0xd0 && marker <= 0xd7):
			i += 2
			continue
		}
		n := int(binary.BigEndian.Uint16(data[i+2:]))
		if n < 2 || i+2+n > len(data) {
			return false
		}
		seg := data[i+4 : i+2+n]
		switch {
		case marker == 0xc2 || marker == 0xc6 || marker == 0xca || marker == 0xce:
			return true
		case marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 && marker != 0xcc && len(seg) >= 6:
			comps = int(seg[5])
		case marker == 0xda:
			return len(seg) >= 1 && int(seg[0]) < comps
		}
		i += 2 + n
	}
	return false
}
