package hfproc

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/media/audio"
	"dataplane/dataplane/media/picture"
)

// tokens.json is testdata/gen_tokens.py's output: transformers' and vLLM's counts, from their
// source, for each released config in testdata/configs.
type reference struct {
	Images []struct {
		Config        string
		Width, Height int
		Tokens        int
		Error         string
		Resized       []int // Qwen2-VL (h, w); LLaVA-NeXT the picture inside the grid (h, w)
		Grid          []int // Qwen2-VL (t, h, w); InternVL (cols, rows)
		Best          []int // LLaVA-NeXT (h, w)
		Tiles         json.RawMessage
		Pad, Features []int
	}
	Audio []struct {
		Config          string
		Seconds         float64
		Samples, Tokens int
		Windows         int
		Error           string
	}
	Sweeps map[string][][3]int
}

func loadReference(t *testing.T) reference {
	data, err := os.ReadFile("testdata/tokens.json")
	require.NoError(t, err)
	var ref reference
	require.NoError(t, json.Unmarshal(data, &ref))
	require.NotEmpty(t, ref.Images)
	return ref
}

func loadConfig(t *testing.T, name string) *Settings {
	t.Helper()
	s, err := Load(filepath.Join("testdata/configs", name))
	require.NoError(t, err, name)
	return s
}

// Every cell of the reference table: token counts, and the geometry behind them.
func TestReference(t *testing.T) {
	ref := loadReference(t)
	settings := map[string]*Settings{}
	get := func(name string) *Settings {
		if settings[name] == nil {
			settings[name] = loadConfig(t, name)
		}
		return settings[name]
	}
	for _, c := range ref.Images {
		p := get(c.Config).Image
		require.NotNil(t, p, c.Config)
		n, err := p.Tokens(c.Width, c.Height)
		if c.Error != "" {
			require.ErrorIs(t, err, picture.ErrDimensions, "%s %dx%d", c.Config, c.Width, c.Height)
			continue
		}
		require.NoError(t, err, "%s %dx%d", c.Config, c.Width, c.Height)
		require.Equal(t, c.Tokens, n, "%s %dx%d", c.Config, c.Width, c.Height)
		switch p.Family {
		case picture.Qwen2VL:
			rh, rw, err := p.SmartResize(c.Height, c.Width)
			require.NoError(t, err)
			require.Equal(t, c.Resized, []int{rh, rw}, "%s %dx%d", c.Config, c.Width, c.Height)
		case picture.LlavaNext:
			g := p.Anyres(c.Width, c.Height)
			var tiles []int
			require.NoError(t, json.Unmarshal(c.Tiles, &tiles))
			require.Equal(t, c.Best, []int{g.BestH, g.BestW}, "%s %dx%d", c.Config, c.Width, c.Height)
			require.Equal(t, tiles, []int{g.Rows, g.Cols})
			require.Equal(t, c.Resized, []int{g.ResizedH, g.ResizedW})
			require.Equal(t, c.Pad, []int{g.PadTop, g.PadLeft})
			require.Equal(t, c.Features, []int{g.FeatH, g.FeatW})
		case picture.InternVL:
			cols, rows := p.TileGrid(c.Width, c.Height)
			require.Equal(t, c.Grid, []int{cols, rows}, "%s %dx%d", c.Config, c.Width, c.Height)
		}
	}
	for _, c := range ref.Audio {
		a := get(c.Config).Audio
		require.NotNil(t, a, c.Config)
		n, err := a.CheckTokens(c.Samples)
		if c.Error != "" {
			require.ErrorIs(t, err, audio.ErrTooShort, "%s %g s", c.Config, c.Seconds)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, c.Tokens, n, "%s %g s", c.Config, c.Seconds)
		require.Equal(t, c.Windows, a.Windows(c.Samples), "%s %g s", c.Config, c.Seconds)
	}
	require.Len(t, ref.Sweeps, 3)
	for name, rows := range ref.Sweeps {
		p := get(name).Image
		for _, r := range rows {
			n, err := p.Tokens(r[0], r[1])
			if r[2] < 0 {
				require.Error(t, err, "%s %dx%d", name, r[0], r[1])
				continue
			}
			require.NoError(t, err)
			require.Equal(t, r[2], n, "%s %dx%d", name, r[0], r[1])
		}
	}
}

