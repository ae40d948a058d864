package hfproc

import (
	"fmt"

	"dataplane/dataplane/media/picture"
	"dataplane/native"
)

// The image processor classes read, by family (a "Fast" or "Pil" suffix is the same settings).
var imageClasses = map[string]picture.Family{
	"Qwen2VLImageProcessor":    picture.Qwen2VL,
	"Qwen2_5_VLImageProcessor": picture.Qwen2VL, // an early name of Qwen2.5-VL's (the same class)
	"CLIPImageProcessor":       picture.CLIP,
	"CLIPFeatureExtractor":     picture.CLIP,
	"SiglipImageProcessor":     picture.SigLIP,
	"LlavaNextImageProcessor":  picture.LlavaNext,
}

// image builds the image preset from an image processor's settings.
func (p *parse) image(o *object) error {
	class := o.str("image_processor_type", "")
	if class == "" {
		class = o.str("feature_extractor_type", "")
	}
	family, ok := imageClasses[className(class)]
	if !ok {
		o.fail("image_processor_type", "%q is not a processor this server reproduces (Qwen2-VL, CLIP/LLaVA, SigLIP, LLaVA-NeXT)", class)
		return o.err
	}
	var pr *picture.Preset
	switch family {
	case picture.Qwen2VL:
		pr = p.qwen2VL(o, picture.Qwen2VLImage)
	case picture.CLIP, picture.LlavaNext:
		pr = p.clip(o, family)
	case picture.SigLIP:
		pr = p.siglip(o)
	}
	o.ignore(metadata...)
	if err := o.unknown(); err != nil {
		return err
	}
	if err := p.proc.errOrNil(); err != nil {
		return err
	}
	pr.Name = name(family.String(), *pr)
	if err := checkPreset(o.file, pr); err != nil {
		return err
	}
	p.s.Image, p.s.Class = pr, class
	return nil
}

// checkPreset turns a preset the picture package refuses into an error naming the file.
func checkPreset(file string, pr *picture.Preset) error {
	if _, err := pr.Tokens(pr.Patch*64, pr.Patch*64); err != nil {
		return &Error{File: file, Msg: err.Error()}
	}
	return nil
}

// pixels reads what every image processor shares: the resize filter, the rescale and the
// normalisation, and the switches this server cannot turn off.
func pixels(o *object, pr *picture.Preset) {
	switch r := o.int("resample", 3); r {
	case 3:
		pr.Filter = native.Bicubic
	case 2:
		pr.Filter = native.Bilinear
	default:
		o.fail("resample", "%d (PIL's %s) is not supported: bicubic (3) and bilinear (2) are", r, pilFilter(r))
	}
	if !o.bool("do_resize", true) {
		o.fail("do_resize", "false is not supported: the encoders take the resized pictures")
	}
	if !o.bool("do_convert_rgb", true) {
		o.fail("do_convert_rgb", "false is not supported: pictures are always decoded to RGB")
	}
	factor := o.float("rescale_factor", 1.0/255)
	if o.bool("do_rescale", true) {
		if !(factor > 0 && factor <= 1) {
			o.fail("rescale_factor", "%g is not in (0, 1]", factor)
		}
		pr.Divisor = float32(1 / factor)
	} else {
		pr.Divisor = 1
	}
	mean, std := o.floats3("image_mean", pr.Mean), o.floats3("image_std", pr.Std)
	if o.bool("do_normalize", true) {
		pr.Mean, pr.Std = mean, std
	} else {
		pr.Mean, pr.Std = [3]float32{}, [3]float32{1, 1, 1}
	}
	for c := range 3 {
		if !(pr.Std[c] > 0) {
			o.fail("image_std", "%v: every channel's must be > 0", pr.Std)
		}
	}
}

// pilFilter names PIL's resampling filters by their number.
func pilFilter(r int) string {
	names := []string{"NEAREST", "LANCZOS", "BILINEAR", "BICUBIC", "BOX", "HAMMING"}
	if r >= 0 && r < len(names) {
		return names[r]
	}
	return "unknown"
}

