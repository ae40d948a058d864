package audio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"

	"dataplane/dataplane/media/ffmpeg"
)

// decodeFFmpeg decodes anything ffmpeg reads with the command openai/whisper's load_audio runs
// (mono, 16 kHz, s16le; samples / 32768), so the samples are the ones Whisper sees.
func decodeFFmpeg(ctx context.Context, data []byte, opts Options) (*Clip, error) {
	bin := opts.FFmpeg
	if bin == "" {
		bin = "ffmpeg"
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	limit := int64(opts.maxSeconds()*SampleRate) * 2
	var pcm []byte
	tooLong := false
	err := ffmpeg.Run(ctx, bin, timeout, data, func(path string) []string {
		return []string{"-nostdin", "-hide_banner", "-loglevel", "error", "-threads", "0", "-i", path,
			"-f", "s16le", "-ac", "1", "-acodec", "pcm_s16le", "-ar", strconv.Itoa(SampleRate), "-"}
	}, func(out io.Reader) error {
		b, err := io.ReadAll(io.LimitReader(out, limit+2))
		if int64(len(b)) > limit {
			tooLong = true
			return nil // stop reading: ffmpeg is killed
		}
		pcm = b
		return err
	})
	switch {
	case tooLong:
		return nil, errorf(ErrTooLong, "decode", "ffmpeg", "more than %.0f s", opts.maxSeconds())
	case errors.Is(err, ffmpeg.ErrMissing):
		what := "this format"
		if f := sniff(data); f != "" {
			what = f
		}
		return nil, errorf(ErrFormat, "decode", "ffmpeg", "%s needs ffmpeg: %v", what, err)
	case err != nil:
		return nil, errorf(ErrFFmpeg, "decode", "ffmpeg", "%v", err)
	}
	n := len(pcm) / 2
	if n == 0 {
		return nil, errorf(ErrEmpty, "decode", "ffmpeg", "no audio stream or no samples")
	}
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(int16(uint16(pcm[2*i])|uint16(pcm[2*i+1])<<8)) / 32768
	}
	return &Clip{Samples: s, Rate: SampleRate, Format: "ffmpeg", SourceRate: 0, SourceChannels: 0}, nil
}

// FFmpegAvailable reports whether the ffmpeg command is found (for messages and tests).
func FFmpegAvailable(bin string) error {
	if bin == "" {
		bin = "ffmpeg"
	}
	err := ffmpeg.Run(context.Background(), bin, DefaultTimeout, nil, func(string) []string { return []string{"-version"} },
		func(out io.Reader) error { _, err := io.Copy(io.Discard, out); return err })
	if err != nil {
		return fmt.Errorf("audio: %w", err)
	}
	return nil
}
