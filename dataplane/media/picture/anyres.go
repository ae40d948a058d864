package picture

import (
	"math"

	"dataplane/native"
)

// LLaVA-NeXT's "anyres" preprocessing, as transformers' LlavaNextImageProcessor (PIL backend)
// and LlavaNextProcessor._get_number_of_features compute it; see hfproc/testdata/README.md for
// the files and commit this follows.

// MaxPinpoints bounds a LLaVA-NeXT preset's grid resolutions.
const MaxPinpoints = 64

func (p Preset) checkPinpoints() error {
	c := p.crop()
	if len(p.Pinpoints) == 0 || len(p.Pinpoints) > MaxPinpoints {
		return errorf(ErrPreset, "preprocess", "", "%s: %d grid pinpoints (want 1..%d)", p.Name, len(p.Pinpoints), MaxPinpoints)
	}
	if p.Size != c {
		return errorf(ErrPreset, "preprocess", "", "%s: base size %d differs from the tile size %d", p.Name, p.Size, c)
	}
	for _, pp := range p.Pinpoints {
		if pp[0] < c || pp[1] < c || pp[0]%c != 0 || pp[1]%c != 0 || pp[0] > native.MaxImageSide || pp[1] > native.MaxImageSide {
			return errorf(ErrPreset, "preprocess", "", "%s: pinpoint %dx%d is not a grid of %d-px tiles", p.Name, pp[1], pp[0], c)
		}
	}
	return nil
}

// AnyresGeometry is where a picture goes in LLaVA-NeXT's anyres grid, and its token count.
type AnyresGeometry struct {
	BestH, BestW       int // the chosen pinpoint (select_best_resolution)
	Rows, Cols         int // tiles of CropSize: BestH/CropSize x BestW/CropSize
	ResizedH, ResizedW int // the picture's size inside the grid (get_patch_output_size)
	PadTop, PadLeft    int // where it sits: the rest of the grid is zero padding
	// FeatH, FeatW are the tile features' grid once the padding rows or columns are taken
	// off (_get_unpadded_features); the model adds a newline token after each of FeatH rows.
	FeatH, FeatW int
	Tokens       int // FeatH*FeatW + FeatH + (CropSize/Patch)^2 + ExtraTokens
}

// Anyres is the geometry of a w x h picture (the preset must be LlavaNext and valid).
func (p Preset) Anyres(w, h int) AnyresGeometry {
	c := p.crop()
	var g AnyresGeometry
	g.BestH, g.BestW = selectBestResolution(w, h, p.Pinpoints)
	g.Rows, g.Cols = g.BestH/c, g.BestW/c
	g.ResizedH, g.ResizedW = patchOutputSize(w, h, g.BestW, g.BestH)
	g.PadTop, g.PadLeft = (g.BestH-g.ResizedH)/2, (g.BestW-g.ResizedW)/2

	// _get_unpadded_features: the features of the tiles, less the rows (or columns) that only
	// hold padding. The float expressions are transformers' own, in the same order.
	n := c / p.Patch
	curH, curW := n*g.Rows, n*g.Cols
	fh, fw := float64(h), float64(w)
	if fw/fh > float64(curW)/float64(curH) {
		newH := intRound7(fh * (float64(curW) / fw))
		curH -= (curH - newH) / 2 * 2
	} else {
		newW := intRound7(fw * (float64(curH) / fh))
		curW -= (curW - newW) / 2 * 2
	}
	g.FeatH, g.FeatW = curH, curW
	g.Tokens = curH*curW + curH + n*n + p.ExtraTokens
	return g
}

// selectBestResolution is transformers' select_best_resolution: the pinpoint (h, w) where the
// picture, scaled to fit, keeps the most of its pixels; on a tie the one with least waste.
func selectBestResolution(w, h int, pinpoints [][2]int) (int, int) {
	bestH, bestW := 0, 0
	maxEffective, minWasted := 0, math.MaxInt
	for _, pp := range pinpoints {
		scale := min(float64(pp[1])/float64(w), float64(pp[0])/float64(h))
		dw, dh := int(float64(w)*scale), int(float64(h)*scale)
		effective := min(dw*dh, w*h)
		wasted := pp[0]*pp[1] - effective
		if effective > maxEffective || (effective == maxEffective && wasted < minWasted) {
			maxEffective, minWasted = effective, wasted
			bestH, bestW = pp[0], pp[1]
		}
	}
	return bestH, bestW
}

