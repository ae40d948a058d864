package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"dataplane/dataplane/media"
	"dataplane/dataplane/media/audio"
	"dataplane/dataplane/media/video"
	"dataplane/native"
	"dataplane/transfer/safetensors"
)

func init() {
	register(command{"preprocess", "turn one image, audio or video into its encoder input tensors (safetensors)", preprocess})
}

// maxDataURLBytes bounds a data: URL given instead of a file.
const maxDataURLBytes = 256 << 20

func preprocess(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("preprocess", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		presetName = fs.String("preset", "", "preprocessing preset (see the list below)")
		procDir    = fs.String("processor", "", "directory of a checkpoint's Hugging Face processor files (preprocessor_config.json, ...): its settings instead of --preset")
		imagePath  = fs.String("image", "", "a JPEG or PNG file, or a data: URL")
		audioPath  = fs.String("audio", "", "an audio file (WAV, FLAC, MP3; others through ffmpeg), or a data: URL")
		videoPath  = fs.String("video", "", "a video file (through ffmpeg)")
		imagesList = fs.String("images", "", "comma-separated picture files taken as one video")
		outPath    = fs.String("out", "", "output .safetensors file")
		dtypeName  = fs.String("dtype", "f32", "tensor dtype: f32, f16 or bf16")
		mel        = fs.String("mel", "", "log-mel convention: transcribe (openai/whisper) or hf (Hugging Face); default: the preset's")
		sampling   = fs.String("sampling", "uniform", "video frames: uniform, fps, keyframe or max_frames")
		frames     = fs.Int("frames", 0, "video frames for uniform and keyframe (0: --max-frames)")
		fps        = fs.Float64("fps", video.DefaultFPS, "frames a second for --sampling fps")
		maxFrames  = fs.Int("max-frames", video.DefaultMaxFrames, "most video frames")
		budget     = fs.Int("budget", 0, "video token budget: the frame count is capped to fit (0: none)")
		imageFPS   = fs.Float64("image-fps", video.DefaultImageFPS, "frame rate of --images")
		maxPixels  = fs.Int("max-pixels", 0, "refuse pictures and frames with more pixels (0: the default limit)")
		maxSeconds = fs.Float64("max-seconds", 0, "refuse longer audio or video (0: the default limit)")
		noEXIF     = fs.Bool("no-exif", false, "ignore the EXIF orientation")
		threads    = fs.Int("threads", 0, "log-mel threads (0: all)")
	)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: dataplane preprocess (--preset NAME | --processor DIR) (--image F | --audio F | --video F | --images F1,F2,..) --out OUT.safetensors\n\n")
		fmt.Fprintf(stderr, "Writes the exact encoder input tensor(s) of one item and prints its token count and content key.\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\nPresets:\n")
		for _, p := range media.Presets() {
			fmt.Fprintf(stderr, "  %-12s %s\n", p.Name, p.Summary())
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	usage := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "preprocess: "+format+"\n", a...)
		return errUsage
	}
	if fs.NArg() > 0 {
		return usage("unexpected arguments %q", fs.Args())
	}
	inputs := 0
	for _, s := range []string{*imagePath, *audioPath, *videoPath, *imagesList} {
		if s != "" {
			inputs++
		}
	}
	if (*presetName == "") == (*procDir == "") || *outPath == "" || inputs != 1 {
		return usage("need one of --preset and --processor, --out and exactly one of --image, --audio, --video, --images (-h lists presets)")
	}
	var preset media.Preset
	if *presetName != "" {
		p, err := media.Lookup(*presetName)
		if err != nil {
			return usage("%v", err)
		}
		preset = p
	} else {
		p, err := processorPreset(*procDir, *audioPath != "", stdout)
		if err != nil {
			return err
		}
		preset = *p
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if preset.Video != nil { // the checkpoint's video processor says these unless a flag does
		if !set["fps"] {
			*fps = 0
		}
		if !set["max-frames"] {
			*maxFrames = 0
		}
	}
	dtype, err := native.ParseDType(*dtypeName)
	if err != nil {
		return usage("--dtype: %v", err)
	}
	opts := media.Options{DType: dtype, Threads: *threads}
	opts.Picture.MaxPixels, opts.Picture.IgnoreOrientation = *maxPixels, *noEXIF
	opts.Audio.MaxSeconds = *maxSeconds
	if *mel != "" {
		c, err := audio.ParseConvention(*mel)
		if err != nil {
			return usage("--mel: %v", err)
		}
		opts.Convention = &c
	}
	s, err := video.ParseSampling(*sampling)
	if err != nil {
		return usage("--sampling: %v", err)
	}
	opts.Video = video.Options{Sampling: s, Frames: *frames, FPS: *fps, MaxFrames: *maxFrames, Budget: video.Budget{Tokens: *budget},
		ImageFPS: *imageFPS, MaxPixels: *maxPixels, MaxSeconds: *maxSeconds}

	var (
		res      *media.Result
		modality string
		names    tensorNames
	)
	switch {
	case *imagePath != "":
		modality, names = "image", tensorNames{"pixel_values", "image_grid_thw", "image_sizes"}
		data, err := readInput(*imagePath)
		if err != nil {
			return err
		}
		res, err = media.Image(data, preset, opts)
		if err != nil {
			return err
		}
	case *audioPath != "":
		modality, names = "audio", tensorNames{input: "input_features"}
		data, err := readInput(*audioPath)
		if err != nil {
			return err
		}
		if res, err = media.Audio(ctx, data, preset, opts); err != nil {
			return err
		}
	default:
		modality, names = "video", tensorNames{input: "pixel_values_videos", grid: "video_grid_thw"}
		var data []byte
		var images [][]byte
		if *videoPath != "" {
			if data, err = readInput(*videoPath); err != nil {
				return err
			}
		} else {
			for _, p := range strings.Split(*imagesList, ",") {
				b, err := readInput(strings.TrimSpace(p))
				if err != nil {
					return err
				}
				images = append(images, b)
			}
		}
		if res, err = media.Video(ctx, data, images, preset, opts); err != nil {
			return err
		}
	}
	meta := map[string]string{"preset": preset.Name, "modality": modality, "tokens": strconv.Itoa(res.Tokens),
		"content_key": res.Key.Hex(), "source": res.Detail}
	tensors := fileTensors(res, names)
	if err := safetensors.WriteFile(*outPath, tensors, meta); err != nil {
		return fmt.Errorf("write %s: %w", *outPath, err)
	}
	fmt.Fprintf(stdout, "%s: %s\n", modality, res.Detail)
	for _, t := range tensors {
		fmt.Fprintf(stdout, "tensor %s %s %v\n", t.Name, t.DType, t.Shape)
	}
	fmt.Fprintf(stdout, "tokens %d\ncontent_key %s\nwrote %s\n", res.Tokens, res.Key.Hex(), *outPath)
	return nil
}

