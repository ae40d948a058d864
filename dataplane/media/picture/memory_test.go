package picture

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"image"
	"image/jpeg"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// rawPNG writes a w x h PNG of colour type ct and bit depth, with filter 0 rows of a byte
// pattern, a 256-entry PLTE for palettes, an optional tRNS chunk (before the pixels, where the
// decoder reads it) and optional Adam7 interlacing: every layout image/png decodes, including
// the ones its encoder never writes (grey + alpha, grey with tRNS, interlaced).
func rawPNG(t testing.TB, w, h, ct, depth int, trns, interlaced bool) []byte {
	chunk := func(b []byte, typ string, body []byte) []byte {
		b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
		c := append([]byte(typ), body...)
		b = append(b, c...)
		return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(c))
	}
	ihdr := binary.BigEndian.AppendUint32(nil, uint32(w))
	ihdr = binary.BigEndian.AppendUint32(ihdr, uint32(h))
	il := byte(0)
	if interlaced {
		il = 1
	}
	ihdr = append(ihdr, byte(depth), byte(ct), 0, 0, il)
	b := chunk(append([]byte{}, pngMagic...), "IHDR", ihdr)
	if ct == 3 {
		b = chunk(b, "PLTE", bytes.Repeat([]byte{10, 20, 30}, 1<<depth))
	}
	if trns {
		switch ct {
		case 0:
			b = chunk(b, "tRNS", []byte{0, 1})
		case 2:
			b = chunk(b, "tRNS", []byte{0, 1, 0, 2, 0, 3})
		case 3:
			b = chunk(b, "tRNS", []byte{0, 128})
		}
	}
	bpp := depth * map[int]int{0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ct]
	var raw bytes.Buffer
	rows := func(pw, ph int) {
		if pw == 0 || ph == 0 {
			return
		}
		row := make([]byte, 1+(bpp*pw+7)/8)
		for y := range ph {
			for i := 1; i < len(row); i++ {
				row[i] = byte(i*7 + y)
			}
			raw.Write(row)
		}
	}
	if interlaced {
		for _, p := range [][4]int{{0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8}, {2, 0, 4, 4}, {0, 2, 2, 4}, {1, 0, 2, 2}, {0, 1, 1, 2}} {
			rows((w-p[0]+p[2]-1)/p[2], (h-p[1]+p[3]-1)/p[3])
		}
	} else {
		rows(w, h)
	}
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	_, err := zw.Write(raw.Bytes())
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	b = chunk(b, "IDAT", z.Bytes())
	return chunk(b, "IEND", nil)
}

// withOrientation is a PNG with an eXIf chunk (big-endian TIFF, one IFD entry: Orientation)
// after its IHDR.
func withOrientation(data []byte, o int) []byte {
	tiff := orientationTIFF(o)
	c := append([]byte("eXIf"), tiff...)
	chunk := binary.BigEndian.AppendUint32(nil, uint32(len(tiff)))
	chunk = binary.BigEndian.AppendUint32(append(chunk, c...), crc32.ChecksumIEEE(c))
	return append(append(bytes.Clone(data[:33]), chunk...), data[33:]...)
}

// withJPEGOrientation is a JPEG with an APP1 Exif segment after its SOI.
func withJPEGOrientation(data []byte, o int) []byte {
	body := append([]byte("Exif\x00\x00"), orientationTIFF(o)...)
	seg := binary.BigEndian.AppendUint16([]byte{0xff, 0xe1}, uint16(2+len(body)))
	return append(append(append(bytes.Clone(data[:2]), seg...), body...), data[2:]...)
}

func orientationTIFF(o int) []byte {
	tiff := []byte("MM\x00*\x00\x00\x00\x08\x00\x01\x01\x12\x00\x03\x00\x00\x00\x01\x00")
	return append(tiff, byte(o), 0, 0, 0, 0, 0, 0)
}

// allocated is the Go heap bytes f allocates (TotalAlloc: every allocation counts, freed or
// not, so it bounds what f holds at its peak).
func allocated(f func()) int64 {
	runtime.GC()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return int64(b.TotalAlloc - a.TotalAlloc)
}