// What the released configs become.
func TestReleasedSettings(t *testing.T) {
	q := loadConfig(t, "qwen2-vl-7b-instruct")
	require.Equal(t, picture.Qwen2VL, q.Image.Family)
	require.Equal(t, 12845056, q.Image.MaxPixels) // not the class default, 1,003,520
	require.Equal(t, 3136, q.Image.MinPixels)
	require.Equal(t, picture.CLIPMean, q.Image.Mean)
	require.Equal(t, []string{PreprocessorFile, ModelFile}, q.Files)
	n, err := q.Image.Tokens(1920, 1080)
	require.NoError(t, err)
	require.Equal(t, 2691, n) // vLLM's count; the class defaults give 1,222
	def, _ := picture.Qwen2VLImage.Tokens(1920, 1080)
	require.Equal(t, 1222, def)

	l := loadConfig(t, "llava-1.5-7b-hf")
	require.Equal(t, picture.CLIP, l.Image.Family)
	require.Equal(t, [3]int{336, 336, 14}, [3]int{l.Image.Size, l.Image.CropSize, l.Image.Patch})
	require.True(t, l.Image.CropFloor)
	require.Zero(t, l.Image.ExtraTokens)

	nx := loadConfig(t, "llava-v1.6-mistral-7b-hf")
	require.Equal(t, picture.LlavaNext, nx.Image.Family)
	require.Equal(t, picture.LlavaNext336.Pinpoints, nx.Image.Pinpoints)

	iv := loadConfig(t, "internvl2_5-8b")
	require.Equal(t, "internvl_chat", iv.Class)
	require.Equal(t, [4]int{448, 1, 12, 256}, [4]int{iv.Image.Size, iv.Image.MinTiles, iv.Image.MaxTiles, iv.Image.TokensPerTile})
	require.True(t, iv.Image.Thumbnail)

	sg := loadConfig(t, "siglip-so400m-patch14-384")
	require.Equal(t, [2]int{384, 14}, [2]int{sg.Image.Size, sg.Image.Patch})
	require.Equal(t, picture.HalfMean, sg.Image.Mean)

	qa := loadConfig(t, "qwen2-audio-7b-instruct")
	require.True(t, qa.Audio.Qwen2Audio && qa.Audio.Truncate)
	require.Equal(t, 128, qa.Audio.Mels)
	require.Nil(t, qa.Image)

	wb := loadConfig(t, "whisper-base")
	require.Equal(t, "whisper-80", wb.Audio.Name)
	require.False(t, wb.Audio.Truncate)

	_, err = Load(t.TempDir())
	require.ErrorIs(t, err, ErrNone)
}

