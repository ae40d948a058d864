// Package encoder loads Hugging Face encoder checkpoints (CLIP and SigLIP vision towers, the
// Whisper encoder, and LLaVA-style checkpoints that hold a vision tower and a projector) and
// runs them on the native CPU kernels. It is the interface the encoder worker loop calls:
// Load a model directory, ask the exact token count of an input, Run a batch into buffers the
// caller owns.
package encoder

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"dataplane/native"
)

// ErrConfig is what every config.json problem unwraps to.
var ErrConfig = errors.New("unsupported or malformed config.json")

// visionConfig holds the fields of CLIPVisionConfig / SiglipVisionConfig we use; pointers tell
// a missing field (take the architecture's default) from a zero one.
type visionConfig struct {
	ModelType         string   `json:"model_type"`
	HiddenSize        *int     `json:"hidden_size"`
	IntermediateSize  *int     `json:"intermediate_size"`
	NumHiddenLayers   *int     `json:"num_hidden_layers"`
	NumAttentionHeads *int     `json:"num_attention_heads"`
	NumChannels       *int     `json:"num_channels"`
	ImageSize         *int     `json:"image_size"`
	PatchSize         *int     `json:"patch_size"`
	HiddenAct         *string  `json:"hidden_act"`
	LayerNormEps      *float64 `json:"layer_norm_eps"`
	ProjectionDim     *int     `json:"projection_dim"`
}

// whisperConfig holds the encoder fields of WhisperConfig.
type whisperConfig struct {
	DModel                *int    `json:"d_model"`
	EncoderLayers         *int    `json:"encoder_layers"`
	EncoderAttentionHeads *int    `json:"encoder_attention_heads"`
	EncoderFFNDim         *int    `json:"encoder_ffn_dim"`
	NumMelBins            *int    `json:"num_mel_bins"`
	MaxSourcePositions    *int    `json:"max_source_positions"`
	ActivationFunction    *string `json:"activation_function"`
	ScaleEmbedding        bool    `json:"scale_embedding"`
}

// topConfig is config.json: a vision or Whisper config itself, or one that nests a vision
// config (CLIPConfig, SiglipConfig, LlavaConfig).
type topConfig struct {
	visionConfig
	whisperConfig
	VisionConfig *visionConfig `json:"vision_config"`
	TextConfig   *struct {
		HiddenSize *int `json:"hidden_size"`
	} `json:"text_config"`
	ProjectorHiddenAct          *string `json:"projector_hidden_act"`
	VisionFeatureLayer          *int    `json:"vision_feature_layer"`
	VisionFeatureSelectStrategy *string `json:"vision_feature_select_strategy"`
	MultimodalProjectorBias     *bool   `json:"multimodal_projector_bias"`
}

// Spec is what a config.json says about a checkpoint: the native encoder configuration, the
// features a VLM takes from it by default, and where its tensors sit.
type Spec struct {
	Config    native.EncoderConfig
	Select    native.OutputSelection
	ModelType string // config.json's model_type
}

// activations maps HF hidden_act names to ours.
var activations = map[string]native.Activation{
	"gelu":              native.ActGELU,
	"gelu_pytorch_tanh": native.ActGELUTanh,
	"gelu_new":          native.ActGELUTanh,
	"quick_gelu":        native.ActQuickGELU,
}

func or[T any](p *T, def T) T {
	if p != nil {
		return *p
	}
	return def
}

func activation(name string) (native.Activation, error) {
	a, ok := activations[name]
	if !ok {
		return 0, fmt.Errorf("%w: activation %q (want gelu, gelu_pytorch_tanh, gelu_new or quick_gelu)", ErrConfig, name)
	}
	return a, nil
}

// ReadSpec reads dir/config.json.
func ReadSpec(dir string) (Spec, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return Spec{}, err
	}
	return ParseSpec(raw)
}

