package picture

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"dataplane/native"
)

// Family is a model family's preprocessing scheme.
type Family uint8

const (
	// CLIP: resize the shortest side to Size (the long side int(Size*long/short)), centre crop
	// Size x Size (offsets rounded half to even), as openai/CLIP's _transform (torchvision).
	CLIP Family = iota + 1
	// SigLIP: resize to Size x Size, as Hugging Face's SiglipImageProcessor.
	SigLIP
	// Qwen2VL: smart_resize to multiples of Patch*MergeSize within [MinPixels, MaxPixels], then
	// flattened into patches of TemporalPatch frames (Hugging Face's Qwen2VLImageProcessor).
	Qwen2VL
	// InternVL: the tile grid (cols x rows <= MaxTiles) closest to the aspect ratio, each tile
	// Size x Size, plus a Size x Size thumbnail of the whole picture when there is more than one
	// tile (InternVL's dynamic_preprocess).
	InternVL
	// LlavaNext: LLaVA-NeXT's "anyres": the grid resolution (Pinpoints) that keeps most of the
	// picture, the picture resized into it and padded, cut into CropSize tiles, after a base
	// picture squashed to Size x Size (Hugging Face's LlavaNextImageProcessor).
	LlavaNext
)

func (f Family) String() string {
	switch f {
	case CLIP:
		return "clip"
	case SigLIP:
		return "siglip"
	case Qwen2VL:
		return "qwen2-vl"
	case InternVL:
		return "internvl"
	case LlavaNext:
		return "llava-next"
	}
	return fmt.Sprintf("family(%d)", uint8(f))
}

// Normalisation constants, as float32 (what torch.tensor(mean) holds).
var (
	CLIPMean     = [3]float32{0.48145466, 0.4578275, 0.40821073}
	CLIPStd      = [3]float32{0.26862954, 0.26130258, 0.27577711}
	ImageNetMean = [3]float32{0.485, 0.456, 0.406}
	ImageNetStd  = [3]float32{0.229, 0.224, 0.225}
	HalfMean     = [3]float32{0.5, 0.5, 0.5} // SigLIP: mean = std = 0.5
	HalfStd      = [3]float32{0.5, 0.5, 0.5}
)

// Preset is one model's image preprocessing and token count. Fields a family does not use are
// ignored.
type Preset struct {
	Name   string
	Family Family
	Size   int // CLIP: shortest side and crop; SigLIP: square side; InternVL: tile side
	Patch  int // ViT patch side
	Filter native.Filter
	Mean   [3]float32
	Std    [3]float32

	MinPixels, MaxPixels int // Qwen2VL: smart_resize bounds
	MergeSize            int // Qwen2VL: spatial merge (tokens = patches / MergeSize^2)
	TemporalPatch        int // Qwen2VL: frames per temporal patch (a picture is repeated to fill it)

	MinTiles, MaxTiles int  // InternVL
	Thumbnail          bool // InternVL: add a thumbnail when there are several tiles
	TokensPerTile      int  // InternVL: 256 (1024 patches, pixel shuffle 0.5)

	// Set from a checkpoint's processor config (hfproc); the zero values are the built-in
	// presets' conventions.

	// CropSize is CLIP's centre crop and LLaVA-NeXT's tile side (0: Size).
	CropSize int
	// CropFloor places CLIP's crop at floor((resized - crop) / 2), as transformers'
	// center_crop does; false rounds half to even, as torchvision's CenterCrop.
	CropFloor bool
	// Divisor is what a pixel is divided by before mean and std (0: 255; 1 when the processor
	// does not rescale).
	Divisor float32
	// ExtraTokens are tokens beyond the patch grid a CLIP, SigLIP or LLaVA-NeXT picture gives
	// (the CLS token when the LLaVA processor's vision_feature_select_strategy is "full").
	ExtraTokens int
	// Pinpoints are LLaVA-NeXT's image_grid_pinpoints, (height, width), multiples of CropSize.
	Pinpoints [][2]int
}

// crop is the CLIP crop and LLaVA-NeXT tile side.
func (p Preset) crop() int {
	if p.CropSize > 0 {
		return p.CropSize
	}
	return p.Size
}

// divisor is the rescale's divisor.
func (p Preset) divisor() float32 {
	if p.Divisor > 0 {
		return p.Divisor
	}
	return 255
}

