package hfproc

import (
	"fmt"

	"dataplane/dataplane/media/audio"
	"dataplane/dataplane/media/picture"
	"dataplane/native"
)

// audio builds the audio preset from a WhisperFeatureExtractor's settings: the mel bins, and
// the model's convention for audio longer than a window (Qwen2-Audio's processor truncates at
// 30 s; Whisper transcribes window after window).
func (p *parse) audio(o *object) error {
	class := o.str("feature_extractor_type", "")
	if className(class) != "WhisperFeatureExtractor" {
		o.fail("feature_extractor_type", "%q is not a feature extractor this server reproduces (WhisperFeatureExtractor)", class)
		return o.err
	}
	mels := bounded(o, "feature_size", o.int("feature_size", 80), 1, 512)
	// Whisper's front end is fixed here (native log-mel): refuse a file that changes it.
	fixed := func(field string, want float64) {
		if v := o.float(field, want); v != want {
			o.fail(field, "%g is not supported: Whisper's front end takes %g", v, want)
		}
	}
	fixed("sampling_rate", audio.SampleRate)
	fixed("hop_length", native.WhisperHop)
	fixed("n_fft", 400)
	fixed("chunk_length", 30)
	fixed("n_samples", audio.WindowSamples)
	fixed("nb_max_frames", audio.WindowFrames)
	fixed("padding_value", 0)
	fixed("dither", 0)
	if s := o.str("padding_side", "right"); s != "right" {
		o.fail("padding_side", "%q is not supported: audio is padded on the right", s)
	}
	o.ignore("return_attention_mask", // Qwen2-Audio's processor asks for the mask either way
		"mel_filters") // older files carry the filters; ours are librosa's, the same
	o.ignore(metadata...)
	processor := o.str("processor_class", "")
	if p.proc != nil && p.proc.has("processor_class") {
		processor = p.proc.str("processor_class", "")
	}
	var pr audio.Preset
	switch className(processor) {
	case "Qwen2AudioProcessor":
		pr = audio.Qwen2Audio7
	case "WhisperProcessor", "":
		pr = audio.Preset{Name: fmt.Sprintf("whisper-%d", mels)}
	default:
		o.fail("processor_class", "%q is not a processor this server reproduces (WhisperProcessor, Qwen2AudioProcessor)", processor)
	}
	pr.Mels = mels
	p.model.needFor(o, "num_mel_bins", "audio_config", "audio_config.num_mel_bins")
	if m := p.model; m != nil {
		if m.NumMelBins != nil {
			agree(o, "feature_size", mels, "num_mel_bins", m.NumMelBins)
		}
		if m.Audio != nil {
			agree(o, "feature_size", mels, "audio_config.num_mel_bins", m.Audio.NumMelBins)
		}
	}
	if err := o.unknown(); err != nil {
		return err
	}
	p.s.Audio, p.s.AudioClass = &pr, class
	if processor != "" {
		p.s.AudioClass += " (" + processor + ")"
	}
	return nil
}

// videoClasses are the video processors read.
var videoClasses = map[string]bool{"Qwen2VLVideoProcessor": true, "Qwen2_5_VLVideoProcessor": true}

// Qwen2VLVideo is transformers' Qwen2VLVideoProcessor's defaults: frames between 128 and 768
// tokens' worth of pixels, 2 fps, 4 to 768 frames.
var Qwen2VLVideo = func() picture.Preset {
	p := picture.Qwen2VLImage
	p.MinPixels, p.MaxPixels = 128*28*28, 768*28*28
	return p
}()

// video reads a video processor's settings (Qwen2-VL's): its frames' pixel bounds and sampling.
func (p *parse) video(o *object) error {
	class := o.str("video_processor_type", "")
	if class == "" {
		class = o.str("image_processor_type", "")
	}
	if !videoClasses[className(class)] {
		o.fail("video_processor_type", "%q is not a video processor this server reproduces (Qwen2VLVideoProcessor)", class)
		return o.err
	}
	frames := p.qwen2VL(o, Qwen2VLVideo)
	v := &Video{Frames: frames}
	v.FPS = o.float("fps", 2)
	if !(v.FPS > 0 && v.FPS <= 240) {
		o.fail("fps", "%g is not in (0, 240]", v.FPS)
	}
	v.MinFrames = bounded(o, "min_frames", o.int("min_frames", 4), 1, 4096)
	v.MaxFrames = bounded(o, "max_frames", o.int("max_frames", 768), v.MinFrames, 4096)
	// do_sample_frames and num_frames say whether the processor samples; vLLM samples itself
	// and hands it the frames, as this server does with FPS, MinFrames and MaxFrames.
	o.ignore("do_sample_frames", "num_frames", "default_to_square", "return_metadata", "video_metadata")
	o.ignore(metadata...)
	if err := o.unknown(); err != nil {
		return err
	}
	frames.Name = name("qwen2-vl-video", *frames)
	if err := checkPreset(o.file, frames); err != nil {
		return err
	}
	p.s.Video = v
	return nil
}