// ParseSpec reads a config.json. Missing fields take transformers' defaults for the model type.
func ParseSpec(raw []byte) (Spec, error) {
	var top topConfig
	if err := json.Unmarshal(raw, &top); err != nil {
		return Spec{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	s := Spec{ModelType: top.visionConfig.ModelType, Select: native.OutputSelection{Kind: native.OutputLastHidden}}
	var err error
	switch s.ModelType {
	case "whisper":
		s.Config, err = whisperSpec(top.whisperConfig)
		return s, err
	case "clip_vision_model", "siglip_vision_model":
		s.Config, err = vitSpec(top.visionConfig, top.ProjectionDim)
		return s, err
	case "clip", "siglip":
		if top.VisionConfig == nil {
			return Spec{}, fmt.Errorf("%w: %s config without vision_config", ErrConfig, s.ModelType)
		}
		top.VisionConfig.ModelType = s.ModelType + "_vision_model"
		s.Config, err = vitSpec(*top.VisionConfig, top.ProjectionDim)
		return s, err
	case "llava":
		return llavaSpec(top)
	case "":
		return Spec{}, fmt.Errorf("%w: no model_type", ErrConfig)
	}
	return Spec{}, fmt.Errorf("%w: model_type %q (want clip, clip_vision_model, siglip, siglip_vision_model, llava or whisper)", ErrConfig, s.ModelType)
}

// vitSpec applies CLIPVisionConfig's or SiglipVisionConfig's defaults. projectionDim is CLIP's
// visual projection width where the checkpoint has one (0 otherwise; the weights decide).
func vitSpec(v visionConfig, projectionDim *int) (native.EncoderConfig, error) {
	c := native.EncoderConfig{
		Hidden: or(v.HiddenSize, 768), Intermediate: or(v.IntermediateSize, 3072),
		Layers: or(v.NumHiddenLayers, 12), Heads: or(v.NumAttentionHeads, 12),
		Channels: or(v.NumChannels, 3), ImageSize: or(v.ImageSize, 224),
	}
	act := "quick_gelu"
	eps := 1e-5
	switch v.ModelType {
	case "clip_vision_model":
		c.Arch, c.PatchSize = native.ArchCLIP, or(v.PatchSize, 32)
		c.ProjDim = or(projectionDim, or(v.ProjectionDim, 0))
	case "siglip_vision_model":
		c.Arch, c.PatchSize = native.ArchSigLIP, or(v.PatchSize, 16)
		act, eps = "gelu_pytorch_tanh", 1e-6
	default:
		return c, fmt.Errorf("%w: vision model_type %q (want clip_vision_model or siglip_vision_model)", ErrConfig, v.ModelType)
	}
	c.LNEps = float32(or(v.LayerNormEps, eps))
	var err error
	if c.Act, err = activation(or(v.HiddenAct, act)); err != nil {
		return c, err
	}
	return c, checkSizes(c)
}

func whisperSpec(w whisperConfig) (native.EncoderConfig, error) {
	if w.ScaleEmbedding {
		return native.EncoderConfig{}, fmt.Errorf("%w: scale_embedding is not supported (it scales only the decoder's embeddings in HF; set false)", ErrConfig)
	}
	c := native.EncoderConfig{
		Arch: native.ArchWhisper, Hidden: or(w.DModel, 384), Layers: or(w.EncoderLayers, 4),
		Heads: or(w.EncoderAttentionHeads, 6), Intermediate: or(w.EncoderFFNDim, 1536),
		NMels: or(w.NumMelBins, 80), MaxPositions: or(w.MaxSourcePositions, 1500), LNEps: 1e-5,
	}
	var err error
	if c.Act, err = activation(or(w.ActivationFunction, "gelu")); err != nil {
		return c, err
	}
	return c, checkSizes(c)
}

// llavaSpec reads LlavaConfig: a nested vision config, the projector (linear, act, linear to
// the text model's width) and which hidden state the LLM takes.
func llavaSpec(top topConfig) (Spec, error) {
	if top.VisionConfig == nil {
		return Spec{}, fmt.Errorf("%w: llava config without vision_config", ErrConfig)
	}
	v := *top.VisionConfig
	if v.ModelType == "" {
		v.ModelType = "clip_vision_model"
	}
	c, err := vitSpec(v, nil)
	if err != nil {
		return Spec{}, err
	}
	c.ProjDim = 0         // a vision tower has no CLIP projection
	c.ProjectorDim = 4096 // LlamaConfig's default hidden_size
	if top.TextConfig != nil {
		c.ProjectorDim = or(top.TextConfig.HiddenSize, 4096)
	}
	if c.ProjectorAct, err = activation(or(top.ProjectorHiddenAct, "gelu")); err != nil {
		return Spec{}, err
	}
	if !or(top.MultimodalProjectorBias, true) {
		return Spec{}, fmt.Errorf("%w: multimodal_projector_bias false is not supported", ErrConfig)
	}
	sel := native.OutputSelection{Kind: native.OutputHiddenState, Layer: or(top.VisionFeatureLayer, -2), Project: true}
	switch strategy := or(top.VisionFeatureSelectStrategy, "default"); strategy {
	case "default":
		sel.DropCLS = c.Arch == native.ArchCLIP
	case "full":
	default:
		return Spec{}, fmt.Errorf("%w: vision_feature_select_strategy %q (want default or full)", ErrConfig, strategy)
	}
	if sel.Layer < -(c.Layers+1) || sel.Layer > c.Layers {
		return Spec{}, fmt.Errorf("%w: vision_feature_layer %d outside [-%d, %d]", ErrConfig, sel.Layer, c.Layers+1, c.Layers)
	}
	return Spec{Config: c, Select: sel, ModelType: "llava"}, nil
}

// checkSizes refuses configurations no checkpoint could match, before any weight is read.
func checkSizes(c native.EncoderConfig) error {
	const most = 1 << 16
	ok := func(v int) bool { return v > 0 && v <= most }
	switch {
	case !ok(c.Hidden) || !ok(c.Intermediate) || !ok(c.Layers) || !ok(c.Heads) || c.Hidden%c.Heads != 0:
		return fmt.Errorf("%w: hidden %d, intermediate %d, layers %d, heads %d", ErrConfig, c.Hidden, c.Intermediate, c.Layers, c.Heads)
	case c.Arch == native.ArchWhisper && (!ok(c.NMels) || !ok(c.MaxPositions)):
		return fmt.Errorf("%w: num_mel_bins %d, max_source_positions %d", ErrConfig, c.NMels, c.MaxPositions)
	case c.Arch != native.ArchWhisper && (!ok(c.PatchSize) || !ok(c.Channels) || c.ImageSize < c.PatchSize || c.ImageSize > 8192):
		return fmt.Errorf("%w: image_size %d, patch_size %d, num_channels %d", ErrConfig, c.ImageSize, c.PatchSize, c.Channels)
	case c.ProjDim < 0 || c.ProjDim > most:
		return fmt.Errorf("%w: projection_dim %d", ErrConfig, c.ProjDim)
	}
	return nil
}
