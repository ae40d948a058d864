// Package sweep measures encoders across batch sizes: for each encoder and batch size (1, 2,
// 4, … 64), the latency of one batch, per item, and items per second, against whichever
// backend runs the encoder (the host CPU kernels, or a backend plugin: the CPU table today,
// CUDA when the plugin is built).
package sweep

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"dataplane/bench/plot"
	"dataplane/dataplane/encoder"
	"dataplane/native"
)

// Encoder runs batches of a fixed input.
type Encoder interface {
	Name() string
	// Run encodes batch copies of the encoder's input and returns when the outputs are complete.
	Run(batch int) error
	Close()
}

// Options configure a sweep. DefaultOptions has the defaults.
type Options struct {
	Batches    []int         // 1, 2, 4, 8, 16, 32, 64
	Iterations int           // timed runs per batch size (the median is reported); 5
	Warmup     int           // untimed runs first; 1
	MaxTime    time.Duration // stop adding iterations to a batch size after this (at least one runs); 20s
}

// DefaultOptions are the defaults above.
func DefaultOptions() Options {
	return Options{Batches: []int{1, 2, 4, 8, 16, 32, 64}, Iterations: 5, Warmup: 1, MaxTime: 20 * time.Second}
}

// Row is one (encoder, batch size) measurement.
type Row struct {
	Encoder    string
	Batch      int
	Runs       int
	BatchMS    float64 // median latency of one batch
	ItemMS     float64 // BatchMS / Batch
	ItemsPerS  float64
	SpeedupVs1 float64 // items/s over items/s at batch 1
}

// Run sweeps every encoder over the batch sizes.
func Run(ctx context.Context, encs []Encoder, opts Options) ([]Row, error) {
	var rows []Row
	for _, e := range encs {
		base := 0.0
		for _, b := range opts.Batches {
			if b <= 0 {
				return rows, fmt.Errorf("sweep: batch size %d", b)
			}
			for range opts.Warmup {
				if err := e.Run(b); err != nil {
					return rows, fmt.Errorf("%s batch %d: %w", e.Name(), b, err)
				}
			}
			var times []float64
			start := time.Now()
			for i := 0; i < max(opts.Iterations, 1); i++ {
				if err := ctx.Err(); err != nil {
					return rows, err
				}
				t0 := time.Now()
				if err := e.Run(b); err != nil {
					return rows, fmt.Errorf("%s batch %d: %w", e.Name(), b, err)
				}
				times = append(times, float64(time.Since(t0))/1e6)
				if time.Since(start) > opts.MaxTime {
					break
				}
			}
			slices.Sort(times)
			med := times[len(times)/2]
			r := Row{Encoder: e.Name(), Batch: b, Runs: len(times), BatchMS: med, ItemMS: med / float64(b), ItemsPerS: float64(b) / med * 1e3}
			if base == 0 {
				base = r.ItemsPerS
			}
			r.SpeedupVs1 = r.ItemsPerS / base
			rows = append(rows, r)
		}
	}
	return rows, nil
}

