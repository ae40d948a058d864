package media

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/media/audio"
	"dataplane/dataplane/media/picture"
	"dataplane/dataplane/sequence"
	"dataplane/native"
	"dataplane/native/fixtures"
)

// Keys computed by testdata/gen_keys.py: Pillow's pixels, struct.pack, the b3sum command.
var wantKeys = map[string]string{
	"image_200x150.png": "c767dd330233b5d722a1bcab609a548dffcbb22f08135aaf64f7efec47ce05f2",
	"image_200x150.jpg": "18d3a0278351dbd6e1f9208d01ce2b56dd80238ae2e77dacd5b80e2c8e23aee1",
	"audio_7s3.wav":     "0770703235e3c4da6ced05341c9dd8de3efde5642817397aacb7e3e5e84c157e",
}

func read(t testing.TB, name string) []byte {
	b, err := os.ReadFile(fixtures.Path(t, name))
	require.NoError(t, err)
	return b
}

func TestKeysAgainstB3sum(t *testing.T) {
	for _, name := range []string{"image_200x150.png", "image_200x150.jpg"} {
		img, _, err := picture.Decode(read(t, name), picture.Options{})
		require.NoError(t, err)
		require.Equal(t, wantKeys[name], ImageKey(img).Hex(), name)
	}
	clip, err := audio.Load(context.Background(), read(t, "audio_7s3.wav"), audio.Options{})
	require.NoError(t, err)
	require.Equal(t, wantKeys["audio_7s3.wav"], AudioKey(clip.Samples, clip.Rate).Hex())
}

// The same pixels in another container give the same key: the JPEG's decoded pixels written
// as PNG, and a picture stored rotated with an EXIF orientation vs. stored upright.
func TestKeysFollowContentNotContainer(t *testing.T) {
	jpg := read(t, "image_200x150.jpg")
	img, _, err := picture.Decode(jpg, picture.Options{})
	require.NoError(t, err)
	m := image.NewNRGBA(image.Rect(0, 0, img.W, img.H))
	for i := range img.W * img.H {
		copy(m.Pix[4*i:], img.Pix[3*i:3*i+3])
		m.Pix[4*i+3] = 255
	}
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, m))
	a, err := Image(jpg, Preset{Name: "clip-224", Picture: &picture.CLIP224}, Options{})
	require.NoError(t, err)
	b, err := Image(buf.Bytes(), Preset{Name: "clip-224", Picture: &picture.CLIP224}, Options{})
	require.NoError(t, err)
	require.Equal(t, a.Key, b.Key)
	require.Equal(t, a.Input.Data, b.Input.Data)

	// orient6.png is stored sideways with orientation 6; its upright pixels as a plain PNG.
	rot, err := os.ReadFile("picture/testdata/orient6.png")
	require.NoError(t, err)
	up, _, err := picture.Decode(rot, picture.Options{})
	require.NoError(t, err)
	m = image.NewNRGBA(image.Rect(0, 0, up.W, up.H))
	for i := range up.W * up.H {
		copy(m.Pix[4*i:], up.Pix[3*i:3*i+3])
		m.Pix[4*i+3] = 255
	}
	buf.Reset()
	require.NoError(t, png.Encode(&buf, m))
	plain, _, err := picture.Decode(buf.Bytes(), picture.Options{})
	require.NoError(t, err)
	require.Equal(t, ImageKey(up), ImageKey(plain))
	require.NotEqual(t, ImageKey(up), ImageKey(&picture.Image{W: up.H, H: up.W, Pix: up.Pix})) // same bytes, other shape

	// The WAV and a FLAC of it.
	dir := t.TempDir()
	flac := filepath.Join(dir, "a.flac")
	out, err := exec.Command("ffmpeg", "-nostdin", "-loglevel", "error", "-i", fixtures.Path(t, "audio_7s3.wav"), flac).CombinedOutput()
	require.NoError(t, err, "%s", out)
	fl, err := os.ReadFile(flac)
	require.NoError(t, err)
	whisper, err := Lookup("whisper-80")
	require.NoError(t, err)
	x, err := Audio(context.Background(), read(t, "audio_7s3.wav"), whisper, Options{})
	require.NoError(t, err)
	y, err := Audio(context.Background(), fl, whisper, Options{})
	require.NoError(t, err)
	require.Equal(t, x.Key, y.Key)
	require.Equal(t, wantKeys["audio_7s3.wav"], x.Key.Hex())
}

