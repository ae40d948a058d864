package audio

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/media/ffmpeg/ffmpegtest"
	"dataplane/native"
	"dataplane/native/fixtures"
)

func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("random seed %#x", seed)
	return rand.New(rand.NewPCG(seed, 11))
}

// encode converts the fixture with ffmpeg into dir/name using the given output options.
func encode(t testing.TB, src, dir, name string, opts ...string) []byte {
	t.Helper()
	path := filepath.Join(dir, name)
	ffmpegtest.Run(t, append(append([]string{"-i", src}, opts...), path)...)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}

// ffmpegF32 is ffmpeg's own decode of a file to float32 at its source rate, its channels
// averaged (in float64) to mono.
func ffmpegF32(t testing.TB, path string, channels int) []float32 {
	raw := ffmpegtest.Run(t, "-i", path, "-f", "f32le", "-acodec", "pcm_f32le", "-")
	out := make([]float32, len(raw)/4/channels)
	for i := range out {
		var s float64
		for c := range channels {
			s += float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*(i*channels+c):])))
		}
		out[i] = float32(s / float64(channels))
	}
	return out
}

func fixtureSamples(t testing.TB) []float32 {
	raw, err := os.ReadFile(fixtures.Path(t, "audio_7s3.wav"))
	require.NoError(t, err)
	out := make([]float32, (len(raw)-44)/2)
	for i := range out {
		out[i] = float32(int16(binary.LittleEndian.Uint16(raw[44+2*i:]))) / 32768
	}
	return out
}

func maxAbsDiff(a, b []float32) float64 {
	w := 0.0
	for i := range min(len(a), len(b)) {
		w = math.Max(w, math.Abs(float64(a[i])-float64(b[i])))
	}
	return w
}

// The shared WAV, re-encoded by ffmpeg in every WAV encoding and in FLAC, decoded by us and
// compared with ffmpeg's own decode of the same file (lossless ones also with the source).
func TestDecodeFormatsAgainstFFmpeg(t *testing.T) {
	src := fixtures.Path(t, "audio_7s3.wav")
	orig := fixtureSamples(t)
	dir := t.TempDir()
	cases := []struct {
		name     string
		opts     []string
		format   string
		channels int
		lossless bool
	}{
		{"s16.wav", nil, "wav", 1, true},
		{"u8.wav", []string{"-c:a", "pcm_u8"}, "wav", 1, false},
		{"s24.wav", []string{"-c:a", "pcm_s24le"}, "wav", 1, true},
		{"s32.wav", []string{"-c:a", "pcm_s32le"}, "wav", 1, true},
		{"f32.wav", []string{"-c:a", "pcm_f32le"}, "wav", 1, true},
		{"f64.wav", []string{"-c:a", "pcm_f64le"}, "wav", 1, true},
		{"alaw.wav", []string{"-c:a", "pcm_alaw"}, "wav", 1, false},
		{"mulaw.wav", []string{"-c:a", "pcm_mulaw"}, "wav", 1, false},
		{"stereo.wav", []string{"-ac", "2"}, "wav", 2, false}, // ffmpeg's upmix scales the channels
		{"ext6.wav", []string{"-af", "pan=5.1|c0=c0|c1=c0|c2=c0|c3=c0|c4=c0|c5=c0", "-c:a", "pcm_s24le"}, "wav", 6, true},
		{"s16.flac", nil, "flac", 1, true},
		{"s24.flac", []string{"-sample_fmt", "s32", "-bits_per_raw_sample", "24"}, "flac", 1, true},
		{"stereo.flac", []string{"-ac", "2"}, "flac", 2, false},
	}
	for _, c := range cases {
		data := encode(t, src, dir, c.name, c.opts...)
		clip, err := Decode(context.Background(), data, Options{})
		require.NoError(t, err, c.name)
		require.Equal(t, c.format, clip.Format, c.name)
		require.Equal(t, c.channels, clip.SourceChannels, c.name)
		require.Equal(t, 16000, clip.Rate, c.name)
		want := ffmpegF32(t, filepath.Join(dir, c.name), c.channels)
		require.Len(t, clip.Samples, len(want), c.name)
		d := maxAbsDiff(want, clip.Samples)
		t.Logf("%s: max |ours - ffmpeg| = %.3g", c.name, d)
		require.LessOrEqual(t, d, 1e-6, c.name)
		if c.lossless {
			require.LessOrEqual(t, maxAbsDiff(orig, clip.Samples), 1e-6, "%s against the source", c.name)
		}
	}
}

