package picture

import (
	"bytes"
	"encoding/binary"
)

// The EXIF orientation tag and what its values do to the stored pixels to show them upright.
const (
	orientationTag = 0x0112
	maxIFDEntries  = 4096 // more entries than any real IFD0 has: a corrupt count
)

// exifOrientation reads the Orientation tag (1..8) from a TIFF-structured EXIF block (the bytes
// after "Exif\0\0"). Anything missing, malformed or out of range gives 1 (upright), as Pillow's
// exif_transpose leaves such images alone.
func exifOrientation(tiff []byte) int {
	if len(tiff) < 8 {
		return 1
	}
	var bo binary.ByteOrder
	switch string(tiff[:4]) {
	case "II*\x00":
		bo = binary.LittleEndian
	case "MM\x00*":
		bo = binary.BigEndian
	default:
		return 1
	}
	off := int64(bo.Uint32(tiff[4:]))
	if off < 8 || off+2 > int64(len(tiff)) {
		return 1
	}
	n := int64(bo.Uint16(tiff[off:]))
	if n > maxIFDEntries {
		return 1
	}
	for i := range n {
		e := off + 2 + 12*i
		if e+12 > int64(len(tiff)) {
			return 1
		}
		if bo.Uint16(tiff[e:]) != orientationTag {
			continue
		}
		typ, count := bo.Uint16(tiff[e+2:]), bo.Uint32(tiff[e+4:])
		var v int
		switch {
		case typ == 3 && count >= 1: // SHORT, stored in the first two bytes of the value field
			v = int(bo.Uint16(tiff[e+8:]))
		case typ == 4 && count >= 1: // LONG (seen in some writers)
			v = int(bo.Uint32(tiff[e+8:]))
		default:
			return 1
		}
		if v < 1 || v > 8 {
			return 1
		}
		return v
	}
	return 1
}

var exifMagic = []byte("Exif\x00\x00")

// jpegOrientation finds the first APP1 "Exif" segment before the scan data and reads its
// orientation; 1 when there is none.
func jpegOrientation(data []byte) int {
	o := 1
	jpegSegments(data, func(marker byte, seg []byte) bool {
		if marker == 0xe1 && bytes.HasPrefix(seg, exifMagic) {
			o = exifOrientation(seg[len(exifMagic):])
			return false
		}
		return true
	})
	return o
}

// jpegSegments calls fn with each marker segment's payload before the scan, until fn returns
// false or the data stops making sense.
func jpegSegments(data []byte, fn func(marker byte, seg []byte) bool) {
	i := 2 // after SOI
	for i+4 <= len(data) {
		if data[i] != 0xff {
			return
		}
		marker := data[i+1]
		if marker == 0xff { // fill byte
			i++
			continue
		}
		if marker == 0xda || marker == 0xd9 { // start of scan, end of image: no headers past here
			return
		}
		if marker == 0x01 || (marker >= 0xd0 && marker <= 0xd7) { // no length
			i += 2
			continue
		}
		n := int(binary.BigEndian.Uint16(data[i+2:]))
		if n < 2 || i+2+n > len(data) {
			return
		}
		if !fn(marker, data[i+4:i+2+n]) {
			return
		}
		i += 2 + n
	}
}

// pngOrientation reads the orientation from the eXIf chunk; 1 when none. Like Pillow it looks
// past the image data too (the spec puts eXIf before IDAT; some writers do not).
func pngOrientation(data []byte) int {
	i := 8 // after the signature
	for i+8 <= len(data) {
		n := int64(binary.BigEndian.Uint32(data[i:]))
		typ := string(data[i+4 : i+8])
		end := int64(i) + 12 + n
		if n > 1<<31 || end > int64(len(data)) {
			return 1
		}
		switch typ {
		case "eXIf":
			chunk := data[i+8 : i+8+int(n)]
			return exifOrientation(bytes.TrimPrefix(chunk, exifMagic))
		case "IEND":
			return 1
		}
		i = int(end)
	}
	return 1
}