// Refusals name the file and the field.
func TestParseRefusals(t *testing.T) {
	qwen := `"image_processor_type": "Qwen2VLImageProcessor"`
	cases := []struct {
		files       map[string]string
		file, field string
	}{
		{map[string]string{PreprocessorFile: `{` + qwen + `, "patch_size": 16}`, ModelFile: `{"model_type": "qwen2_vl", "vision_config": {"patch_size": 14}}`},
			PreprocessorFile, "patch_size"},
		{map[string]string{PreprocessorFile: `{` + qwen + `, "merge_size": 3}`, ModelFile: `{"vision_config": {"spatial_merge_size": 2}}`},
			PreprocessorFile, "merge_size"},
		{map[string]string{PreprocessorFile: `{` + qwen + `, "frobnicate": 1}`}, PreprocessorFile, "frobnicate"},
		{map[string]string{PreprocessorFile: `{` + qwen + `, "size": {"shortest_edge": 3136}}`}, PreprocessorFile, "size"},
		{map[string]string{PreprocessorFile: `{` + qwen + `, "size": {"shortest_edge": 3136, "longest_edge": 9, "depth": 1}}`}, PreprocessorFile, "size.depth"},
		{map[string]string{PreprocessorFile: `{` + qwen + `, "min_pixels": 5000, "max_pixels": 4000}`}, PreprocessorFile, "max_pixels"},
		{map[string]string{PreprocessorFile: `{` + qwen + `, "min_pixels": 1.5}`}, PreprocessorFile, "min_pixels"},
		{map[string]string{PreprocessorFile: `{` + qwen + `, "resample": 1}`}, PreprocessorFile, "resample"},
		{map[string]string{PreprocessorFile: `{` + qwen + `, "image_mean": [0.5, 0.5]}`}, PreprocessorFile, "image_mean"},
		{map[string]string{PreprocessorFile: `{` + qwen + `, "image_std": [0.5, 0, 0.5]}`}, PreprocessorFile, "image_std"},
		{map[string]string{PreprocessorFile: `{` + qwen + `, "do_resize": false}`}, PreprocessorFile, "do_resize"},
		{map[string]string{PreprocessorFile: `{"image_processor_type": "BlipImageProcessor"}`}, PreprocessorFile, "image_processor_type"},
		{map[string]string{PreprocessorFile: `{"size": 224}`}, PreprocessorFile, "image_processor_type"},
		{map[string]string{PreprocessorFile: `[1, 2]`}, PreprocessorFile, ""},
		{map[string]string{PreprocessorFile: `{"image_processor_type": "CLIPImageProcessor", "size": {"height": 336, "width": 336}}`}, PreprocessorFile, "size"},
		{map[string]string{PreprocessorFile: `{"image_processor_type": "CLIPImageProcessor", "do_center_crop": false}`}, PreprocessorFile, "do_center_crop"},
		{map[string]string{PreprocessorFile: `{"image_processor_type": "CLIPImageProcessor", "crop_size": 336, "size": 336}`,
			ModelFile: `{"vision_config": {"image_size": 224}}`}, PreprocessorFile, "crop_size"},
		{map[string]string{PreprocessorFile: `{"image_processor_type": "CLIPImageProcessor", "crop_size": 336, "size": 336}`,
			ProcessorFile: `{"patch_size": 16}`, ModelFile: `{"vision_config": {"patch_size": 14}}`}, ProcessorFile, "patch_size"},
		{map[string]string{PreprocessorFile: `{"image_processor_type": "CLIPImageProcessor", "crop_size": 336, "size": 336}`,
			ProcessorFile: `{"vision_feature_select_strategy": "full"}`, ModelFile: `{"vision_feature_select_strategy": "default"}`},
			ProcessorFile, "vision_feature_select_strategy"},
		{map[string]string{PreprocessorFile: `{"image_processor_type": "LlavaNextImageProcessor", "size": {"shortest_edge": 336}, "crop_size": 336,
			"image_grid_pinpoints": [[336, 672]]}`, ModelFile: `{"image_grid_pinpoints": [[672, 336]]}`}, PreprocessorFile, "image_grid_pinpoints"},
		{map[string]string{PreprocessorFile: `{"image_processor_type": "LlavaNextImageProcessor", "size": {"shortest_edge": 336}, "crop_size": 336,
			"image_grid_pinpoints": [[336, 500]]}`}, PreprocessorFile, "image_grid_pinpoints"},
		{map[string]string{PreprocessorFile: `{"feature_extractor_type": "WhisperFeatureExtractor", "sampling_rate": 8000}`}, PreprocessorFile, "sampling_rate"},
		{map[string]string{PreprocessorFile: `{"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80}`,
			ModelFile: `{"num_mel_bins": 128}`}, PreprocessorFile, "feature_size"},
		{map[string]string{PreprocessorFile: `{"feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "ClapProcessor"}`}, PreprocessorFile, "processor_class"},
		{map[string]string{ModelFile: `{"model_type": "internvl_chat", "force_image_size": 448, "vision_config": {"image_size": 224, "patch_size": 14}}`},
			ModelFile, "force_image_size"},
		{map[string]string{ModelFile: `{"model_type": "internvl_chat", "vision_config": {"patch_size": 14}}`}, ModelFile, "vision_config"},
		{map[string]string{ModelFile: `{"model_type": "internvl_chat", "vision_config": {"image_size": "448"}}`}, ModelFile, "vision_config.image_size"},
		{map[string]string{PreprocessorFile: `{` + qwen + `}`, VideoFile: `{"video_processor_type": "LlavaOnevisionVideoProcessor"}`}, VideoFile, "video_processor_type"},
		{map[string]string{PreprocessorFile: `{` + qwen + `}`, VideoFile: `{"video_processor_type": "Qwen2VLVideoProcessor", "fps": -1}`}, VideoFile, "fps"},
		{map[string]string{PreprocessorFile: `{` + qwen + `}`, ProcessorFile: `{"patch_size": 14}`}, ProcessorFile, "patch_size"},
		{map[string]string{PreprocessorFile: `{"image_processor_type": "SiglipImageProcessor"}`, VideoFile: `{"video_processor_type": "Qwen2VLVideoProcessor"}`},
			VideoFile, "video_processor_type"},
		{map[string]string{ProcessorFile: `{"video_processor": {"video_processor_type": "Qwen2VLVideoProcessor"}}`}, ProcessorFile, "video_processor.video_processor_type"},
		{map[string]string{PreprocessorFile: `{` + qwen + `}`, ProcessorFile: `{"image_processor": {` + qwen + `}}`}, PreprocessorFile, ""},
		{map[string]string{"tokenizer.json": `{}`}, "tokenizer.json", ""},
	}
	for i, c := range cases {
		files := map[string][]byte{}
		for k, v := range c.files {
			files[k] = []byte(v)
		}
		_, err := Parse(files)
		var e *Error
		require.ErrorAs(t, err, &e, "case %d: %v", i, err)
		require.Equal(t, c.file, e.File, "case %d: %v", i, err)
		require.Equal(t, c.field, e.Field, "case %d: %v", i, err)
		require.Contains(t, err.Error(), c.file)
	}
}

