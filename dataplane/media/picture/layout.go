package picture

import (
	"cmp"
	"math"
	"slices"

	"dataplane/native"
)

// MaxAspect is smart_resize's limit on the long side over the short one.
const MaxAspect = 200

// SmartResize is Qwen2-VL's smart_resize(height, width): both sides rounded (half to even) to
// multiples of f = Patch*MergeSize; scaled down (floor) when the area exceeds MaxPixels, up (ceil)
// when below MinPixels. Returns the new height and width.
func (p Preset) SmartResize(h, w int) (int, int, error) {
	f := p.Patch * p.MergeSize
	if h < 1 || w < 1 {
		return 0, 0, errorf(ErrDimensions, "preprocess", "", "%dx%d", w, h)
	}
	if float64(max(h, w))/float64(min(h, w)) > MaxAspect {
		return 0, 0, errorf(ErrDimensions, "preprocess", "", "%dx%d: aspect ratio over %d", w, h, MaxAspect)
	}
	fh, fw, ff := float64(h), float64(w), float64(f)
	hb, wb := roundHalfEven(fh/ff)*f, roundHalfEven(fw/ff)*f
	if hb*wb > p.MaxPixels {
		beta := math.Sqrt(fh * fw / float64(p.MaxPixels))
		hb = max(f, int(math.Floor(fh/beta/ff))*f)
		wb = max(f, int(math.Floor(fw/beta/ff))*f)
	} else if hb*wb < p.MinPixels {
		beta := math.Sqrt(float64(p.MinPixels) / (fh * fw))
		hb = int(math.Ceil(fh*beta/ff)) * f
		wb = int(math.Ceil(fw*beta/ff)) * f
	}
	return hb, wb, nil
}

// PatchLayout arranges t frames (CHW, h x w, es-byte elements, one after another in chw) into
// Qwen2-VL's flattened patches: frames padded to a multiple of TemporalPatch by repeating the
// last, then reshaped to (gt, T, C, gh/M, M, P, gw/M, M, P), transposed to
// (gt, gh/M, gw/M, M, M, C, T, P, P) and flattened to [gt*gh*gw, C*T*P*P]. grid is (gt, gh, gw).
func (p Preset) PatchLayout(chw []byte, t, h, w, es int) ([]byte, [3]int) {
	P, M, T := p.Patch, p.MergeSize, p.TemporalPatch
	gt, gh, gw := (t+T-1)/T, h/P, w/P
	row := 3 * T * P * P * es
	out := make([]byte, gt*gh*gw*row)
	plane, frame := h*w*es, 3*h*w*es
	run := P * es // one patch row: P contiguous elements in source and destination
	at := 0
	for it := range gt {
		for bh := range gh / M {
			for bw := range gw / M {
				for mh := range M {
					for mw := range M {
						for c := range 3 {
							for tt := range T {
								f := min(it*T+tt, t-1) // the padding repeats the last frame
								base := f*frame + c*plane
								y0, x0 := (bh*M+mh)*P, (bw*M+mw)*P
								for py := range P {
									src := base + ((y0+py)*w+x0)*es
									copy(out[at:at+run], chw[src:src+run])
									at += run
								}
							}
						}
					}
				}
			}
		}
	}
	return out, [3]int{gt, gh, gw}
}

// TileGrid is InternVL's tile grid for a w x h picture: columns and rows (the preset must be
// InternVL and valid).
func (p Preset) TileGrid(w, h int) (cols, rows int) { return p.tileGrid(w, h) }

// tileGrid is InternVL's find_closest_aspect_ratio: among (cols, rows) with MinTiles <=
// cols*rows <= MaxTiles, ordered by tile count, the aspect ratio closest to w/h; on a tie, the
// later (larger) grid when the picture's area exceeds half the grid's area.
func (p Preset) tileGrid(w, h int) (cols, rows int) {
	type ratio struct{ c, r int }
	var ratios []ratio
	for n := p.MinTiles; n <= p.MaxTiles; n++ {
		for c := 1; c <= n; c++ {
			for r := 1; r <= n; r++ {
				if c*r >= p.MinTiles && c*r <= p.MaxTiles && !slices.Contains(ratios, ratio{c, r}) {
					ratios = append(ratios, ratio{c, r})
				}
			}
		}
	}
	// Python sorts a set by tile count (stable over the set's order); ties in tile count with
	// equal distance cannot both win below, so (c, r) order among them does not matter.
	slices.SortStableFunc(ratios, func(a, b ratio) int {
		return cmp.Or(cmp.Compare(a.c*a.r, b.c*b.r), cmp.Compare(a.c, b.c))
	})
	aspect, area := float64(w)/float64(h), float64(w)*float64(h)
	best, bestDiff := ratio{1, 1}, math.Inf(1)
	for _, q := range ratios {
		diff := math.Abs(aspect - float64(q.c)/float64(q.r))
		if diff < bestDiff {
			best, bestDiff = q, diff
		} else if diff == bestDiff && area > 0.5*float64(p.Size*p.Size*q.c*q.r) {
			best = q
		}
	}
	return best.c, best.r
}

// tiles resizes the picture to the grid's size, cuts it into Size x Size tiles in row-major
// order, adds the thumbnail, and returns the tiles as [n, 3, Size, Size] dtype.
func (p Preset) tiles(img *Image, dtype native.DType) ([]byte, int, error) {
	cols, rows := p.tileGrid(img.W, img.H)
	n := cols * rows
	if p.Thumbnail && n > 1 {
		n++
	}
	one := 3 * p.Size * p.Size * dtype.Size()
	out := make([]byte, n*one)
	for i := range cols * rows {
		crop := native.Rect{X: (i % cols) * p.Size, Y: (i / cols) * p.Size, W: p.Size, H: p.Size}
		if _, err := p.resizeNormalize(img, cols*p.Size, rows*p.Size, crop, dtype, out[i*one:(i+1)*one]); err != nil {
			return nil, 0, err
		}
	}
	if n > cols*rows {
		if _, err := p.resizeNormalize(img, p.Size, p.Size, native.Rect{W: p.Size, H: p.Size}, dtype, out[(n-1)*one:]); err != nil {
			return nil, 0, err
		}
	}
	return out, n, nil
}
