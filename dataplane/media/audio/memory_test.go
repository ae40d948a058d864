package audio

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/native/fixtures"
)

// DecodeBytes bounds what Load allocates for WAV (exact from the header: the samples, the mono
// mix, the 16 kHz clip), and is at least the buffers Load keeps for the other formats, whose
// sample buffers grow by append (held at most 2.25 times their size at once).
func TestDecodeBytes(t *testing.T) {
	ctx := context.Background()
	allocated := func(f func()) int64 {
		runtime.GC()
		var a, b runtime.MemStats
		runtime.ReadMemStats(&a)
		f()
		runtime.ReadMemStats(&b)
		return int64(b.TotalAlloc - a.TotalAlloc)
	}
	stereo := make([]byte, 4*44100*3) // 3 s of 16-bit stereo at 44.1 kHz
	for i := range stereo {
		stereo[i] = byte(i * 7)
	}
	dir := t.TempDir()
	src := fixtures.Path(t, "audio_7s3.wav")
	for _, c := range []struct {
		name  string
		data  []byte
		exact bool
	}{
		{"wav mono 16 kHz", encode(t, src, dir, "a.wav", "-ar", "16000"), true},
		{"wav stereo 44.1 kHz", wavHeader(1, 2, 44100, 16, 4, stereo), true},
		{"flac stereo 44.1 kHz", encode(t, src, dir, "a.flac", "-ac", "2", "-ar", "44100"), false},
		{"mp3 44.1 kHz", encode(t, src, dir, "a.mp3", "-c:a", "libmp3lame", "-ar", "44100"), false},
		{"ogg (ffmpeg)", encode(t, src, dir, "a.ogg", "-c:a", "libvorbis"), false},
	} {
		est := DecodeBytes(c.data, Options{})
		var clip *Clip
		var err error
		got := allocated(func() { clip, err = Load(ctx, c.data, Options{}) })
		require.NoError(t, err, c.name)
		kept := int64(4 * len(clip.Samples))
		t.Logf("%-22s estimate %9d allocated %9d, the 16 kHz clip %d", c.name, est, got, kept)
		require.GreaterOrEqual(t, est, kept, c.name)
		if c.exact {
			require.LessOrEqual(t, got, est, c.name)
		}
	}
	require.Zero(t, DecodeBytes([]byte("RIFF\x00\x00\x00\x00WAVE"), Options{}), "no header: Load fails first")
	// ffmpeg's bound is the duration limit's worth.
	require.Equal(t, int64(10*16000*2*9/4+10*16000*4+audioOverhead), DecodeBytes([]byte("OggS"), Options{MaxSeconds: 10}))
}