func TestPresetsAndPipelines(t *testing.T) {
	names := map[string]bool{}
	for _, p := range Presets() {
		names[p.Name] = true
		require.NotEmpty(t, p.Summary())
	}
	for _, n := range []string{"clip-224", "clip-336", "siglip-384", "whisper-80", "whisper-128", "qwen2-vl", "internvl", "qwen2-audio", "llava-next"} {
		require.True(t, names[n], n)
	}
	_, err := Lookup("nope")
	require.ErrorContains(t, err, "have clip-224")

	clip336, _ := Lookup("clip-336")
	n, err := ImageTokens(read(t, "image_200x150.jpg"), clip336)
	require.NoError(t, err)
	require.Equal(t, 576, n)
	r, err := Image(read(t, "image_200x150.png"), clip336, Options{DType: native.BF16})
	require.NoError(t, err)
	require.Equal(t, 576, r.Tokens)
	require.Equal(t, native.BF16, r.Input.DType)
	require.Equal(t, []int{1, 3, 336, 336}, r.Input.Shape)

	w128, _ := Lookup("whisper-128")
	hf := audio.HF
	a, err := Audio(context.Background(), read(t, "audio_7s3.wav"), w128, Options{Convention: &hf})
	require.NoError(t, err)
	require.Equal(t, 1500, a.Tokens)
	require.Equal(t, []int{1, 128, 3000}, a.Input.Shape)
	require.Contains(t, a.Detail, "hf convention")

	// LLaVA-NeXT: 200x150 goes to the 336x672 (h x w) grid: 2 tiles after the base picture.
	next, _ := Lookup("llava-next")
	r, err = Image(read(t, "image_200x150.png"), next, Options{})
	require.NoError(t, err)
	require.Equal(t, []int{3, 3, 336, 336}, r.Input.Shape)
	require.Equal(t, 1368, r.Tokens) // gen_tokens.py's llava_next(200, 150)
	require.Equal(t, [2]int{150, 200}, r.ImageSize)
	n, err = ImageTokens(read(t, "image_200x150.jpg"), next)
	require.NoError(t, err)
	require.Equal(t, r.Tokens, n)
	_, err = Video(context.Background(), nil, [][]byte{read(t, "image_200x150.png")}, next, Options{})
	require.ErrorContains(t, err, "not for video")

	// Presets from a checkpoint's processor files; the first directory that has them.
	s, err := LoadProcessor("", t.TempDir(), "hfproc/testdata/configs/qwen2-audio-7b-instruct")
	require.NoError(t, err)
	img, snd := FromProcessor(s)
	require.Nil(t, img)
	require.Equal(t, "qwen2-audio", snd.Name)
	require.Contains(t, snd.Summary(), "the first 30 s only")
	a, err = Audio(context.Background(), read(t, "audio_7s3.wav"), *snd, Options{})
	require.NoError(t, err)
	require.Equal(t, 750*73/300, a.Tokens) // 7.3 s: 730 frames -> 365 -> 182

	_, err = Audio(context.Background(), nil, clip336, Options{})
	require.ErrorContains(t, err, "not for audio")
	_, err = Image(nil, w128, Options{})
	require.ErrorContains(t, err, "not for images")
}

