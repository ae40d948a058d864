// Package hfproc reads a Hugging Face checkpoint's processor settings — preprocessor_config.json,
// processor_config.json, video_preprocessor_config.json, and the config.json fields that decide
// preprocessing — into picture and audio presets, so token counts and encoder inputs follow the
// checkpoint (as transformers and vLLM do) rather than a class's defaults. A field it does not
// know, a value it cannot honour, or two files that disagree is an *Error naming the file and the
// field.
package hfproc

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"dataplane/dataplane/media/audio"
	"dataplane/dataplane/media/picture"
)

// The files read from a checkpoint directory.
const (
	PreprocessorFile = "preprocessor_config.json"       // the image processor or feature extractor
	ProcessorFile    = "processor_config.json"          // the processor: patch size, feature selection; nested sub-processors (transformers v5)
	VideoFile        = "video_preprocessor_config.json" // the video processor
	ModelFile        = "config.json"                    // the model: only its vision and audio settings are read
)

// MaxFileBytes bounds one file (Whisper's older configs carry their mel filters: ~300 KB).
const MaxFileBytes = 8 << 20

// Settings are what a directory's processor files say.
type Settings struct {
	Dir   string
	Files []string // the files read, in the order above
	// Class is what chose the image family: the image processor's class or config.json's
	// model_type; AudioClass the feature extractor's (with the processor's, for Qwen2-Audio).
	Class, AudioClass string
	Image             *picture.Preset // nil: the files have no image processor
	Video             *Video          // nil: no video settings beyond the image preset
	Audio             *audio.Preset   // nil: no feature extractor
	// Notes say what was read but is decided elsewhere, or left at a default.
	Notes []string
}

// Video is a video processor's settings.
type Video struct {
	Frames *picture.Preset // frame preprocessing (Qwen2-VL: its own pixel bounds)
	// FPS, MinFrames and MaxFrames bound frame sampling (0: not set).
	FPS                  float64
	MinFrames, MaxFrames int
}

// ErrNone: the directory has no processor settings.
var ErrNone = errors.New("no processor config files")

// Load reads dir's processor files. A directory with none of them gives ErrNone.
func Load(dir string) (*Settings, error) {
	files := map[string][]byte{}
	for _, name := range []string{PreprocessorFile, ProcessorFile, VideoFile, ModelFile} {
		data, err := readFile(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, &Error{File: filepath.Join(dir, name), Msg: err.Error()}
		}
		files[name] = data
	}
	s, err := Parse(files)
	if err != nil {
		return nil, err
	}
	s.Dir = dir
	return s, nil
}

// readFile reads a regular file of at most MaxFileBytes.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxFileBytes)
	}
	return data, nil
}

// Parse reads the files' contents, by name (the names above; others are refused).
func Parse(files map[string][]byte) (*Settings, error) {
	p := &parse{s: &Settings{}, objs: map[string]*object{}}
	for name := range files {
		switch name {
		case PreprocessorFile, ProcessorFile, VideoFile, ModelFile:
		default:
			return nil, &Error{File: name, Msg: "not a processor config file"}
		}
	}
	for _, name := range []string{PreprocessorFile, ProcessorFile, VideoFile, ModelFile} {
		data, ok := files[name]
		if !ok {
			continue
		}
		if name == ModelFile {
			m, err := parseModel(data)
			if err != nil {
				return nil, err
			}
			p.model = m
		} else {
			o, err := parseObject(name, data)
			if err != nil {
				return nil, err
			}
			p.objs[name] = o
		}
		p.s.Files = append(p.s.Files, name)
	}
	if err := p.run(); err != nil {
		return nil, err
	}
	if p.s.Image == nil && p.s.Audio == nil && p.s.Video == nil {
		return nil, ErrNone
	}
	return p.s, nil
}

// parse holds the files while the presets are built.
type parse struct {
	s     *Settings
	objs  map[string]*object
	model *model
	// proc holds processor-level settings: processor_config.json's top level.
	proc *object
}

func (p *parse) note(format string, args ...any) {
	p.s.Notes = append(p.s.Notes, fmt.Sprintf(format, args...))
}

func (p *parse) run() error {
	pre, vid := p.objs[PreprocessorFile], p.objs[VideoFile]
	p.proc = p.objs[ProcessorFile]
	var image, audioObj *object
	if p.proc != nil {
		// transformers v5 nests the sub-processors' settings in processor_config.json.
		image, audioObj = p.proc.sub("image_processor"), p.proc.sub("feature_extractor")
		if v := p.proc.sub("video_processor"); v != nil {
			if vid != nil {
				return &Error{File: ProcessorFile, Field: "video_processor", Msg: "given here and in " + VideoFile}
			}
			vid = v
		}
		if p.proc.err != nil {
			return p.proc.err
		}
	}
	if pre != nil {
		switch {
		case pre.has("image_processor_type"), pre.str("feature_extractor_type", "") == "CLIPFeatureExtractor":
			if image != nil {
				return &Error{File: PreprocessorFile, Msg: "an image processor here and in " + ProcessorFile}
			}
			image = pre
		case pre.has("feature_extractor_type"):
			if audioObj != nil {
				return &Error{File: PreprocessorFile, Msg: "a feature extractor here and in " + ProcessorFile}
			}
			audioObj = pre
		default:
			return &Error{File: PreprocessorFile, Field: "image_processor_type", Msg: "missing (and no feature_extractor_type): cannot tell which processor this is"}
		}
		if pre.err != nil {
			return pre.err
		}
	}
	if p.model != nil && p.model.ModelType == "internvl_chat" {
		// vLLM's InternVL processor reads config.json only (its preprocessor_config.json, a
		// CLIP feature extractor, is not what the model was trained with).
		if image != nil {
			p.note("%s: not read: InternVL's tiling and normalisation come from %s", image.file, ModelFile)
		}
		pr, err := p.internVL()
		if err != nil {
			return err
		}
		p.s.Image, p.s.Class = pr, "internvl_chat"
	} else if image != nil {
		if err := p.image(image); err != nil {
			return err
		}
	}
	if vid != nil {
		if err := p.video(vid); err != nil {
			return err
		}
		if p.s.Image == nil || p.s.Image.Family != picture.Qwen2VL {
			return &Error{File: vid.file, Field: vid.prefix + "video_processor_type", Msg: "a Qwen2-VL video processor needs a Qwen2-VL image processor beside it"}
		}
	}
	if audioObj != nil {
		if err := p.audio(audioObj); err != nil {
			return err
		}
	}
	if p.proc != nil {
		p.processorFields()
		if err := p.proc.unknown(); err != nil {
			return err
		}
	}
	return nil
}

// className is a processor class without its backend suffix.
func className(s string) string {
	for _, suffix := range []string{"Fast", "Pil"} {
		s = strings.TrimSuffix(s, suffix)
	}
	return s
}

// metadata are keys every processor file may carry that say nothing about preprocessing.
var metadata = []string{"processor_class", "image_processor_type", "feature_extractor_type", "video_processor_type",
	"auto_map", "_processor_class", "_valid_processor_keys", "_valid_kwargs_names", "transformers_version", "use_fast"}

// name is a preset's name: its family and a digest of its settings, so the feature cache never
// mixes inputs preprocessed two ways.
func name(family string, settings any) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%+v", settings)))
	return family + "@" + hex.EncodeToString(sum[:4])
}
