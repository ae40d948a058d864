package picture

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/native"
	"dataplane/native/fixtures"
)

func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("random seed %#x", seed)
	return rand.New(rand.NewPCG(seed, 5))
}

// refs are Pillow's outputs (testdata/gen_refs.py): sha256 of packed RGB bytes.
func refs(t testing.TB) map[string]json.RawMessage {
	raw, err := os.ReadFile("testdata/refs.json")
	require.NoError(t, err)
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &m))
	return m
}

func refHash(t testing.TB, r map[string]json.RawMessage, key string) string {
	t.Helper()
	var s string
	require.NoError(t, json.Unmarshal(r[key], &s), "reference %q", key)
	return s
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func decodeFile(t testing.TB, path string, opts Options) (*Image, Info) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	img, info, err := Decode(data, opts)
	require.NoError(t, err, path)
	require.Len(t, img.Pix, 3*img.W*img.H)
	return img, info
}

// The photo-like JPEG through CLIP-336, full decode (Apply) and window decode (ApplyBytes),
// against Pillow + torchvision (testdata/gen_photo.py: sha256 of the 8-bit crop and of the f32
// tensor).
func TestCLIP336PhotoMatchesTorchvision(t *testing.T) {
	raw, err := os.ReadFile("testdata/photo_refs.json")
	require.NoError(t, err)
	var ref struct {
		JPEG    string `json:"jpeg_sha256"`
		Resized [2]int
		Crop    string `json:"crop_rgb_sha256"`
		Tensor  string `json:"clip336_f32_sha256"`
	}
	require.NoError(t, json.Unmarshal(raw, &ref))
	data, err := os.ReadFile("testdata/photo_1024x768.jpg")
	require.NoError(t, err)
	require.Equal(t, ref.JPEG, sum(data), "photo_1024x768.jpg is not the one the references were computed from")
	img, _, err := Decode(data, Options{})
	require.NoError(t, err)
	rw, rh, crop := CLIP336.clipCrop(img.W, img.H)
	require.Equal(t, ref.Resized, [2]int{rw, rh})
	rgb := make([]byte, 3*336*336)
	require.NoError(t, native.Resize(&native.ResizeJob{Src: img.Pix, SrcW: img.W, SrcH: img.H, Channels: 3, OutW: rw, OutH: rh, Crop: crop, Dst: rgb, Filter: native.Bicubic}))
	require.Equal(t, ref.Crop, sum(rgb), "8-bit crop")
	out, err := CLIP336.Apply(img, native.F32)
	require.NoError(t, err)
	require.Equal(t, ref.Tensor, sum(out.PixelValues.Data), "Apply")
	direct, _, err := CLIP336.ApplyBytes(data, native.F32, Options{})
	require.NoError(t, err)
	require.Equal(t, ref.Tensor, sum(direct.PixelValues.Data), "ApplyBytes")
	require.Equal(t, out.PixelValues.Shape, direct.PixelValues.Shape)
	require.Equal(t, out.Tokens, direct.Tokens)
}

// ApplyBytes gives Decode + Apply's tensors for every preset, orientation and format (the
// window decode for upright JPEGs and CLIP, the full decode otherwise).
func TestApplyBytesMatchesApply(t *testing.T) {
	files := []string{fixtures.Path(t, "image_200x150.jpg"), fixtures.Path(t, "image_200x150.png"), "testdata/orient1.jpg", "testdata/orient6.jpg"}
	for _, path := range files {
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, p := range []Preset{CLIP224, CLIP336, {Name: "clip-64-floor", Family: CLIP, Size: 64, CropFloor: true, Patch: 16, Filter: native.Bilinear, Mean: CLIPMean, Std: CLIPStd}, SigLIP384} {
			for _, opts := range []Options{{}, {IgnoreOrientation: true}} {
				img, _, err := Decode(data, opts)
				require.NoError(t, err)
				want, err := p.Apply(img, native.BF16)
				require.NoError(t, err)
				got, _, err := p.ApplyBytes(data, native.BF16, opts)
				require.NoError(t, err)
				require.Equal(t, want, got, "%s %s %+v", path, p.Name, opts)
			}
		}
	}
	_, _, err := CLIP336.ApplyBytes([]byte("\xff\xd8\xff garbage"), native.F32, Options{})
	require.Error(t, err)
}

