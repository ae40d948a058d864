package audio

import (
	"fmt"

	"dataplane/native"
)

// Whisper's fixed input: 30 s windows of 3000 frames.
const (
	WindowSamples = 30 * SampleRate // 480,000
	WindowFrames  = WindowSamples / native.WhisperHop
)

// Convention is how long audio is cut into 30 s windows, and so where the log-mel's maximum
// (the clamp at max - 8) is taken.
type Convention uint8

const (
	// Transcribe is openai/whisper's transcribe: 30 s of zeros appended to the whole file, the
	// log-mel of all of it (max over the whole file), then consecutive 3000-frame windows
	// (whisper advances by what it decoded; a preprocessor cannot know that, so windows start
	// every 3000 frames while there is audio).
	Transcribe Convention = iota
	// HF is Hugging Face's WhisperFeatureExtractor: each 30 s chunk's waveform padded with zeros
	// to 480,000 samples first, its log-mel (max per chunk) computed alone.
	HF
)

func (c Convention) String() string {
	if c == HF {
		return "hf"
	}
	return "transcribe"
}

// ParseConvention reads "transcribe" or "hf".
func ParseConvention(s string) (Convention, error) {
	switch s {
	case "transcribe", "openai":
		return Transcribe, nil
	case "hf", "huggingface":
		return HF, nil
	}
	return 0, fmt.Errorf("unknown log-mel convention %q (want transcribe or hf)", s)
}

// Preset is one audio encoder's input: mel bins, windowing convention and token count.
type Preset struct {
	Name       string
	Mels       int
	Convention Convention
	// Qwen2Audio counts tokens as Qwen2-Audio does (Whisper's 1500 a window, average-pooled by
	// 2, from the frames that hold audio); otherwise 1500 per window.
	Qwen2Audio bool
	// Truncate keeps only the first 30 s, as Hugging Face's WhisperFeatureExtractor does by
	// default (truncation=True, max_length = n_samples): one window, whatever the length.
	// Qwen2-Audio's processor, and so vLLM, feed the model that way.
	Truncate bool
}

// The built-in presets.
var (
	Whisper80   = Preset{Name: "whisper-80", Mels: 80}   // Whisper tiny .. large-v2
	Whisper128  = Preset{Name: "whisper-128", Mels: 128} // Whisper large-v3
	Qwen2Audio7 = Preset{Name: "qwen2-audio", Mels: 128, Convention: HF, Qwen2Audio: true, Truncate: true}
)

// Presets lists the built-in presets.
func Presets() []Preset { return []Preset{Whisper80, Whisper128, Qwen2Audio7} }

// Features is a log-mel spectrogram cut into windows: Data is [Windows, Mels, 3000] float32.
type Features struct {
	Data    []float32
	Windows int
	Mels    int
	// AudioFrames[w] is how many of window w's frames hold audio (the rest is padding).
	AudioFrames []int
}

// Windows is how many 30 s windows n samples at 16 kHz make (at least 1): HF cuts the waveform
// every 480,000 samples; transcribe cuts the frames with audio, n / 160 of them, every 3000; a
// truncating preset takes one.
func (p Preset) Windows(n int) int {
	if p.Truncate {
		return 1
	}
	if p.Convention == HF {
		return max(1, (n+WindowSamples-1)/WindowSamples)
	}
	return max(1, (n/native.WhisperHop+WindowFrames-1)/WindowFrames)
}

