package dataplane

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"dataplane/dataplane/media/picture"
)

// writeDir writes files into a new directory.
func writeDir(t *testing.T, files map[string]string) string {
	dir := t.TempDir()
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	return dir
}

func demoModels(t *testing.T, edit func(*ModelOptions)) (*Models, error) {
	o := DefaultModelOptions()
	o.DemoHidden, o.DemoVocab, o.DType = 64, 300, 0
	edit(&o)
	m, err := LoadModels(o)
	if err == nil {
		t.Cleanup(m.Close)
	}
	return m, err
}

// The demo CLIP at 224 px takes a CLIP processor config's settings; a processor it cannot
// reproduce, or one that contradicts it, stops the start with the file named.
func TestModelsProcessorFiles(t *testing.T) {
	clip := writeDir(t, map[string]string{"preprocessor_config.json": `{"image_processor_type": "CLIPImageProcessor",
		"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}, "image_mean": [0.5, 0.5, 0.5]}`,
		"preprocessor_config.json.bak": "ignored"})
	m, err := demoModels(t, func(o *ModelOptions) { o.Processor = clip })
	require.NoError(t, err)
	require.Equal(t, clip, m.VisionPreset.Source)
	require.True(t, m.VisionPreset.Picture.CropFloor)
	require.Equal(t, picture.HalfMean, m.VisionPreset.Picture.Mean)
	require.Equal(t, clip, m.VisionProcessor.Dir)

	// Found in the tokenizer's directory when no flag names one; "none" turns that off.
	m, err = demoModels(t, func(o *ModelOptions) { o.TokenizerDir = clip })
	require.NoError(t, err)
	require.Equal(t, clip, m.VisionPreset.Source)
	m, err = demoModels(t, func(o *ModelOptions) { o.TokenizerDir, o.Processor = clip, ProcessorNone })
	require.NoError(t, err)
	require.Equal(t, "clip-224", m.VisionPreset.Name)
	require.Nil(t, m.VisionProcessor)

	qwen := writeDir(t, map[string]string{"preprocessor_config.json": `{"image_processor_type": "Qwen2VLImageProcessor", "max_pixels": 12845056}`})
	_, err = demoModels(t, func(o *ModelOptions) { o.TokenizerDir = qwen })
	require.ErrorIs(t, err, ErrModels)
	require.ErrorContains(t, err, qwen)
	require.ErrorContains(t, err, "not a CLIP or SigLIP")

	big := writeDir(t, map[string]string{"preprocessor_config.json": `{"image_processor_type": "CLIPImageProcessor", "size": 336, "crop_size": 336}`})
	_, err = demoModels(t, func(o *ModelOptions) { o.Processor = big })
	require.ErrorContains(t, err, "makes 336-px inputs, the vision encoder takes 224")

	_, err = demoModels(t, func(o *ModelOptions) { o.Processor, o.VisionPreset = clip, "siglip-384" })
	require.ErrorContains(t, err, "--vision-preset siglip-384 contradicts")

	bad := writeDir(t, map[string]string{"preprocessor_config.json": `{"image_processor_type": "CLIPImageProcessor", "crop_pct": 0.9}`})
	_, err = demoModels(t, func(o *ModelOptions) { o.Processor = bad })
	require.ErrorContains(t, err, `preprocessor_config.json: field "crop_pct": unknown field`)

	_, err = demoModels(t, func(o *ModelOptions) { o.Processor = t.TempDir() })
	require.ErrorContains(t, err, "--processor")
}

// The audio preset: a Whisper feature extractor's mel bins; Qwen2-Audio's processor is not
// the Whisper encoder's input.
func TestModelsAudioProcessor(t *testing.T) {
	whisper := writeDir(t, map[string]string{"preprocessor_config.json": `{"feature_extractor_type": "WhisperFeatureExtractor",
		"feature_size": 80, "processor_class": "WhisperProcessor", "return_attention_mask": false}`})
	m, err := demoModels(t, func(o *ModelOptions) { o.Processor = whisper })
	require.NoError(t, err)
	require.Equal(t, "whisper-80", m.AudioPreset.Name)
	require.Equal(t, whisper, m.AudioPreset.Source)
	require.Equal(t, "clip-224", m.VisionPreset.Name) // no image processor there

	qa := writeDir(t, map[string]string{"preprocessor_config.json": `{"feature_extractor_type": "WhisperFeatureExtractor",
		"feature_size": 80, "processor_class": "Qwen2AudioProcessor"}`})
	_, err = demoModels(t, func(o *ModelOptions) { o.TokenizerDir = qa })
	require.ErrorIs(t, err, ErrModels)
	require.ErrorContains(t, err, "qwen2-audio")

	mels := writeDir(t, map[string]string{"preprocessor_config.json": `{"feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128}`})
	_, err = demoModels(t, func(o *ModelOptions) { o.Processor = mels })
	require.ErrorContains(t, err, "80-bin")
}
