package audio

import (
	"encoding/binary"
	"math"
)

// WAV: a RIFF file with a "fmt " chunk and a "data" chunk (other chunks skipped). Encodings:
// PCM 8 (unsigned), 16, 24 and 32 bits; IEEE float 32 and 64; A-law and mu-law; the same inside
// WAVE_FORMAT_EXTENSIBLE. A data chunk whose size runs past the file (streaming writers put
// 0xFFFFFFFF there) is read to the end of the file, whole frames only.

const (
	wavPCM        = 1
	wavFloat      = 3
	wavALaw       = 6
	wavMuLaw      = 7
	wavExtensible = 0xfffe
)

type wavFormat struct {
	encoding   int
	channels   int
	rate       int
	blockAlign int
	bits       int
}

// decodeWAV returns interleaved float32 samples, the channel count and the rate. The
// duration limit is checked from the data chunk's size before any sample is converted.
func decodeWAV(data []byte, maxSeconds float64) ([]float32, int, int, error) {
	f, body, frames, err := parseWAV(data, maxSeconds)
	if err != nil {
		return nil, 0, 0, err
	}
	out, err := f.convert(data[body:body+frames*int64(f.blockAlign)], int(frames))
	return out, f.channels, f.rate, err
}

// parseWAV walks the chunks to the data chunk: the format, where the samples start and how
// many whole frames there are (at most maxSeconds' worth).
func parseWAV(data []byte, maxSeconds float64) (f *wavFormat, body, frames int64, err error) {
	bad := func(kind error, format string, args ...any) (*wavFormat, int64, int64, error) {
		return nil, 0, 0, errorf(kind, "decode", "wav", format, args...)
	}
	if len(data) < 12 || string(data[:4]) != "RIFF" || string(data[8:12]) != "WAVE" {
		return bad(ErrCorrupt, "no RIFF/WAVE header")
	}
	for at := 12; ; {
		if at+8 > len(data) {
			return bad(ErrCorrupt, "no data chunk")
		}
		id, size := string(data[at:at+4]), int64(binary.LittleEndian.Uint32(data[at+4:]))
		body := int64(at + 8)
		switch id {
		case "fmt ":
			if body+size > int64(len(data)) {
				return bad(ErrCorrupt, "fmt chunk of %d bytes runs past the end", size)
			}
			if f, err = parseWAVFormat(data[body : body+size]); err != nil {
				return nil, 0, 0, err
			}
		case "data":
			if f == nil {
				return bad(ErrCorrupt, "data chunk before the fmt chunk")
			}
			end := min(body+size, int64(len(data)))
			frames := (end - body) / int64(f.blockAlign)
			if frames == 0 {
				return bad(ErrEmpty, "data chunk holds no whole frame")
			}
			if secs := float64(frames) / float64(f.rate); secs > maxSeconds {
				return bad(ErrTooLong, "%.1f s, limit %.0f s", secs, maxSeconds)
			}
			return f, body, frames, nil
		}
		next := body + size + size&1 // chunks are padded to even sizes
		if next > int64(len(data)) {
			return bad(ErrCorrupt, "chunk %q of %d bytes runs past the end", id, size)
		}
		at = int(next)
	}
}