// DecodeBytes bounds what a decode allocates, for every PNG layout image/png decodes into, a
// baseline and a progressive JPEG, and an orientation copy; and is not far above it.
func TestDecodeBytes(t *testing.T) {
	const w, h = 1000, 700
	const slack = 16 << 10 // the Image header, the error-free path's small bits
	f := func(name string, data []byte, opts Options, tight bool) {
		t.Helper()
		info, err := DecodeConfig(data)
		require.NoError(t, err, name)
		est := DecodeBytes(info, opts)
		var derr error
		got := allocated(func() { _, _, derr = Decode(data, opts) })
		require.NoError(t, derr, name)
		t.Logf("%-28s estimate %9d allocated %9d (%.3f)", name, est, got, float64(got)/float64(est))
		require.LessOrEqual(t, got, est+slack, "%s: %+v", name, info)
		if tight {
			require.Greater(t, float64(got), 0.9*float64(est), "%s: the estimate is loose", name)
		}
	}
	for _, c := range []struct {
		ct, depth   int
		trns, adam7 bool
	}{
		{0, 1, false, false}, {0, 8, false, false}, {0, 8, true, false}, {0, 16, false, false}, {0, 16, true, false},
		{2, 8, false, false}, {2, 8, true, false}, {2, 16, false, false}, {3, 8, false, false}, {3, 4, true, false},
		{4, 8, false, false}, {4, 16, false, false}, {6, 8, false, false}, {6, 16, false, false},
		{0, 8, false, true}, {2, 8, false, true}, {6, 16, false, true}, {3, 8, false, true},
	} {
		data := rawPNG(t, w, h, c.ct, c.depth, c.trns, c.adam7)
		f(fmt.Sprintf("png ct %d depth %d trns %v adam7 %v", c.ct, c.depth, c.trns, c.adam7), data, Options{}, true)
	}
	var jb bytes.Buffer
	require.NoError(t, jpeg.Encode(&jb, image.NewRGBA(image.Rect(0, 0, w, h)), nil))
	f("jpeg baseline", jb.Bytes(), Options{}, false)
	for _, o := range []int{3, 6} {
		data := withOrientation(rawPNG(t, w, h, 2, 8, false, false), o)
		f(fmt.Sprintf("png orientation %d", o), data, Options{}, true)
		f(fmt.Sprintf("png orientation %d ignored", o), data, Options{IgnoreOrientation: true}, true)
	}
	f("jpeg orientation 6", withJPEGOrientation(jb.Bytes(), 6), Options{}, false)

	// The layout fields come from the header, and the JPEG's coefficients are counted for a
	// progressive frame (C memory: not on the Go heap, so only the arithmetic is checked).
	info, err := DecodeConfig(rawPNG(t, 8, 8, 0, 16, true, true))
	require.NoError(t, err)
	require.Equal(t, [2]int{0, 16}, [2]int{info.ColorType, info.BitDepth})
	require.True(t, info.Transparent && info.Interlaced)
	base := DecodeBytes(Info{Format: JPEG, StoredW: 100, StoredH: 100, Orientation: 1, Subsampling: 2}, Options{})
	prog := DecodeBytes(Info{Format: JPEG, StoredW: 100, StoredH: 100, Orientation: 1, Subsampling: 2, Progressive: true}, Options{})
	require.Equal(t, int64(112*112*3), prog-base) // 4:2:0: 1.5 planes of 2-byte coefficients, padded to 16
	require.True(t, jpegProgressive(jpegSOF(0xc2, 16, 16)))
	require.False(t, jpegProgressive(jpegSOF(0xc0, 16, 16)))
	require.True(t, jpegProgressive(progressiveJPEG(t)))
	require.False(t, jpegProgressive(jb.Bytes()))
}

// progressiveJPEG is a baseline JPEG (image/jpeg writes no other) with SOF2 in place of its
// SOF0: enough for the header walk, which decides at the frame header.
func progressiveJPEG(t testing.TB) []byte {
	var jb bytes.Buffer
	require.NoError(t, jpeg.Encode(&jb, image.NewGray(image.Rect(0, 0, 8, 8)), nil))
	b := bytes.Clone(jb.Bytes())
	i := bytes.Index(b, []byte{0xff, 0xc0})
	require.Positive(t, i)
	b[i+1] = 0xc2
	return b
}