// Settings read the way transformers reads them.
func TestParseSettings(t *testing.T) {
	parse := func(files map[string]string) *Settings {
		t.Helper()
		in := map[string][]byte{}
		for k, v := range files {
			in[k] = []byte(v)
		}
		s, err := Parse(in)
		require.NoError(t, err)
		return s
	}
	// Qwen2.5-VL's size form; min_pixels overrides it (transformers' __init__).
	s := parse(map[string]string{PreprocessorFile: `{"image_processor_type": "Qwen2VLImageProcessorFast",
		"size": {"shortest_edge": 1000, "longest_edge": 2000000}, "max_pixels": 1000000, "do_normalize": false, "resample": 2}`})
	require.Equal(t, [2]int{1000, 1000000}, [2]int{s.Image.MinPixels, s.Image.MaxPixels})
	require.Equal(t, [3]float32{}, s.Image.Mean)
	require.Equal(t, [3]float32{1, 1, 1}, s.Image.Std)
	require.Equal(t, "bilinear", s.Image.Filter.String())
	// transformers 4.4x's {"min_pixels", "max_pixels"} size; do_rescale off.
	s = parse(map[string]string{PreprocessorFile: `{"image_processor_type": "Qwen2VLImageProcessor",
		"size": {"min_pixels": 3136, "max_pixels": 1003520}, "do_rescale": false, "image_mean": 0.5}`})
	require.Equal(t, [2]int{3136, 1003520}, [2]int{s.Image.MinPixels, s.Image.MaxPixels})
	require.Equal(t, float32(1), s.Image.Divisor)
	require.Equal(t, picture.HalfMean, s.Image.Mean)
	// transformers v5: the sub-processors nested in processor_config.json; a video processor.
	s = parse(map[string]string{ProcessorFile: `{"processor_class": "Qwen2VLProcessor",
		"image_processor": {"image_processor_type": "Qwen2VLImageProcessor", "max_pixels": 500000},
		"video_processor": {"video_processor_type": "Qwen2VLVideoProcessor", "fps": 1.5, "max_frames": 64, "do_sample_frames": false}}`})
	require.Equal(t, 500000, s.Image.MaxPixels)
	require.Equal(t, 1.5, s.Video.FPS)
	require.Equal(t, [2]int{4, 64}, [2]int{s.Video.MinFrames, s.Video.MaxFrames})
	require.Equal(t, 768*28*28, s.Video.Frames.MaxPixels) // the video processor's default
	// A config.json field no processor here needs may be anything.
	s = parse(map[string]string{PreprocessorFile: `{"image_processor_type": "Qwen2VLImageProcessor"}`,
		ModelFile: `{"model_type": "qwen2_vl", "vision_config": {"image_size": [384, 384], "patch_size": 14}, "use_thumbnail": "yes"}`})
	require.Equal(t, 14, s.Image.Patch)
	// The "full" strategy keeps the CLS token.
	s = parse(map[string]string{PreprocessorFile: `{"image_processor_type": "CLIPImageProcessor", "size": 336, "crop_size": 336}`,
		ProcessorFile: `{"patch_size": 14, "vision_feature_select_strategy": "full", "num_additional_image_tokens": 1}`})
	n, err := s.Image.Tokens(100, 100)
	require.NoError(t, err)
	require.Equal(t, 577, n)
	// InternVL: its preprocessor_config.json is not what vLLM reads; noted, not refused.
	s = parse(map[string]string{PreprocessorFile: `{"feature_extractor_type": "CLIPFeatureExtractor", "size": 448, "crop_size": 448}`,
		ModelFile: `{"model_type": "internvl_chat", "dynamic_image_size": false, "vision_config": {"image_size": 448, "patch_size": 14}}`})
	require.Equal(t, [2]int{1, 1}, [2]int{s.Image.MinTiles, s.Image.MaxTiles})
	require.Len(t, s.Notes, 1)
	// Settings that differ get different names (the feature cache keys on it).
	a := parse(map[string]string{PreprocessorFile: `{"image_processor_type": "Qwen2VLImageProcessor", "max_pixels": 1000000}`})
	b := parse(map[string]string{PreprocessorFile: `{"image_processor_type": "Qwen2VLImageProcessor", "max_pixels": 1000001}`})
	require.NotEqual(t, a.Image.Name, b.Image.Name)
}

