package audio

import (
	"bytes"
	"encoding/binary"

	"github.com/hajimehoshi/go-mp3"

	"dataplane/native"
)

// DecodeBytes is what Load holds at its peak for data, in bytes, from the headers alone,
// counting every sample buffer it allocates as held until it returns (a buffer grown by append
// or io.ReadAll counts 2.25 times its final size: the old and the new array during the last
// copy):
//   - WAV: the interleaved float32 samples (frames·channels·4, exact from the data chunk), the
//     mono mix when there are several channels (frames·4) and the 16 kHz clip when the rate
//     differs (its length·4);
//   - FLAC: the same from STREAMINFO's sample count (the samples grown by append: a hostile
//     header's count is not worth allocating up front); when it is 0 ("unknown"), the duration
//     limit's worth at the stream's rate;
//   - MP3: go-mp3's 16-bit stereo PCM (its length from the frame headers, read by io.ReadAll),
//     the float32 stereo samples, the mono mix and the 16 kHz clip;
//   - anything else, and everything with ForceFFmpeg: the duration limit's worth of 16 kHz
//     16-bit mono read by io.ReadAll, and its float32 samples (a stated bound: ffmpeg's output
//     length is known only once it is read).
//
// Each adds audioOverhead. Input whose header does not parse gives 0: Load then fails before
// it allocates samples. For FLAC and MP3 this is the peak of what is referenced; the decoders
// allocate more in all (per-frame buffers, the arrays append outgrew) that is garbage by then.
func DecodeBytes(data []byte, opts Options) int64 {
	n := decodeBytes(data, opts)
	if n == 0 {
		return 0
	}
	return n + audioOverhead
}

// audioOverhead is the clip, the decoder's state and the resampler's filter: measured at under
// 16 KiB for WAV (TestDecodeBytes).
const audioOverhead = 32 << 10

func decodeBytes(data []byte, opts Options) int64 {
	const f32 = 4
	clip := func(frames, channels int64, rate int) int64 { // downmix + resample
		n := int64(0)
		if channels > 1 {
			n += frames * f32
		}
		if rate != SampleRate {
			n += max(int64(native.ResampleLen(int(frames), rate, SampleRate)), 0) * f32
		}
		return n
	}
	grown := func(n int64) int64 { return n * 9 / 4 }
	format := sniff(data)
	if opts.ForceFFmpeg || format == "" {
		pcm := int64(opts.maxSeconds()*SampleRate) * 2
		return grown(pcm) + pcm/2*f32
	}
	switch format {
	case "wav":
		f, _, frames, err := parseWAV(data, opts.maxSeconds())
		if err != nil {
			return 0
		}
		ch := int64(f.channels)
		return frames*ch*f32 + clip(frames, ch, f.rate)
	case "flac":
		rate, ch, total, ok := flacStreamInfo(data)
		if !ok || rate < MinRate || rate > MaxRate {
			return 0
		}
		frames := int64(opts.maxSeconds() * float64(rate))
		if total > 0 {
			frames = min(total, frames)
		}
		return grown(frames*ch*f32) + clip(frames, ch, rate)
	case "mp3":
		d, err := mp3.NewDecoder(bytes.NewReader(data))
		if err != nil || d.SampleRate() < MinRate || d.SampleRate() > MaxRate {
			return 0
		}
		pcm := d.Length() // 4 bytes a stereo frame
		if limit := int64(opts.maxSeconds()*float64(d.SampleRate())) * 4; pcm < 0 || pcm > limit {
			pcm = limit
		}
		frames := pcm / 4
		return grown(pcm+4) + frames*2*f32 + clip(frames, 2, d.SampleRate())
	}
	return 0
}

// flacStreamInfo reads the rate, channels and total samples (0: unknown) from the STREAMINFO
// block that must follow "fLaC".
func flacStreamInfo(data []byte) (rate int, channels, total int64, ok bool) {
	if len(data) < 8+34 || string(data[:4]) != "fLaC" || data[4]&0x7f != 0 {
		return 0, 0, 0, false
	}
	si := data[8:]
	v := binary.BigEndian.Uint64(si[10:]) // rate 20 bits, channels-1 3, bits-1 5, samples 36
	rate = int(v >> 44)
	channels = int64(v>>41&7) + 1
	total = int64(v & (1<<36 - 1))
	return rate, channels, total, true
}