// floorDiv is Python's //.
func floorDiv(a, b int) int {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// LogMel computes the preset's features of 16 kHz mono samples on up to threads threads
// (0: native.DefaultThreads()).
func (p Preset) LogMel(samples []float32, threads int) (*Features, error) {
	if p.Mels < 1 || p.Mels > 512 {
		return nil, errorf(ErrPreset, "log-mel", "", "%s: %d mels", p.Name, p.Mels)
	}
	if len(samples) == 0 {
		return nil, errorf(ErrEmpty, "log-mel", "", "no samples")
	}
	samples = p.Kept(samples)
	w := p.Windows(len(samples))
	f := &Features{Data: make([]float32, w*p.Mels*WindowFrames), Windows: w, Mels: p.Mels, AudioFrames: make([]int, w)}
	audioFrames := (len(samples) + native.WhisperHop - 1) / native.WhisperHop
	for i := range w {
		f.AudioFrames[i] = max(0, min(WindowFrames, audioFrames-i*WindowFrames))
	}
	switch p.Convention {
	case Transcribe:
		total := native.LogMelFrames(len(samples) + WindowSamples)
		all := make([]float32, p.Mels*total)
		if _, err := native.LogMel(all, native.LogMelInput{Samples: samples, Zeros: WindowSamples, Mels: p.Mels, Threads: threads}); err != nil {
			return nil, errorf(ErrPreset, "log-mel", "", "%v", err)
		}
		for i := range w {
			for m := range p.Mels {
				// The appended 30 s guarantee every window's 3000 frames exist.
				copy(f.Data[(i*p.Mels+m)*WindowFrames:][:WindowFrames], all[m*total+i*WindowFrames:])
			}
		}
	case HF:
		for i := range w {
			chunk := samples[i*WindowSamples : min(len(samples), (i+1)*WindowSamples)]
			dst := f.Data[i*p.Mels*WindowFrames : (i+1)*p.Mels*WindowFrames]
			if _, err := native.LogMel(dst, native.LogMelInput{Samples: chunk, Zeros: WindowSamples - len(chunk), Mels: p.Mels, Threads: threads}); err != nil {
				return nil, errorf(ErrPreset, "log-mel", "", "%v", err)
			}
		}
	default:
		return nil, errorf(ErrPreset, "log-mel", "", "%s: unknown convention %d", p.Name, p.Convention)
	}
	return f, nil
}

// Kept is the part of the samples the preset encodes: all of them, or the first 30 s when it
// truncates.
func (p Preset) Kept(samples []float32) []float32 {
	if p.Truncate && len(samples) > WindowSamples {
		return samples[:WindowSamples]
	}
	return samples
}

// Tokens is the encoder token count for n samples at 16 kHz, known before decoding the whole
// file: Whisper 1500 per 30 s window; Qwen2-Audio per window L = frames with audio (the
// feature extractor's attention mask), then ((L - 1) / 2 + 1 - 2) / 2 + 1 (its conv stride 2 and
// average pool 2): 750 for a full window, and one window (truncated at 30 s).
func (p Preset) Tokens(n int) int {
	if n <= 0 {
		return 0
	}
	if p.Truncate {
		n = min(n, WindowSamples)
	}
	w := p.Windows(n)
	if !p.Qwen2Audio {
		return w * WindowFrames / 2
	}
	frames := (n + native.WhisperHop - 1) / native.WhisperHop
	tokens := 0
	for i := range w {
		l := max(0, min(WindowFrames, frames-i*WindowFrames))
		tokens += max(0, floorDiv(floorDiv(l-1, 2)+1-2, 2)+1)
	}
	return tokens
}

// CheckTokens refuses audio of n samples that gives no token: Qwen2-Audio's count is 0 for
// 20 ms or less, which vLLM refuses ("too short to be represented inside the model").
func (p Preset) CheckTokens(n int) (int, error) {
	t := p.Tokens(n)
	if t < 1 {
		return 0, errorf(ErrTooShort, "log-mel", "", "%s: %d samples (%.3f s) give no token", p.Name, n, float64(n)/SampleRate)
	}
	return t, nil
}

// InputFeatures is the features as the encoder's input, Hugging Face's input_features:
// [Windows, Mels, 3000] in dtype.
func (f *Features) InputFeatures(dtype native.DType) (native.Tensor, error) {
	data := native.AsBytes(f.Data)
	if dtype != native.F32 {
		out := make([]byte, len(f.Data)*dtype.Size())
		if err := native.Convert(out, dtype, data, native.F32); err != nil {
			return native.Tensor{}, errorf(ErrPreset, "log-mel", "", "%v", err)
		}
		data = out
	}
	return native.Tensor{DType: dtype, Shape: []int{f.Windows, f.Mels, WindowFrames}, Data: data}, nil
}
