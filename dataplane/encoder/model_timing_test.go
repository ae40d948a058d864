package encoder

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"dataplane/native"
)

// Encoder benchmarks: each iteration runs one batch of 1 and one batch of n, and reports the
// per-item time of both, their ratio (x-batch1: the batching goal is <= 0.6) and the share of
// time spent in the linear-layer GEMMs and in attention. Random weights, real shapes.
// "ms/item" is the per-item time at batch n: what `make bench-peers` sets beside the PyTorch
// peers (bench/peers/vit_b16.py at batch 8, whisper_base_encoder.py at batch 4). cpu-ms/item
// is the process's CPU time for the batched runs per item: on a machine shared with other
// work, where wall time swings, it still counts what the encoder itself spent.

var (
	vitB16 = native.EncoderConfig{Arch: native.ArchCLIP, Hidden: 768, Intermediate: 3072, Layers: 12, Heads: 12,
		Act: native.ActQuickGELU, LNEps: 1e-5, ImageSize: 224, PatchSize: 16, Channels: 3}
	whisperBase = native.EncoderConfig{Arch: native.ArchWhisper, Hidden: 512, Intermediate: 2048, Layers: 6, Heads: 8,
		Act: native.ActGELU, LNEps: 1e-5, NMels: 80, MaxPositions: 1500}
)

func benchEncoder(b *testing.B, c native.EncoderConfig, frames, batch int) {
	m, err := Random(c, 1, nil, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	r := rand.New(rand.NewPCG(1, 2))
	input := func() Input {
		shape := m.InputShape(frames)
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return Input{Data: v, Frames: frames}
	}
	inputs := make([]Input, batch)
	outs := make([]native.Matrix, batch)
	for i := range inputs {
		inputs[i] = input()
		tokens, err := m.Tokens(inputs[i])
		if err != nil {
			b.Fatal(err)
		}
		outs[i] = native.Matrix{Data: make([]byte, tokens*m.Width()*2), DType: native.BF16, Rows: tokens, Cols: m.Width()}
	}
	var single, batched, cpu time.Duration
	before := m.Stats()
	for b.Loop() {
		t0 := time.Now()
		if err := m.Run(inputs[:1], outs[:1]); err != nil {
			b.Fatal(err)
		}
		t1, c1 := time.Now(), cpuTime(b)
		if err := m.Run(inputs, outs); err != nil {
			b.Fatal(err)
		}
		single += t1.Sub(t0)
		batched += time.Since(t1)
		cpu += cpuTime(b) - c1
	}
	s := m.Stats()
	total := float64(s.Total - before.Total)
	perSingle := single.Seconds() * 1e3 / float64(b.N)
	perBatched := batched.Seconds() * 1e3 / float64(b.N*batch)
	b.ReportMetric(perBatched, "ms/item")
	b.ReportMetric(cpu.Seconds()*1e3/float64(b.N*batch), "cpu-ms/item")
	b.ReportMetric(perSingle, "ms/item-b1")
	b.ReportMetric(perBatched, fmt.Sprintf("ms/item-b%d", batch))
	b.ReportMetric(perBatched/perSingle, "x-batch1")
	b.ReportMetric(float64(s.GEMM-before.GEMM)/total, "gemm-share")
	b.ReportMetric(float64(s.Attention-before.Attention)/total, "attention-share")
}

// cpuTime is the user and system time this process has used.
func cpuTime(b *testing.B) time.Duration {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

func BenchmarkViTB16(b *testing.B) { benchEncoder(b, vitB16, 0, 8) }

func BenchmarkWhisperBase30s(b *testing.B) { benchEncoder(b, whisperBase, 3000, 4) }
