package video

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"dataplane/dataplane/media/ffmpeg"
	"dataplane/dataplane/media/picture"
	"dataplane/native"
)

// probe asks ffprobe for the first video stream: size (as displayed: a 90-degree rotation in
// the metadata swaps it, and ffmpeg rotates the frames it outputs to match), frame rate, frame
// count (packets counted, as container frame counts are often missing) and duration.
func probe(ctx context.Context, data []byte, opts *Options) (Info, error) {
	bin := opts.FFprobe
	if bin == "" {
		bin = "ffprobe"
	}
	var raw []byte
	err := ffmpeg.Run(ctx, bin, opts.timeout(), data, func(path string) []string {
		return []string{"-v", "error", "-select_streams", "v:0", "-count_packets", "-show_entries",
			"stream=width,height,avg_frame_rate,r_frame_rate,nb_read_packets,duration:stream_side_data=rotation:stream_tags=rotate:format=duration",
			"-of", "json", path}
	}, func(out io.Reader) error {
		var err error
		raw, err = ffmpeg.ReadAtMost(out, 1<<20, "ffprobe output")
		return err
	})
	if err != nil {
		return Info{}, ffmpegError("probe", err)
	}
	return parseProbe(raw)
}

// parseProbe reads ffprobe's JSON (the entries probe asks for). Whatever it says, the result is
// an Info that is safe to compute with (sides within native.MaxImageSide, so their product
// cannot overflow past the pixel limit; finite positive rate and duration) or ErrCorrupt.
func parseProbe(raw []byte) (Info, error) {
	var p struct {
		Streams []struct {
			Width, Height int
			AvgFrameRate  string `json:"avg_frame_rate"`
			RFrameRate    string `json:"r_frame_rate"`
			Packets       string `json:"nb_read_packets"`
			Duration      string `json:"duration"`
			SideData      []struct {
				Rotation float64 `json:"rotation"`
			} `json:"side_data_list"`
			Tags struct {
				Rotate string `json:"rotate"`
			} `json:"tags"`
		}
		Format struct {
			Duration string `json:"duration"`
		}
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return Info{}, errorf(ErrCorrupt, "probe", "ffprobe output: %v", err)
	}
	if len(p.Streams) == 0 {
		return Info{}, errorf(ErrCorrupt, "probe", "no video stream")
	}
	s := p.Streams[0]
	info := Info{W: s.Width, H: s.Height, FPS: rate(s.AvgFrameRate)}
	if info.FPS <= 0 {
		info.FPS = rate(s.RFrameRate)
	}
	info.Frames, _ = strconv.Atoi(s.Packets)
	info.Duration = positive(s.Duration)
	if info.Duration == 0 {
		info.Duration = positive(p.Format.Duration)
	}
	rot, _ := strconv.ParseFloat(s.Tags.Rotate, 64)
	for _, sd := range s.SideData {
		rot = sd.Rotation
	}
	if r := math.Mod(math.Abs(rot), 180); r == 90 {
		info.W, info.H = info.H, info.W
	}
	if info.W < 1 || info.H < 1 || info.W > native.MaxImageSide || info.H > native.MaxImageSide || info.Frames < 1 ||
		!(info.FPS > 0) || math.IsInf(info.FPS, 0) {
		return Info{}, errorf(ErrCorrupt, "probe", "stream says %dx%d, %d frames at %g fps", info.W, info.H, info.Frames, info.FPS)
	}
	if info.Duration == 0 {
		info.Duration = float64(info.Frames) / info.FPS
	}
	return info, nil
}

// positive parses a duration; 0 when missing, not a number, infinite or not above zero.
func positive(s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// rate parses "num/den" (or a plain number).
func rate(s string) float64 {
	num, den, ok := strings.Cut(s, "/")
	n, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0
	}
	if !ok {
		return n
	}
	d, err := strconv.ParseFloat(den, 64)
	if err != nil || d == 0 {
		return 0
	}
	return n / d
}

