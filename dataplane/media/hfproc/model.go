package hfproc

import (
	"encoding/json"
	"fmt"
	"math"
)

// model is what config.json says about preprocessing. The file describes the whole model, so
// only these fields are read and the rest is left alone; a wrongly typed one is an error.
type model struct {
	ModelType string        `json:"model_type"`
	Vision    *visionConfig `json:"vision_config"`
	Audio     *struct {
		NumMelBins *int `json:"num_mel_bins"`
	} `json:"audio_config"`
	NumMelBins *int `json:"num_mel_bins"` // Whisper's own config

	ImageGridPinpoints          [][2]int `json:"image_grid_pinpoints"`
	VisionFeatureSelectStrategy string   `json:"vision_feature_select_strategy"`
	ForceImageSize              *int     `json:"force_image_size"` // InternVL
	DownsampleRatio             *float64 `json:"downsample_ratio"`
	MinDynamicPatch             *int     `json:"min_dynamic_patch"`
	MaxDynamicPatch             *int     `json:"max_dynamic_patch"`
	UseThumbnail                *bool    `json:"use_thumbnail"`
	DynamicImageSize            *bool    `json:"dynamic_image_size"`
}

type visionConfig struct {
	ImageSize         *int `json:"image_size"`
	PatchSize         *int `json:"patch_size"`
	SpatialMergeSize  *int `json:"spatial_merge_size"`
	TemporalPatchSize *int `json:"temporal_patch_size"`
}

func parseModel(data []byte) (*model, error) {
	var m model
	if err := json.Unmarshal(data, &m); err != nil {
		var te *json.UnmarshalTypeError
		if ok := asTypeError(err, &te); ok {
			return nil, &Error{File: ModelFile, Field: te.Field, Msg: fmt.Sprintf("a %s where a %v belongs", te.Value, te.Type)}
		}
		return nil, &Error{File: ModelFile, Msg: fmt.Sprintf("not a JSON object: %v", err)}
	}
	for _, v := range []*int{m.imageSize(), m.patchSize(), m.ForceImageSize, m.MinDynamicPatch, m.MaxDynamicPatch} {
		if v != nil && (*v < 0 || *v > maxInt) {
			return nil, &Error{File: ModelFile, Msg: fmt.Sprintf("a size of %d", *v)}
		}
	}
	if m.DownsampleRatio != nil && (math.IsNaN(*m.DownsampleRatio) || *m.DownsampleRatio <= 0 || *m.DownsampleRatio > 1) {
		return nil, &Error{File: ModelFile, Field: "downsample_ratio", Msg: fmt.Sprintf("%g is not in (0, 1]", *m.DownsampleRatio)}
	}
	return &m, nil
}

func asTypeError(err error, te **json.UnmarshalTypeError) bool {
	t, ok := err.(*json.UnmarshalTypeError)
	if ok {
		*te = t
	}
	return ok
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