// bounded refuses an integer outside lo..hi.
func bounded(o *object, field string, v, lo, hi int) int {
	if v < lo || v > hi {
		o.fail(field, "%d is not in %d..%d", v, lo, hi)
	}
	return v
}

// qwen2VL reads Qwen2-VL's (and Qwen2.5-VL's) image or video processor, starting from the
// class defaults in base.
func (p *parse) qwen2VL(o *object, base picture.Preset) *picture.Preset {
	pr := base
	if sz, ok := o.size("size"); ok {
		// {"shortest_edge": min_pixels, "longest_edge": max_pixels}; transformers 4.4x wrote
		// {"min_pixels", "max_pixels"}. Both are pixel counts, not edges.
		lo, hi := max(sz.Shortest, sz.MinPixels), max(sz.Longest, sz.MaxPixels)
		if lo == 0 || hi == 0 || sz.Height != 0 || sz.Width != 0 || sz.Bare != 0 {
			o.fail("size", "want {\"shortest_edge\": min pixels, \"longest_edge\": max pixels}")
		}
		pr.MinPixels, pr.MaxPixels = lo, hi
	}
	// min_pixels and max_pixels override size, as in transformers' __init__.
	pr.MinPixels = bounded(o, "min_pixels", o.int("min_pixels", pr.MinPixels), 1, maxInt)
	pr.MaxPixels = bounded(o, "max_pixels", o.int("max_pixels", pr.MaxPixels), pr.MinPixels, maxInt)
	pr.Patch = bounded(o, "patch_size", o.int("patch_size", pr.Patch), 1, 256)
	pr.MergeSize = bounded(o, "merge_size", o.int("merge_size", pr.MergeSize), 1, 16)
	pr.TemporalPatch = bounded(o, "temporal_patch_size", o.int("temporal_patch_size", pr.TemporalPatch), 1, 16)
	pixels(o, &pr)
	p.model.needFor(o, "vision_config", "vision_config.patch_size", "vision_config.spatial_merge_size", "vision_config.temporal_patch_size")
	if v := p.model.vision(); v != nil {
		agree(o, "patch_size", pr.Patch, "vision_config.patch_size", v.PatchSize)
		agree(o, "merge_size", pr.MergeSize, "vision_config.spatial_merge_size", v.SpatialMergeSize)
		agree(o, "temporal_patch_size", pr.TemporalPatch, "vision_config.temporal_patch_size", v.TemporalPatchSize)
	}
	return &pr
}

// clip reads a CLIPImageProcessor (CLIP itself, LLaVA-1.5) or a LlavaNextImageProcessor:
// shortest side to size, centre crop (transformers' floor offsets), and LLaVA-NeXT's grid.
func (p *parse) clip(o *object, family picture.Family) *picture.Preset {
	pr := picture.Preset{Family: family, Size: 224, CropSize: 224, Mean: picture.CLIPMean, Std: picture.CLIPStd, CropFloor: true}
	if sz, ok := o.size("size"); ok {
		switch {
		case sz.Bare > 0: // an int is the shortest edge for CLIP (default_to_square=False)
			pr.Size = sz.Bare
		case sz.Shortest > 0 && sz.Longest == 0 && sz.Height == 0 && sz.Width == 0:
			pr.Size = sz.Shortest
		default:
			o.fail("size", "only {\"shortest_edge\": N} is supported")
		}
	}
	if sz, ok := o.size("crop_size"); ok {
		switch {
		case sz.Bare > 0:
			pr.CropSize = sz.Bare
		case sz.Height > 0 && sz.Height == sz.Width && sz.Shortest == 0 && sz.Longest == 0:
			pr.CropSize = sz.Height
		default:
			o.fail("crop_size", "only a square {\"height\": N, \"width\": N} is supported")
		}
	}
	pr.Size = bounded(o, "size", pr.Size, 1, native.MaxImageSide)
	pr.CropSize = bounded(o, "crop_size", pr.CropSize, 1, pr.Size)
	if !o.bool("do_center_crop", true) {
		o.fail("do_center_crop", "false is not supported: the encoders take square pictures")
	}
	pixels(o, &pr)
	if family == picture.LlavaNext {
		pr.Pinpoints = o.pairs("image_grid_pinpoints", picture.MaxPinpoints)
		if pr.Pinpoints == nil {
			pr.Pinpoints = picture.LlavaNext336.Pinpoints
		}
		if s := o.str("aspect_ratio_setting", "anyres"); s != "anyres" {
			o.fail("aspect_ratio_setting", "%q is not supported: anyres is", s)
		}
		o.ignore("do_pad") // pads a batch to its most tiles: one picture has its own
		for _, pp := range pr.Pinpoints {
			if pp[0]%pr.CropSize != 0 || pp[1]%pr.CropSize != 0 || pp[0] > native.MaxImageSide || pp[1] > native.MaxImageSide {
				o.fail("image_grid_pinpoints", "%v is not a grid of %d-px tiles", pp, pr.CropSize)
			}
		}
		if pr.Size != pr.CropSize {
			o.fail("size", "shortest_edge %d differs from crop_size %d: LLaVA-NeXT's tiles are both", pr.Size, pr.CropSize)
		}
		p.model.needFor(o, "image_grid_pinpoints")
		if mp := p.model.gridPinpoints(); mp != nil && fmt.Sprint(mp) != fmt.Sprint(pr.Pinpoints) {
			o.fail("image_grid_pinpoints", "%v disagrees with %s image_grid_pinpoints %v (vLLM reads the latter)", pr.Pinpoints, ModelFile, mp)
		}
	}
	p.visionTokens(o, &pr, "crop_size", pr.CropSize, 1)
	return &pr
}