// tensorNames are what Hugging Face's processors call an item's tensors: its encoder input,
// Qwen2-VL's patch grid and LLaVA-NeXT's image size.
type tensorNames struct{ input, grid, sizes string }

// fileTensors is what preprocess writes: the encoder input and, where the preset has them,
// the patch grid as the [1, 3] I64 tensor Qwen2-VL's processors return and the [1, 2] I64
// (height, width) LLaVA-NeXT's return.
func fileTensors(res *media.Result, names tensorNames) []safetensors.Tensor {
	in := res.Input
	out := []safetensors.Tensor{{Name: names.input, DType: safetensors.DTypeName(in.DType), Shape: in.Shape, Data: in.Data}}
	i64 := func(name string, v ...int) safetensors.Tensor {
		data := make([]byte, 0, 8*len(v))
		for _, x := range v {
			data = binary.LittleEndian.AppendUint64(data, uint64(x))
		}
		return safetensors.Tensor{Name: name, DType: "I64", Shape: []int{1, len(v)}, Data: data}
	}
	if res.Grid != [3]int{} { // Qwen2-VL; a grid has at least one patch a side
		out = append(out, i64(names.grid, res.Grid[:]...))
	}
	if res.ImageSize != [2]int{} && names.sizes != "" { // LLaVA-NeXT
		out = append(out, i64(names.sizes, res.ImageSize[:]...))
	}
	return out
}

// processorPreset is the preset a checkpoint's processor files make for the item (audio or
// pictures), after printing what was read.
func processorPreset(dir string, sound bool, stdout io.Writer) (*media.Preset, error) {
	s, err := media.LoadProcessor(dir)
	if err != nil {
		return nil, fmt.Errorf("--processor %s: %w", dir, err)
	}
	image, audio := media.FromProcessor(s)
	p, what := image, "image processor"
	if sound {
		p, what = audio, "feature extractor"
	}
	if p == nil {
		return nil, fmt.Errorf("--processor %s: its files (%s) have no %s", dir, strings.Join(s.Files, ", "), what)
	}
	fmt.Fprintf(stdout, "processor: %s (%s): %s\n", dir, strings.Join(s.Files, ", "), p.Summary())
	for _, n := range s.Notes {
		fmt.Fprintf(stdout, "processor note: %s\n", n)
	}
	return p, nil
}

// readInput reads a file, or decodes a data: URL given in its place.
func readInput(arg string) ([]byte, error) {
	if strings.HasPrefix(strings.ToLower(arg), "data:") {
		d, err := media.ParseDataURL(arg, maxDataURLBytes)
		if err != nil {
			return nil, err
		}
		return d.Data, nil
	}
	return os.ReadFile(arg)
}