// WriteCSV writes the rows.
func WriteCSV(w io.Writer, rows []Row) error {
	cw := csv.NewWriter(w)
	_ = cw.Write([]string{"encoder", "batch", "runs", "batch_ms", "item_ms", "items_per_s", "speedup_vs_batch1"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, r := range rows {
		_ = cw.Write([]string{r.Encoder, strconv.Itoa(r.Batch), strconv.Itoa(r.Runs), f(r.BatchMS), f(r.ItemMS), f(r.ItemsPerS), f(r.SpeedupVs1)})
	}
	cw.Flush()
	return cw.Error()
}

// Chart plots items per second against batch size, one line per encoder.
func Chart(rows []Row, backend string) plot.Chart {
	var series []plot.Series
	idx := map[string]int{}
	for _, r := range rows {
		i, ok := idx[r.Encoder]
		if !ok {
			i = len(series)
			idx[r.Encoder] = i
			series = append(series, plot.Series{Name: r.Encoder})
		}
		series[i].X = append(series[i].X, float64(r.Batch))
		series[i].Y = append(series[i].Y, r.ItemsPerS)
	}
	return plot.Chart{Title: "encoder throughput by batch size (" + backend + ")", XLabel: "batch size", YLabel: "items/s", XScale: plot.Log2, Series: series}
}

// Presets are random-weight encoders of real shapes (weights do not change the cost).
var Presets = map[string]struct {
	Config native.EncoderConfig
	Frames int // Whisper input frames
}{
	"vit-tiny":     {native.EncoderConfig{Arch: native.ArchCLIP, Hidden: 192, Intermediate: 768, Layers: 12, Heads: 3, Act: native.ActQuickGELU, LNEps: 1e-5, ImageSize: 224, PatchSize: 16, Channels: 3}, 0},
	"clip-b16":     {native.EncoderConfig{Arch: native.ArchCLIP, Hidden: 768, Intermediate: 3072, Layers: 12, Heads: 12, Act: native.ActQuickGELU, LNEps: 1e-5, ImageSize: 224, PatchSize: 16, Channels: 3}, 0},
	"clip-l14-336": {native.EncoderConfig{Arch: native.ArchCLIP, Hidden: 1024, Intermediate: 4096, Layers: 24, Heads: 16, Act: native.ActQuickGELU, LNEps: 1e-5, ImageSize: 336, PatchSize: 14, Channels: 3}, 0},
	"whisper-tiny": {native.EncoderConfig{Arch: native.ArchWhisper, Hidden: 384, Intermediate: 1536, Layers: 4, Heads: 6, Act: native.ActGELU, LNEps: 1e-5, NMels: 80, MaxPositions: 1500}, 1000},
	"whisper-base": {native.EncoderConfig{Arch: native.ArchWhisper, Hidden: 512, Intermediate: 2048, Layers: 6, Heads: 8, Act: native.ActGELU, LNEps: 1e-5, NMels: 80, MaxPositions: 1500}, 3000},
}

// Host runs an encoder.Model on the host CPU kernels (the daemon's CPU backend).
type Host struct {
	name  string
	m     *encoder.Model
	input encoder.Input
	outs  []native.Matrix
}

// NewHost wraps m, encoding random input of frames (Whisper) into bf16 outputs.
func NewHost(name string, m *encoder.Model, frames int) (*Host, error) {
	shape := m.InputShape(frames)
	n := 1
	for _, d := range shape {
		n *= d
	}
	r := rand.New(rand.NewPCG(1, 2))
	data := make([]float32, n)
	for i := range data {
		data[i] = float32(r.NormFloat64())
	}
	in := encoder.Input{Data: data, Frames: frames}
	if _, err := m.Tokens(in); err != nil {
		return nil, err
	}
	return &Host{name: name, m: m, input: in}, nil
}

// NewPreset builds a preset with random weights on the host.
func NewPreset(name string, threads int) (*Host, error) {
	p, ok := Presets[name]
	if !ok {
		return nil, fmt.Errorf("sweep: no preset %q", name)
	}
	m, err := encoder.Random(p.Config, 1, nil, threads)
	if err != nil {
		return nil, err
	}
	h, err := NewHost(name, m, p.Frames)
	if err != nil {
		m.Close()
	}
	return h, err
}

func (h *Host) Name() string { return h.name }

// Tokens is how many feature rows (tokens) one item encodes to.
func (h *Host) Tokens() int { n, _ := h.m.Tokens(h.input); return n }
func (h *Host) Close()      { h.m.Close() }

func (h *Host) Run(batch int) error {
	tokens, _ := h.m.Tokens(h.input)
	for len(h.outs) < batch {
		h.outs = append(h.outs, native.Matrix{Data: make([]byte, tokens*h.m.Width()*2), DType: native.BF16, Rows: tokens, Cols: h.m.Width()})
	}
	inputs := make([]encoder.Input, batch)
	for i := range inputs {
		inputs[i] = h.input
	}
	return h.m.Run(inputs, h.outs[:batch])
}

// Device runs an encoder on a backend's device 0 (a loaded plugin: the CPU table, or CUDA):
// inputs uploaded once, each batch one Forward on a stream, timed to the stream's Sync.
type Device struct {
	name   string
	b      *native.Backend
	enc    *native.BackendEncoder
	sel    native.OutputSelection
	stream *native.Stream
	buf    *native.DeviceBuffer
	inRows int // floats per input
	tokens int
	width  int
	frames int
	max    int
}

// NewDevice uploads weights (from encoder.LoadWeights) and room for maxBatch items.
func NewDevice(name string, b *native.Backend, cfg native.EncoderConfig, weights []native.Matrix, sel native.OutputSelection, frames, maxBatch int) (*Device, error) {
	enc, err := b.NewEncoder(0, cfg, weights)
	if err != nil {
		return nil, err
	}
	d := &Device{name: name, b: b, enc: enc, sel: sel, frames: frames, max: maxBatch}
	d.tokens, d.width = enc.Tokens(sel, frames), enc.Width(sel)
	d.inRows = cfg.Channels * cfg.ImageSize * cfg.ImageSize
	if cfg.Arch == native.ArchWhisper {
		d.inRows = cfg.NMels * frames
	}
	if d.tokens <= 0 || d.width <= 0 || d.inRows <= 0 {
		enc.Close()
		return nil, fmt.Errorf("sweep: %s: no output for this selection and %d frames", name, frames)
	}
	if d.stream, err = b.NewStream(0, 0); err != nil {
		enc.Close()
		return nil, err
	}
	in := int64(4 * d.inRows)
	out := int64(2 * d.tokens * d.width)
	if d.buf, err = b.DeviceAlloc(0, in+out*int64(maxBatch)); err != nil {
		d.Close()
		return nil, err
	}
	r := rand.New(rand.NewPCG(1, 2))
	data := make([]float32, d.inRows)
	for i := range data {
		data[i] = float32(r.NormFloat64())
	}
	if err := d.stream.Upload(d.buf, 0, native.AsBytes(data)); err != nil {
		d.Close()
		return nil, err
	}
	return d, d.stream.Sync()
}

func (d *Device) Name() string { return d.name }

func (d *Device) Run(batch int) error {
	if batch > d.max {
		return fmt.Errorf("sweep: batch %d over the %d allocated", batch, d.max)
	}
	in := int64(4 * d.inRows)
	out := int64(2 * d.tokens * d.width)
	items := make([]native.DeviceEncoderItem, batch)
	for i := range items {
		items[i] = native.DeviceEncoderItem{Input: native.DeviceMatrix{Buf: d.buf, DType: native.F32, Rows: 1, Cols: d.inRows}, Frames: d.frames,
			Out: native.DeviceMatrix{Buf: d.buf, Offset: in + out*int64(i), DType: native.BF16, Rows: d.tokens, Cols: d.width}}
	}
	if err := d.enc.Forward(d.stream, d.sel, items); err != nil {
		return err
	}
	return d.stream.Sync()
}

func (d *Device) Close() {
	if d.buf != nil {
		d.buf.Free()
	}
	if d.stream != nil {
		_ = d.stream.Close()
	}
	d.enc.Close()
}