// The built-in presets.
var (
	CLIP224 = Preset{Name: "clip-224", Family: CLIP, Size: 224, Patch: 14, Filter: native.Bicubic, Mean: CLIPMean, Std: CLIPStd}
	CLIP336 = Preset{Name: "clip-336", Family: CLIP, Size: 336, Patch: 14, Filter: native.Bicubic, Mean: CLIPMean, Std: CLIPStd}
	// SigLIP so400m/14 @ 384 (SigLIP 2 resizes bilinearly: set Filter).
	SigLIP384 = Preset{Name: "siglip-384", Family: SigLIP, Size: 384, Patch: 14, Filter: native.Bicubic, Mean: HalfMean, Std: HalfStd}
	// Qwen2-VL / Qwen2.5-VL images: 28-pixel multiples within [56*56, 28*28*1280].
	Qwen2VLImage = Preset{Name: "qwen2-vl", Family: Qwen2VL, Patch: 14, Filter: native.Bicubic, Mean: CLIPMean, Std: CLIPStd,
		MinPixels: 56 * 56, MaxPixels: 28 * 28 * 1280, MergeSize: 2, TemporalPatch: 2}
	// InternVL 2 / 2.5: 448 tiles, 1 to 12, with a thumbnail.
	InternVL448 = Preset{Name: "internvl", Family: InternVL, Size: 448, Patch: 14, Filter: native.Bicubic, Mean: ImageNetMean,
		Std: ImageNetStd, MinTiles: 1, MaxTiles: 12, Thumbnail: true, TokensPerTile: 256}
	// LLaVA-NeXT (v1.6) on CLIP-L/14 at 336: transformers' LlavaNextImageProcessor defaults
	// for llava-hf's checkpoints, the "default" feature selection (no CLS token).
	LlavaNext336 = Preset{Name: "llava-next", Family: LlavaNext, Size: 336, Patch: 14, Filter: native.Bicubic, Mean: CLIPMean,
		Std: CLIPStd, Pinpoints: [][2]int{{336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}}}
)

// Presets lists the built-in presets.
func Presets() []Preset {
	return []Preset{CLIP224, CLIP336, SigLIP384, Qwen2VLImage, InternVL448, LlavaNext336}
}

// check refuses presets whose parameters cannot work.
func (p Preset) check() error {
	bad := func(format string, args ...any) error {
		return errorf(ErrPreset, "preprocess", "", "%s: %s", p.Name, fmt.Sprintf(format, args...))
	}
	for c := range 3 {
		if !(p.Std[c] > 0) {
			return bad("std[%d] = %g", c, p.Std[c])
		}
	}
	if p.Patch < 1 {
		return bad("patch %d", p.Patch)
	}
	if p.Divisor < 0 || p.ExtraTokens < 0 || p.CropSize < 0 {
		return bad("divisor %g, extra tokens %d, crop %d", p.Divisor, p.ExtraTokens, p.CropSize)
	}
	switch p.Family {
	case CLIP, SigLIP, InternVL, LlavaNext:
		if p.Size < p.Patch || p.Size > native.MaxImageSide {
			return bad("size %d", p.Size)
		}
		if c := p.crop(); c < p.Patch || c > p.Size {
			return bad("crop %d of a %d resize", c, p.Size)
		}
		if p.Family == InternVL && (p.MinTiles < 1 || p.MaxTiles < p.MinTiles || p.MaxTiles > 64 || p.TokensPerTile < 1) {
			return bad("tiles %d..%d, %d tokens a tile", p.MinTiles, p.MaxTiles, p.TokensPerTile)
		}
		if p.Family == LlavaNext {
			return p.checkPinpoints()
		}
	case Qwen2VL:
		if p.MergeSize < 1 || p.TemporalPatch < 1 || p.MinPixels < 1 || p.MaxPixels < p.MinPixels {
			return bad("merge %d, temporal patch %d, pixels %d..%d", p.MergeSize, p.TemporalPatch, p.MinPixels, p.MaxPixels)
		}
	default:
		return bad("unknown family %v", p.Family)
	}
	return nil
}

// Tokens is the number of encoder tokens (LLM placeholder positions) a picture of w x h
// (upright) produces, known before decoding: CLIP (crop/Patch)^2 (LLaVA drops the CLS token:
// 576 at 336/14), SigLIP floor(Size/Patch)^2 (729 at 384/14), both + ExtraTokens; Qwen2-VL
// (H'/28)(W'/28) after smart_resize; InternVL TokensPerTile per tile and thumbnail; LLaVA-NeXT
// the unpadded grid, a newline a row and the base picture (Anyres).
func (p Preset) Tokens(w, h int) (int, error) {
	if err := p.check(); err != nil {
		return 0, err
	}
	if w < 1 || h < 1 {
		return 0, errorf(ErrDimensions, "preprocess", "", "%dx%d", w, h)
	}
	switch p.Family {
	case CLIP, SigLIP:
		n := p.crop() / p.Patch
		return n*n + p.ExtraTokens, nil
	case LlavaNext:
		return p.Anyres(w, h).Tokens, nil
	case Qwen2VL:
		rh, rw, err := p.SmartResize(h, w)
		if err != nil {
			return 0, err
		}
		f := p.Patch * p.MergeSize
		return (rh / f) * (rw / f), nil
	case InternVL:
		cols, rows := p.tileGrid(w, h)
		n := cols * rows
		if p.Thumbnail && n > 1 {
			n++
		}
		return n * p.TokensPerTile, nil
	}
	return 0, nil
}

