package media

import (
	"bytes"
	"compress/zlib"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/media/admit"
	"dataplane/dataplane/media/ffmpeg/ffmpegtest"
	"dataplane/dataplane/media/picture"
	"dataplane/dataplane/media/video"
	"dataplane/native"
)

// zeroPNG is a side x side RGB PNG of zeros (compressed to almost nothing, as in the request
// that made a 5 MB body hold 6 GB): image/png decodes it into an RGBA image, then it is copied
// to RGB.
func zeroPNG(t testing.TB, side int) []byte {
	chunk := func(b []byte, typ string, body []byte) []byte {
		b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
		c := append([]byte(typ), body...)
		return binary.BigEndian.AppendUint32(append(b, c...), crc32.ChecksumIEEE(c))
	}
	ihdr := binary.BigEndian.AppendUint32(nil, uint32(side))
	ihdr = binary.BigEndian.AppendUint32(ihdr, uint32(side))
	b := chunk([]byte("\x89PNG\r\n\x1a\n"), "IHDR", append(ihdr, 8, 2, 0, 0, 0))
	var z bytes.Buffer
	zw, err := zlib.NewWriterLevel(&z, zlib.BestSpeed)
	require.NoError(t, err)
	row := make([]byte, 1+3*side)
	for range side {
		_, err = zw.Write(row)
		require.NoError(t, err)
	}
	require.NoError(t, zw.Close())
	return chunk(chunk(b, "IDAT", z.Bytes()), "IEND", nil)
}

// ledger is an Admit hook that tracks the bytes outstanding, their maximum, and every call.
type ledger struct {
	mu           sync.Mutex
	out, maxOut  int64
	calls, freed int
	refuseAt     int // refuse the call with this number (1-based); 0: never
}

var errBudget = errors.New("over the test budget")

func (l *ledger) admit(n int64) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if l.calls == l.refuseAt {
		return nil, errBudget
	}
	l.out += n
	l.maxOut = max(l.maxOut, l.out)
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.out -= n
		l.freed++
	}, nil
}

// peakHeap runs f while sampling the live heap every millisecond, with the collector made
// eager (GOGC=10) so that the heap follows what is referenced; it returns the most the heap
// grew over its size before f.
func peakHeap(t testing.TB, f func()) int64 {
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := int64(ms.HeapAlloc)
	var peak int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, int64(ms.HeapAlloc)-base)
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	f()
	close(stop)
	<-done
	return peak
}

// Sixteen pictures taken as a video, fifteen of them large and zero-filled: the full-size frames
// are decoded one at a time. With an Admit hook, at most one frame's decode bytes are ever
// outstanding; and the heap itself grows by about one frame, not sixteen. (The request seen in
// production had 9400x9400 pictures; 2000x2000 keeps the same shape and the test quick.) The
// heap bound allows for the decoder image of the frame before, garbage not yet collected.
func TestVideoPicturesPeakIsOneFrame(t *testing.T) {
	const side, frames = 2000, 16
	big := zeroPNG(t, side)
	small := zeroPNG(t, 64)
	images := [][]byte{small}
	for range frames - 1 {
		images = append(images, big)
	}
	info, err := picture.DecodeConfig(big)
	require.NoError(t, err)
	one := picture.DecodeBytes(info, picture.Options{})
	rgb := int64(3 * side * side)

	clip, _ := Lookup("clip-224")
	var l ledger
	var res *Result
	grew := peakHeap(t, func() {
		res, err = Video(context.Background(), nil, images, clip, Options{Admit: l.admit, Video: video.Options{Frames: frames}})
	})
	require.NoError(t, err)
	require.Equal(t, []int{frames, 3, 224, 224}, res.Input.Shape)
	t.Logf("%d frames of %dx%d: one frame's decode %d MB, all frames' RGB %d MB; admitted at most %d MB; heap grew %d MB",
		frames, side, side, one>>20, frames*rgb>>20, l.maxOut>>20, grew>>20)
	require.Equal(t, frames, l.calls)
	require.Equal(t, frames, l.freed)
	require.Zero(t, l.out, "every admission released")
	require.LessOrEqual(t, l.maxOut, one, "at most one frame's decode outstanding")
	out := int64(len(res.Input.Data))
	require.Less(t, grew, 2*one+out, "the heap holds about one frame")
	require.Less(t, grew, frames*rgb/2, "far below every frame held")
}

