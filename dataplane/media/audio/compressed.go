package audio

import (
	"bytes"
	"errors"
	"io"

	"github.com/hajimehoshi/go-mp3"
	"github.com/mewkiz/flac"
)

// decodeFLAC decodes with mewkiz/flac: integer samples over 2^(bits-1), interleaved. The limit
// is checked from STREAMINFO's sample count and again while decoding (the count may be 0,
// "unknown").
func decodeFLAC(data []byte, maxSeconds float64) (out []float32, channels, rate int, err error) {
	defer guard("flac", &err)
	s, err := flac.New(bytes.NewReader(data))
	if err != nil {
		return nil, 0, 0, errorf(ErrCorrupt, "decode", "flac", "%v", err)
	}
	info := s.Info
	channels, rate = int(info.NChannels), int(info.SampleRate)
	if rate < MinRate || rate > MaxRate {
		return nil, 0, 0, errorf(ErrRate, "decode", "flac", "sample rate %d Hz (%d..%d)", rate, MinRate, MaxRate)
	}
	if info.BitsPerSample < 4 || info.BitsPerSample > 32 {
		return nil, 0, 0, errorf(ErrUnsupported, "decode", "flac", "%d bits a sample", info.BitsPerSample)
	}
	maxFrames := int64(maxSeconds * float64(rate))
	if info.NSamples > uint64(maxFrames) {
		return nil, 0, 0, errorf(ErrTooLong, "decode", "flac", "%.1f s, limit %.0f s", float64(info.NSamples)/float64(rate), maxSeconds)
	}
	scale := 1 / float32(int64(1)<<(info.BitsPerSample-1))
	for {
		f, err := s.ParseNext()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, 0, 0, errorf(ErrCorrupt, "decode", "flac", "frame after %d samples: %v", len(out)/channels, err)
		}
		if len(f.Subframes) != channels {
			return nil, 0, 0, errorf(ErrCorrupt, "decode", "flac", "a frame with %d channels in a %d-channel stream", len(f.Subframes), channels)
		}
		n := len(f.Subframes[0].Samples)
		if int64(len(out)/channels+n) > maxFrames {
			return nil, 0, 0, errorf(ErrTooLong, "decode", "flac", "more than %.0f s", maxSeconds)
		}
		for i := range n {
			for c := range channels {
				sub := f.Subframes[c].Samples
				if i >= len(sub) {
					return nil, 0, 0, errorf(ErrCorrupt, "decode", "flac", "channel %d is short", c)
				}
				out = append(out, float32(sub[i])*scale)
			}
		}
	}
	if len(out) == 0 {
		return nil, 0, 0, errorf(ErrEmpty, "decode", "flac", "no frames")
	}
	return out, channels, rate, nil
}

// decodeMP3 decodes with hajimehoshi/go-mp3, which always yields 16-bit stereo (mono sources
// duplicated), so channels is 2 and the mean of the two is the source's mono signal.
func decodeMP3(data []byte, maxSeconds float64) (out []float32, channels, rate int, err error) {
	defer guard("mp3", &err)
	d, err := mp3.NewDecoder(bytes.NewReader(data))
	if err != nil {
		return nil, 0, 0, errorf(ErrCorrupt, "decode", "mp3", "%v", err)
	}
	rate = d.SampleRate()
	if rate < MinRate || rate > MaxRate {
		return nil, 0, 0, errorf(ErrRate, "decode", "mp3", "sample rate %d Hz", rate)
	}
	maxBytes := int64(maxSeconds*float64(rate)) * 4
	if n := d.Length(); n > maxBytes {
		return nil, 0, 0, errorf(ErrTooLong, "decode", "mp3", "%.1f s, limit %.0f s", float64(n)/4/float64(rate), maxSeconds)
	}
	pcm, err := io.ReadAll(io.LimitReader(d, maxBytes+4))
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, 0, 0, errorf(ErrCorrupt, "decode", "mp3", "after %d samples: %v", len(pcm)/4, err)
	}
	if int64(len(pcm)) > maxBytes {
		return nil, 0, 0, errorf(ErrTooLong, "decode", "mp3", "more than %.0f s", maxSeconds)
	}
	n := len(pcm) / 2
	if n < 2 {
		return nil, 0, 0, errorf(ErrEmpty, "decode", "mp3", "no frames")
	}
	out = make([]float32, n&^1)
	for i := range out {
		out[i] = float32(int16(uint16(pcm[2*i])|uint16(pcm[2*i+1])<<8)) / 32768
	}
	return out, 2, rate, nil
}