// MP3 (LAME through ffmpeg) decoded by go-mp3 against ffmpeg's decoder. go-mp3 does not trim
// the encoder delay, so the signals are aligned first.
func TestDecodeMP3(t *testing.T) {
	dir := t.TempDir()
	data := encode(t, fixtures.Path(t, "audio_7s3.wav"), dir, "a.mp3", "-c:a", "libmp3lame", "-b:a", "192k", "-ar", "44100")
	clip, err := Decode(context.Background(), data, Options{})
	require.NoError(t, err)
	require.Equal(t, "mp3", clip.Format)
	require.Equal(t, 44100, clip.Rate)
	want := ffmpegF32(t, filepath.Join(dir, "a.mp3"), 1)
	best, lag := math.Inf(1), 0
	for l := 0; l <= 3000; l++ {
		var e float64
		for i := 2000; i < 40000; i += 7 {
			d := float64(clip.Samples[i+l] - want[i])
			e += d * d
		}
		if e < best {
			best, lag = e, l
		}
	}
	var sig, noise float64
	for i := 1000; i < len(want)-5000 && i+lag < len(clip.Samples); i++ {
		sig += float64(want[i]) * float64(want[i])
		d := float64(clip.Samples[i+lag] - want[i])
		noise += d * d
	}
	snr := 10 * math.Log10(sig/noise)
	t.Logf("go-mp3 vs ffmpeg: lag %d samples, SNR %.1f dB", lag, snr)
	require.Greater(t, snr, 60.0)
}

// Formats without a Go decoder go through ffmpeg (openai/whisper's load_audio command), or
// fail clearly when there is no ffmpeg.
func TestDecodeThroughFFmpeg(t *testing.T) {
	dir := t.TempDir()
	src := fixtures.Path(t, "audio_7s3.wav")
	for _, name := range []string{"a.ogg", "a.m4a"} {
		data := encode(t, src, dir, name, "-ar", "44100")
		clip, err := Decode(context.Background(), data, Options{})
		require.NoError(t, err, name)
		require.Equal(t, "ffmpeg", clip.Format)
		require.Equal(t, 16000, clip.Rate)
		require.InDelta(t, 7.3, clip.Seconds(), 0.05, name)
		_, err = Decode(context.Background(), data, Options{FFmpeg: "/nonexistent/ffmpeg"})
		require.ErrorIs(t, err, ErrFormat)
		require.Contains(t, err.Error(), "needs ffmpeg")
	}
	// ForceFFmpeg gives whisper's own samples: for the 16 kHz mono fixture, the file's.
	data, err := os.ReadFile(src)
	require.NoError(t, err)
	clip, err := Decode(context.Background(), data, Options{ForceFFmpeg: true})
	require.NoError(t, err)
	require.Equal(t, fixtureSamples(t), clip.Samples)
}

// Whisper's log-mel of the fixture through the whole path (decode, 16 kHz already, log-mel)
// in both conventions: for audio under 30 s both equal whisper's reference.
func TestLogMelPresetsAgainstWhisper(t *testing.T) {
	data, err := os.ReadFile(fixtures.Path(t, "audio_7s3.wav"))
	require.NoError(t, err)
	clip, err := Load(context.Background(), data, Options{})
	require.NoError(t, err)
	for _, p := range []Preset{Whisper80, Whisper128} {
		want, _ := fixtures.ReadF32(t, fmt.Sprintf("logmel%d_7s3", p.Mels))
		for _, conv := range []Convention{Transcribe, HF} {
			p.Convention = conv
			f, err := p.LogMel(clip.Samples, 0)
			require.NoError(t, err)
			require.Equal(t, 1, f.Windows)
			require.Equal(t, []int{730}, f.AudioFrames)
			d := maxAbsDiff(want, f.Data)
			t.Logf("%s %v: max abs error %.3g", p.Name, conv, d)
			require.LessOrEqual(t, d, 1e-4)
		}
	}
}