func parseWAVFormat(b []byte) (*wavFormat, error) {
	bad := func(kind error, f string, args ...any) (*wavFormat, error) {
		return nil, errorf(kind, "decode", "wav", f, args...)
	}
	if len(b) < 16 {
		return bad(ErrCorrupt, "fmt chunk of %d bytes (at least 16)", len(b))
	}
	f := &wavFormat{
		encoding:   int(binary.LittleEndian.Uint16(b)),
		channels:   int(binary.LittleEndian.Uint16(b[2:])),
		rate:       int(binary.LittleEndian.Uint32(b[4:])),
		blockAlign: int(binary.LittleEndian.Uint16(b[12:])),
		bits:       int(binary.LittleEndian.Uint16(b[14:])),
	}
	if f.encoding == wavExtensible {
		if len(b) < 26 {
			return bad(ErrCorrupt, "extensible fmt chunk of %d bytes (at least 26)", len(b))
		}
		f.encoding = int(binary.LittleEndian.Uint16(b[24:])) // the sub-format GUID starts with the format code
	}
	if f.channels < 1 || f.channels > MaxChannels {
		return bad(ErrRate, "%d channels (1..%d)", f.channels, MaxChannels)
	}
	if f.rate < MinRate || f.rate > MaxRate {
		return bad(ErrRate, "sample rate %d Hz (%d..%d)", f.rate, MinRate, MaxRate)
	}
	ok := false
	switch f.encoding {
	case wavPCM:
		ok = f.bits == 8 || f.bits == 16 || f.bits == 24 || f.bits == 32
	case wavFloat:
		ok = f.bits == 32 || f.bits == 64
	case wavALaw, wavMuLaw:
		ok = f.bits == 8
	}
	if !ok {
		return bad(ErrUnsupported, "encoding %#x with %d bits", f.encoding, f.bits)
	}
	if f.blockAlign != f.channels*f.bits/8 {
		return bad(ErrCorrupt, "block align %d, %d channels of %d bits need %d", f.blockAlign, f.channels, f.bits, f.channels*f.bits/8)
	}
	return f, nil
}

// convert turns frames of raw samples into float32 in [-1, 1): integers over 2^(bits-1) (16-bit
// as whisper's int16 / 32768), unsigned 8-bit centred at 128, floats as they are (NaN and Inf
// are refused).
func (f *wavFormat) convert(raw []byte, frames int) ([]float32, error) {
	n := frames * f.channels
	out := make([]float32, n)
	switch {
	case f.encoding == wavPCM && f.bits == 8:
		for i := range out {
			out[i] = float32(int(raw[i])-128) / 128
		}
	case f.encoding == wavPCM && f.bits == 16:
		for i := range out {
			out[i] = float32(int16(binary.LittleEndian.Uint16(raw[2*i:]))) / 32768
		}
	case f.encoding == wavPCM && f.bits == 24:
		for i := range out {
			v := int32(uint32(raw[3*i])<<8|uint32(raw[3*i+1])<<16|uint32(raw[3*i+2])<<24) >> 8
			out[i] = float32(v) / (1 << 23)
		}
	case f.encoding == wavPCM && f.bits == 32:
		for i := range out {
			out[i] = float32(float64(int32(binary.LittleEndian.Uint32(raw[4*i:]))) / (1 << 31))
		}
	case f.encoding == wavFloat && f.bits == 32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	case f.encoding == wavFloat && f.bits == 64:
		for i := range out {
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
		}
	case f.encoding == wavALaw:
		for i := range out {
			out[i] = float32(alaw(raw[i])) / 32768
		}
	case f.encoding == wavMuLaw:
		for i := range out {
			out[i] = float32(mulaw(raw[i])) / 32768
		}
	}
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, errorf(ErrCorrupt, "decode", "wav", "sample %d is %v", i, v)
		}
	}
	return out, nil
}

// alaw and mulaw expand G.711 bytes to 16-bit linear PCM (ITU-T G.711).
func alaw(b byte) int16 {
	b ^= 0x55
	t := int16(b&0x0f) << 4
	seg := (b & 0x70) >> 4
	switch seg {
	case 0:
		t += 8
	case 1:
		t += 0x108
	default:
		t = (t + 0x108) << (seg - 1)
	}
	if b&0x80 != 0 {
		return t
	}
	return -t
}

func mulaw(b byte) int16 {
	b = ^b
	t := (int16(b&0x0f) << 3) + 0x84
	t <<= (b & 0x70) >> 4
	if b&0x80 != 0 {
		return 0x84 - t
	}
	return t - 0x84
}
