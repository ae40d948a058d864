package hfproc

import (
	"encoding/json"
	"fmt"
	"math"
)

// model is what config.json says about preprocessing. The file describes the whole model, so
// only these fields are read; one that does not parse is refused only when a processor needs it
// (a tokenizer's directory may hold any model's config).
type model struct {
	ModelType  string
	Vision     *visionConfig
	Audio      *audioConfig
	NumMelBins *int // Whisper's own config

	ImageGridPinpoints          [][2]int
	VisionFeatureSelectStrategy string
	ForceImageSize              *int // InternVL
	DownsampleRatio             *float64
	MinDynamicPatch             *int
	MaxDynamicPatch             *int
	UseThumbnail                *bool
	DynamicImageSize            *bool

	bad map[string]string // fields that did not parse, by path, and why
}

type visionConfig struct {
	ImageSize, PatchSize, SpatialMergeSize, TemporalPatchSize *int
}

type audioConfig struct{ NumMelBins *int }

func parseModel(data []byte) (*model, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil || top == nil {
		return nil, &Error{File: ModelFile, Msg: "not a JSON object"}
	}
	m := &model{bad: map[string]string{}}
	get := func(dst any, path string, v json.RawMessage) bool {
		if len(v) == 0 || string(v) == "null" {
			return false
		}
		if err := json.Unmarshal(v, dst); err != nil {
			m.bad[path] = fmt.Sprintf("%.40s is not a %s", v, kind(dst))
			return false
		}
		return true
	}
	size := func(dst **int, path string, v json.RawMessage) {
		if get(dst, path, v) && (**dst < 0 || **dst > maxInt) {
			m.bad[path], *dst = fmt.Sprintf("%d is not in 0..2^40", **dst), nil
		}
	}
	sub := func(key string) map[string]json.RawMessage {
		var s map[string]json.RawMessage
		get(&s, key, top[key])
		return s
	}
	get(&m.ModelType, "model_type", top["model_type"])
	if v := sub("vision_config"); v != nil {
		m.Vision = &visionConfig{}
		size(&m.Vision.ImageSize, "vision_config.image_size", v["image_size"])
		size(&m.Vision.PatchSize, "vision_config.patch_size", v["patch_size"])
		size(&m.Vision.SpatialMergeSize, "vision_config.spatial_merge_size", v["spatial_merge_size"])
		size(&m.Vision.TemporalPatchSize, "vision_config.temporal_patch_size", v["temporal_patch_size"])
	}
	if a := sub("audio_config"); a != nil {
		m.Audio = &audioConfig{}
		size(&m.Audio.NumMelBins, "audio_config.num_mel_bins", a["num_mel_bins"])
	}
	size(&m.NumMelBins, "num_mel_bins", top["num_mel_bins"])
	get(&m.ImageGridPinpoints, "image_grid_pinpoints", top["image_grid_pinpoints"])
	get(&m.VisionFeatureSelectStrategy, "vision_feature_select_strategy", top["vision_feature_select_strategy"])
	size(&m.ForceImageSize, "force_image_size", top["force_image_size"])
	size(&m.MinDynamicPatch, "min_dynamic_patch", top["min_dynamic_patch"])
	size(&m.MaxDynamicPatch, "max_dynamic_patch", top["max_dynamic_patch"])
	get(&m.UseThumbnail, "use_thumbnail", top["use_thumbnail"])
	get(&m.DynamicImageSize, "dynamic_image_size", top["dynamic_image_size"])
	if get(&m.DownsampleRatio, "downsample_ratio", top["downsample_ratio"]) {
		if r := *m.DownsampleRatio; math.IsNaN(r) || r <= 0 || r > 1 {
			m.bad["downsample_ratio"], m.DownsampleRatio = fmt.Sprintf("%g is not in (0, 1]", r), nil
		}
	}
	return m, nil
}

// kind names what a field should have been.
func kind(dst any) string {
	switch dst.(type) {
	case **int:
		return "whole number"
	case *string:
		return "string"
	case **bool:
		return "boolean"
	case **float64:
		return "number"
	case *[][2]int:
		return "list of [height, width] pairs"
	}
	return "JSON object"
}

// need refuses the first of these config.json fields that did not parse (a processor needs
// them).
func (m *model) need(paths ...string) error {
	if m == nil {
		return nil
	}
	for _, p := range paths {
		if why, ok := m.bad[p]; ok {
			return &Error{File: ModelFile, Field: p, Msg: why}
		}
	}
	return nil
}

// needFor is need, kept as o's error (o is the processor file that needs the fields).
func (m *model) needFor(o *object, paths ...string) {
	if err := m.need(paths...); err != nil && o.err == nil {
		o.err = err
	}
}

func (m *model) imageSize() *int {
	if v := m.vision(); v != nil {
		return v.ImageSize
	}
	return nil
}

func (m *model) patchSize() *int {
	if v := m.vision(); v != nil {
		return v.PatchSize
	}
	return nil
}

// agree refuses a processor setting that config.json contradicts: the model's own value wins
// in vLLM for some settings and the processor's in transformers, so a checkpoint where they
// differ would give the two different token counts.
func agree(o *object, field string, v int, modelField string, mv *int) {
	if mv != nil && *mv != v {
		o.fail(field, "%d disagrees with %s %s = %d", v, ModelFile, modelField, *mv)
	}
}

func (m *model) vision() *visionConfig {
	if m == nil {
		return nil
	}
	return m.Vision
}

func (m *model) gridPinpoints() [][2]int {
	if m == nil {
		return nil
	}
	return m.ImageGridPinpoints
}

func (m *model) strategy() string {
	if m == nil {
		return ""
	}
	return m.VisionFeatureSelectStrategy
}
