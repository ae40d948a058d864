package encoder

import (
	"fmt"
	"math"
	"math/rand/v2"

	"dataplane/native"
)

// Random builds a model of the given shape with seeded random weights (linear weights
// N(0, 1/fan_in), biases N(0, 0.02^2), LayerNorm scale 1 and shift 0, sinusoid positions for
// Whisper): for benchmarks, and so the daemon runs end to end with no checkpoint at all.
// sel nil means last_hidden_state.
func Random(c native.EncoderConfig, seed uint64, sel *native.OutputSelection, threads int) (*Model, error) {
	if err := checkSizes(c); err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	normal := func(n int, std float64) []byte {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * std)
		}
		return native.AsBytes(v)
	}
	fill := func(n int, x float32) []byte {
		v := make([]float32, n)
		for i := range v {
			v[i] = x
		}
		return native.AsBytes(v)
	}
	w := make([]native.Matrix, native.WeightCount(c.Layers))
	mat := func(i, rows, cols int, data []byte) {
		w[i] = native.Matrix{Data: data, DType: native.F32, Rows: rows, Cols: cols}
	}
	linear := func(i, out, in int) { mat(i, out, in, normal(out*in, 1/math.Sqrt(float64(in)))) }
	bias := func(i, n int) { mat(i, 1, n, normal(n, 0.02)) }
	norm := func(i, n int) {
		mat(i, 1, n, fill(n, 1))
		mat(i+1, 1, n, fill(n, 0))
	}
	h := c.Hidden
	switch c.Arch {
	case native.ArchCLIP, native.ArchSigLIP:
		grid := c.ImageSize / c.PatchSize
		linear(native.WeightPatch, h, c.Channels*c.PatchSize*c.PatchSize)
		tokens := grid * grid
		if c.Arch == native.ArchCLIP {
			mat(native.WeightCLS, 1, h, normal(h, 0.02))
			norm(native.WeightPreLN, h)
			tokens++
		} else {
			bias(native.WeightPatchBias, h)
		}
		mat(native.WeightPositions, tokens, h, normal(tokens*h, 0.02))
		norm(native.WeightPostLN, h)
		if c.ProjDim > 0 {
			linear(native.WeightProj, c.ProjDim, h)
		}
	case native.ArchWhisper:
		linear(native.WeightConv1, h, c.NMels*3)
		bias(native.WeightConv1Bias, h)
		linear(native.WeightConv2, h, h*3)
		bias(native.WeightConv2Bias, h)
		mat(native.WeightPositions, c.MaxPositions, h, sinusoids(c.MaxPositions, h))
		norm(native.WeightPostLN, h)
	default:
		return nil, fmt.Errorf("%w: architecture %v", ErrConfig, c.Arch)
	}
	if c.ProjectorDim > 0 {
		linear(native.WeightProjector1, c.ProjectorDim, h)
		bias(native.WeightProjector1B, c.ProjectorDim)
		linear(native.WeightProjector2, c.ProjectorDim, c.ProjectorDim)
		bias(native.WeightProjector2B, c.ProjectorDim)
	}
	for l := range c.Layers {
		at := native.WeightCount(l)
		for _, i := range []int{native.LayerQ, native.LayerK, native.LayerV, native.LayerO} {
			linear(at+i, h, h)
			if i != native.LayerK || c.Arch != native.ArchWhisper {
				bias(at+i+1, h)
			}
		}
		norm(at+native.LayerLN1, h)
		norm(at+native.LayerLN2, h)
		linear(at+native.LayerFC1, c.Intermediate, h)
		bias(at+native.LayerFC1Bias, c.Intermediate)
		linear(at+native.LayerFC2, h, c.Intermediate)
		bias(at+native.LayerFC2Bias, h)
	}
	enc, err := native.NewEncoder(c, w)
	if err != nil {
		return nil, err
	}
	m := &Model{Name: fmt.Sprintf("random-%v-%d", c.Arch, seed), Spec: Spec{Config: c}, enc: enc, thread: threads}
	s := native.OutputSelection{Kind: native.OutputLastHidden}
	if sel != nil {
		s = *sel
	}
	if err := m.SetSelect(s); err != nil {
		enc.Close()
		return nil, err
	}
	m.Spec.Select = s
	return m, nil
}

// sinusoids is Whisper's position table: sin of the first half of the channels, cos of the
// second, timescales from 1 to 10000.
func sinusoids(length, channels int) []byte {
	v := make([]float32, length*channels)
	half := channels / 2
	inc := math.Log(10000) / float64(half-1)
	for t := range length {
		for i := range half {
			a := float64(t) * math.Exp(-inc*float64(i))
			v[t*channels+i] = float32(math.Sin(a))
			v[t*channels+half+i] = float32(math.Cos(a))
		}
	}
	return native.AsBytes(v)
}
