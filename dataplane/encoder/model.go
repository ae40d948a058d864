package encoder

import (
	"fmt"
	"path/filepath"
	"strings"

	"dataplane/native"
)

// Options adjust a loaded model.
type Options struct {
	// Select overrides the features the model returns (nil: the checkpoint's default: a VLM's
	// vision_feature_layer and strategy through its projector, else last_hidden_state).
	Select *native.OutputSelection
	// Threads for the kernels (0: native.DefaultThreads()).
	Threads int
}

// Model is a loaded encoder. Run may be called from one goroutine at a time per model (the
// worker loop owns it); Tokens and Width from any.
type Model struct {
	Name   string // the checkpoint directory's base name
	Spec   Spec
	sel    native.OutputSelection
	width  int
	enc    *native.Encoder
	thread int
}

// Load reads dir/config.json and dir/*.safetensors, checks every tensor against the config
// (errors name the tensor) and packs the weights for the CPU kernels; the files are closed
// again before it returns.
func Load(dir string, opts Options) (*Model, error) {
	spec, weights, closeFiles, err := LoadWeights(dir)
	if err != nil {
		return nil, err
	}
	defer closeFiles()
	enc, err := native.NewEncoder(spec.Config, weights)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	m := &Model{Name: filepath.Base(filepath.Clean(dir)), Spec: spec, enc: enc, thread: opts.Threads}
	sel := spec.Select
	if opts.Select != nil {
		sel = *opts.Select
	}
	if err := m.SetSelect(sel); err != nil {
		enc.Close()
		return nil, err
	}
	return m, nil
}

// LoadWeights reads a checkpoint directory into its Spec and the encoder's weight slots
// (views of the memory-mapped files, valid until closeFiles), for creating encoders on any
// backend (native.NewEncoder, native.Backend.NewEncoder).
func LoadWeights(dir string) (spec Spec, weights []native.Matrix, closeFiles func(), err error) {
	if spec, err = ReadSpec(dir); err != nil {
		return spec, nil, nil, fmt.Errorf("%s: %w", dir, err)
	}
	ck, err := openCheckpoint(dir)
	if err != nil {
		return spec, nil, nil, err
	}
	c := spec.Config
	var prefix string
	var ok bool
	if c.Arch == native.ArchWhisper {
		prefix, ok = ck.findPrefix(whisperPrefixes, "conv1.weight")
	} else {
		prefix, ok = ck.findPrefix(vitPrefixes, "embeddings.patch_embedding.weight")
	}
	if !ok {
		ck.Close()
		return spec, nil, nil, fmt.Errorf("%w: %s: no %v encoder tensors (looked for conv1.weight / embeddings.patch_embedding.weight under the usual prefixes)",
			ErrWeights, dir, c.Arch)
	}
	projRoot, _ := ck.findPrefix(projectorRoots, "linear_1.weight")
	_, hasProj := ck.tensors[strings.TrimSuffix(prefix, "vision_model.")+"visual_projection.weight"]
	if !hasProj {
		c.ProjDim = 0
	}
	if weights, err = ck.weights(c, slots(c, prefix, projRoot, hasProj)); err != nil {
		ck.Close()
		return spec, nil, nil, fmt.Errorf("%s: %w", dir, err)
	}
	spec.Config = c
	return spec, weights, ck.Close, nil
}

// SetSelect changes which features Run returns.
func (m *Model) SetSelect(sel native.OutputSelection) error {
	w, err := m.enc.Width(sel)
	if err != nil {
		return err
	}
	m.sel, m.width = sel, w
	return nil
}

// Select is the feature selection in use.
func (m *Model) Select() native.OutputSelection { return m.sel }

// Input is one preprocessed item: pixels [channels, size, size] for a ViT; log-mel
// [n_mels, Frames] for Whisper.
type Input struct {
	Data   []float32
	Frames int
}

// InputShape is the shape an input must have (frames: Whisper only).
func (m *Model) InputShape(frames int) []int {
	c := m.Spec.Config
	if c.Arch == native.ArchWhisper {
		return []int{c.NMels, frames}
	}
	return []int{c.Channels, c.ImageSize, c.ImageSize}
}

// Tokens is the exact number of feature rows an input gives.
func (m *Model) Tokens(in Input) (int, error) { return m.enc.Tokens(m.sel, in.Frames) }

// Width is the width of every feature row.
func (m *Model) Width() int { return m.width }

// Run encodes a batch into outs[i] ([Tokens(inputs[i]), Width()] of any float dtype), which
// the caller owns (feature-store buffers).
func (m *Model) Run(inputs []Input, outs []native.Matrix) error {
	if len(inputs) != len(outs) {
		return fmt.Errorf("encoder: %d inputs, %d outputs", len(inputs), len(outs))
	}
	items := make([]native.EncoderItem, len(inputs))
	for i, in := range inputs {
		items[i] = native.EncoderItem{Input: in.Data, Frames: in.Frames, Out: outs[i]}
	}
	return m.enc.Forward(m.sel, items, m.thread, native.ISAAuto)
}

// Stats are the kernels' time so far.
func (m *Model) Stats() native.EncoderStats { return m.enc.Stats() }

// Close frees the packed weights.
func (m *Model) Close() { m.enc.Close() }
