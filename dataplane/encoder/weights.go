package encoder

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"dataplane/native"
	"dataplane/transfer/safetensors"
)

// ErrWeights is what every missing, misshapen or unexpected tensor error unwraps to.
var ErrWeights = errors.New("checkpoint weights do not match the config")

// checkpoint is a directory's *.safetensors files (one, or the shards of a large model), open
// and memory-mapped until Close.
type checkpoint struct {
	files   []*safetensors.File
	tensors map[string]safetensors.Tensor
}

func openCheckpoint(dir string) (*checkpoint, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("%s: no *.safetensors files", dir)
	}
	ck := &checkpoint{tensors: map[string]safetensors.Tensor{}}
	for _, p := range paths {
		f, err := safetensors.Open(p)
		if err != nil {
			ck.Close()
			return nil, err
		}
		ck.files = append(ck.files, f)
		for _, t := range f.Tensors {
			if _, dup := ck.tensors[t.Name]; dup {
				ck.Close()
				return nil, fmt.Errorf("%w: tensor %q is in more than one file of %s", ErrWeights, t.Name, dir)
			}
			ck.tensors[t.Name] = t
		}
	}
	return ck, nil
}

func (ck *checkpoint) Close() {
	for _, f := range ck.files {
		f.Close()
	}
	ck.files = nil
}

// prefixes are where encoders sit inside the checkpoints we read, tried in order: the part of
// the name before "embeddings." (ViTs) or before "conv1." (Whisper).
var (
	vitPrefixes     = []string{"vision_model.", "vision_tower.vision_model.", "model.vision_tower.vision_model.", ""}
	whisperPrefixes = []string{"model.encoder.", "encoder.", ""}
	projectorRoots  = []string{"multi_modal_projector.", "model.multi_modal_projector."}
)

// findPrefix returns the first prefix under which probe exists.
func (ck *checkpoint) findPrefix(prefixes []string, probe string) (string, bool) {
	for _, p := range prefixes {
		if _, ok := ck.tensors[p+probe]; ok {
			return p, true
		}
	}
	return "", false
}

// slot is one native weight slot: the HF tensor name and the shape the config implies.
type slot struct {
	index    int
	name     string
	shape    []int // the tensor's own shape
	optional bool
}

// slots lists, for a config, every tensor the encoder reads and where it goes.
func slots(c native.EncoderConfig, prefix, projRoot string, hasProj bool) []slot {
	h, inter := c.Hidden, c.Intermediate
	var s []slot
	add := func(index int, name string, optional bool, shape ...int) {
		s = append(s, slot{index, name, shape, optional})
	}
	var layer string
	var lnames [native.LayerWeights]string
	switch c.Arch {
	case native.ArchCLIP, native.ArchSigLIP:
		grid := c.ImageSize / c.PatchSize
		clip := c.Arch == native.ArchCLIP
		add(native.WeightPatch, prefix+"embeddings.patch_embedding.weight", false, h, c.Channels, c.PatchSize, c.PatchSize)
		positions := grid * grid
		if clip {
			add(native.WeightCLS, prefix+"embeddings.class_embedding", false, h)
			add(native.WeightPreLN, prefix+"pre_layrnorm.weight", false, h)
			add(native.WeightPreLNBias, prefix+"pre_layrnorm.bias", false, h)
			positions++
		} else {
			add(native.WeightPatchBias, prefix+"embeddings.patch_embedding.bias", false, h)
		}
		add(native.WeightPositions, prefix+"embeddings.position_embedding.weight", false, positions, h)
		add(native.WeightPostLN, prefix+"post_layernorm.weight", true, h)
		add(native.WeightPostLNBias, prefix+"post_layernorm.bias", true, h)
		if clip && hasProj {
			add(native.WeightProj, strings.TrimSuffix(prefix, "vision_model.")+"visual_projection.weight", false, c.ProjDim, h)
		}
		layer = prefix + "encoder.layers.%d."
		lnames = [native.LayerWeights]string{
			"self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight", "self_attn.k_proj.bias",
			"self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
			"layer_norm1.weight", "layer_norm1.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias",
			"layer_norm2.weight", "layer_norm2.bias",
		}
	case native.ArchWhisper:
		add(native.WeightConv1, prefix+"conv1.weight", false, h, c.NMels, 3)
		add(native.WeightConv1Bias, prefix+"conv1.bias", false, h)
		add(native.WeightConv2, prefix+"conv2.weight", false, h, h, 3)
		add(native.WeightConv2Bias, prefix+"conv2.bias", false, h)
		add(native.WeightPositions, prefix+"embed_positions.weight", false, c.MaxPositions, h)
		add(native.WeightPostLN, prefix+"layer_norm.weight", false, h)
		add(native.WeightPostLNBias, prefix+"layer_norm.bias", false, h)
		layer = prefix + "layers.%d."
		lnames = [native.LayerWeights]string{
			"self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight", "",
			"self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
			"self_attn_layer_norm.weight", "self_attn_layer_norm.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
			"final_layer_norm.weight", "final_layer_norm.bias",
		}
	}
	if c.ProjectorDim > 0 {
		p := c.ProjectorDim
		add(native.WeightProjector1, projRoot+"linear_1.weight", false, p, h)
		add(native.WeightProjector1B, projRoot+"linear_1.bias", false, p)
		add(native.WeightProjector2, projRoot+"linear_2.weight", false, p, p)
		add(native.WeightProjector2B, projRoot+"linear_2.bias", false, p)
	}
	lshapes := [native.LayerWeights][]int{{h, h}, {h}, {h, h}, {h}, {h, h}, {h}, {h, h}, {h}, {h}, {h}, {inter, h}, {inter}, {h, inter}, {h}, {h}, {h}}
	for l := range c.Layers {
		for i, n := range lnames {
			if n != "" {
				add(native.WeightCount(l)+i, fmt.Sprintf(layer, l)+n, false, lshapes[i]...)
			}
		}
	}
	return s
}

// weights resolves every slot against the checkpoint: each tensor present (unless optional),
// of a float dtype, with the shape the config implies. Tensors are flattened to the native
// layout (vectors [1, n]; convolutions [out, in * kernel]) as views of the mapped files.
func (ck *checkpoint) weights(c native.EncoderConfig, slots []slot) ([]native.Matrix, error) {
	out := make([]native.Matrix, native.WeightCount(c.Layers))
	for _, s := range slots {
		t, ok := ck.tensors[s.name]
		if !ok {
			if s.optional {
				continue
			}
			return nil, fmt.Errorf("%w: missing tensor %q", ErrWeights, s.name)
		}
		if !slices.Equal(t.Shape, s.shape) {
			return nil, fmt.Errorf("%w: tensor %q has shape %v, the config implies %v", ErrWeights, s.name, t.Shape, s.shape)
		}
		dt, err := native.ParseDType(t.DType)
		if err != nil {
			return nil, fmt.Errorf("%w: tensor %q has dtype %s, want F32, F16 or BF16", ErrWeights, s.name, t.DType)
		}
		rows := 1
		if len(s.shape) > 1 {
			rows = s.shape[0]
		}
		out[s.index] = native.Matrix{Data: t.Data, DType: dt, Rows: rows, Cols: t.Elements() / max(rows, 1)}
	}
	return out, nil
}