// patchOutputSize is transformers' get_patch_output_size: the picture scaled to fit the
// target, the fitting side exact and the other rounded up (at most the target's).
func patchOutputSize(w, h, tw, th int) (int, int) {
	scaleW, scaleH := float64(tw)/float64(w), float64(th)/float64(h)
	if scaleW < scaleH {
		return min(int(math.Ceil(float64(h)*scaleW)), th), tw
	}
	return th, min(int(math.Ceil(float64(w)*scaleH)), tw)
}

// intRound7 is Python's int(round(x, 7)) for x >= 0: x truncated, unless it lies within half a
// 1e-7 of the next integer (the float error of a product that should be whole).
func intRound7(x float64) int {
	f := math.Floor(x)
	if math.RoundToEven((x-f)*1e7) >= 1e7 {
		f++
	}
	return int(f)
}

// AnyresRGB cuts a picture into LLaVA-NeXT's 8-bit pictures, CropSize square: the base picture
// (resized to Size x Size), then the grid's tiles in row-major order (the picture resized into
// the grid, the rest zero). Apply normalises exactly these.
func (p Preset) AnyresRGB(img *Image) ([][]byte, AnyresGeometry, error) {
	if err := p.check(); err != nil {
		return nil, AnyresGeometry{}, err
	}
	if p.Family != LlavaNext {
		return nil, AnyresGeometry{}, errorf(ErrPreset, "preprocess", "", "%s is not a LLaVA-NeXT preset", p.Name)
	}
	g := p.Anyres(img.W, img.H)
	c := p.crop()
	out := make([][]byte, 1+g.Rows*g.Cols)
	base := make([]byte, 3*c*c)
	if err := p.resizeInto(img, c, c, native.Rect{W: c, H: c}, base); err != nil {
		return nil, g, err
	}
	out[0] = base
	for i := range g.Rows * g.Cols {
		tile := make([]byte, 3*c*c) // zero: the padding
		ty, tx := (i/g.Cols)*c, (i%g.Cols)*c
		// The part of the resized picture inside this tile, in the picture's coordinates.
		x0, y0 := max(tx, g.PadLeft)-g.PadLeft, max(ty, g.PadTop)-g.PadTop
		x1, y1 := min(tx+c, g.PadLeft+g.ResizedW)-g.PadLeft, min(ty+c, g.PadTop+g.ResizedH)-g.PadTop
		if x1 > x0 && y1 > y0 {
			win := native.Rect{X: x0, Y: y0, W: x1 - x0, H: y1 - y0}
			part := make([]byte, 3*win.W*win.H)
			if err := p.resizeInto(img, g.ResizedW, g.ResizedH, win, part); err != nil {
				return nil, g, err
			}
			dx, dy := g.PadLeft+x0-tx, g.PadTop+y0-ty
			for y := range win.H {
				copy(tile[3*((dy+y)*c+dx):], part[3*y*win.W:3*(y+1)*win.W])
			}
		}
		out[1+i] = tile
	}
	return out, g, nil
}

// resizeInto resizes img to w x h with the preset's filter and writes the window crop, 8-bit
// RGB, into dst (a copy when no resize is needed).
func (p Preset) resizeInto(img *Image, w, h int, crop native.Rect, dst []byte) error {
	if w == img.W && h == img.H {
		for y := range crop.H {
			src := img.Pix[3*((crop.Y+y)*img.W+crop.X):]
			copy(dst[3*y*crop.W:3*(y+1)*crop.W], src)
		}
		return nil
	}
	job := native.ResizeJob{Src: img.Pix, SrcW: img.W, SrcH: img.H, Channels: 3, OutW: w, OutH: h, Crop: crop, Dst: dst, Filter: p.Filter}
	if err := native.Resize(&job); err != nil {
		return errorf(ErrDimensions, "preprocess", "", "resize %dx%d to %dx%d: %v", img.W, img.H, w, h, err)
	}
	return nil
}

// anyresTiles is AnyresRGB normalised: [1 + tiles, 3, C, C] of dtype.
func (p Preset) anyresTiles(img *Image, dtype native.DType) ([]byte, int, error) {
	pics, _, err := p.AnyresRGB(img)
	if err != nil {
		return nil, 0, err
	}
	c := p.crop()
	one := 3 * c * c * dtype.Size()
	out := make([]byte, len(pics)*one)
	for i, rgb := range pics {
		if err := native.Normalize(out[i*one:(i+1)*one], dtype, rgb, c, c, p.Mean, p.Std, p.divisor()); err != nil {
			return nil, 0, errorf(ErrPreset, "preprocess", "", "normalize: %v", err)
		}
	}
	return out, len(pics), nil
}