// siglip reads a SiglipImageProcessor: a square resize.
func (p *parse) siglip(o *object) *picture.Preset {
	pr := picture.Preset{Family: picture.SigLIP, Size: 224, Mean: picture.HalfMean, Std: picture.HalfStd}
	if sz, ok := o.size("size"); ok {
		switch {
		case sz.Bare > 0:
			pr.Size = sz.Bare
		case sz.Height > 0 && sz.Height == sz.Width && sz.Shortest == 0 && sz.Longest == 0:
			pr.Size = sz.Height
		default:
			o.fail("size", "only a square {\"height\": N, \"width\": N} is supported")
		}
	}
	pr.Size = bounded(o, "size", pr.Size, 1, native.MaxImageSide)
	pixels(o, &pr)
	p.visionTokens(o, &pr, "size", pr.Size, 0)
	return &pr
}

// visionTokens sets a ViT preset's patch size and extra tokens from the processor's settings
// and config.json, refusing the two when they disagree. cls is the tokens the tower adds to
// the patch grid (1 for CLIP's CLS).
func (p *parse) visionTokens(o *object, pr *picture.Preset, sizeField string, side, cls int) {
	p.model.needFor(o, "vision_config", "vision_config.image_size", "vision_config.patch_size", "vision_feature_select_strategy")
	if v := p.model.vision(); v != nil {
		agree(o, sizeField, side, "vision_config.image_size", v.ImageSize)
	}
	patch := p.model.patchSize()
	if p.proc != nil && p.proc.has("patch_size") {
		n := p.proc.int("patch_size", 0)
		if patch != nil && *patch != n {
			p.proc.fail("patch_size", "%d disagrees with %s vision_config.patch_size = %d", n, ModelFile, *patch)
		}
		patch = &n
	}
	pr.Patch = 14 // CLIP-L/14 and SigLIP so400m/14, the towers these processors come with
	if patch != nil {
		pr.Patch = *patch
	} else {
		p.note("patch size %d assumed: neither %s nor %s names it", pr.Patch, ProcessorFile, ModelFile)
	}
	if pr.Patch < 1 || pr.Patch > side {
		o.fail(sizeField, "%d is smaller than the patch size %d", side, pr.Patch)
	}
	strategy := p.model.strategy()
	if p.proc != nil && p.proc.has("vision_feature_select_strategy") {
		s := p.proc.str("vision_feature_select_strategy", "")
		if strategy != "" && s != strategy {
			p.proc.fail("vision_feature_select_strategy", "%q disagrees with %s's %q", s, ModelFile, strategy)
		}
		strategy = s
	}
	extra := cls
	if p.proc != nil {
		extra = bounded(p.proc, "num_additional_image_tokens", p.proc.int("num_additional_image_tokens", cls), 0, 16)
	}
	switch strategy {
	case "", "default": // the tower's extra tokens are dropped
	case "full":
		pr.ExtraTokens = extra
	default:
		o.fail("vision_feature_select_strategy", "%q is not default or full", strategy)
	}
}

