// Package media is the entry point for preprocessing one request item: it names the presets
// (picture, audio and video families), runs the right pipeline for a preset and a modality,
// and returns the encoder's input tensor, the token count and the content key. The work lives
// in picture, audio and video; data URLs and content keys live here.
package media

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"dataplane/dataplane/media/admit"
	"dataplane/dataplane/media/audio"
	"dataplane/dataplane/media/hfproc"
	"dataplane/dataplane/media/picture"
	"dataplane/dataplane/media/video"
	"dataplane/native"
)

// Preset is a named preprocessing: a picture preset (used for images and video frames) or an
// audio preset, built in or read from a checkpoint's processor files (FromProcessor).
type Preset struct {
	Name    string
	Picture *picture.Preset
	Audio   *audio.Preset
	// Video, when set, is a checkpoint's video processor: its frames' preprocessing and the
	// sampling defaults (fps, min and max frames) for options that leave them unset.
	Video *hfproc.Video
	// Source is the directory the settings were read from ("": built in).
	Source string
}

// FromProcessor is the presets a checkpoint's processor settings make: images (with video) and
// audio, each nil when the files have none.
func FromProcessor(s *hfproc.Settings) (image, sound *Preset) {
	if s.Image != nil {
		image = &Preset{Name: s.Image.Name, Picture: s.Image, Video: s.Video, Source: s.Dir}
	}
	if s.Audio != nil {
		sound = &Preset{Name: s.Audio.Name, Audio: s.Audio, Source: s.Dir}
	}
	return image, sound
}

// LoadProcessor reads the first of dirs that holds processor files (see hfproc.Load); empty
// names are skipped. hfproc.ErrNone when none does.
func LoadProcessor(dirs ...string) (*hfproc.Settings, error) {
	for _, d := range dirs {
		if d == "" {
			continue
		}
		s, err := hfproc.Load(d)
		if errors.Is(err, hfproc.ErrNone) {
			continue
		}
		return s, err
	}
	return nil, hfproc.ErrNone
}

// Summary is one line for --help and the start-up log.
func (p Preset) Summary() string {
	s := p.summary()
	if p.Video != nil {
		f := p.Video.Frames
		s += fmt.Sprintf("; video frames in [%d, %d] px, %g fps, %d..%d frames", f.MinPixels, f.MaxPixels, p.Video.FPS, p.Video.MinFrames, p.Video.MaxFrames)
	}
	if p.Source != "" {
		s += " (from " + p.Source + ")"
	}
	return s
}

func (p Preset) summary() string {
	if p.Audio != nil {
		a := p.Audio
		s := fmt.Sprintf("audio: %d-bin log-mel, %v windows of 3000 frames", a.Mels, a.Convention)
		if a.Truncate {
			s += ", the first 30 s only"
		}
		return s
	}
	v := p.Picture
	switch v.Family {
	case picture.CLIP:
		n, _ := v.Tokens(v.Size, v.Size)
		return fmt.Sprintf("image/video: shortest side %d + centre crop, %v, mean %v std %v, %d tokens", v.Size, v.Filter, v.Mean, v.Std, n)
	case picture.SigLIP:
		n, _ := v.Tokens(v.Size, v.Size)
		return fmt.Sprintf("image/video: %dx%d %v, mean %v std %v, %d tokens", v.Size, v.Size, v.Filter, v.Mean, v.Std, n)
	case picture.LlavaNext:
		return fmt.Sprintf("image: LLaVA-NeXT anyres, %d-px tiles on %v pinpoints + a base picture, %d-px patches", v.Size, v.Pinpoints, v.Patch)
	case picture.Qwen2VL:
		return fmt.Sprintf("image/video: smart_resize to %d-px multiples in [%d, %d] px, patches of %d frames", v.Patch*v.MergeSize, v.MinPixels, v.MaxPixels, v.TemporalPatch)
	case picture.InternVL:
		return fmt.Sprintf("image/video: %d-px tiles (%d..%d), thumbnail %v, ImageNet mean/std, %d tokens a tile", v.Size, v.MinTiles, v.MaxTiles, v.Thumbnail, v.TokensPerTile)
	}
	return v.Family.String()
}

