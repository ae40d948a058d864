package encoder

import (
	"encoding/json"
	"errors"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/native"
	"dataplane/native/fixtures"
	"dataplane/transfer/safetensors"
)

// tensor is a checkpoint tensor under construction: values and shape.
type tensor struct {
	v     []float32
	shape []int
}

// fixtureTensors reads a fixture checkpoint's tensors.
func fixtureTensors(t *testing.T, name string) map[string]tensor {
	f, err := safetensors.Open(fixtures.Path(t, name+".safetensors"))
	require.NoError(t, err)
	defer f.Close()
	out := map[string]tensor{}
	for _, ts := range f.Tensors {
		v, err := ts.Float32()
		require.NoError(t, err)
		out[ts.Name] = tensor{v, slices.Clone(ts.Shape)}
	}
	return out
}

// writeCheckpoint writes config.json and model.safetensors (weights stored as dtype) into a
// new directory, and returns it with the weights as the stored values (rounded to dtype).
func writeCheckpoint(t *testing.T, config map[string]any, tensors map[string]tensor, dtype native.DType) (string, refWeights) {
	dir := t.TempDir()
	raw, err := json.Marshal(config)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644))
	var list []safetensors.Tensor
	ref := refWeights{}
	for _, name := range slices.Sorted(maps.Keys(tensors)) {
		tv := tensors[name]
		data := make([]byte, len(tv.v)*dtype.Size())
		require.NoError(t, native.Convert(data, dtype, native.AsBytes(tv.v), native.F32))
		back := make([]float32, len(tv.v))
		require.NoError(t, native.Convert(native.AsBytes(back), native.F32, data, dtype))
		list = append(list, safetensors.Tensor{Name: name, DType: safetensors.DTypeName(dtype), Shape: tv.shape, Data: data})
		ref[name] = make([]float64, len(back))
		for i, v := range back {
			ref[name][i] = float64(v)
		}
	}
	require.NoError(t, safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), list, map[string]string{"format": "pt"}))
	return dir, ref
}

func randomTensor(r *rand.Rand, scale float64, shape ...int) tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return tensor{v, shape}
}

func run(t *testing.T, m *Model, sel native.OutputSelection, inputs ...Input) [][]float32 {
	t.Helper()
	require.NoError(t, m.SetSelect(sel))
	outs := make([]native.Matrix, len(inputs))
	res := make([][]float32, len(inputs))
	for i, in := range inputs {
		n, err := m.Tokens(in)
		require.NoError(t, err)
		res[i] = make([]float32, n*m.Width())
		outs[i] = native.Matrix{Data: native.AsBytes(res[i]), DType: native.F32, Rows: n, Cols: m.Width()}
	}
	require.NoError(t, m.Run(inputs, outs))
	return res
}

var clipConfig = map[string]any{
	"model_type": "clip_vision_model", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
	"num_attention_heads": 4, "image_size": 64, "patch_size": 16, "projection_dim": 32, "hidden_act": "quick_gelu",
}

// The Go reference reproduces the CLIP fixture (computed by openai/CLIP), so it can stand in
// where no fixture exists.
func TestReferenceMatchesCLIPFixture(t *testing.T) {
	ref := refViT{cfg: native.EncoderConfig{Arch: native.ArchCLIP, Hidden: 64, Intermediate: 256, Layers: 2, Heads: 4,
		ImageSize: 64, PatchSize: 16, Channels: 3, Act: native.ActQuickGELU, LNEps: 1e-5}, prefix: "vision_model."}
	ref.w = refWeights{}
	for name, tv := range fixtureTensors(t, "clip_vit_tiny_random") {
		ref.w[name] = make([]float64, len(tv.v))
		for i, v := range tv.v {
			ref.w[name][i] = float64(v)
		}
	}
	x, _ := readF32(t, "clip_in_random")
	states, last := ref.hiddenStates(x)
	want, _ := readF32(t, "clip_out_random_last_hidden")
	requireClose(t, want, flatten(last), 1e-5, "reference last_hidden_state")
	want, _ = readF32(t, "clip_out_random_penultimate")
	requireClose(t, want, flatten(states[1]), 1e-5, "reference hidden_states[-2]")
}