// openai/CLIP's preprocessing of the shared PNG at 64 and 224: bit for bit.
func TestCLIPMatchesFixtures(t *testing.T) {
	img, _ := decodeFile(t, fixtures.Path(t, "image_200x150.png"), Options{})
	for _, n := range []int{64, 224} {
		want, shape := fixtures.ReadF32(t, fmt.Sprintf("image_200x150_clip%d", n))
		require.Equal(t, []int{3, n, n}, shape)
		p := Preset{Name: "clip", Family: CLIP, Size: n, Patch: 16, Filter: native.Bicubic, Mean: CLIPMean, Std: CLIPStd}
		out, err := p.Apply(img, native.F32)
		require.NoError(t, err)
		require.Zero(t, out.Grid) // pixel values alone, no grid
		tn := out.PixelValues
		require.Equal(t, native.F32, tn.DType)
		require.Equal(t, []int{1, 3, n, n}, tn.Shape)
		differ, worst := 0, 0.0
		for i, w := range want {
			g := math.Float32frombits(binary.LittleEndian.Uint32(tn.Data[4*i:]))
			if g != w {
				differ++
				worst = math.Max(worst, math.Abs(float64(g-w)))
			}
		}
		t.Logf("clip%d: %d of %d values differ from the fixture, worst by %.3g", n, differ, len(want), worst)
		require.Zero(t, differ, "clip%d: not bit-exact", n)
	}
}

// The same pipeline in f16 and bf16 is the f32 result rounded to nearest even.
func TestCLIPHalfPrecision(t *testing.T) {
	img, _ := decodeFile(t, fixtures.Path(t, "image_200x150.png"), Options{})
	f32, err := CLIP224.Apply(img, native.F32)
	require.NoError(t, err)
	for _, dt := range []native.DType{native.F16, native.BF16} {
		out, err := CLIP224.Apply(img, dt)
		require.NoError(t, err)
		want := make([]byte, len(f32.PixelValues.Data)/2)
		require.NoError(t, native.Convert(want, dt, f32.PixelValues.Data, native.F32))
		require.Equal(t, want, out.PixelValues.Data, "%v", dt)
		require.Equal(t, 256, out.Tokens)
	}
}

func TestDecodeMatchesPillow(t *testing.T) {
	r := refs(t)
	for _, name := range []string{"image_200x150.jpg", "image_200x150.png"} {
		img, info := decodeFile(t, fixtures.Path(t, name), Options{})
		require.Equal(t, 200, info.W)
		require.Equal(t, 150, info.H)
		require.Equal(t, refHash(t, r, "decode/"+name), sum(img.Pix), "%s: pixels differ from Pillow's decode", name)
	}
}

func TestOrientationMatchesPillow(t *testing.T) {
	r := refs(t)
	for _, ext := range []string{"jpg", "png"} {
		for o := 1; o <= 8; o++ {
			img, info := decodeFile(t, fmt.Sprintf("testdata/orient%d.%s", o, ext), Options{})
			require.Equal(t, o, info.Orientation, "%s %d", ext, o)
			w, h := 21, 13
			if o >= 5 {
				w, h = h, w
			}
			require.Equal(t, [2]int{w, h}, [2]int{img.W, img.H}, "%s orientation %d", ext, o)
			format := map[string]string{"jpg": "jpeg", "png": "png"}[ext]
			require.Equal(t, refHash(t, r, fmt.Sprintf("orient/%s/%d", format, o)), sum(img.Pix), "%s orientation %d", ext, o)
			raw, _ := decodeFile(t, fmt.Sprintf("testdata/orient%d.%s", o, ext), Options{IgnoreOrientation: true})
			require.Equal(t, [2]int{21, 13}, [2]int{raw.W, raw.H})
		}
	}
}