// Presets lists every built-in preset, sorted by name.
func Presets() []Preset {
	var out []Preset
	for _, p := range picture.Presets() {
		out = append(out, Preset{Name: p.Name, Picture: &p})
	}
	for _, p := range audio.Presets() {
		out = append(out, Preset{Name: p.Name, Audio: &p})
	}
	slices.SortFunc(out, func(a, b Preset) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Lookup finds a preset by name.
func Lookup(name string) (Preset, error) {
	for _, p := range Presets() {
		if p.Name == name {
			return p, nil
		}
	}
	var names []string
	for _, p := range Presets() {
		names = append(names, p.Name)
	}
	return Preset{}, fmt.Errorf("unknown preset %q (have %s)", name, strings.Join(names, ", "))
}

// Result is one preprocessed item.
type Result struct {
	// Input is the encoder's input: what Hugging Face's processors call pixel_values (an
	// image), pixel_values_videos (a video) or input_features (audio).
	Input native.Tensor
	// Grid is Qwen2-VL's (t, h, w) patch grid of Input (its processors' image_grid_thw or
	// video_grid_thw); zero for the other presets.
	Grid [3]int
	// ImageSize is LLaVA-NeXT's image_sizes entry, (height, width); zero for the others.
	ImageSize [2]int
	Tokens    int
	Key       Key
	Detail    string // what was decoded, for logs and the CLI
}

// Options for the pipelines; the zero value means each package's defaults.
type Options struct {
	DType   native.DType // of the pixel tensors and log-mel features (zero value: F32)
	Picture picture.Options
	Audio   audio.Options
	Video   video.Options
	// Convention overrides an audio preset's log-mel windowing when set.
	Convention *audio.Convention
	Threads    int // log-mel threads (0: native.DefaultThreads())
	// CountOnly: Image and Audio give the token count and the key only (Result.Input empty):
	// the media are decoded (the key is of the decoded pixels or samples) but not resized,
	// normalised or turned into log-mel features; for a caller that does not encode them.
	CountOnly bool

	// Admit, when set, admits decoded-media memory against the caller's budget before it is
	// allocated (nil: no accounting). Each decode calls it once, after the header checks and
	// before its first large allocation, with the bytes it will hold at its peak, computed from
	// the header: a picture's picture.DecodeBytes; audio's audio.DecodeBytes (exact from a WAV
	// or FLAC header, a stated bound otherwise); a video's per picture (a list) or its one
	// ffmpeg frame buffer (3·W·H) and keyframe thumbnails. Release is called once that memory
	// is no longer referenced: for a picture or audio when the call returns, for a video frame
	// once it is preprocessed and keyed. The preprocessed output is not admitted here (it is
	// the feature record's to account for). A refusal stops the decode: the error returned
	// wraps an *admit.Error (What names the picture or frame, Bytes the amount) whose Unwrap is
	// Admit's own error, so errors.Is and errors.As find either.
	Admit admit.Func
}

func errNotFor(p Preset, what string) error {
	return fmt.Errorf("preset %s is not for %s", p.Name, what)
}

// Image preprocesses one picture (JPEG or PNG).
func Image(data []byte, p Preset, opts Options) (*Result, error) {
	if p.Picture == nil {
		return nil, errNotFor(p, "images")
	}
	info, err := picture.DecodeConfig(data)
	if err == nil {
		err = opts.Picture.Check(info)
	}
	if err != nil {
		return nil, err
	}
	release, err := opts.Admit.Take(fmt.Sprintf("%s %dx%d", info.Format, info.StoredW, info.StoredH), picture.DecodeBytes(info, opts.Picture))
	if err != nil {
		return nil, err
	}
	defer release()
	img, info, err := picture.Decode(data, opts.Picture)
	if err != nil {
		return nil, err
	}
	if opts.CountOnly {
		tokens, err := p.Picture.Tokens(img.W, img.H) // upright, as Apply sees it
		if err != nil {
			return nil, err
		}
		return &Result{Tokens: tokens, Key: ImageKey(img), Detail: info.String()}, nil
	}
	out, err := p.Picture.Apply(img, opts.DType)
	if err != nil {
		return nil, err
	}
	return &Result{Input: out.PixelValues, Grid: out.Grid, ImageSize: out.ImageSize, Tokens: out.Tokens, Key: ImageKey(img), Detail: info.String()}, nil
}

// ImageTokens is the token count of a picture from its header alone (no pixels decoded).
func ImageTokens(data []byte, p Preset) (int, error) {
	if p.Picture == nil {
		return 0, errNotFor(p, "images")
	}
	info, err := picture.DecodeConfig(data)
	if err != nil {
		return 0, err
	}
	return p.Picture.Tokens(info.W, info.H)
}

// Audio preprocesses one audio file into log-mel features.
func Audio(ctx context.Context, data []byte, p Preset, opts Options) (*Result, error) {
	if p.Audio == nil {
		return nil, errNotFor(p, "audio")
	}
	a := *p.Audio
	if opts.Convention != nil {
		a.Convention = *opts.Convention
	}
	release, err := opts.Admit.Take("audio", audio.DecodeBytes(data, opts.Audio))
	if err != nil {
		return nil, err
	}
	defer release()
	clip, err := audio.Load(ctx, data, opts.Audio)
	if err != nil {
		return nil, err
	}
	tokens, err := a.CheckTokens(len(clip.Samples))
	if err != nil {
		return nil, err
	}
	if opts.CountOnly {
		return &Result{Tokens: tokens, Key: AudioKey(clip.Samples, clip.Rate), Detail: clip.String()}, nil
	}
	f, err := a.LogMel(clip.Samples, opts.Threads)
	if err != nil {
		return nil, err
	}
	in, err := f.InputFeatures(opts.DType)
	if err != nil {
		return nil, err
	}
	detail := fmt.Sprintf("%v, %d window(s), %v convention", clip, f.Windows, a.Convention)
	if len(a.Kept(clip.Samples)) < len(clip.Samples) {
		detail += ", truncated at 30 s"
	}
	return &Result{Input: in, Tokens: tokens, Key: AudioKey(clip.Samples, clip.Rate), Detail: detail}, nil
}

// Video preprocesses a video container (through ffmpeg), or, when images is non-empty, a list
// of pictures taken as a video. The chosen frames are decoded one at a time: each is
// preprocessed and folded into the content key before the next is decoded.
func Video(ctx context.Context, data []byte, images [][]byte, p Preset, opts Options) (*Result, error) {
	if p.Picture == nil {
		return nil, errNotFor(p, "video")
	}
	vo, frames := opts.Video, *p.Picture
	if v := p.Video; v != nil {
		frames = *v.Frames
		vo.FPS = cmp.Or(vo.FPS, v.FPS)
		vo.MinFrames, vo.MaxFrames = cmp.Or(vo.MinFrames, v.MinFrames), cmp.Or(vo.MaxFrames, v.MaxFrames)
	}
	if frames.Family == picture.Qwen2VL && vo.FrameMultiple == 0 {
		vo.FrameMultiple = frames.TemporalPatch
	}
	if frames.Family == picture.LlavaNext {
		return nil, errNotFor(p, "video (LLaVA-NeXT's video models have their own processor)")
	}
	key := newVideoKeyer()
	vo.Admit, vo.Sink = opts.Admit, key
	var (
		v   *video.Video
		err error
	)
	if len(images) > 0 {
		v, err = video.FromImages(images, vo, frames, opts.DType)
	} else {
		v, err = video.Decode(ctx, data, vo, frames, opts.DType)
	}
	if err != nil {
		return nil, err
	}
	out := v.Output
	return &Result{Input: out.PixelValuesVideos, Grid: out.Grid, Tokens: out.Tokens, Key: key.Sum(),
		Detail: fmt.Sprintf("%dx%d, %d frames at %.3g fps; took %d (%v): %v", v.Info.W, v.Info.H, v.Info.Frames, v.Info.FPS,
			len(v.Indices), vo.Sampling, v.Indices)}, nil
}