// Long audio: windows, and where each convention takes its maximum. The third 30 s chunk is
// 60 dB quieter: under HF its floor is its own max - 8; under transcribe the global one.
func TestLogMelConventionsOnLongAudio(t *testing.T) {
	r := newRand(t)
	n := 2*WindowSamples + 10*SampleRate + r.IntN(SampleRate)
	x := make([]float32, n)
	for i := range x {
		a := 0.3
		if i >= 2*WindowSamples {
			a = 0.0003
		}
		x[i] = float32(a * (math.Sin(float64(i)*0.07) + 0.3*r.NormFloat64()))
	}
	for _, conv := range []Convention{Transcribe, HF} {
		p := Whisper80
		p.Convention = conv
		f, err := p.LogMel(x, 2)
		require.NoError(t, err)
		require.Equal(t, 3, f.Windows)
		require.Equal(t, 3000, f.AudioFrames[1])
		lo := func(w int) (mn, mx float32) {
			mn, mx = float32(math.Inf(1)), float32(math.Inf(-1))
			for _, v := range f.Data[w*80*3000 : (w+1)*80*3000] {
				mn, mx = min(mn, v), max(mx, v)
			}
			return
		}
		_, max0 := lo(0)
		_, max1 := lo(1)
		min2, max2 := lo(2)
		// Scaled s = (x + 4) / 4. The floor is max(M - 8, -10): -10 is log10 of the clamp 1e-10,
		// which the zero padding reaches; M is the window's own max under HF, the file's under
		// transcribe.
		m := max2
		if conv == Transcribe {
			m = max(max0, max1, max2)
			require.Less(t, max2-min2, float32(2))
		}
		floor := (max(4*m-4-8, -10) + 4) / 4
		require.InDelta(t, float64(floor), float64(min2), 1e-5, "%v", conv)
	}
}

func TestTokens(t *testing.T) {
	f := func(p Preset, n, want int) {
		t.Helper()
		require.Equal(t, want, p.Tokens(n), "%s %d samples", p.Name, n)
	}
	f(Whisper80, 480000, 1500)
	f(Whisper80, 116800, 1500)
	f(Whisper128, 480001*2, 3000) // 60 s + 2 samples: frames 6000 -> 2 windows (transcribe)
	f(Qwen2Audio7, 480000, 750)
	f(Qwen2Audio7, 116800, 182)       // 730 frames -> 365 -> 182
	f(Qwen2Audio7, 480000+5*160, 750) // truncated at 30 s, as HF's feature extractor does
	f(Qwen2Audio7, 45*16000, 750)
	f(Qwen2Audio7, 0, 0)
	// Counted per window when a preset keeps every window.
	all := Qwen2Audio7
	all.Truncate = false
	f(all, 480000+160, 750)   // 1 frame in the second window: 0 tokens
	f(all, 480000+5*160, 751) // 5 frames: 1 token
	// 20 ms or less gives Qwen2-Audio no token: refused, as vLLM does.
	for n, want := range map[int]int{1: 0, 320: 0, 321: 1, 16000: 25} {
		got, err := Qwen2Audio7.CheckTokens(n)
		require.Equal(t, want, got, "%d samples", n)
		if want == 0 {
			require.ErrorIs(t, err, ErrTooShort)
		} else {
			require.NoError(t, err)
		}
	}
	n, err := Whisper80.CheckTokens(1)
	require.NoError(t, err)
	require.Equal(t, 1500, n)
}

// A truncating preset's features are the first 30 s's, whatever follows, and its token count
// is the features' attention mask's.
func TestTruncate(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	long := make([]float32, 45*SampleRate)
	for i := range long {
		long[i] = float32(r.NormFloat64() * 0.1)
	}
	p := Qwen2Audio7
	full, err := p.LogMel(long, 2)
	require.NoError(t, err)
	head, err := p.LogMel(long[:WindowSamples], 2)
	require.NoError(t, err)
	require.Equal(t, 1, full.Windows)
	require.Equal(t, head.Data, full.Data)
	require.Equal(t, []int{WindowFrames}, full.AudioFrames)
	require.Equal(t, 750, p.Tokens(len(long)))
	all := p
	all.Truncate = false
	f, err := all.LogMel(long, 2)
	require.NoError(t, err)
	require.Equal(t, 2, f.Windows)
	require.Equal(t, 750+375, all.Tokens(len(long))) // what was counted before: 1,125
}