func TestPNGLayoutsMatchPillow(t *testing.T) {
	r := refs(t)
	for _, name := range []string{"gray", "gray_alpha", "rgb", "rgba", "palette", "palette_trns", "bilevel", "rgb16"} {
		img, _ := decodeFile(t, "testdata/png_"+name+".png", Options{})
		require.Equal(t, refHash(t, r, "png/"+name), sum(img.Pix), name)
	}
}

// Resizes against Pillow, both filters, every kernel variant, including one-pass and 1-pixel
// cases and strong up- and downscales.
func TestResizeMatchesPillow(t *testing.T) {
	r := refs(t)
	photo, _ := decodeFile(t, fixtures.Path(t, "image_200x150.png"), Options{})
	noise, _ := decodeFile(t, "testdata/noise_83x57.png", Options{})
	sizes := [][2]int{{64, 48}, {300, 225}, {85, 64}, {37, 211}, {1, 1}, {200, 1}, {451, 150}, {83, 20}, {7, 57}, {2000, 3}}
	for _, isa := range native.SupportedISAs() {
		for name, img := range map[string]*Image{"image_200x150": photo, "noise_83x57": noise} {
			for _, s := range sizes {
				for _, f := range []native.Filter{native.Bicubic, native.Bilinear} {
					dst := make([]byte, 3*s[0]*s[1])
					job := native.ResizeJob{Src: img.Pix, SrcW: img.W, SrcH: img.H, Channels: 3, OutW: s[0], OutH: s[1],
						Crop: native.Rect{W: s[0], H: s[1]}, Dst: dst, Filter: f, ISA: isa}
					require.NoError(t, native.Resize(&job))
					key := fmt.Sprintf("resize/%s/%dx%d/%v", name, s[0], s[1], f)
					require.Equal(t, refHash(t, r, key), sum(dst), "%s %v", key, isa)
				}
			}
		}
	}
}

func TestInternVLTilesMatchPillow(t *testing.T) {
	r := refs(t)
	photo, _ := decodeFile(t, fixtures.Path(t, "image_200x150.png"), Options{})
	for _, s := range [][2]int{{200, 150}, {1000, 300}, {300, 1000}, {448, 448}, {2000, 2000}, {50, 900}} {
		var want struct {
			Grid  [2]int
			Tiles []string
		}
		require.NoError(t, json.Unmarshal(r[fmt.Sprintf("internvl/%dx%d", s[0], s[1])], &want))
		img := resized(t, photo, s[0], s[1])
		c, rows := InternVL448.tileGrid(img.W, img.H)
		require.Equal(t, want.Grid, [2]int{c, rows}, "%v", s)
		// The tiles in bytes (before normalisation), through the same resize path as Apply.
		for i, h := range want.Tiles {
			var crop native.Rect
			ow, oh := c*448, rows*448
			if i < c*rows {
				crop = native.Rect{X: (i % c) * 448, Y: (i / c) * 448, W: 448, H: 448}
			} else {
				ow, oh, crop = 448, 448, native.Rect{W: 448, H: 448}
			}
			dst := make([]byte, 3*448*448)
			require.NoError(t, native.Resize(&native.ResizeJob{Src: img.Pix, SrcW: img.W, SrcH: img.H, Channels: 3, OutW: ow, OutH: oh,
				Crop: crop, Dst: dst, Filter: native.Bicubic}))
			require.Equal(t, h, sum(dst), "%v tile %d", s, i)
		}
		out, err := InternVL448.Apply(img, native.BF16)
		require.NoError(t, err)
		require.Equal(t, []int{len(want.Tiles), 3, 448, 448}, out.PixelValues.Shape)
		require.Equal(t, 256*len(want.Tiles), out.Tokens)
	}
}

func resized(t testing.TB, img *Image, w, h int) *Image {
	out := &Image{W: w, H: h, Pix: make([]byte, 3*w*h)}
	require.NoError(t, native.Resize(&native.ResizeJob{Src: img.Pix, SrcW: img.W, SrcH: img.H, Channels: 3, OutW: w, OutH: h,
		Crop: native.Rect{W: w, H: h}, Dst: out.Pix, Filter: native.Bicubic}))
	return out
}

