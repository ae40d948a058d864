// Package video turns a video, or a list of pictures taken as one, into vision-encoder inputs:
// frames chosen by a sampling strategy and a token budget, decoded to RGB by the ffmpeg command
// (raw RGB over a pipe, only the chosen frames) or by the picture package, then preprocessed
// per frame with a picture.Preset (Qwen2-VL: all frames at one size, in temporal patches).
package video

import (
	"fmt"
	"math"
	"time"

	"dataplane/dataplane/media/admit"
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

	// Admit, when set, is asked before each decode allocates (see admit.Func): a picture's
	// picture.DecodeBytes (plus what the reused buffer holds beyond it), the keyframe
	// thumbnails, and the raw-frame buffer ffmpeg's output is read into (3·W·H, one for all the
	// frames of a run). Each is released once that buffer is no longer referenced; a refusal is
	// returned as an *Error whose chain holds the *admit.Error (not one of the Err* kinds).
	Admit admit.Func
	// Sink, when set, sees every chosen frame at full size (media folds them into the content
	// key).
	Sink Sink
}

// Sink receives the chosen frames, upright RGB at full size, in order, as they are decoded.
// A frame is only valid during the call: its buffer is reused or dropped afterwards.
type Sink interface {
	// Begin says n frames follow. It is called again, with fewer, when ffmpeg outputs fewer
	// frames than were chosen (it decoded fewer frames than the container has packets): the
	// frames it did output are then sent again under the true count.
	Begin(n int)
	Frame(img *picture.Image) error
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
	// HardMaxFrames bounds MaxFrames itself: every chosen frame's preprocessed tensor is held
	// until the video is done (the full-size frames only one at a time).
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

// Video is a decoded and preprocessed video: the chosen frames' indices and times in the
// source, each one's upright size, and the preset's output. The frames themselves are not kept:
// each was decoded, preprocessed, shown to Options.Sink and dropped before the next one was
// decoded.
type Video struct {
	Info    Info
	Indices []int
	Times   []float64
	Sizes   [][2]int // W, H of each chosen frame, upright
	Output  *Output
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
// chosen by index with the same strategies, and only the chosen ones are decoded, one at a time
// into one reused buffer, each preprocessed with preset into dtype before the next (keyframe
// sampling decodes every picture once more, the same way, for its thumbnail).
func FromImages(images [][]byte, opts Options, preset picture.Preset, dtype native.DType) (*Video, error) {
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
	pics := pictures{opts: picture.Options{MaxPixels: opts.maxPixels()}, admit: opts.Admit}
	var idx []int
	if opts.Sampling == Keyframe {
		release, err := opts.Admit.Take(fmt.Sprintf("%d keyframe thumbnails", len(images)), int64(len(images))*thumbBytes)
		if err != nil {
			return nil, &Error{Op: "keyframe", Msg: "thumbnails", Err: err}
		}
		defer release()
		thumbs := make([][]byte, len(images))
		for i, b := range images {
			done, err := pics.decode(i, b)
			if err != nil {
				return nil, err
			}
			thumbs[i], err = thumbnail(&pics.img)
			done()
			if err != nil {
				return nil, err
			}
		}
		idx = keyframes(thumbs, n)
		release()
	} else {
		idx = opts.indices(len(images), n)
	}
	v := &Video{Info: Info{FPS: fps, Frames: len(images), Duration: float64(len(images)) / fps}}
	pl := newPipeline(preset, dtype, len(idx), opts.Sink)
	for _, i := range idx {
		done, err := pics.decode(i, images[i])
		if err != nil {
			return nil, err
		}
		if len(v.Indices) == 0 {
			v.Info.W, v.Info.H = pics.img.W, pics.img.H
		}
		err = pl.add(&pics.img)
		done()
		if err != nil {
			return nil, err
		}
		v.Indices = append(v.Indices, i)
		v.Times = append(v.Times, float64(i)/fps)
	}
	v.Sizes, v.Output = pl.sizes, pl.output()
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

const (
	thumbSide  = 32
	thumbBytes = 3 * thumbSide * thumbSide
)

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