// SigLIP from the CLIP fixture's weights where the two coincide, plus what differs: a patch
// bias, no CLS token (so one position fewer), no pre-LN, tanh GELU, eps 1e-6 and post-LN on
// every token. Stored in bf16 to cover the conversion at load.
func TestSigLIPAgainstReference(t *testing.T) {
	r := newRand(t)
	ts := fixtureTensors(t, "clip_vit_tiny_random")
	for _, name := range []string{"vision_model.embeddings.class_embedding", "vision_model.pre_layrnorm.weight",
		"vision_model.pre_layrnorm.bias", "visual_projection.weight"} {
		delete(ts, name)
	}
	pos := ts["vision_model.embeddings.position_embedding.weight"]
	ts["vision_model.embeddings.position_embedding.weight"] = tensor{pos.v[64:], []int{16, 64}}
	ts["vision_model.embeddings.patch_embedding.bias"] = randomTensor(r, 0.05, 64)
	cfg := map[string]any{"model_type": "siglip_vision_model", "hidden_size": 64, "intermediate_size": 256,
		"num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 64, "patch_size": 16}
	dir, w := writeCheckpoint(t, cfg, ts, native.BF16)
	m, err := Load(dir, Options{Threads: 2})
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, native.ArchSigLIP, m.Spec.Config.Arch)
	require.Equal(t, native.ActGELUTanh, m.Spec.Config.Act)
	require.InDelta(t, 1e-6, m.Spec.Config.LNEps, 1e-12)

	ref := refViT{cfg: m.Spec.Config, w: w, prefix: "vision_model."}
	x, _ := readF32(t, "clip_in_random")
	states, last := ref.hiddenStates(x)
	got := run(t, m, native.OutputSelection{Kind: native.OutputLastHidden}, Input{Data: x})
	require.Len(t, got[0], 16*64, "no CLS: 16 tokens")
	requireClose(t, flatten(last), got[0], 1e-5, "siglip last_hidden_state (post-LN on all tokens)")
	for layer := -3; layer <= -1; layer++ {
		got = run(t, m, native.OutputSelection{Kind: native.OutputHiddenState, Layer: layer}, Input{Data: x})
		requireClose(t, flatten(states[3+layer]), got[0], 1e-5, "siglip hidden_states")
	}
}

// A LLaVA checkpoint: a CLIP vision tower under vision_tower.vision_model., a projector to the
// text model's width; by default hidden_states[-2] without CLS, through the projector.
func TestLLaVAProjectorAgainstReference(t *testing.T) {
	r := newRand(t)
	ts := map[string]tensor{}
	for name, tv := range fixtureTensors(t, "clip_vit_tiny_random") {
		if name != "visual_projection.weight" {
			ts["vision_tower."+name] = tv
		}
	}
	ts["multi_modal_projector.linear_1.weight"] = randomTensor(r, 0.125, 48, 64)
	ts["multi_modal_projector.linear_1.bias"] = randomTensor(r, 0.05, 48)
	ts["multi_modal_projector.linear_2.weight"] = randomTensor(r, 0.14, 48, 48)
	ts["multi_modal_projector.linear_2.bias"] = randomTensor(r, 0.05, 48)
	vision := maps.Clone(clipConfig)
	delete(vision, "projection_dim")
	cfg := map[string]any{"model_type": "llava", "vision_config": vision, "text_config": map[string]any{"hidden_size": 48}}
	dir, w := writeCheckpoint(t, cfg, ts, native.F16)
	m, err := Load(dir, Options{Threads: 2})
	require.NoError(t, err)
	defer m.Close()
	require.Equal(t, native.OutputSelection{Kind: native.OutputHiddenState, Layer: -2, DropCLS: true, Project: true}, m.Select())
	require.Equal(t, 48, m.Width())

	ref := refViT{cfg: m.Spec.Config, w: w, prefix: "vision_tower.vision_model."}
	x, _ := readF32(t, "clip_in_random")
	states, _ := ref.hiddenStates(x)
	want := ref.project(states[1][1:], "multi_modal_projector.")
	n, err := m.Tokens(Input{Data: x})
	require.NoError(t, err)
	require.Equal(t, 16, n)
	got := run(t, m, m.Select(), Input{Data: x})
	requireClose(t, flatten(want), got[0], 1e-5, "llava features")
}