func TestSmartResize(t *testing.T) {
	p := Qwen2VLImage
	f := func(h, w, wantH, wantW int) {
		t.Helper()
		gh, gw, err := p.SmartResize(h, w)
		require.NoError(t, err)
		require.Equal(t, [2]int{wantH, wantW}, [2]int{gh, gw}, "%dx%d", h, w)
	}
	f(1024, 1024, 980, 980) // REFERENCE.md: 1225 tokens
	f(150, 200, 140, 196)
	f(42, 70, 56, 56)     // 1.5 -> 2 and 2.5 -> 2 (half to even), then 56*56 = MinPixels
	f(10, 10, 56, 56)     // scaled up to MinPixels
	f(28, 5600, 28, 5600) // aspect exactly 200
	f(4000, 3000, 1148, 840)
	_, _, err := p.SmartResize(10, 2011)
	require.ErrorIs(t, err, ErrDimensions)
	n, err := p.Tokens(1024, 1024)
	require.NoError(t, err)
	require.Equal(t, 1225, n)
}

func TestTokens(t *testing.T) {
	f := func(p Preset, w, h, want int) {
		t.Helper()
		n, err := p.Tokens(w, h)
		require.NoError(t, err)
		require.Equal(t, want, n, "%s %dx%d", p.Name, w, h)
	}
	f(CLIP336, 1024, 768, 576)
	f(CLIP224, 10, 5000, 256)
	f(SigLIP384, 640, 480, 729)
	f(InternVL448, 448, 448, 256)
	f(InternVL448, 1000, 300, 4*256) // 3 tiles + thumbnail
	f(Qwen2VLImage, 200, 150, 35)    // 196x140 -> 7 x 5
}

// The patch layout against a direct transcription of the reshape/transpose index formula.
func TestQwenPatchLayout(t *testing.T) {
	r := newRand(t)
	p := Qwen2VLImage
	for _, frames := range []int{1, 2, 3} {
		h, w := 28*(1+r.IntN(3)), 28*(1+r.IntN(3))
		chw := make([]byte, frames*3*h*w*2)
		for i := range chw {
			chw[i] = byte(r.Uint32())
		}
		got, grid := p.PatchLayout(chw, frames, h, w, 2)
		gt, gh, gw := (frames+1)/2, h/14, w/14
		require.Equal(t, [3]int{gt, gh, gw}, grid)
		cols := 3 * 2 * 14 * 14
		for row := range gt * gh * gw {
			// row = ((it*gh/2 + bh)*gw/2 + bw)*4 + mh*2 + mw
			mw, mh := row%2, (row/2)%2
			bw := (row / 4) % (gw / 2)
			bh := (row / 4 / (gw / 2)) % (gh / 2)
			it := row / 4 / (gw / 2) / (gh / 2)
			for col := range cols {
				px, py := col%14, (col/14)%14
				tt, c := (col/196)%2, col/392
				f := min(it*2+tt, frames-1)
				y, x := (bh*2+mh)*14+py, (bw*2+mw)*14+px
				src := ((f*3+c)*h*w + y*w + x) * 2
				require.Equal(t, chw[src:src+2], got[(row*cols+col)*2:(row*cols+col)*2+2], "frames %d row %d col %d", frames, row, col)
			}
		}
	}
}

func TestQwenApply(t *testing.T) {
	img, _ := decodeFile(t, fixtures.Path(t, "image_200x150.png"), Options{})
	out, err := Qwen2VLImage.Apply(img, native.F32)
	require.NoError(t, err)
	require.Equal(t, 35, out.Tokens)
	require.Equal(t, []int{10 * 14, 1176}, out.PixelValues.Shape)
	require.Equal(t, [3]int{1, 10, 14}, out.Grid) // image_grid_thw
	// Both temporal copies of a picture are the same values.
	row := out.PixelValues.Data[:1176*4]
	require.Equal(t, row[:196*4], row[196*4:392*4])
}

