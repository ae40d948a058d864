package dataplane

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"dataplane/dataplane/encoder"
	"dataplane/dataplane/media"
	"dataplane/dataplane/media/hfproc"
	"dataplane/dataplane/media/picture"
	"dataplane/dataplane/sequence"
	"dataplane/native"
	"dataplane/transfer/safetensors"
)

// ModelOptions choose the encoders and the LLM's input embeddings. Empty paths mean seeded
// random demo models, so the daemon runs end to end with no checkpoint at all.
type ModelOptions struct {
	Name         string // the model id clients ask for (GET /v1/models)
	VisionModel  string // encoder checkpoint directory for images and video frames ("": demo)
	VisionPreset string // media preset ("": chosen from the vision model: clip-N / siglip-N)
	AudioModel   string // Whisper encoder checkpoint directory ("": demo)
	AudioPreset  string // media preset ("": whisper-80 or whisper-128 by the model's mel bins)
	NoAudio      bool   // serve no audio encoder
	// Processor is a directory of Hugging Face processor files (preprocessor_config.json, ...)
	// that decide the presets; "": the first of VisionModel and TokenizerDir that has them (the
	// audio preset: AudioModel's); "none": the built-in presets only.
	Processor    string
	TokenizerDir string // the tokenizer's directory (set from the tokenizer options)
	// CountOnly: media are not encoded here (the engine encodes them: --handoff tokens), so the
	// processor files may describe any family (Qwen2-VL, LLaVA-NeXT, InternVL, Qwen2-Audio, ...):
	// their presets count the tokens, and the encoders need not take their inputs.
	CountOnly bool
	// Embeddings is a safetensors file holding the LLM's input embedding table ([vocab,
	// hidden]), named EmbeddingTensor or found by its usual names; "": a random table of
	// DemoVocab × the encoders' width.
	Embeddings      string
	EmbeddingTensor string
	DemoVocab       int // rows of the random table (the tokenizer's vocabulary size)
	DemoHidden      int // the demo models' output width (the demo LLM's hidden size)
	// DemoVision is the shape of the random demo vision tower (nil: a tiny CLIP at 224 px with
	// 14-px patches); its projector always maps to DemoHidden.
	DemoVision *native.EncoderConfig
	DType      native.DType
	Threads    int
	Seed       uint64
}

// DefaultModelOptions: demo models 256 wide, bf16 features.
func DefaultModelOptions() ModelOptions {
	return ModelOptions{Name: "dataplane-demo", DemoHidden: 256, DemoVocab: 32000, DType: native.BF16, Seed: 1}
}

// Models are what requests are encoded and merged with.
type Models struct {
	Name   string
	Vision *encoder.Model // nil: no vision input
	Audio  *encoder.Model // nil: no audio input
	// VisionPreset and AudioPreset turn media into the encoders' inputs.
	VisionPreset, AudioPreset media.Preset
	// CountOnly: media are counted here, not encoded (ModelOptions.CountOnly).
	CountOnly bool
	// VisionProcessor and AudioProcessor are the processor files the presets were read from
	// (nil: built in), for the start-up log.
	VisionProcessor, AudioProcessor *hfproc.Settings
	// Table is the LLM's input embedding table, Hidden its width; features and merged
	// sequences are DType.
	Table  native.Matrix
	Hidden int
	DType  native.DType
}

// ErrModels: the encoders, presets and embedding table do not fit together.
var ErrModels = errors.New("models do not fit together")