func FuzzParse(f *testing.F) {
	for _, dir := range []string{"qwen2-vl-7b-instruct", "llava-v1.6-mistral-7b-hf", "internvl2_5-8b", "qwen2-audio-7b-instruct"} {
		pre, _ := os.ReadFile(filepath.Join("testdata/configs", dir, PreprocessorFile))
		model, _ := os.ReadFile(filepath.Join("testdata/configs", dir, ModelFile))
		f.Add(pre, []byte(nil), model)
	}
	f.Add([]byte(`{"image_processor_type": "LlavaNextImageProcessor", "image_grid_pinpoints": [[336, 336]]}`),
		[]byte(`{"patch_size": 14, "image_processor": {}}`), []byte(`{}`))
	f.Fuzz(func(t *testing.T, pre, proc, model []byte) {
		files := map[string][]byte{}
		for name, data := range map[string][]byte{PreprocessorFile: pre, ProcessorFile: proc, ModelFile: model} {
			if data != nil {
				files[name] = data
			}
		}
		s, err := Parse(files)
		if err != nil {
			var e *Error
			if !errors.Is(err, ErrNone) && !errors.As(err, &e) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		// What parses is a preset that works: a token count for any picture or clip.
		if s.Image != nil {
			if _, err := s.Image.Tokens(640, 480); err != nil {
				t.Fatalf("%+v: %v", *s.Image, err)
			}
		}
		if s.Audio != nil && s.Audio.Tokens(16000) < 1 {
			t.Fatalf("%+v: no tokens for 1 s", *s.Audio)
		}
	})
}