// extract has ffmpeg decode the video and output only frames idx (ascending) as raw RGB of w x h
// (scaled to that size when scale is set), read one frame at a time from the pipe.
func extract(ctx context.Context, data []byte, opts *Options, idx []int, w, h int, scale bool) ([]*picture.Image, error) {
	bin := opts.FFmpeg
	if bin == "" {
		bin = "ffmpeg"
	}
	terms := make([]string, len(idx))
	for i, n := range idx {
		terms[i] = fmt.Sprintf("eq(n\\,%d)", n)
	}
	filter := "select='" + strings.Join(terms, "+") + "'"
	if scale {
		filter += fmt.Sprintf(",scale=%d:%d:flags=bilinear", w, h)
	}
	var frames []*picture.Image
	err := ffmpeg.Run(ctx, bin, opts.timeout(), data, func(path string) []string {
		return []string{"-nostdin", "-hide_banner", "-loglevel", "error", "-i", path, "-map", "0:v:0", "-vf", filter,
			"-fps_mode", "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"}
	}, func(out io.Reader) error {
		var err error
		frames, err = readFrames(out, len(idx), w, h)
		return err
	})
	if err != nil {
		return nil, ffmpegError("decode", err)
	}
	if len(frames) == 0 {
		return nil, errorf(ErrCorrupt, "decode", "ffmpeg decoded none of the %d frames chosen", len(idx))
	}
	return frames, nil
}

// readFrames reads up to n raw RGB frames of w x h from r, one at a time and nothing past
// them. Fewer whole frames than n (ffmpeg decoded fewer frames than there were packets) are
// kept; a partial frame is an error.
func readFrames(r io.Reader, n, w, h int) ([]*picture.Image, error) {
	var frames []*picture.Image
	for range n {
		img := &picture.Image{W: w, H: h, Pix: make([]byte, 3*w*h)}
		if _, err := io.ReadFull(r, img.Pix); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("frame %d of %d: %w", len(frames), n, err)
		}
		frames = append(frames, img)
	}
	return frames, nil
}

func ffmpegError(op string, err error) error {
	if errors.Is(err, ffmpeg.ErrMissing) {
		return errorf(ErrFFmpeg, op, "%v", err)
	}
	return errorf(ErrCorrupt, op, "%v", err)
}

// Decode chooses frames from a video container (anything ffmpeg reads) and decodes only those.
// The preset prices frames for the token budget.
func Decode(ctx context.Context, data []byte, opts Options, preset picture.Preset) (*Video, error) {
	if len(data) == 0 {
		return nil, errorf(ErrEmpty, "decode", "empty input")
	}
	info, err := probe(ctx, data, &opts)
	if err != nil {
		return nil, err
	}
	if px := info.W * info.H; px > opts.maxPixels() {
		return nil, errorf(ErrTooLarge, "decode", "%dx%d frames = %d pixels, limit %d", info.W, info.H, px, opts.maxPixels())
	}
	if limit := orDefault(opts.MaxSeconds, DefaultMaxSeconds); info.Duration > limit {
		return nil, errorf(ErrTooLong, "decode", "%.1f s, limit %.0f s", info.Duration, limit)
	}
	perFrame, err := PerFrameTokens(preset, info.W, info.H)
	if err != nil {
		return nil, err
	}
	if opts.Budget.Pool == 0 {
		opts.Budget.Pool = Pool(preset)
	}
	n, err := opts.choose(info.Frames, info.FPS, perFrame)
	if err != nil {
		return nil, err
	}
	var idx []int
	if opts.Sampling == Keyframe {
		cands := linspace(info.Frames, max(n, min(info.Frames, int(info.Duration*orDefault(opts.CandidateFPS, DefaultCandidateFPS)))), floor)
		cands = dedupe(cands)
		thumbs, err := extract(ctx, data, &opts, cands, thumbSide, thumbSide, true)
		if err != nil {
			return nil, err
		}
		th := make([][]byte, len(thumbs))
		for i, t := range thumbs {
			th[i] = t.Pix
		}
		for _, k := range keyframes(th, n) {
			idx = append(idx, cands[k])
		}
	} else {
		idx = dedupe(opts.indices(info.Frames, n))
	}
	frames, err := extract(ctx, data, &opts, idx, info.W, info.H, false)
	if err != nil {
		return nil, err
	}
	v := &Video{Info: info, Frames: frames, Indices: idx[:len(frames)]}
	for _, i := range v.Indices {
		v.Times = append(v.Times, float64(i)/info.FPS)
	}
	return v, nil
}

// dedupe drops repeated indices from an ascending list (ffmpeg's select outputs a frame once).
func dedupe(idx []int) []int {
	out := idx[:0:0]
	for i, v := range idx {
		if i == 0 || v != idx[i-1] {
			out = append(out, v)
		}
	}
	return out
}