// Output is a preprocessed picture: the encoder's input, named as Hugging Face's image
// processors name it, and its token count.
type Output struct {
	PixelValues native.Tensor // pixel_values
	// Grid is Qwen2-VL's (t, h, w) patch grid of PixelValues, its processor's image_grid_thw;
	// zero for the other families.
	Grid [3]int
	// ImageSize is LLaVA-NeXT's image_sizes entry, the picture's (height, width); zero for the
	// other families.
	ImageSize [2]int
	Tokens    int
}

// Apply preprocesses an upright RGB picture into the family's pixel values, elements of dtype:
//   - CLIP, SigLIP: [1, 3, S, S];
//   - InternVL: [tiles (+ thumbnail), 3, S, S];
//   - LlavaNext: [1 + tiles, 3, C, C], the base picture first, and the image size;
//   - Qwen2VL: [gh*gw, 3*T*P*P] in its patch order, and the grid (1, gh, gw).
func (p Preset) Apply(img *Image, dtype native.DType) (*Output, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	if img == nil || img.W < 1 || img.H < 1 || len(img.Pix) < 3*img.W*img.H {
		return nil, errorf(ErrDimensions, "preprocess", "", "no picture or a short pixel buffer")
	}
	if dtype.Size() == 0 {
		return nil, errorf(ErrPreset, "preprocess", "", "unknown dtype %v", dtype)
	}
	tokens, err := p.Tokens(img.W, img.H)
	if err != nil {
		return nil, err
	}
	out := &Output{Tokens: tokens}
	switch p.Family {
	case CLIP:
		rw, rh, crop := p.clipCrop(img.W, img.H)
		c := crop.W
		data, err := p.resizeNormalize(img, rw, rh, crop, dtype, nil)
		if err != nil {
			return nil, err
		}
		out.PixelValues = tensor(dtype, data, 1, 3, c, c)
	case SigLIP:
		data, err := p.resizeNormalize(img, p.Size, p.Size, native.Rect{W: p.Size, H: p.Size}, dtype, nil)
		if err != nil {
			return nil, err
		}
		out.PixelValues = tensor(dtype, data, 1, 3, p.Size, p.Size)
	case InternVL:
		data, n, err := p.tiles(img, dtype)
		if err != nil {
			return nil, err
		}
		out.PixelValues = tensor(dtype, data, n, 3, p.Size, p.Size)
	case LlavaNext:
		data, n, err := p.anyresTiles(img, dtype)
		if err != nil {
			return nil, err
		}
		c := p.crop()
		out.PixelValues = tensor(dtype, data, n, 3, c, c)
		out.ImageSize = [2]int{img.H, img.W}
	case Qwen2VL:
		rh, rw, err := p.SmartResize(img.H, img.W)
		if err != nil {
			return nil, err
		}
		chw, err := p.resizeNormalize(img, rw, rh, native.Rect{W: rw, H: rh}, dtype, nil)
		if err != nil {
			return nil, err
		}
		patches, grid := p.PatchLayout(chw, 1, rh, rw, dtype.Size())
		out.PixelValues = tensor(dtype, patches, grid[0]*grid[1]*grid[2], 3*p.TemporalPatch*p.Patch*p.Patch)
		out.Grid = grid
	}
	return out, nil
}

// clipCrop is CLIP's resize of a w x h picture (shortest side to Size) and its centre crop.
func (p Preset) clipCrop(w, h int) (rw, rh int, crop native.Rect) {
	rw, rh = ShortestSide(w, h, p.Size)
	c := p.crop()
	crop = native.Rect{X: roundHalfEven(float64(rw-c) / 2), Y: roundHalfEven(float64(rh-c) / 2), W: c, H: c}
	if p.CropFloor {
		crop.X, crop.Y = (rw-c)/2, (rh-c)/2
	}
	return rw, rh, crop
}

