// Package video turns a video, or a list of pictures taken as one, into vision-encoder inputs:
// frames chosen by a sampling strategy and a token budget, decoded to RGB by the ffmpeg command
// (raw RGB over a pipe, only the chosen frames) or by the picture package, then preprocessed
// per frame with a picture.Preset (Qwen2-VL: all frames at one size, in temporal patches).
package video

import (
	"fmt"
	"math"
	"time"

	"dataplane/dataplane/media/picture"
	"dataplane/native"
)

// Options choose and bound the frames. The zero value means the defaults below.
type Options struct {
	Sampling Sampling
	Frames   int     // Uniform: how many frames (0: MaxFrames)
	FPS      float64 // FPS: frames a second (0: DefaultFPS)
	// MinFrames and MaxFrames bound every strategy (0: DefaultMinFrames, DefaultMaxFrames).
	MinFrames, MaxFrames int
	// FrameMultiple rounds the count down to a multiple (Qwen2-VL: 2, its temporal patch).
	FrameMultiple int
	// Budget, when its Tokens > 0, caps the count by the context's room (see Budget).
	Budget Budget
	// CandidateFPS is Keyframe's candidate rate (0: DefaultCandidateFPS).
	CandidateFPS float64
	// ImageFPS is the frame rate of a list of pictures taken as a video (0: DefaultImageFPS).
	ImageFPS float64
	// MaxPixels bounds one frame (0: picture.DefaultMaxPixels); MaxSeconds the video (0:
	// DefaultMaxSeconds).
	MaxPixels  int
	MaxSeconds float64
	// FFmpeg and FFprobe name the commands ("": found on PATH); Timeout bounds each run (0:
	// DefaultTimeout).
	FFmpeg, FFprobe string
	Timeout         time.Duration
}

// Defaults of Options.
const (
	DefaultFPS          = 2.0 // Qwen2-VL's
	DefaultMinFrames    = 1
	DefaultMaxFrames    = 32
	DefaultCandidateFPS = 4.0
	DefaultImageFPS     = 1.0
	DefaultMaxSeconds   = 3600
	DefaultTimeout      = 120 * time.Second
	// HardMaxFrames bounds MaxFrames itself: every chosen frame is held in memory at once.
	HardMaxFrames = 1024
)

func (o *Options) fps() float64 { return orDefault(o.FPS, DefaultFPS) }
func (o *Options) minFrames() int {
	if o.MinFrames > 0 {
		return o.MinFrames
	}
	return DefaultMinFrames
}
func (o *Options) maxFrames() int {
	if o.MaxFrames > 0 {
		return min(o.MaxFrames, HardMaxFrames)
	}
	return DefaultMaxFrames
}
func (o *Options) maxPixels() int {
	if o.MaxPixels > 0 {
		return o.MaxPixels
	}
	return picture.DefaultMaxPixels
}
func (o *Options) timeout() time.Duration {
	if o.Timeout > 0 {
		return o.Timeout
	}
	return DefaultTimeout
}

func orDefault(v, d float64) float64 {
	if v > 0 {
		return v
	}
	return d
}

// Info describes a video: displayed size, frame rate, frame count and duration.
type Info struct {
	W, H     int
	FPS      float64
	Frames   int
	Duration float64
}

// Video is the chosen frames, upright RGB, with their indices and times in the source.
type Video struct {
	Info    Info
	Frames  []*picture.Image
	Indices []int
	Times   []float64
}

// choose applies the strategy, the limits and the budget to a source of total frames; perFrame
// is the tokens one frame (or pooled group) costs, for the budget.
func (o *Options) choose(total int, fps float64, perFrame int) (int, error) {
	if o.Frames < 0 || o.FPS < 0 || o.MinFrames < 0 || o.MaxFrames < 0 || o.FrameMultiple < 0 || o.CandidateFPS < 0 || o.ImageFPS < 0 || o.Budget.Tokens < 0 {
		return 0, errorf(ErrSampling, "sample", "negative option in %+v", *o)
	}
	if o.Sampling > MaxFrames {
		return 0, errorf(ErrSampling, "sample", "unknown sampling %d", o.Sampling)
	}
	if total < 1 {
		return 0, errorf(ErrEmpty, "sample", "no frames")
	}
	n := min(o.count(total, fps), o.maxFrames(), total)
	if o.Budget.Tokens > 0 {
		n = min(n, o.Budget.Frames(perFrame))
	}
	if m := max(o.FrameMultiple, 1); n >= m {
		n = n / m * m
	}
	if n < o.minFrames() {
		if o.Budget.Tokens > 0 && o.Budget.Frames(perFrame) < o.minFrames() {
			return 0, errorf(ErrBudget, "sample", "%d tokens fit %d frames at %d tokens each, fewer than the minimum %d",
				o.Budget.Tokens, o.Budget.Frames(perFrame), perFrame, o.minFrames())
		}
		n = min(o.minFrames(), total)
	}
	return n, nil
}

// indices turns a count into source frame indices for the non-keyframe strategies.
func (o *Options) indices(total, n int) []int {
	if o.Sampling == FPS {
		return linspace(total, n, roundHalfEven)
	}
	return linspace(total, n, floor)
}

func floor(x float64) float64 { return math.Floor(x) }

func roundHalfEven(x float64) float64 { return math.RoundToEven(x) }