// Resampling against ffmpeg's default resampler on the same input: a tone's SNR, and how much of
// a tone above the new Nyquist frequency leaks through (aliasing).
func TestResampleOnParWithFFmpeg(t *testing.T) {
	ffmpegtest.Need(t)
	dir := t.TempDir()
	measure := func(rate int, freq float64) (ours, theirs float64) {
		n := rate * 2
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(0.5 * math.Sin(2*math.Pi*freq*float64(i)/float64(rate)))
		}
		raw := make([]byte, 4*n)
		for i, v := range x {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
		}
		in := filepath.Join(dir, fmt.Sprintf("in%d.f32", rate))
		require.NoError(t, os.WriteFile(in, raw, 0o600))
		clip := &Clip{Samples: x, Rate: rate, Format: "test"}
		got, err := clip.Resample(16000)
		require.NoError(t, err)
		outRaw := ffmpegtest.Run(t, "-f", "f32le", "-ar", fmt.Sprint(rate), "-ac", "1", "-i", in, "-ar", "16000", "-f", "f32le", "-")
		ff := make([]float32, len(outRaw)/4)
		for i := range ff {
			ff[i] = math.Float32frombits(binary.LittleEndian.Uint32(outRaw[4*i:]))
		}
		// Error energy against the ideal output (the tone, or silence above Nyquist) over the
		// middle, relative to the input's energy, in dB.
		errDB := func(y []float32) float64 {
			var e, s float64
			for k := 2000; k < 30000; k++ {
				want := 0.0
				if freq < 8000*0.97 {
					want = 0.5 * math.Sin(2*math.Pi*freq*float64(k)/16000)
				}
				d := float64(y[k]) - want
				e += d * d
				s += 0.125
			}
			return 10 * math.Log10(e/s)
		}
		return errDB(got.Samples), errDB(ff)
	}
	for _, c := range []struct {
		rate int
		freq float64
	}{{44100, 1000}, {44100, 5000}, {48000, 440}, {22050, 7000}, {8000, 1000}, {44100, 11000}, {48000, 9500}} {
		ours, theirs := measure(c.rate, c.freq)
		t.Logf("%d Hz, %.0f Hz tone -> 16 kHz: error %.1f dB (ffmpeg %.1f dB)", c.rate, c.freq, ours, theirs)
		// On par: within 4 dB of ffmpeg, or below -100 dB (far under 16-bit noise) anyway.
		require.True(t, ours < theirs+4 || ours < -100, "%d Hz %.0f Hz: %.1f dB, ffmpeg %.1f dB", c.rate, c.freq, ours, theirs)
	}
}