// ApplyBytes is Decode + Apply from the encoded picture. For a CLIP preset and an upright JPEG
// (orientation 1, or ignored) only the source window the crop reads is decoded
// (native.JPEGResize: iMCU columns through jpeg_crop_scanline, rows through
// jpeg_skip_scanlines) and resized straight from the decoder's rows: the same bytes, without the
// full picture (rows below the window are never decoded, so damage there goes unseen). Anything
// else decodes fully.
func (p Preset) ApplyBytes(data []byte, dtype native.DType, opts Options) (*Output, Info, error) {
	if err := p.check(); err != nil {
		return nil, Info{}, err
	}
	info, err := DecodeConfig(data)
	if err != nil {
		return nil, info, err
	}
	if err := opts.Check(info); err != nil {
		return nil, info, err
	}
	if p.Family != CLIP || info.Format != JPEG || !(opts.IgnoreOrientation || info.Orientation == 1) {
		img, info, err := Decode(data, opts)
		if err != nil {
			return nil, info, err
		}
		out, err := p.Apply(img, dtype)
		return out, info, err
	}
	info.W, info.H = info.StoredW, info.StoredH
	if dtype.Size() == 0 {
		return nil, info, errorf(ErrPreset, "preprocess", "", "unknown dtype %v", dtype)
	}
	tokens, err := p.Tokens(info.W, info.H)
	if err != nil {
		return nil, info, err
	}
	rw, rh, crop := p.clipCrop(info.W, info.H)
	buf := scratch.Get().(*[]byte)
	defer scratch.Put(buf)
	if n := 3 * crop.W * crop.H; cap(*buf) < n {
		*buf = make([]byte, n)
	}
	rgb := (*buf)[:3*crop.W*crop.H]
	job := native.ResizeJob{SrcW: info.W, SrcH: info.H, Channels: 3, OutW: rw, OutH: rh, Crop: crop, Dst: rgb, Filter: p.Filter}
	if err := native.JPEGResize(data, &job); err != nil {
		kind := ErrCorrupt
		if errors.Is(err, native.ErrUnsupported) {
			kind = ErrUnsupported
		}
		return nil, info, errorf(kind, "decode", "jpeg", "%v", err)
	}
	dst := make([]byte, 3*crop.W*crop.H*dtype.Size())
	if err := native.Normalize(dst, dtype, rgb, crop.W, crop.H, p.Mean, p.Std, p.divisor()); err != nil {
		return nil, info, errorf(ErrPreset, "preprocess", "", "normalize: %v", err)
	}
	return &Output{PixelValues: tensor(dtype, dst, 1, 3, crop.H, crop.W), Tokens: tokens}, info, nil
}

// Resized resizes img to w x h with the preset's filter and writes it normalised as CHW dtype
// into dst (3*w*h elements; allocated when nil). Video frames use it to share one size.
func (p Preset) Resized(img *Image, w, h int, dtype native.DType, dst []byte) ([]byte, error) {
	return p.resizeNormalize(img, w, h, native.Rect{W: w, H: h}, dtype, dst)
}

// resizeNormalize resizes img to w x h, keeps the window crop and writes it as CHW dtype into
// dst (allocated when nil, returned).
func (p Preset) resizeNormalize(img *Image, w, h int, crop native.Rect, dtype native.DType, dst []byte) ([]byte, error) {
	rgb := img.Pix
	if w != img.W || h != img.H || crop.W != w || crop.H != h {
		buf := scratch.Get().(*[]byte)
		defer scratch.Put(buf)
		if n := 3 * crop.W * crop.H; cap(*buf) < n {
			*buf = make([]byte, n)
		}
		rgb = (*buf)[:3*crop.W*crop.H]
		job := native.ResizeJob{Src: img.Pix, SrcW: img.W, SrcH: img.H, Channels: 3, OutW: w, OutH: h, Crop: crop, Dst: rgb, Filter: p.Filter}
		if err := native.Resize(&job); err != nil {
			return nil, errorf(ErrDimensions, "preprocess", "", "resize %dx%d to %dx%d: %v", img.W, img.H, w, h, err)
		}
	}
	if dst == nil {
		dst = make([]byte, 3*crop.W*crop.H*dtype.Size())
	}
	if err := native.Normalize(dst, dtype, rgb, crop.W, crop.H, p.Mean, p.Std, p.divisor()); err != nil {
		return nil, errorf(ErrPreset, "preprocess", "", "normalize: %v", err)
	}
	return dst, nil
}

// scratch holds the resized 8-bit pictures between the resize and the normalisation (a
// picture's worth each; returned to the pool when the call ends).
var scratch = sync.Pool{New: func() any { return new([]byte) }}

// ShortestSide is torchvision's Resize(n) size for a w x h picture: the short side becomes n,
// the long side int(n * long / short) (unchanged when the short side already is n).
func ShortestSide(w, h, n int) (int, int) {
	short, long := w, h
	if w > h {
		short, long = h, w
	}
	if short == n {
		return w, h
	}
	newLong := int(float64(n*long) / float64(short))
	if w <= h {
		return n, newLong
	}
	return newLong, n
}

// roundHalfEven is Python's round() on a float: ties go to the even integer.
func roundHalfEven(x float64) int { return int(math.RoundToEven(x)) }

func tensor(dtype native.DType, data []byte, shape ...int) native.Tensor {
	return native.Tensor{DType: dtype, Shape: shape, Data: data}
}
