// Package audio turns audio bytes into Whisper-family encoder inputs: WAV (own parser), FLAC and
// MP3 (pure-Go decoders), anything else through the ffmpeg command when it is installed; mixed
// down to mono, resampled to 16 kHz (windowed sinc, native), then Whisper's log-mel spectrogram
// (native) in either the openai/whisper transcribe or the Hugging Face convention (logmel.go).
package audio

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"dataplane/native"
)

// Limits on what a file may declare.
const (
	MinRate     = 1000   // Hz; lower is not audio we can resample sensibly
	MaxRate     = 384000 // Hz; the highest rate in common use (DXD)
	MaxChannels = 64
	// SampleRate is the rate every encoder here takes.
	SampleRate = native.WhisperSampleRate
)

// Clip is decoded audio: mono float32 samples (nominally in [-1, 1)) at Rate Hz.
type Clip struct {
	Samples []float32
	Rate    int
	// What the source was.
	Format         string // "wav", "flac", "mp3" or "ffmpeg"
	SourceRate     int
	SourceChannels int
}

// Seconds is the clip's duration.
func (c *Clip) Seconds() float64 { return float64(len(c.Samples)) / float64(c.Rate) }

// Options bound decoding. The zero value means the defaults below.
type Options struct {
	// MaxSeconds refuses longer audio (from the header where the format says, else while
	// decoding). 0: DefaultMaxSeconds.
	MaxSeconds float64
	// FFmpeg is the ffmpeg command for formats without a Go decoder ("": "ffmpeg" on PATH).
	FFmpeg string
	// ForceFFmpeg decodes every format with ffmpeg to 16 kHz mono s16le, exactly as
	// whisper.audio.load_audio does (bit-identical samples to openai/whisper's).
	ForceFFmpeg bool
	// Timeout bounds one ffmpeg run. 0: DefaultTimeout.
	Timeout time.Duration
}

// Defaults of Options.
const (
	DefaultMaxSeconds = 600 // ten minutes: 20 Whisper windows
	DefaultTimeout    = 60 * time.Second
)

func (o Options) maxSeconds() float64 {
	if o.MaxSeconds > 0 {
		return o.MaxSeconds
	}
	return DefaultMaxSeconds
}

// sniff names the container from the first bytes ("" when only ffmpeg could say).
func sniff(data []byte) string {
	switch {
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WAVE":
		return "wav"
	case bytes.HasPrefix(data, []byte("fLaC")):
		return "flac"
	case bytes.HasPrefix(data, []byte("ID3")):
		return "mp3"
	case len(data) >= 4 && data[0] == 0xff && data[1]&0xe0 == 0xe0 && (data[1]>>1)&3 == 1: // MPEG audio, layer III
		return "mp3"
	}
	return ""
}

// Decode decodes audio to mono at its own rate (Load also resamples to 16 kHz).
func Decode(ctx context.Context, data []byte, opts Options) (*Clip, error) {
	if len(data) == 0 {
		return nil, errorf(ErrEmpty, "decode", "", "empty input")
	}
	format := sniff(data)
	if opts.ForceFFmpeg || format == "" {
		return decodeFFmpeg(ctx, data, opts)
	}
	var (
		samples  []float32
		channels int
		rate     int
		err      error
	)
	switch format {
	case "wav":
		samples, channels, rate, err = decodeWAV(data, opts.maxSeconds())
	case "flac":
		samples, channels, rate, err = decodeFLAC(data, opts.maxSeconds())
	case "mp3":
		samples, channels, rate, err = decodeMP3(data, opts.maxSeconds())
	}
	if err != nil {
		return nil, err
	}
	return &Clip{Samples: Downmix(samples, channels), Rate: rate, Format: format, SourceRate: rate, SourceChannels: channels}, nil
}

// Load decodes and resamples to 16 kHz mono: what the encoders take.
func Load(ctx context.Context, data []byte, opts Options) (*Clip, error) {
	c, err := Decode(ctx, data, opts)
	if err != nil {
		return nil, err
	}
	return c.Resample(SampleRate)
}

// Downmix averages interleaved channels to mono, as librosa.to_mono (and so Hugging Face and
// Qwen2-Audio's loaders) does. (ffmpeg's -ac 1, which openai/whisper's loader runs, sums stereo
// at 1/sqrt(2) each instead; Options.ForceFFmpeg gives exactly that.) Mono input is returned as
// is.
func Downmix(interleaved []float32, channels int) []float32 {
	if channels <= 1 {
		return interleaved
	}
	n := len(interleaved) / channels
	out := make([]float32, n)
	inv := 1 / float32(channels)
	for i := range n {
		var s float32
		for _, v := range interleaved[i*channels : (i+1)*channels] {
			s += v
		}
		out[i] = s * inv
	}
	return out
}

// Resample returns the clip at rate Hz (the clip itself when it already is).
func (c *Clip) Resample(rate int) (*Clip, error) {
	if c.Rate == rate {
		return c, nil
	}
	n := native.ResampleLen(len(c.Samples), c.Rate, rate)
	if n < 0 {
		return nil, errorf(ErrRate, "resample", c.Format, "%d Hz to %d Hz", c.Rate, rate)
	}
	out := *c
	out.Samples, out.Rate = make([]float32, n), rate
	if err := native.Resample(out.Samples, c.Samples, c.Rate, rate, native.ISAAuto); err != nil {
		return nil, errorf(ErrRate, "resample", c.Format, "%v", err)
	}
	return &out, nil
}

// guard turns a panic inside a third-party decoder into ErrCorrupt: hostile input must give an
// error, and those decoders are not ours to fix.
func guard(format string, err *error) {
	if r := recover(); r != nil {
		*err = errorf(ErrCorrupt, "decode", format, "decoder failed: %v", r)
	}
}

func (c *Clip) String() string {
	return fmt.Sprintf("%s %d Hz x %d -> %d Hz mono, %.2f s", c.Format, c.SourceRate, c.SourceChannels, c.Rate, c.Seconds())
}