// wavHeader builds a minimal WAV with the given fmt fields and data length.
func wavHeader(format, channels, rate, bits, blockAlign int, data []byte) []byte {
	b := []byte("RIFF\x00\x00\x00\x00WAVEfmt \x10\x00\x00\x00")
	b = binary.LittleEndian.AppendUint16(b, uint16(format))
	b = binary.LittleEndian.AppendUint16(b, uint16(channels))
	b = binary.LittleEndian.AppendUint32(b, uint32(rate))
	b = binary.LittleEndian.AppendUint32(b, uint32(rate*blockAlign))
	b = binary.LittleEndian.AppendUint16(b, uint16(blockAlign))
	b = binary.LittleEndian.AppendUint16(b, uint16(bits))
	b = append(b, "data"...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// Bad inputs: each a typed error naming the problem.
func TestBadInputs(t *testing.T) {
	good, err := os.ReadFile(fixtures.Path(t, "audio_7s3.wav"))
	require.NoError(t, err)
	flacData := encode(t, fixtures.Path(t, "audio_7s3.wav"), t.TempDir(), "a.flac")
	pcm := make([]byte, 3200)
	f := func(name string, data []byte, opts Options, kind error, words string) {
		t.Helper()
		_, err := Decode(context.Background(), data, opts)
		require.Error(t, err, name)
		require.ErrorIs(t, err, kind, "%s: %v", name, err)
		require.Contains(t, err.Error(), words, name)
	}
	f("empty", nil, Options{}, ErrEmpty, "empty input")
	f("header only", good[:40], Options{}, ErrCorrupt, "no data chunk")
	f("zero-length data", wavHeader(1, 1, 16000, 16, 2, nil), Options{}, ErrEmpty, "no whole frame")
	f("zero channels", wavHeader(1, 0, 16000, 16, 0, pcm), Options{}, ErrRate, "0 channels")
	f("absurd rate", wavHeader(1, 1, 50_000_000, 16, 2, pcm), Options{}, ErrRate, "50000000 Hz")
	f("zero rate", wavHeader(1, 1, 0, 16, 2, pcm), Options{}, ErrRate, "sample rate 0")
	f("12-bit", wavHeader(1, 1, 16000, 12, 2, pcm), Options{}, ErrUnsupported, "12 bits")
	f("adpcm", wavHeader(2, 1, 16000, 4, 1, pcm), Options{}, ErrUnsupported, "encoding 0x2")
	f("block align", wavHeader(1, 2, 16000, 16, 2, pcm), Options{}, ErrCorrupt, "block align")
	f("too long", wavHeader(1, 1, 16000, 16, 2, make([]byte, 16000*2*3)), Options{MaxSeconds: 2}, ErrTooLong, "3.0 s")
	f("nan", wavHeader(3, 1, 16000, 32, 4, []byte{0, 0, 0xc0, 0x7f}), Options{}, ErrCorrupt, "NaN")
	f("truncated flac", flacData[:len(flacData)/3], Options{}, ErrCorrupt, "flac")
	f("flac header only", []byte("fLaC"), Options{}, ErrCorrupt, "flac")
	f("long flac", flacData, Options{MaxSeconds: 1}, ErrTooLong, "7.3 s")
	f("mp3 garbage", append([]byte("ID3\x03\x00\x00\x00\x00\x00\x00"), bytes.Repeat([]byte{0x13}, 500)...), Options{}, ErrCorrupt, "mp3")
	f("unknown, no ffmpeg", []byte("hello, this is not audio"), Options{FFmpeg: "/nonexistent/ffmpeg"}, ErrFormat, "needs ffmpeg")
	ffmpegtest.Need(t)
	f("unknown, ffmpeg refuses", []byte("hello, this is not audio at all"), Options{}, ErrFFmpeg, "ffmpeg")
	// Resampling from a rate the kernel refuses.
	_, err = (&Clip{Samples: make([]float32, 10), Rate: 5_000_000}).Resample(16000)
	require.ErrorIs(t, err, ErrRate)
	_, err = Whisper80.LogMel(nil, 1)
	require.ErrorIs(t, err, ErrEmpty)
}

func fuzzSeeds(f *testing.F) {
	good, err := os.ReadFile(fixtures.Path(f, "audio_7s3.wav"))
	require.NoError(f, err)
	f.Add(good[:2000])
	f.Add(wavHeader(3, 2, 44100, 32, 8, make([]byte, 64)))
	f.Add(wavHeader(0xfffe, 1, 8000, 8, 1, make([]byte, 16)))
	f.Add([]byte("fLaC\x00\x00\x00\x22\x10\x00\x10\x00\x00\x00\x00\x00\x00\x00\x0a\xc4\x42\xf0\x00\x00\x00\x00"))
	f.Add([]byte("ID3\x03\x00\x00\x00\x00\x00\x00\xff\xfb\x90\x00"))
}

// The Go decoders on arbitrary bytes (ffmpeg is never run here): a typed error or a clip whose
// samples are finite and within the duration limit.
func FuzzDecode(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		if sniff(data) == "" {
			return // would go to ffmpeg
		}
		clip, err := Decode(context.Background(), data, Options{MaxSeconds: 5, FFmpeg: "/nonexistent/ffmpeg"})
		if err != nil {
			var e *Error
			require.ErrorAs(t, err, &e)
			return
		}
		require.NotEmpty(t, clip.Samples)
		require.LessOrEqual(t, clip.Seconds(), 5.0+1e-9)
		for _, v := range clip.Samples {
			require.False(t, math.IsNaN(float64(v)) || math.IsInf(float64(v), 0))
		}
	})
}

var _ = native.F32