// internVL builds InternVL 2 / 2.5's preset from config.json, as vLLM's InternVL processor does.
func (p *parse) internVL() (*picture.Preset, error) {
	m := p.model
	if err := m.need("model_type", "vision_config", "vision_config.image_size", "vision_config.patch_size", "force_image_size",
		"downsample_ratio", "min_dynamic_patch", "max_dynamic_patch", "use_thumbnail", "dynamic_image_size"); err != nil {
		return nil, err
	}
	bad := func(field, format string, args ...any) (*picture.Preset, error) {
		return nil, &Error{File: ModelFile, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	v := m.vision()
	if v == nil || v.ImageSize == nil || v.PatchSize == nil {
		return bad("vision_config", "needs image_size and patch_size")
	}
	size, patch := *v.ImageSize, *v.PatchSize
	if size < 1 || size > native.MaxImageSide || patch < 1 || patch > size {
		return bad("vision_config.image_size", "%d with patch %d", size, patch)
	}
	if m.ForceImageSize != nil && *m.ForceImageSize != size {
		return bad("force_image_size", "%d disagrees with vision_config.image_size %d (vLLM tiles at the latter)", *m.ForceImageSize, size)
	}
	ratio := 0.5
	if m.DownsampleRatio != nil {
		ratio = *m.DownsampleRatio
	}
	lo, hi, thumb, dynamic := 1, 6, false, false // InternVLChatConfig's defaults
	if m.MinDynamicPatch != nil {
		lo = *m.MinDynamicPatch
	}
	if m.MaxDynamicPatch != nil {
		hi = *m.MaxDynamicPatch
	}
	if m.UseThumbnail != nil {
		thumb = *m.UseThumbnail
	}
	if m.DynamicImageSize != nil {
		dynamic = *m.DynamicImageSize
	}
	if !dynamic {
		lo, hi = 1, 1
	}
	if lo < 1 || hi < lo || hi > 64 {
		return bad("max_dynamic_patch", "tiles %d..%d (want 1 <= min <= max <= 64)", lo, hi)
	}
	n := size / patch
	tokens := int(float64(n*n) * (ratio * ratio))
	if tokens < 1 {
		return bad("downsample_ratio", "%g leaves no tokens of a %d-patch tile", ratio, n*n)
	}
	pr := picture.InternVL448
	pr.Size, pr.Patch, pr.MinTiles, pr.MaxTiles, pr.Thumbnail, pr.TokensPerTile = size, patch, lo, hi, thumb, tokens
	pr.Name = name("internvl", pr)
	if err := checkPreset(ModelFile, &pr); err != nil {
		return nil, err
	}
	return &pr, nil
}

// processorFields reads what processor_config.json says beyond the sub-processors: the
// fields visionTokens did not take are tokens and templates, for the tokenizer to know.
func (p *parse) processorFields() {
	p.proc.ignore(metadata...)
	p.proc.ignore("image_token", "video_token", "audio_token", "audio_bos_token", "audio_eos_token", "chat_template",
		"vision_start_token", "vision_end_token", "image_start_token", "image_end_token")
	if p.s.Image == nil || (p.s.Image.Family != picture.CLIP && p.s.Image.Family != picture.LlavaNext && p.s.Image.Family != picture.SigLIP) {
		// The CLIP-family fields mean nothing to another family's processor.
		for _, k := range []string{"patch_size", "vision_feature_select_strategy", "num_additional_image_tokens"} {
			if p.proc.has(k) {
				p.proc.fail(k, "set, but the image processor is not a CLIP, SigLIP or LLaVA-NeXT one")
			}
		}
	}
}

func (o *object) errOrNil() error {
	if o == nil {
		return nil
	}
	return o.err
}