// pngHeader is a PNG signature and an IHDR with the given size (and nothing else).
func pngHeader(w, h uint32) []byte {
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr, w)
	binary.BigEndian.PutUint32(ihdr[4:], h)
	ihdr[8], ihdr[9] = 8, 2
	b := append([]byte{}, pngMagic...)
	b = binary.BigEndian.AppendUint32(b, 13)
	b = append(b, "IHDR"...)
	b = append(b, ihdr...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(append([]byte("IHDR"), ihdr...)))
}

// jpegSOF is a JPEG of SOI, one frame header (marker 0xc0 baseline, 0xc2 progressive, ...)
// of w x h with one component, and EOI: enough for the header walk, no image data.
func jpegSOF(marker byte, w, h uint16) []byte {
	b := []byte{0xff, 0xd8, 0xff, marker, 0, 11, 8}
	b = binary.BigEndian.AppendUint16(b, h)
	b = binary.BigEndian.AppendUint16(b, w)
	return append(b, 1, 1, 0x11, 0, 0xff, 0xd9)
}

// withSize is a real picture with the size in its header replaced (the PNG's IHDR CRC
// recomputed), so everything but the size is valid.
func withSize(t testing.TB, data []byte, w, h uint16) []byte {
	data = bytes.Clone(data)
	if bytes.HasPrefix(data, pngMagic) {
		binary.BigEndian.PutUint32(data[16:], uint32(w))
		binary.BigEndian.PutUint32(data[20:], uint32(h))
		binary.BigEndian.PutUint32(data[29:], crc32.ChecksumIEEE(data[12:29]))
		return data
	}
	for i := 2; i+9 < len(data); i++ {
		if data[i] == 0xff && data[i+1] == 0xc0 {
			binary.BigEndian.PutUint16(data[i+5:], h)
			binary.BigEndian.PutUint16(data[i+7:], w)
			return data
		}
	}
	t.Fatal("no SOF0 marker")
	return nil
}

// A zero side is refused from the header as ErrDimensions, before any decoder sees the data
// (image/png would call it a format error, libjpeg a corrupt stream).
func TestZeroDimensions(t *testing.T) {
	jpg, err := os.ReadFile(fixtures.Path(t, "image_200x150.jpg"))
	require.NoError(t, err)
	pngData, err := os.ReadFile(fixtures.Path(t, "image_200x150.png"))
	require.NoError(t, err)
	for _, c := range []struct {
		name string
		data []byte
		size string
	}{
		{"png width 0", pngHeader(0, 10), "0x10"},
		{"png height 0", pngHeader(10, 0), "10x0"},
		{"png 0x0", pngHeader(0, 0), "0x0"},
		{"real png, width 0", withSize(t, pngData, 0, 150), "0x150"},
		{"real png, height 0", withSize(t, pngData, 200, 0), "200x0"},
		{"jpeg sof0 0x0", jpegSOF(0xc0, 0, 0), "0x0"},
		{"jpeg sof0 width 0", jpegSOF(0xc0, 0, 10), "0x10"},
		{"jpeg sof0 height 0", jpegSOF(0xc0, 10, 0), "10x0"},
		{"jpeg sof2 height 0", jpegSOF(0xc2, 16, 0), "16x0"},
		{"real jpeg, width 0", withSize(t, jpg, 0, 150), "0x150"},
		{"real jpeg, height 0", withSize(t, jpg, 200, 0), "200x0"},
	} {
		_, err := DecodeConfig(c.data)
		require.ErrorIs(t, err, ErrDimensions, "%s: %v", c.name, err)
		require.ErrorContains(t, err, c.size, c.name)
		_, _, err = Decode(c.data, Options{})
		require.ErrorIs(t, err, ErrDimensions, "%s: %v", c.name, err)
		var pe *Error
		require.ErrorAs(t, err, &pe, c.name)
		require.Equal(t, "header", pe.Op, c.name)
	}
	// With a real size the same headers pass the size check: the hand-made JPEG reaches
	// libjpeg, which finds no scan.
	_, err = DecodeConfig(jpegSOF(0xc0, 16, 8))
	require.ErrorIs(t, err, ErrCorrupt)
	require.ErrorContains(t, err, "SOS")
	info, err := DecodeConfig(pngHeader(16, 8))
	require.NoError(t, err)
	require.Equal(t, [2]int{16, 8}, [2]int{info.W, info.H})
	_, _, err = Decode(withSize(t, jpg, 200, 150), Options{})
	require.NoError(t, err)
	_, _, err = Decode(withSize(t, pngData, 200, 150), Options{})
	require.NoError(t, err)
}

