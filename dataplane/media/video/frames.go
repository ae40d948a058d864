package video

import (
	"fmt"

	"dataplane/dataplane/media/admit"
	"dataplane/dataplane/media/picture"
	"dataplane/native"
)

// pictures decodes the pictures of a list one at a time into one reused buffer, admitting each
// decode before it allocates.
type pictures struct {
	img   picture.Image
	opts  picture.Options
	admit admit.Func
}

// decode decodes picture i into p.img; done releases its admission once p.img is no longer
// needed. The admission is the decode's peak (picture.DecodeBytes) plus whatever the reused
// buffer holds beyond the picture's own RGB (a larger picture decoded before it).
func (p *pictures) decode(i int, data []byte) (done func(), err error) {
	info, err := picture.DecodeConfig(data)
	if err == nil {
		err = p.opts.Check(info)
	}
	if err != nil {
		return nil, errorf(ErrFrame, "images", "picture %d: %v", i, err)
	}
	held := max(0, int64(cap(p.img.Pix))-3*int64(info.StoredW)*int64(info.StoredH))
	done, err = p.admit.Take(fmt.Sprintf("picture %d (%s %dx%d)", i, info.Format, info.StoredW, info.StoredH),
		picture.DecodeBytes(info, p.opts)+held)
	if err != nil {
		return nil, &Error{Op: "images", Msg: fmt.Sprintf("picture %d", i), Err: err}
	}
	if _, err := picture.DecodeInto(&p.img, data, p.opts); err != nil {
		done()
		return nil, errorf(ErrFrame, "images", "picture %d: %v", i, err)
	}
	return done, nil
}

// pipeline preprocesses the chosen frames as they are decoded, one at a time, into the video's
// output (what Preprocess did with every frame held): per-frame presets append [3, S, S] per
// frame; Qwen2-VL resizes every frame to the first one's smart_resize size and lays the
// patches out at the end. Each frame is also shown to the sink.
type pipeline struct {
	preset picture.Preset // per frame (InternVL: one tile)
	family picture.Family
	dtype  native.DType
	n      int // frames expected
	sink   Sink

	// From the first frame.
	perFrame int
	rw, rh   int // Qwen2-VL
	one      int // bytes of one preprocessed frame (Qwen2-VL)
	data     []byte
	sizes    [][2]int
}

func newPipeline(p picture.Preset, dtype native.DType, n int, sink Sink) *pipeline {
	pl := &pipeline{preset: p, family: p.Family, dtype: dtype, n: n, sink: sink}
	if p.Family == picture.InternVL {
		pl.preset.MinTiles, pl.preset.MaxTiles = 1, 1
	}
	if sink != nil {
		sink.Begin(n)
	}
	return pl
}

// add preprocesses one frame (upright, full size) and shows it to the sink; img is not kept.
func (pl *pipeline) add(img *picture.Image) error {
	k := len(pl.sizes)
	if k == 0 {
		perFrame, err := PerFrameTokens(pl.preset, img.W, img.H)
		if err != nil {
			return err
		}
		pl.perFrame = perFrame
		if pl.family == picture.Qwen2VL {
			if pl.rh, pl.rw, err = pl.preset.SmartResize(img.H, img.W); err != nil {
				return err
			}
			pl.one = 3 * pl.rw * pl.rh * pl.dtype.Size()
			pl.data = make([]byte, pl.n*pl.one)
		}
	}
	if pl.family == picture.Qwen2VL {
		if k >= pl.n {
			return errorf(ErrCorrupt, "preprocess", "frame %d of %d", k, pl.n)
		}
		if _, err := pl.preset.Resized(img, pl.rw, pl.rh, pl.dtype, pl.data[k*pl.one:(k+1)*pl.one]); err != nil {
			return fmt.Errorf("frame %d: %w", k, err)
		}
	} else {
		o, err := pl.preset.Apply(img, pl.dtype)
		if err != nil {
			return fmt.Errorf("frame %d: %w", k, err)
		}
		if pl.data == nil {
			pl.data = make([]byte, 0, pl.n*len(o.PixelValues.Data))
		}
		pl.data = append(pl.data, o.PixelValues.Data...)
	}
	if pl.sink != nil {
		if err := pl.sink.Frame(img); err != nil {
			return fmt.Errorf("frame %d: %w", k, err)
		}
	}
	pl.sizes = append(pl.sizes, [2]int{img.W, img.H})
	return nil
}

// output is the preprocessed video of the frames added: [T, 3, S, S], or Qwen2-VL's
// [gt*gh*gw, 3*T*P*P] and grid (gt, gh, gw). Tokens = ceil(T / pool) * per frame.
func (pl *pipeline) output() *Output {
	t := len(pl.sizes)
	p := pl.preset
	out := &Output{Tokens: TokenCount(t, pl.perFrame, Pool(p))}
	if pl.family == picture.Qwen2VL {
		patches, grid := p.PatchLayout(pl.data[:t*pl.one], t, pl.rh, pl.rw, pl.dtype.Size())
		out.PixelValuesVideos = native.Tensor{DType: pl.dtype, Shape: []int{grid[0] * grid[1] * grid[2], 3 * p.TemporalPatch * p.Patch * p.Patch}, Data: patches}
		out.Grid = grid
		return out
	}
	s := p.Size
	out.PixelValuesVideos = native.Tensor{DType: pl.dtype, Shape: []int{t, 3, s, s}, Data: pl.data}
	return out
}
