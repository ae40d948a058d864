package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"dataplane/dataplane/encoder"
	"dataplane/native"
	"dataplane/transfer/safetensors"
)

func init() {
	register(command{"encode", "run an encoder checkpoint offline over inputs (dataplane encode -h)", encodeCommand})
}

const encodeUsage = `Usage: dataplane encode --model DIR [--raw F --shape d0,d1,...]... --out OUT.safetensors [flags]

Runs the encoder in DIR (a Hugging Face checkpoint: config.json + *.safetensors; CLIP, SigLIP,
LLaVA vision tower + projector, or Whisper) over each input and writes one tensor per input to
OUT.safetensors, named "<kind>.<n>" in the order given (raw.0, raw.1, ...), each
[tokens, width] in --dtype.

Inputs:
  --raw F --shape d0,d1,...  an already-preprocessed little-endian float32 tensor: [channels,
                             size, size] pixels for a ViT, [n_mels, frames] log-mel for Whisper

Flags:
`

// rawInput is one --raw file and its --shape.
type rawInput struct {
	path  string
	shape []int
}

// rawList collects --raw and --shape in order: each --shape belongs to the --raw before it.
type rawList struct{ inputs []rawInput }

func (r *rawList) String() string { return "" }

func (r *rawList) Set(path string) error {
	r.inputs = append(r.inputs, rawInput{path: path})
	return nil
}

type shapeFlag struct{ raws *rawList }

func (s shapeFlag) String() string { return "" }

func (s shapeFlag) Set(v string) error {
	if len(s.raws.inputs) == 0 || s.raws.inputs[len(s.raws.inputs)-1].shape != nil {
		return errors.New("--shape must follow the --raw it describes")
	}
	var shape []int
	for _, f := range strings.Split(v, ",") {
		d, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			return fmt.Errorf("bad dimension %q in %q", f, v)
		}
		shape = append(shape, d)
	}
	s.raws.inputs[len(s.raws.inputs)-1].shape = shape
	return nil
}

// parseFeatures reads --features: default, last, pooled or hidden:N.
func parseFeatures(v string, dropCLS, project bool) (*native.OutputSelection, error) {
	sel := native.OutputSelection{DropCLS: dropCLS, Project: project}
	switch {
	case v == "default":
		if dropCLS || project {
			return nil, errors.New("--drop-cls and --project go with an explicit --features")
		}
		return nil, nil
	case v == "last":
		sel.Kind = native.OutputLastHidden
	case v == "pooled":
		sel.Kind = native.OutputPooled
	case strings.HasPrefix(v, "hidden:"):
		n, err := strconv.Atoi(strings.TrimPrefix(v, "hidden:"))
		if err != nil {
			return nil, fmt.Errorf("--features %q: want hidden:N", v)
		}
		sel.Kind, sel.Layer = native.OutputHiddenState, n
	default:
		return nil, fmt.Errorf("--features %q: want default, last, pooled or hidden:N", v)
	}
	return &sel, nil
}

func encodeCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("encode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, encodeUsage)
		fs.PrintDefaults()
	}
	var raws rawList
	model := fs.String("model", "", "checkpoint directory (config.json + *.safetensors)")
	out := fs.String("out", "", "output .safetensors file")
	fs.Var(&raws, "raw", "preprocessed float32 input file (repeat; each followed by --shape)")
	fs.Var(shapeFlag{&raws}, "shape", "comma-separated shape of the preceding --raw")
	features := fs.String("features", "default", "default (the checkpoint's: a VLM's feature layer + projector), last, pooled or hidden:N")
	dropCLS := fs.Bool("drop-cls", false, "with --features: drop the CLS token (CLIP)")
	project := fs.Bool("project", false, "with --features: apply the checkpoint's projector")
	dtypeName := fs.String("dtype", "f32", "output dtype: f32, f16 or bf16")
	batch := fs.Int("batch", 8, "inputs per forward pass")
	threadCount := fs.Int("threads", 0, "kernel threads (0: all CPUs, up to 8)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	usageErr := func(format string, a ...any) error {
		fmt.Fprintf(stderr, "encode: "+format+"\n", a...)
		return errUsage
	}
	switch {
	case fs.NArg() > 0:
		return usageErr("unexpected arguments %q", fs.Args())
	case *model == "" || *out == "":
		return usageErr("--model and --out are required")
	case len(raws.inputs) == 0:
		return usageErr("no inputs (--raw F --shape ...)")
	case *batch < 1:
		return usageErr("--batch %d: want at least 1", *batch)
	}
	for _, r := range raws.inputs {
		if r.shape == nil {
			return usageErr("--raw %s has no --shape", r.path)
		}
	}
	dtype, err := native.ParseDType(*dtypeName)
	if err != nil {
		return usageErr("--dtype: %v", err)
	}
	sel, err := parseFeatures(*features, *dropCLS, *project)
	if err != nil {
		return usageErr("%v", err)
	}

	m, err := encoder.Load(*model, encoder.Options{Select: sel, Threads: *threadCount})
	if err != nil {
		return err
	}
	defer m.Close()
	inputs := make([]encoder.Input, len(raws.inputs))
	for i, r := range raws.inputs {
		if inputs[i], err = readRaw(m, r); err != nil {
			return err
		}
	}
	tensors := make([]safetensors.Tensor, len(inputs))
	progress := newProgress(stderr, len(inputs))
	for start := 0; start < len(inputs); start += *batch {
		if err := ctx.Err(); err != nil {
			return err
		}
		end := min(start+*batch, len(inputs))
		outs := make([]native.Matrix, end-start)
		for i := start; i < end; i++ {
			n, err := m.Tokens(inputs[i])
			if err != nil {
				return fmt.Errorf("input %d (%s): %w", i, raws.inputs[i].path, err)
			}
			outs[i-start] = native.Matrix{Data: make([]byte, n*m.Width()*dtype.Size()), DType: dtype, Rows: n, Cols: m.Width()}
			tensors[i] = safetensors.Tensor{Name: fmt.Sprintf("raw.%d", i), DType: safetensors.DTypeName(dtype),
				Shape: []int{n, m.Width()}, Data: outs[i-start].Data}
		}
		if err := m.Run(inputs[start:end], outs); err != nil {
			return fmt.Errorf("inputs %d..%d: %w", start, end-1, err)
		}
		progress.add(end - start)
	}
	progress.done()
	meta := map[string]string{"format": "pt", "producer": "dataplane encode", "model": m.Name, "features": m.Select().String()}
	if err := safetensors.WriteFile(*out, tensors, meta); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %d tensors to %s\n", len(tensors), *out)
	return nil
}

// readRaw reads one --raw file and checks its shape against what the model takes.
func readRaw(m *encoder.Model, r rawInput) (encoder.Input, error) {
	frames := 0
	if len(r.shape) == 2 {
		frames = r.shape[1]
	}
	want := m.InputShape(frames)
	if !slices.Equal(want, r.shape) {
		return encoder.Input{}, fmt.Errorf("--raw %s: shape %v, the model takes %v", r.path, r.shape, want)
	}
	raw, err := os.ReadFile(r.path)
	if err != nil {
		return encoder.Input{}, err
	}
	n := 1
	for _, d := range r.shape {
		n *= d
	}
	if len(raw) != 4*n {
		return encoder.Input{}, fmt.Errorf("--raw %s: %d bytes, shape %v of float32 needs %d", r.path, len(raw), r.shape, 4*n)
	}
	data := make([]float32, n)
	copy(native.AsBytes(data), raw)
	return encoder.Input{Data: data, Frames: frames}, nil
}

// progress prints "encoded n/total" on one line when there is more than one batch's worth.
type progress struct {
	w            io.Writer
	n, total     int
	start, shown time.Time
}

func newProgress(w io.Writer, total int) *progress {
	return &progress{w: w, total: total, start: time.Now()}
}

func (p *progress) add(n int) {
	p.n += n
	if p.n == p.total && p.shown.IsZero() {
		return // a single quick run: no bar
	}
	if time.Since(p.shown) < 200*time.Millisecond && p.n < p.total {
		return
	}
	p.shown = time.Now()
	const width = 30
	bar := strings.Repeat("=", width*p.n/p.total) + strings.Repeat(" ", width-width*p.n/p.total)
	rate := float64(p.n) / time.Since(p.start).Seconds()
	fmt.Fprintf(p.w, "\rencode [%s] %d/%d  %.1f inputs/s", bar, p.n, p.total, rate)
}

func (p *progress) done() {
	if !p.shown.IsZero() {
		fmt.Fprintln(p.w)
	}
}