// LoadModels loads (or builds) the encoders and the embedding table and checks they agree:
// every encoder's output width must be the table's width, and each preset must produce the
// input its encoder takes.
func LoadModels(o ModelOptions) (*Models, error) {
	m := &Models{Name: o.Name, DType: o.DType, CountOnly: o.CountOnly}
	if m.DType.Size() == 0 {
		m.DType = native.BF16
	}
	var err error
	if m.Vision, err = loadVision(o); err != nil {
		return nil, err
	}
	if !o.NoAudio {
		if m.Audio, err = loadAudio(o); err != nil {
			m.Close()
			return nil, err
		}
	}
	if err := m.choosePresets(o); err != nil {
		m.Close()
		return nil, err
	}
	width := m.Vision.Width()
	if m.Audio != nil && m.Audio.Width() != width {
		m.Close()
		return nil, fmt.Errorf("%w: the audio encoder gives %d-wide features, the vision encoder %d", ErrModels, m.Audio.Width(), width)
	}
	if err := m.loadTable(o, width); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// llava selection: the LLM takes the penultimate layer without CLS through the projector.
var llavaSelect = native.OutputSelection{Kind: native.OutputHiddenState, Layer: -2, DropCLS: true, Project: true}

func loadVision(o ModelOptions) (*encoder.Model, error) {
	if o.VisionModel != "" {
		m, err := encoder.Load(o.VisionModel, encoder.Options{Threads: o.Threads})
		if err != nil {
			return nil, fmt.Errorf("--vision-model: %w", err)
		}
		if m.Spec.Config.Arch == native.ArchWhisper {
			m.Close()
			return nil, fmt.Errorf("--vision-model %s is a Whisper encoder", o.VisionModel)
		}
		return m, nil
	}
	// The demo: a small CLIP ViT at 224 px with 14-px patches (256 tokens without CLS) and a
	// LLaVA projector to DemoHidden.
	c := native.EncoderConfig{Arch: native.ArchCLIP, Hidden: 64, Intermediate: 256, Layers: 2, Heads: 4,
		Act: native.ActQuickGELU, LNEps: 1e-5, ImageSize: 224, PatchSize: 14, Channels: 3}
	if o.DemoVision != nil {
		c = *o.DemoVision
	}
	c.ProjectorDim, c.ProjectorAct = o.DemoHidden, native.ActGELU
	return encoder.Random(c, o.Seed, &llavaSelect, o.Threads)
}

func loadAudio(o ModelOptions) (*encoder.Model, error) {
	if o.AudioModel != "" {
		m, err := encoder.Load(o.AudioModel, encoder.Options{Threads: o.Threads})
		if err != nil {
			return nil, fmt.Errorf("--audio-model: %w", err)
		}
		if m.Spec.Config.Arch != native.ArchWhisper {
			m.Close()
			return nil, fmt.Errorf("--audio-model %s is not a Whisper encoder", o.AudioModel)
		}
		return m, nil
	}
	// The demo: a two-layer Whisper encoder as wide as the demo LLM, 30 s windows.
	c := native.EncoderConfig{Arch: native.ArchWhisper, Hidden: o.DemoHidden, Intermediate: 4 * o.DemoHidden, Layers: 2,
		Heads: 4, Act: native.ActGELU, LNEps: 1e-5, NMels: 80, MaxPositions: 1500}
	return encoder.Random(c, o.Seed+1, nil, o.Threads)
}

// ProcessorNone as ModelOptions.Processor turns the processor files off.
const ProcessorNone = "none"

// processor reads the processor files of the first of dirs that has them (nil when none
// does, or when turned off).
func (o ModelOptions) processor(dirs ...string) (*hfproc.Settings, error) {
	if o.Processor == ProcessorNone {
		return nil, nil
	}
	if o.Processor != "" {
		s, err := media.LoadProcessor(o.Processor)
		if err != nil {
			return nil, fmt.Errorf("--processor %s: %w", o.Processor, err)
		}
		return s, nil
	}
	s, err := media.LoadProcessor(dirs...)
	if errors.Is(err, hfproc.ErrNone) {
		return nil, nil
	}
	return s, err
}

// choosePresets picks (or checks) the media presets and that their inputs and token counts
// are the encoders'. A checkpoint's processor files decide a preset when there are some; the
// built-in ones are the defaults when there are none.
func (m *Models) choosePresets(o ModelOptions) error {
	vc := m.Vision.Spec.Config
	settings, err := o.processor(o.VisionModel, o.TokenizerDir)
	if err != nil {
		return err
	}
	var p media.Preset
	if image, _ := fromSettings(settings); image != nil {
		p = *image
		if o.VisionPreset != "" {
			named, err := media.Lookup(o.VisionPreset)
			if err != nil {
				return fmt.Errorf("--vision-preset: %w", err)
			}
			if named.Picture == nil || named.Picture.Family != p.Picture.Family || named.Picture.Size != p.Picture.Size {
				return fmt.Errorf("%w: --vision-preset %s contradicts the processor files in %s (%s)", ErrModels, named.Name, settings.Dir, p.Summary())
			}
		}
		m.VisionProcessor = settings
	} else {
		name := o.VisionPreset
		if name == "" {
			family := "clip"
			if vc.Arch == native.ArchSigLIP {
				family = "siglip"
			}
			name = fmt.Sprintf("%s-%d", family, vc.ImageSize)
		}
		if p, err = media.Lookup(name); err != nil {
			return fmt.Errorf("--vision-preset: %w", err)
		}
	}
	name := p.Name
	if p.Source != "" {
		name = fmt.Sprintf("the processor files in %s (%s)", p.Source, p.Picture.Family)
	}
	if !o.CountOnly || p.Source == "" { // with CountOnly, files' presets are counted here and encoded by the engine
		if err := m.checkVisionPreset(p, name); err != nil {
			return err
		}
	}
	m.VisionPreset = p
	if m.Audio == nil {
		return nil
	}
	return m.chooseAudioPreset(o)
}

// checkVisionPreset refuses a picture preset whose inputs or token counts are not the vision
// encoder's (name says where the preset came from).
func (m *Models) checkVisionPreset(p media.Preset, name string) error {
	vc := m.Vision.Spec.Config
	if p.Picture == nil || (p.Picture.Family != picture.CLIP && p.Picture.Family != picture.SigLIP) {
		return fmt.Errorf("%w: %s: not a CLIP or SigLIP picture preset (the CPU encoders run ViTs of fixed size; an engine fed this way would count other tokens than this server)", ErrModels, name)
	}
	if p.Picture.Size != vc.ImageSize {
		return fmt.Errorf("%w: %s makes %d-px inputs, the vision encoder takes %d", ErrModels, name, p.Picture.Size, vc.ImageSize)
	}
	if p.Picture.Family == picture.CLIP && p.Picture.CropSize != 0 && p.Picture.CropSize != vc.ImageSize {
		return fmt.Errorf("%w: %s crops %d-px inputs, the vision encoder takes %d", ErrModels, name, p.Picture.CropSize, vc.ImageSize)
	}
	tokens, err := m.Vision.Tokens(encoder.Input{})
	if err != nil {
		return err
	}
	if want, err := p.Picture.Tokens(vc.ImageSize, vc.ImageSize); err != nil || want != tokens {
		return fmt.Errorf("%w: %s counts %d tokens an image (%v), the vision encoder's selection (%v) gives %d",
			ErrModels, name, want, err, m.Vision.Select(), tokens)
	}
	return nil
}

// chooseAudioPreset picks the audio preset: from the first of --processor, the audio model's
// directory and the tokenizer's whose processor files have a feature extractor, else the
// built-in one for the encoder's mel bins.
func (m *Models) chooseAudioPreset(o ModelOptions) error {
	ac := m.Audio.Spec.Config
	var settings *hfproc.Settings
	for _, dir := range []string{o.Processor, o.AudioModel, o.TokenizerDir} {
		if o.Processor == ProcessorNone || dir == "" {
			continue
		}
		s, err := media.LoadProcessor(dir)
		if errors.Is(err, hfproc.ErrNone) {
			continue
		}
		if err != nil {
			return fmt.Errorf("audio processor: %w", err)
		}
		if s.Audio != nil {
			settings = s
			break
		}
	}
	var p media.Preset
	if _, sound := fromSettings(settings); sound != nil {
		p = *sound
		if o.AudioPreset != "" {
			named, err := media.Lookup(o.AudioPreset)
			if err != nil {
				return fmt.Errorf("--audio-preset: %w", err)
			}
			if named.Audio == nil || named.Audio.Mels != p.Audio.Mels || named.Audio.Qwen2Audio != p.Audio.Qwen2Audio {
				return fmt.Errorf("%w: --audio-preset %s contradicts the processor files in %s (%s)", ErrModels, named.Name, settings.Dir, p.Summary())
			}
		}
		m.AudioProcessor = settings
	} else {
		name := o.AudioPreset
		if name == "" {
			name = "whisper-80"
			if ac.NMels == 128 {
				name = "whisper-128"
			}
		}
		var err error
		if p, err = media.Lookup(name); err != nil {
			return fmt.Errorf("--audio-preset: %w", err)
		}
	}
	if o.CountOnly && p.Source != "" && p.Audio != nil { // counted here, encoded by the engine
		m.AudioPreset = p
		return nil
	}
	if p.Audio == nil || p.Audio.Mels != ac.NMels || p.Audio.Qwen2Audio {
		return fmt.Errorf("%w: preset %s (%s) does not make the %d-bin Whisper input the audio encoder takes", ErrModels, p.Name, p.Summary(), ac.NMels)
	}
	if ac.MaxPositions*2 != 3000 {
		return fmt.Errorf("%w: the audio encoder takes %d frames, presets make 3000-frame windows", ErrModels, 2*ac.MaxPositions)
	}
	m.AudioPreset = p
	return nil
}

func fromSettings(s *hfproc.Settings) (image, sound *media.Preset) {
	if s == nil {
		return nil, nil
	}
	return media.FromProcessor(s)
}

// embeddingNames are where LLM checkpoints keep the input embedding table.
var embeddingNames = []string{"model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
	"language_model.model.embed_tokens.weight", "embed_tokens.weight", "tok_embeddings.weight", "transformer.wte.weight"}

func (m *Models) loadTable(o ModelOptions, width int) error {
	m.Hidden = width
	if o.Embeddings == "" {
		vocab := max(o.DemoVocab, 1)
		r := rand.New(rand.NewPCG(o.Seed, 0xe1))
		f := make([]float32, vocab*width)
		scale := 1 / math.Sqrt(float64(width))
		for i := range f {
			f[i] = float32(r.NormFloat64() * scale)
		}
		data := tableBytes(len(f) * m.DType.Size())
		if err := native.Convert(data, m.DType, native.AsBytes(f), native.F32); err != nil {
			return err
		}
		m.Table = native.Matrix{Data: data, DType: m.DType, Rows: vocab, Cols: width}
		return nil
	}
	f, err := safetensors.Open(o.Embeddings)
	if err != nil {
		return fmt.Errorf("--embeddings: %w", err)
	}
	defer f.Close()
	names := embeddingNames
	if o.EmbeddingTensor != "" {
		names = []string{o.EmbeddingTensor}
	}
	var t safetensors.Tensor
	found := false
	for _, n := range names {
		if t, found = f.Tensor(n); found {
			break
		}
	}
	if !found {
		return fmt.Errorf("--embeddings %s: no tensor named %v", o.Embeddings, names)
	}
	dt, err := native.ParseDType(t.DType)
	if err != nil || len(t.Shape) != 2 {
		return fmt.Errorf("--embeddings: tensor %q is %s %v, want a 2-D float table", t.Name, t.DType, t.Shape)
	}
	if t.Shape[1] != width {
		return fmt.Errorf("%w: the embedding table %q is %d wide, the encoders give %d-wide features", ErrModels, t.Name, t.Shape[1], width)
	}
	// Copied out of the mapping in the merge dtype, so the file can close.
	data := tableBytes(t.Shape[0] * width * m.DType.Size())
	if err := native.Convert(data, m.DType, t.Data, dt); err != nil {
		return err
	}
	m.Table = native.Matrix{Data: data, DType: m.DType, Rows: t.Shape[0], Cols: width}
	return nil
}

// hugeTable is the table size from which it is kept in 2 MiB pages: past the caches, where text
// rows gathered at random would otherwise cost a TLB miss and a page walk each 4 KiB.
const hugeTable = 64 << 20

// tableBytes allocates the embedding table: a large one in 2 MiB pages (native.MapPages, the
// allocation BenchmarkMerge's table uses), kept for the life of the process (the daemon loads
// its models once; slices of the table go to the merges), a small one in Go memory.
func tableBytes(n int) []byte {
	if n >= hugeTable {
		if p, err := native.MapPages(n); err == nil {
			return p.Data
		}
	}
	return make([]byte, n)
}

// ForModality is the encoder and preset for a modality (video frames use the vision ones).
func (m *Models) ForModality(mod sequence.Modality) (*encoder.Model, media.Preset, error) {
	switch mod {
	case sequence.Image, sequence.Video:
		return m.Vision, m.VisionPreset, nil
	case sequence.Audio:
		if m.Audio != nil {
			return m.Audio, m.AudioPreset, nil
		}
	}
	return nil, media.Preset{}, fmt.Errorf("this server has no %v encoder", mod)
}

// Modalities lists what the server accepts.
func (m *Models) Modalities() []sequence.Modality {
	out := []sequence.Modality{sequence.Image, sequence.Video}
	if m.Audio != nil {
		out = append(out, sequence.Audio)
	}
	return slices.Clip(out)
}

// Close frees the encoders.
func (m *Models) Close() {
	if m.Vision != nil {
		m.Vision.Close()
	}
	if m.Audio != nil {
		m.Audio.Close()
	}
}