// A batch is one matrix through the linear maps, but every element is still the same dot
// product in the same order: a batch equals its items run alone, bit for bit.
func TestBatchEqualsSingles(t *testing.T) {
	r := newRand(t)
	m, err := Load(fixtureModel(t, "clip_vit_tiny_random"), Options{Threads: 2})
	require.NoError(t, err)
	defer m.Close()
	var inputs []Input
	for range 5 {
		inputs = append(inputs, Input{Data: randomTensor(r, 1, 3, 64, 64).v})
	}
	for _, sel := range []native.OutputSelection{{Kind: native.OutputLastHidden}, {Kind: native.OutputHiddenState, Layer: -2, DropCLS: true},
		{Kind: native.OutputPooled}} {
		batch := run(t, m, sel, inputs...)
		for i, in := range inputs {
			require.Equal(t, run(t, m, sel, in)[0], batch[i], "%v item %d", sel, i)
		}
	}

	w, err := Load(fixtureModel(t, "whisper_enc_tiny_random"), Options{Threads: 2})
	require.NoError(t, err)
	defer w.Close()
	audio, _ := readF32(t, "whisper_enc_in_audio")
	// Ragged: a full input, a shorter one (the first 121 frames of it), and a single frame.
	short := make([]float32, 80*121)
	for mel := range 80 {
		copy(short[mel*121:(mel+1)*121], audio[mel*200:mel*200+121])
	}
	one := randomTensor(r, 1, 80, 1).v
	ins := []Input{{Data: audio, Frames: 200}, {Data: short, Frames: 121}, {Data: one, Frames: 1}}
	batch := run(t, w, native.OutputSelection{Kind: native.OutputLastHidden}, ins...)
	for i, want := range []int{100, 61, 1} {
		require.Len(t, batch[i], want*64, "item %d tokens", i)
		require.Equal(t, run(t, w, native.OutputSelection{Kind: native.OutputLastHidden}, ins[i])[0], batch[i], "item %d", i)
	}
}

