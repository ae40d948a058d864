package video

import (
	"bytes"
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
// (scaled to that size when scale is set), and calls each with them in order, one at a time, all
// read into one buffer (admitted, as what, before ffmpeg starts; released when extract returns).
// It returns how many frames ffmpeg output: fewer than len(idx) when it decoded fewer frames
// than there were packets; none is ErrCorrupt. An error from each is returned as it is.
func extract(ctx context.Context, data []byte, opts *Options, idx []int, w, h int, scale bool, what string,
	each func(k int, img *picture.Image) error) (int, error) {
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
	release, err := opts.Admit.Take(fmt.Sprintf("%s: %d frames of %dx%d rgb24, one at a time", what, len(idx), w, h), 3*int64(w)*int64(h))
	if err != nil {
		return 0, &Error{Op: "decode", Msg: what, Err: err}
	}
	defer release()
	var (
		count   int
		eachErr error
	)
	err = ffmpeg.Run(ctx, bin, opts.timeout(), data, func(path string) []string {
		return []string{"-nostdin", "-hide_banner", "-loglevel", "error", "-i", path, "-map", "0:v:0", "-vf", filter,
			"-fps_mode", "passthrough", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"}
	}, func(out io.Reader) error {
		var err error
		count, err = readFrames(out, len(idx), w, h, func(k int, img *picture.Image) error {
			eachErr = each(k, img)
			return eachErr
		})
		return err
	})
	switch {
	case eachErr != nil:
		return count, eachErr
	case err != nil:
		return count, ffmpegError("decode", err)
	case count == 0:
		return 0, errorf(ErrCorrupt, "decode", "ffmpeg decoded none of the %d frames chosen", len(idx))
	}
	return count, nil
}

// readFrames reads up to n raw RGB frames of w x h from r into one buffer, one at a time and
// nothing past them, calling each after every frame; it returns how many it read. Fewer whole
// frames than n (ffmpeg decoded fewer frames than there were packets) are not an error; a
// partial frame is.
func readFrames(r io.Reader, n, w, h int, each func(k int, img *picture.Image) error) (int, error) {
	img := &picture.Image{W: w, H: h}
	for k := range n {
		if img.Pix == nil {
			img.Pix = make([]byte, 3*w*h)
		}
		if _, err := io.ReadFull(r, img.Pix); err != nil {
			if errors.Is(err, io.EOF) {
				return k, nil
			}
			return k, fmt.Errorf("frame %d of %d: %w", k, n, err)
		}
		if err := each(k, img); err != nil {
			return k, err
		}
	}
	return n, nil
}

func ffmpegError(op string, err error) error {
	if errors.Is(err, ffmpeg.ErrMissing) {
		return errorf(ErrFFmpeg, op, "%v", err)
	}
	return errorf(ErrCorrupt, op, "%v", err)
}

// Decode chooses frames from a video container (anything ffmpeg reads), decodes only those, and
// preprocesses each with preset into dtype as it comes out of ffmpeg: one full-size frame is
// held at a time. The preset also prices frames for the token budget.
func Decode(ctx context.Context, data []byte, opts Options, preset picture.Preset, dtype native.DType) (*Video, error) {
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
		release, err := opts.Admit.Take(fmt.Sprintf("%d keyframe thumbnails", len(cands)), int64(len(cands))*thumbBytes)
		if err != nil {
			return nil, &Error{Op: "keyframe", Msg: "thumbnails", Err: err}
		}
		defer release()
		thumbs := make([][]byte, 0, len(cands))
		_, err = extract(ctx, data, &opts, cands, thumbSide, thumbSide, true, "keyframe candidates", func(_ int, img *picture.Image) error {
			thumbs = append(thumbs, bytes.Clone(img.Pix))
			return nil
		})
		if err != nil {
			return nil, err
		}
		for _, k := range keyframes(thumbs, n) {
			idx = append(idx, cands[k])
		}
		release()
	} else {
		idx = dedupe(opts.indices(info.Frames, n))
	}
	pl := newPipeline(preset, dtype, len(idx), opts.Sink)
	k, err := extract(ctx, data, &opts, idx, info.W, info.H, false, "frames", func(_ int, img *picture.Image) error { return pl.add(img) })
	if err != nil {
		return nil, err
	}
	if k < len(idx) && opts.Sink != nil {
		// ffmpeg decoded fewer frames than were chosen. The sink (the content key) counts the
		// frames before the first one, so it is shown those it got again, under their count:
		// a second decode, rather than holding every frame.
		opts.Sink.Begin(k)
		again, err := extract(ctx, data, &opts, idx[:k], info.W, info.H, false, "frames", func(_ int, img *picture.Image) error {
			return opts.Sink.Frame(img)
		})
		if err != nil {
			return nil, err
		}
		if again != k {
			return nil, errorf(ErrCorrupt, "decode", "ffmpeg decoded %d of the %d frames chosen, then %d of those", k, len(idx), again)
		}
	}
	v := &Video{Info: info, Indices: idx[:k], Sizes: pl.sizes, Output: pl.output()}
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