// Bad inputs: each a typed error naming the problem, never a panic.
func TestBadInputs(t *testing.T) {
	jpg, err := os.ReadFile(fixtures.Path(t, "image_200x150.jpg"))
	require.NoError(t, err)
	pngData, err := os.ReadFile(fixtures.Path(t, "image_200x150.png"))
	require.NoError(t, err)
	cmyk, err := os.ReadFile("testdata/cmyk.jpg")
	require.NoError(t, err)
	corrupt := bytes.Clone(jpg)
	for i := 600; i < len(corrupt)-2; i += 7 {
		corrupt[i] = 0xff
	}
	f := func(name string, data []byte, opts Options, kind error, words string) {
		t.Helper()
		_, _, err := Decode(data, opts)
		require.Error(t, err, name)
		require.ErrorIs(t, err, kind, "%s: %v", name, err)
		require.Contains(t, err.Error(), words, name)
		var pe *Error
		require.ErrorAs(t, err, &pe, name)
	}
	f("empty", nil, Options{}, ErrFormat, "empty input")
	f("gif", []byte("GIF89a\x01\x00\x01\x00"), Options{}, ErrFormat, "GIF")
	f("webp", []byte("RIFF\x10\x00\x00\x00WEBPVP8 "), Options{}, ErrFormat, "WebP")
	f("text", []byte("hello, world"), Options{}, ErrFormat, "want JPEG or PNG")
	f("truncated jpeg header", jpg[:40], Options{}, ErrCorrupt, "jpeg")
	f("truncated jpeg data", jpg[:len(jpg)/2], Options{}, ErrCorrupt, "truncated")
	f("corrupt jpeg data", corrupt, Options{}, ErrCorrupt, "jpeg")
	f("truncated png", pngData[:len(pngData)/2], Options{}, ErrCorrupt, "png")
	f("png magic only", pngMagic, Options{}, ErrCorrupt, "png")
	f("giant png", pngHeader(100000, 100000), Options{}, ErrDimensions, "100000x100000")
	f("bomb png", pngHeader(60000, 60000), Options{}, ErrTooLarge, "3600000000 pixels")
	f("over a set limit", jpg, Options{MaxPixels: 100 * 100}, ErrTooLarge, "200x150")
	f("cmyk jpeg", cmyk, Options{}, ErrUnsupported, "CMYK")
	// Presets and pictures that cannot be preprocessed.
	bad := CLIP336
	bad.Std[1] = 0
	_, err = bad.Apply(&Image{W: 2, H: 2, Pix: make([]byte, 12)}, native.F32)
	require.ErrorIs(t, err, ErrPreset)
	_, err = CLIP336.Apply(&Image{W: 2, H: 2, Pix: make([]byte, 5)}, native.F32)
	require.ErrorIs(t, err, ErrDimensions)
	_, err = Qwen2VLImage.Tokens(1, 500)
	require.ErrorIs(t, err, ErrDimensions)
}

func FuzzDecode(f *testing.F) {
	for _, p := range []string{fixtures.Path(f, "image_200x150.jpg"), fixtures.Path(f, "image_200x150.png")} {
		data, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(data)
	}
	files, _ := filepath.Glob("testdata/*.*g")
	for _, p := range files {
		data, err := os.ReadFile(p)
		require.NoError(f, err)
		f.Add(data)
	}
	f.Add(pngHeader(1, 1))
	f.Fuzz(func(t *testing.T, data []byte) {
		img, info, err := Decode(data, Options{MaxPixels: 1 << 20})
		if err != nil {
			var pe *Error
			require.ErrorAs(t, err, &pe)
			return
		}
		require.Equal(t, [2]int{info.W, info.H}, [2]int{img.W, img.H})
		require.Len(t, img.Pix, 3*img.W*img.H)
		require.LessOrEqual(t, img.W*img.H, 1<<20)
		// The window decode of what decodes in full gives Apply's tensor. (The other way round
		// it may succeed: rows below the window are never decoded, so damage there is unseen.)
		want, err := CLIP224.Apply(img, native.F32)
		require.NoError(t, err)
		got, _, err := CLIP224.ApplyBytes(data, native.F32, Options{MaxPixels: 1 << 20})
		require.NoError(t, err)
		require.Equal(t, want, got)
	})
}

