//go:build ignore

// featgen writes encoder outputs for BenchmarkCompress: our CPU encoder (dataplane/encoder,
// seeded random weights at real shapes) run on the real inputs of ../shared/fixtures (a photo
// preprocessed by openai/CLIP, a 7.3 s recording's log-mel by openai/whisper), each output in
// f16 and bf16, into one safetensors file:
//
//	go run ./transfer/wire/testdata/featgen.go -fixtures ../shared/fixtures -out /tmp/features.safetensors
//	WIRE_FEATURES=/tmp/features.safetensors go test -run '^$' -bench Compress ./transfer/wire
//
// It is a tool (build tag ignore), not part of package wire: it imports the encoder, which
// sits above transfer/ in DESIGN.md's table.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"path/filepath"

	"dataplane/dataplane/encoder"
	"dataplane/native"
	"dataplane/transfer/safetensors"
)

func main() {
	fixtures := flag.String("fixtures", "../shared/fixtures", "the reference fixtures folder")
	out := flag.String("out", "/tmp/features.safetensors", "output file")
	flag.Parse()

	image := readF32(filepath.Join(*fixtures, "image_200x150_clip224.f32"), 3*224*224)
	mel := readF32(filepath.Join(*fixtures, "logmel80_7s3.f32"), 80*3000)

	vitB16 := native.EncoderConfig{Arch: native.ArchCLIP, Hidden: 768, Intermediate: 3072, Layers: 12, Heads: 12,
		Act: native.ActQuickGELU, LNEps: 1e-5, ImageSize: 224, PatchSize: 16, Channels: 3}
	llava := vitB16
	llava.ProjectorDim, llava.ProjectorAct = 4096, native.ActGELU
	whisperBase := native.EncoderConfig{Arch: native.ArchWhisper, Hidden: 512, Intermediate: 2048, Layers: 6, Heads: 8,
		Act: native.ActGELU, LNEps: 1e-5, NMels: 80, MaxPositions: 1500}

	var tensors []safetensors.Tensor
	run := func(name string, c native.EncoderConfig, sel *native.OutputSelection, in encoder.Input) {
		m, err := encoder.Random(c, 1, sel, 0)
		if err != nil {
			log.Fatal(err)
		}
		defer m.Close()
		tokens, err := m.Tokens(in)
		if err != nil {
			log.Fatal(err)
		}
		for _, dt := range []native.DType{native.F16, native.BF16} {
			o := native.Matrix{Data: make([]byte, tokens*m.Width()*dt.Size()), DType: dt, Rows: tokens, Cols: m.Width()}
			if err := m.Run([]encoder.Input{in}, []native.Matrix{o}); err != nil {
				log.Fatal(err)
			}
			tensors = append(tensors, safetensors.Tensor{Name: name + "." + dt.String(), DType: safetensors.DTypeName(dt), Shape: []int{tokens, m.Width()}, Data: o.Data})
			fmt.Printf("%s.%v [%d, %d]\n", name, dt, tokens, m.Width())
		}
	}
	run("vit_b16_last_hidden", vitB16, nil, encoder.Input{Data: image})
	run("llava_vit_b16_projected", llava, &native.OutputSelection{Kind: native.OutputHiddenState, Layer: -2, DropCLS: true, Project: true}, encoder.Input{Data: image})
	run("whisper_base_last_hidden", whisperBase, nil, encoder.Input{Data: mel, Frames: 3000})
	if err := safetensors.WriteFile(*out, tensors, map[string]string{"producer": "transfer/wire/testdata/featgen.go"}); err != nil {
		log.Fatal(err)
	}
}

func readF32(path string, n int) []float32 {
	b, err := os.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	if len(b) != 4*n {
		log.Fatalf("%s: %d bytes, want %d", path, len(b), 4*n)
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}