// The same through ffmpeg: one raw frame buffer for all the chosen frames.
func TestVideoFFmpegPeakIsOneFrame(t *testing.T) {
	const w, h, frames = 1920, 1080, 16
	path := filepath.Join(t.TempDir(), "big.mkv")
	ffmpegtest.Run(t, "-f", "lavfi", "-i", "testsrc2=size=1920x1080:rate=8:duration=2", "-c:v", "ffv1", "-pix_fmt", "bgr0", path)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	clip, _ := Lookup("clip-224")
	var l ledger
	var res *Result
	grew := peakHeap(t, func() {
		res, err = Video(context.Background(), data, nil, clip, Options{Admit: l.admit, Video: video.Options{Frames: frames}})
	})
	require.NoError(t, err)
	require.Equal(t, []int{frames, 3, 224, 224}, res.Input.Shape)
	frame := int64(3 * w * h)
	t.Logf("%d frames of %dx%d (%d MB each): admitted at most %d MB in %d call(s); heap grew %d MB",
		frames, w, h, frame>>20, l.maxOut>>20, l.calls, grew>>20)
	require.Equal(t, frame, l.maxOut)
	require.Zero(t, l.out)
	require.Less(t, grew, 3*frame+int64(len(res.Input.Data)), "the heap holds about one frame")
	require.Less(t, grew, frames*frame/4, "far below every frame held")
}

// A refusal stops the decode and comes back naming what was refused, with the hook's error
// reachable by errors.Is and the *admit.Error by errors.As.
func TestAdmitRefused(t *testing.T) {
	ctx := context.Background()
	clip, _ := Lookup("clip-224")
	whisper, _ := Lookup("whisper-80")
	png := zeroPNG(t, 100)
	refused := func(name string, err error, bytes int64, words ...string) {
		t.Helper()
		require.ErrorIs(t, err, errBudget, name)
		var ae *admit.Error
		require.ErrorAs(t, err, &ae, name)
		if bytes > 0 {
			require.Equal(t, bytes, ae.Bytes, name)
		}
		for _, w := range words {
			require.ErrorContains(t, err, w, name)
		}
	}
	info, err := picture.DecodeConfig(png)
	require.NoError(t, err)
	l := ledger{refuseAt: 1}
	_, err = Image(png, clip, Options{Admit: l.admit})
	refused("image", err, picture.DecodeBytes(info, picture.Options{}), "png 100x100")

	// The fourth picture of a list is refused: the error names it; the three before were
	// released.
	l = ledger{refuseAt: 4}
	_, err = Video(ctx, nil, [][]byte{png, png, png, png, png}, clip, Options{Admit: l.admit, Video: video.Options{Frames: 5}})
	refused("pictures", err, 0, "picture 3")
	require.Equal(t, 3, l.freed)
	require.Zero(t, l.out)

	// Keyframe sampling: the thumbnails, then each picture's decode for its thumbnail.
	l = ledger{refuseAt: 3}
	_, err = Video(ctx, nil, [][]byte{png, png, png}, clip, Options{Admit: l.admit, Video: video.Options{Sampling: video.Keyframe, Frames: 2}})
	refused("keyframe pictures", err, 0, "picture 1")
	require.Zero(t, l.out)

	mkv, _ := clip4s(t)
	l = ledger{refuseAt: 1}
	_, err = Video(ctx, mkv, nil, clip, Options{Admit: l.admit, Video: video.Options{Frames: 4}})
	refused("ffmpeg frames", err, 3*96*64, "frames", "96x64")

	l = ledger{refuseAt: 1}
	_, err = Audio(ctx, read(t, "audio_7s3.wav"), whisper, Options{Admit: l.admit})
	refused("audio", err, 0, "audio")

	// Nil: no accounting, and a hook that admits everything changes nothing.
	a, err := Video(ctx, mkv, nil, clip, Options{Video: video.Options{Frames: 4}})
	require.NoError(t, err)
	l = ledger{}
	b, err := Video(ctx, mkv, nil, clip, Options{Admit: l.admit, Video: video.Options{Frames: 4}})
	require.NoError(t, err)
	require.Equal(t, a.Key, b.Key)
	require.Equal(t, a.Input.Data, b.Input.Data)
	require.Equal(t, l.calls, l.freed)
}

// clip4s is clip's lossless video alone.
func clip4s(t testing.TB) ([]byte, [][]byte) { return clip(t, "testsrc2") }

var _ = native.F32