// The EXIF walkers on arbitrary bytes: an orientation in 1..8, never a panic.
func FuzzOrientation(f *testing.F) {
	for o := 1; o <= 8; o++ {
		data, err := os.ReadFile(fmt.Sprintf("testdata/orient%d.jpg", o))
		require.NoError(f, err)
		f.Add(data)
	}
	f.Add([]byte("\xff\xd8\xff\xe1\x00\x10Exif\x00\x00MM\x00*\x00\x00\x00\x08"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, o := range []int{jpegOrientation(data), pngOrientation(data), exifOrientation(data)} {
			require.True(t, o >= 1 && o <= 8, "orientation %d", o)
		}
	})
}

// LLaVA-NeXT's base picture and tiles against transformers' PIL processor's (gen_refs.py
// section 6), and Apply's tensor is exactly those, normalised.
func TestLlavaNextTilesMatchPillow(t *testing.T) {
	r := refs(t)
	photo, _ := decodeFile(t, fixtures.Path(t, "image_200x150.png"), Options{})
	p := LlavaNext336
	p.CropFloor = true
	for _, s := range [][2]int{{200, 150}, {1000, 300}, {83, 900}, {336, 336}, {700, 1400}, {1, 1}, {55, 88}} {
		var want []string
		require.NoError(t, json.Unmarshal(r[fmt.Sprintf("llava-next/%dx%d", s[0], s[1])], &want))
		img := resized(t, photo, s[0], s[1])
		pics, g, err := p.AnyresRGB(img)
		require.NoError(t, err)
		require.Len(t, pics, len(want), "%v: %+v", s, g)
		for i, pic := range pics {
			require.Equal(t, want[i], sum(pic), "%v picture %d (%+v)", s, i, g)
		}
		out, err := p.Apply(img, native.F32)
		require.NoError(t, err)
		require.Equal(t, []int{len(want), 3, 336, 336}, out.PixelValues.Shape)
		require.Equal(t, [2]int{s[1], s[0]}, out.ImageSize)
		require.Equal(t, g.Tokens, out.Tokens)
		one := make([]byte, 3*336*336*4)
		for i, pic := range pics {
			require.NoError(t, native.Normalize(one, native.F32, pic, 336, 336, CLIPMean, CLIPStd, 255))
			require.Equal(t, one, out.PixelValues.Data[i*len(one):(i+1)*len(one)], "%v picture %d", s, i)
		}
	}
}

// The CLIP crop offsets: torchvision's rounding for the built-in presets, transformers' floor
// for a processor config's. They differ when the margin is odd: 339 - 336 = 3, round(1.5) = 2
// and 3 // 2 = 1 (a 339 x 336 picture is not resized: its short side already is 336).
func TestCLIPCropConvention(t *testing.T) {
	img := &Image{W: 339, H: 336, Pix: make([]byte, 3*339*336)}
	for i := range img.Pix {
		img.Pix[i] = byte(i * 7)
	}
	at := func(x int) []byte {
		win := make([]byte, 3*336*336)
		for y := range 336 {
			copy(win[3*y*336:3*(y+1)*336], img.Pix[3*(y*339+x):])
		}
		out := make([]byte, 3*336*336*4)
		require.NoError(t, native.Normalize(out, native.F32, win, 336, 336, CLIPMean, CLIPStd, 255))
		return out
	}
	crop := func(p Preset) []byte {
		out, err := p.Apply(img, native.F32)
		require.NoError(t, err)
		return out.PixelValues.Data
	}
	hf := CLIP336
	hf.CropFloor = true
	require.Equal(t, at(2), crop(CLIP336))
	require.Equal(t, at(1), crop(hf))
}