func TestDataURL(t *testing.T) {
	f := func(s string, typ string, params map[string]string, b64 bool, data string) {
		t.Helper()
		d, err := ParseDataURL(s, 1<<20)
		require.NoError(t, err, s)
		require.Equal(t, typ, d.MediaType)
		require.Equal(t, params, d.Params)
		require.Equal(t, b64, d.Base64)
		require.Equal(t, data, string(d.Data))
	}
	f("data:,Hello%2C%20World%21", "text/plain", map[string]string{}, false, "Hello, World!")
	f("data:text/plain;base64,SGVsbG8sIFdvcmxkIQ==", "text/plain", map[string]string{}, true, "Hello, World!")
	f("data:text/plain;base64,SGVsbG8sIFdvcmxkIQ", "text/plain", map[string]string{}, true, "Hello, World!") // no padding
	f("DATA:Image/PNG;Base64,AAEC", "image/png", map[string]string{}, true, "\x00\x01\x02")
	f("data:text/html;charset=utf-8,%3Ch1%3E", "text/html", map[string]string{"charset": "utf-8"}, false, "<h1>")
	f("data:image/jpeg;base64,-_8=", "image/jpeg", map[string]string{}, true, "\xfb\xff") // URL-safe alphabet
	d, err := ParseDataURL("data:audio/wav;base64,AAAA", 10)
	require.NoError(t, err)
	require.Equal(t, sequence.Audio, d.Modality())

	bad := func(s string, max int, words string, at int) {
		t.Helper()
		_, err := ParseDataURL(s, max)
		require.ErrorIs(t, err, ErrDataURL, s)
		var de *DataURLError
		require.True(t, errors.As(err, &de))
		require.Contains(t, err.Error(), words, s)
		require.Equal(t, at, de.Offset, s)
	}
	bad("http://x/y.png", 100, "does not start with", 0)
	bad("data:image/png;base64", 100, "no comma", 21)
	bad("data:image;base64,AAAA", 100, "not type/subtype", 5)
	bad("data:image/png;base64,AA!A", 100, "bad base64", 24)
	bad("data:image/png;base64,"+strings.Repeat("A", 400), 100, "decode to more than 100", 22)
	bad("data:image/png;base64;base64,AA", 100, "base64 given twice", 22)
	bad("data:text/plain;x,abc", 100, "not name=value", 16)
	bad("data:,ab%4", 100, "bad percent-escape", 8)
	bad("data:,abcdef", 3, "more than 3 bytes", 9)
}

func FuzzParseDataURL(f *testing.F) {
	for _, s := range []string{"data:,Hello%2C%20World%21", "data:image/png;base64,iVBORw0KGgo=", "data:;base64,", "data:a/b;c=d;base64,-_8", "data:,%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDataURL(s, 1<<16)
		if err != nil {
			require.ErrorIs(t, err, ErrDataURL)
			return
		}
		require.LessOrEqual(t, len(d.Data), 1<<16)
		require.NotEmpty(t, d.MediaType)
	})
}

// CountOnly gives what the full pipeline gives for tokens and key, with no input tensor: for
// every image preset (an EXIF-rotated JPEG among the pictures, so the upright size counts) and
// the audio ones.
func TestCountOnlyAgreesWithTheFullPipeline(t *testing.T) {
	orient6, err := os.ReadFile(filepath.Join("picture", "testdata", "orient6.jpg")) // rotated 90°
	require.NoError(t, err)
	pictures := map[string][]byte{"png": read(t, "image_200x150.png"), "jpg": read(t, "image_200x150.jpg"), "orient6": orient6}
	for _, p := range Presets() {
		switch {
		case p.Picture != nil:
			for name, data := range pictures {
				full, err := Image(data, p, Options{})
				require.NoError(t, err, "%s %s", p.Name, name)
				count, err := Image(data, p, Options{CountOnly: true})
				require.NoError(t, err)
				require.Equal(t, full.Tokens, count.Tokens, "%s %s", p.Name, name)
				require.Equal(t, full.Key, count.Key, "%s %s", p.Name, name)
				require.Empty(t, count.Input.Data)
			}
		case p.Audio != nil:
			full, err := Audio(context.Background(), read(t, "audio_7s3.wav"), p, Options{})
			require.NoError(t, err, p.Name)
			count, err := Audio(context.Background(), read(t, "audio_7s3.wav"), p, Options{CountOnly: true})
			require.NoError(t, err)
			require.Equal(t, full.Tokens, count.Tokens, p.Name)
			require.Equal(t, full.Key, count.Key, p.Name)
			require.Empty(t, count.Input.Data)
		}
	}
}