// Outputs in f16/bf16 are the f32 features rounded once.
func TestOutputDTypes(t *testing.T) {
	m, err := Load(fixtureModel(t, "clip_vit_tiny_random"), Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	x, _ := readF32(t, "clip_in_random")
	f32 := run(t, m, native.OutputSelection{Kind: native.OutputLastHidden}, Input{Data: x})[0]
	for _, dt := range []native.DType{native.F16, native.BF16} {
		out := native.Matrix{Data: make([]byte, 17*64*dt.Size()), DType: dt, Rows: 17, Cols: 64}
		require.NoError(t, m.Run([]Input{{Data: x}}, []native.Matrix{out}))
		want := make([]byte, len(out.Data))
		require.NoError(t, native.Convert(want, dt, native.AsBytes(f32), native.F32))
		require.Equal(t, want, out.Data, dt.String())
	}
}

func TestSelectionsAndTokens(t *testing.T) {
	m, err := Load(fixtureModel(t, "clip_vit_tiny_random"), Options{})
	require.NoError(t, err)
	defer m.Close()
	f := func(sel native.OutputSelection, tokens, width int) {
		t.Helper()
		require.NoError(t, m.SetSelect(sel))
		n, err := m.Tokens(Input{})
		require.NoError(t, err)
		require.Equal(t, tokens, n)
		require.Equal(t, width, m.Width())
	}
	f(native.OutputSelection{Kind: native.OutputLastHidden}, 17, 64)
	f(native.OutputSelection{Kind: native.OutputLastHidden, DropCLS: true}, 16, 64)
	f(native.OutputSelection{Kind: native.OutputHiddenState, Layer: 0}, 17, 64)
	f(native.OutputSelection{Kind: native.OutputPooled}, 1, 32)
	bad := func(sel native.OutputSelection, want string) {
		t.Helper()
		require.ErrorContains(t, m.SetSelect(sel), want)
	}
	bad(native.OutputSelection{Kind: native.OutputHiddenState, Layer: 3}, "hidden state 3 outside [-3, 2]")
	bad(native.OutputSelection{Kind: native.OutputHiddenState, Layer: -4}, "outside")
	bad(native.OutputSelection{Kind: native.OutputLastHidden, Project: true}, "no projector")
	bad(native.OutputSelection{Kind: native.OutputPooled, DropCLS: true}, "pooled output takes no drop_cls")

	w, err := Load(fixtureModel(t, "whisper_enc_tiny_random"), Options{})
	require.NoError(t, err)
	defer w.Close()
	require.ErrorContains(t, w.SetSelect(native.OutputSelection{Kind: native.OutputPooled}), "pooled output needs a CLIP model")
	require.ErrorContains(t, w.SetSelect(native.OutputSelection{Kind: native.OutputLastHidden, DropCLS: true}), "no CLS token")
	_, err = w.Tokens(Input{Frames: 201})
	require.ErrorContains(t, err, "201 input frames, want 1..200")
	require.ErrorContains(t, w.Run([]Input{{Data: make([]float32, 80*10), Frames: 11}},
		[]native.Matrix{{Data: make([]byte, 6*64*4), DType: native.F32, Rows: 6, Cols: 64}}), "input has 800 values, want 880")
	require.ErrorContains(t, w.Run([]Input{{Data: make([]float32, 80*10), Frames: 10}},
		[]native.Matrix{{Data: make([]byte, 6*64*4), DType: native.F32, Rows: 6, Cols: 64}}), "output is [6, 64], want [5, 64]")
}

func TestParseSpec(t *testing.T) {
	f := func(config string, check func(s Spec)) {
		t.Helper()
		s, err := ParseSpec([]byte(config))
		require.NoError(t, err, config)
		check(s)
	}
	f(`{"model_type":"clip","projection_dim":768,"vision_config":{"hidden_size":1024,"intermediate_size":4096,
		"num_hidden_layers":24,"num_attention_heads":16,"image_size":336,"patch_size":14}}`, func(s Spec) {
		c := s.Config
		require.Equal(t, native.ArchCLIP, c.Arch)
		require.Equal(t, []int{1024, 4096, 24, 16, 336, 14, 768}, []int{c.Hidden, c.Intermediate, c.Layers, c.Heads, c.ImageSize, c.PatchSize, c.ProjDim})
		require.Equal(t, native.ActQuickGELU, c.Act)
	})
	f(`{"model_type":"siglip_vision_model","hidden_size":1152,"intermediate_size":4304,"num_hidden_layers":27,
		"num_attention_heads":16,"image_size":384,"patch_size":14}`, func(s Spec) {
		require.Equal(t, native.ArchSigLIP, s.Config.Arch)
		require.Equal(t, native.ActGELUTanh, s.Config.Act)
		require.InDelta(t, 1e-6, s.Config.LNEps, 1e-12)
	})
	f(`{"model_type":"whisper"}`, func(s Spec) { // WhisperConfig defaults
		c := s.Config
		require.Equal(t, []int{384, 4, 6, 1536, 80, 1500}, []int{c.Hidden, c.Layers, c.Heads, c.Intermediate, c.NMels, c.MaxPositions})
		require.Equal(t, native.ActGELU, c.Act)
	})
	f(`{"model_type":"llava","vision_config":{"model_type":"clip_vision_model","hidden_size":1024,"intermediate_size":4096,
		"num_hidden_layers":24,"num_attention_heads":16,"image_size":336,"patch_size":14},"text_config":{"model_type":"llama"},
		"vision_feature_select_strategy":"full","vision_feature_layer":-1}`, func(s Spec) {
		require.Equal(t, 4096, s.Config.ProjectorDim)
		require.Equal(t, native.OutputSelection{Kind: native.OutputHiddenState, Layer: -1, Project: true}, s.Select)
	})
	bad := func(config, want string) {
		t.Helper()
		_, err := ParseSpec([]byte(config))
		require.ErrorIs(t, err, ErrConfig)
		require.ErrorContains(t, err, want)
	}
	bad(`{"model_type":"bert"}`, `model_type "bert"`)
	bad(`{}`, "no model_type")
	bad(`{"model_type":"whisper","activation_function":"relu"}`, `activation "relu"`)
	bad(`{"model_type":"whisper","scale_embedding":true}`, "scale_embedding")
	bad(`{"model_type":"clip_vision_model","image_size":16,"patch_size":32}`, "image_size 16, patch_size 32")
	bad(`{"model_type":"clip_vision_model","hidden_size":100,"num_attention_heads":12}`, "hidden 100")
	bad(`{"model_type":"llava"}`, "without vision_config")
	bad(`{"model_type":"llava","vision_config":{},"vision_feature_layer":-30}`, "vision_feature_layer -30")
	bad(`{"model_type":"clip","vision_config":`, "unexpected end")
}

// Checkpoints that do not match their config fail with the tensor's name.
func TestBadCheckpoints(t *testing.T) {
	base := fixtureTensors(t, "clip_vit_tiny_random")
	f := func(mutate func(ts map[string]tensor), want string) {
		t.Helper()
		ts := maps.Clone(base)
		mutate(ts)
		dir, _ := writeCheckpoint(t, clipConfig, ts, native.F32)
		_, err := Load(dir, Options{})
		require.ErrorIs(t, err, ErrWeights)
		require.ErrorContains(t, err, want)
	}
	f(func(ts map[string]tensor) { delete(ts, "vision_model.encoder.layers.1.mlp.fc2.bias") },
		`missing tensor "vision_model.encoder.layers.1.mlp.fc2.bias"`)
	f(func(ts map[string]tensor) {
		ts["vision_model.encoder.layers.0.mlp.fc1.weight"] = tensor{make([]float32, 255*64), []int{255, 64}}
	}, `tensor "vision_model.encoder.layers.0.mlp.fc1.weight" has shape [255 64], the config implies [256 64]`)
	f(func(ts map[string]tensor) {
		for name := range ts {
			delete(ts, name)
		}
		ts["something.else"] = tensor{[]float32{1}, []int{1}}
	}, "no clip encoder tensors")

	// A weight stored as an integer dtype.
	dir, _ := writeCheckpoint(t, clipConfig, base, native.F32)
	path := filepath.Join(dir, "model.safetensors")
	sf, err := safetensors.Open(path)
	require.NoError(t, err)
	var list []safetensors.Tensor
	for _, ts := range sf.Tensors {
		ts.Data = slices.Clone(ts.Data)
		if ts.Name == "vision_model.pre_layrnorm.bias" {
			ts.DType = "I32"
		}
		list = append(list, ts)
	}
	sf.Close()
	require.NoError(t, safetensors.WriteFile(path, list, nil))
	_, err = Load(dir, Options{})
	require.ErrorContains(t, err, `tensor "vision_model.pre_layrnorm.bias" has dtype I32`)

	// Truncated file; a tensor in two shards; no weights at all.
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, raw[:len(raw)-100], 0o644))
	_, err = Load(dir, Options{})
	require.ErrorIs(t, err, safetensors.ErrFormat)
	require.NoError(t, os.WriteFile(path, raw, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model-2.safetensors"), raw, 0o644))
	_, err = Load(dir, Options{})
	require.ErrorContains(t, err, "is in more than one file")
	empty := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(empty, "config.json"), []byte(`{"model_type":"whisper"}`), 0o644))
	_, err = Load(empty, Options{})
	require.ErrorContains(t, err, "no *.safetensors files")
}

// Any config.json: a Spec whose sizes the kernels accept, or an ErrConfig; never a panic.
func FuzzParseSpec(f *testing.F) {
	f.Add([]byte(`{"model_type":"whisper","d_model":64,"encoder_layers":2,"encoder_attention_heads":4}`))
	f.Add([]byte(`{"model_type":"llava","vision_config":{"hidden_size":32,"num_attention_heads":4},"vision_feature_layer":-1}`))
	f.Add([]byte(`{"model_type":"siglip","vision_config":{"image_size":30,"patch_size":14}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		s, err := ParseSpec(raw)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error %v is not an ErrConfig", err)
			}
			return
		}
		if err := checkSizes(s.Config); err != nil {
			t.Fatalf("accepted sizes the checks refuse: %v", err)
		}
	})
}