// FromImages takes a list of pictures as a video at opts.ImageFPS frames a second: frames are
// chosen by index with the same strategies, and only the chosen ones are decoded.
func FromImages(images [][]byte, opts Options, preset picture.Preset) (*Video, error) {
	if len(images) == 0 {
		return nil, errorf(ErrEmpty, "images", "no pictures")
	}
	if len(images) > HardMaxFrames*16 {
		return nil, errorf(ErrTooLong, "images", "%d pictures (at most %d)", len(images), HardMaxFrames*16)
	}
	first, err := picture.DecodeConfig(images[0])
	if err != nil {
		return nil, errorf(ErrFrame, "images", "picture 0: %v", err)
	}
	perFrame, err := PerFrameTokens(preset, first.W, first.H)
	if err != nil {
		return nil, err
	}
	if opts.Budget.Pool == 0 {
		opts.Budget.Pool = Pool(preset)
	}
	fps := orDefault(opts.ImageFPS, DefaultImageFPS)
	n, err := opts.choose(len(images), fps, perFrame)
	if err != nil {
		return nil, err
	}
	var idx []int
	if opts.Sampling == Keyframe {
		thumbs := make([][]byte, len(images))
		for i, b := range images {
			img, _, err := picture.Decode(b, picture.Options{MaxPixels: opts.maxPixels()})
			if err != nil {
				return nil, errorf(ErrFrame, "images", "picture %d: %v", i, err)
			}
			if thumbs[i], err = thumbnail(img); err != nil {
				return nil, err
			}
		}
		idx = keyframes(thumbs, n)
	} else {
		idx = opts.indices(len(images), n)
	}
	v := &Video{Info: Info{FPS: fps, Frames: len(images), Duration: float64(len(images)) / fps}}
	for _, i := range idx {
		img, info, err := picture.Decode(images[i], picture.Options{MaxPixels: opts.maxPixels()})
		if err != nil {
			return nil, errorf(ErrFrame, "images", "picture %d: %v", i, err)
		}
		if len(v.Frames) == 0 {
			v.Info.W, v.Info.H = info.W, info.H
		}
		v.Frames = append(v.Frames, img)
		v.Indices = append(v.Indices, i)
		v.Times = append(v.Times, float64(i)/fps)
	}
	return v, nil
}

// thumbnail is a 32x32 RGB version of img (Pillow's bilinear), for keyframe scores.
func thumbnail(img *picture.Image) ([]byte, error) {
	out := make([]byte, thumbSide*thumbSide*3)
	err := native.Resize(&native.ResizeJob{Src: img.Pix, SrcW: img.W, SrcH: img.H, Channels: 3, OutW: thumbSide, OutH: thumbSide,
		Crop: native.Rect{W: thumbSide, H: thumbSide}, Dst: out, Filter: native.Bilinear})
	if err != nil {
		return nil, errorf(ErrFrame, "keyframe", "%v", err)
	}
	return out, nil
}

const thumbSide = 32

// PerFrameTokens is what one frame costs under a preset (for Qwen2-VL, one temporal patch of
// TemporalPatch frames), at the video's displayed size.
func PerFrameTokens(p picture.Preset, w, h int) (int, error) {
	if p.Family == picture.InternVL {
		return p.TokensPerTile, nil // one tile a frame
	}
	return p.Tokens(w, h)
}

// Pool is the preset's temporal pooling (Qwen2-VL: its temporal patch; others 1).
func Pool(p picture.Preset) int {
	if p.Family == picture.Qwen2VL {
		return max(p.TemporalPatch, 1)
	}
	return 1
}

// Output is a preprocessed video: the encoder's input, named as Hugging Face's video processors
// name it, and its token count.
type Output struct {
	PixelValuesVideos native.Tensor // pixel_values_videos
	// Grid is Qwen2-VL's (t, h, w) patch grid of PixelValuesVideos, its processor's
	// video_grid_thw; zero for the other families.
	Grid   [3]int
	Tokens int
}

// Preprocess turns the frames into the preset's video pixel values, elements of dtype:
// [T, 3, S, S] for CLIP, SigLIP and InternVL (one 448 tile a frame); for Qwen2-VL every frame
// resized to the first frame's smart_resize size, then [gt*gh*gw, 3*T*P*P] and the grid
// (gt, gh, gw). Tokens = ceil(T / pool) * per frame.
func (v *Video) Preprocess(p picture.Preset, dtype native.DType) (*Output, error) {
	if len(v.Frames) == 0 {
		return nil, errorf(ErrEmpty, "preprocess", "no frames")
	}
	first := v.Frames[0]
	perFrame, err := PerFrameTokens(p, first.W, first.H)
	if err != nil {
		return nil, err
	}
	out := &Output{Tokens: TokenCount(len(v.Frames), perFrame, Pool(p))}
	if p.Family == picture.Qwen2VL {
		rh, rw, err := p.SmartResize(first.H, first.W)
		if err != nil {
			return nil, err
		}
		one := 3 * rw * rh * dtype.Size()
		chw := make([]byte, len(v.Frames)*one)
		for i, f := range v.Frames {
			if _, err := p.Resized(f, rw, rh, dtype, chw[i*one:(i+1)*one]); err != nil {
				return nil, fmt.Errorf("frame %d: %w", i, err)
			}
		}
		patches, grid := p.PatchLayout(chw, len(v.Frames), rh, rw, dtype.Size())
		out.PixelValuesVideos = native.Tensor{DType: dtype, Shape: []int{grid[0] * grid[1] * grid[2], 3 * p.TemporalPatch * p.Patch * p.Patch}, Data: patches}
		out.Grid = grid
		return out, nil
	}
	frame := p
	if p.Family == picture.InternVL {
		frame.MinTiles, frame.MaxTiles = 1, 1
	}
	var data []byte
	for i, f := range v.Frames {
		o, err := frame.Apply(f, dtype)
		if err != nil {
			return nil, fmt.Errorf("frame %d: %w", i, err)
		}
		data = append(data, o.PixelValues.Data...)
	}
	s := frame.Size
	out.PixelValuesVideos = native.Tensor{DType: dtype, Shape: []int{len(v.Frames), 3, s, s}, Data: data}
	return out, nil
}
