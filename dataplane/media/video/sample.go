package video

import (
	"fmt"
	"math"
	"slices"
)

// Sampling is how frames are chosen from a video.
type Sampling uint8

const (
	// Uniform takes Options.Frames frames evenly spaced over the video:
	// np.linspace(0, total - 1, n, dtype=int), as vLLM's and LLaVA-Video's loaders do.
	Uniform Sampling = iota
	// FPS takes Options.FPS frames a second, as Qwen2-VL's smart_nframes does:
	// n = total / video_fps * fps, bounded by the frame limits and the total, floored to a
	// multiple of Options.FrameMultiple, then linspace(0, total - 1, n) rounded half to even.
	FPS
	// Keyframe takes the frames that differ most from the frame before them (scene changes):
	// candidates at Options.CandidateFPS are scored by the mean absolute difference of 32x32
	// thumbnails from the previous candidate; the first frame always counts; the n best are
	// kept in time order. (The frame-difference selector the design notes call for.)
	Keyframe
	// MaxFrames takes as many frames as the limits allow (Options.MaxFrames and the token
	// budget), evenly spaced as Uniform.
	MaxFrames
)

func (s Sampling) String() string {
	return [...]string{"uniform", "fps", "keyframe", "max_frames"}[min(int(s), 3)]
}

// ParseSampling reads the names String writes.
func ParseSampling(s string) (Sampling, error) {
	for _, v := range []Sampling{Uniform, FPS, Keyframe, MaxFrames} {
		if v.String() == s {
			return v, nil
		}
	}
	return 0, fmt.Errorf("unknown sampling %q (want uniform, fps, keyframe or max_frames)", s)
}

// Budget picks the frame count from the tokens the model's context has left for this video
// (a VideoTokenBudget): the most frames n such that ceil(n / Pool) * per-frame tokens <= Tokens.
type Budget struct {
	Tokens int // tokens available for the video (context length minus text and other items)
	Pool   int // temporal pooling: frames that share one set of tokens (Qwen2-VL: 2; 0 means 1)
}

// Frames is the most frames the budget allows at perFrame tokens a frame (or pooled group).
func (b Budget) Frames(perFrame int) int {
	if perFrame <= 0 || b.Tokens <= 0 {
		return 0
	}
	return b.Tokens / perFrame * max(b.Pool, 1)
}

// TokenCount is the token count of n frames: ceil(n / pool) * perFrame.
func TokenCount(n, perFrame, pool int) int {
	pool = max(pool, 1)
	return (n + pool - 1) / pool * perFrame
}

// linspace is numpy's linspace(0, total - 1, n) taken to integers by conv (floor for
// dtype=int, round half to even for torch's round()).
func linspace(total, n int, conv func(float64) float64) []int {
	if n <= 0 || total <= 0 {
		return nil
	}
	if n == 1 {
		return []int{0}
	}
	out := make([]int, n)
	step := float64(total-1) / float64(n-1)
	for i := range out {
		v := float64(i) * step
		if i == n-1 {
			v = float64(total - 1)
		}
		out[i] = min(total-1, int(conv(v)))
	}
	return out
}

// floorTo is n floored to a multiple of m (Qwen's floor_by_factor), at least m.
func floorTo(n float64, m int) int {
	m = max(m, 1)
	return max(m, int(math.Floor(n/float64(m)))*m)
}

// count is how many frames a strategy takes from total frames at rate fps, before the budget.
func (o *Options) count(total int, fps float64) int {
	switch o.Sampling {
	case FPS:
		n := float64(total) / fps * o.fps()
		return floorTo(min(max(n, float64(o.minFrames())), float64(o.maxFrames()), float64(total)), o.FrameMultiple)
	case MaxFrames:
		return o.maxFrames()
	default:
		if o.Frames > 0 {
			return o.Frames
		}
		return o.maxFrames()
	}
}

// keyframes picks n candidates with the largest difference from their predecessor (the first
// counts as the largest), returned in time order. thumbs are equal-sized byte thumbnails.
func keyframes(thumbs [][]byte, n int) []int {
	type scored struct {
		i     int
		score float64
	}
	s := make([]scored, len(thumbs))
	for i := range thumbs {
		s[i] = scored{i, math.Inf(1)}
		if i > 0 {
			var d float64
			for k, v := range thumbs[i] {
				d += math.Abs(float64(v) - float64(thumbs[i-1][k]))
			}
			s[i].score = d / float64(max(len(thumbs[i]), 1))
		}
	}
	slices.SortStableFunc(s, func(a, b scored) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return 0
	})
	var out []int
	for _, v := range s[:min(n, len(s))] {
		out = append(out, v.i)
	}
	slices.Sort(out)
	return out
}
