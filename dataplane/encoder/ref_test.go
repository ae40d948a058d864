package encoder

// A straightforward float64 reference of the ViT forward pass, written from the Hugging Face
// modelling code's definitions (CLIPVisionTransformer, SiglipVisionTransformer, the LLaVA
// projector), one loop per formula. It reads weights by their HF names. It is checked against
// the CLIP fixture (computed by openai/CLIP), then used where no fixture exists (SigLIP,
// projectors).

import (
	"math"
	"strconv"

	"dataplane/native"
)

type refWeights map[string][]float64

type refViT struct {
	cfg    native.EncoderConfig
	w      refWeights
	prefix string
}

type mat [][]float64

func newMat(rows, cols int) mat {
	m := make(mat, rows)
	for i := range m {
		m[i] = make([]float64, cols)
	}
	return m
}

// linear is x W^T + b for W [out, in] stored row-major.
func (r refViT) linear(x mat, name string, out int, bias bool) mat {
	w := r.w[name+".weight"]
	in := len(x[0])
	y := newMat(len(x), out)
	for i := range x {
		for o := range out {
			s := 0.0
			if bias {
				s = r.w[name+".bias"][o]
			}
			for k := range in {
				s += x[i][k] * w[o*in+k]
			}
			y[i][o] = s
		}
	}
	return y
}

func (r refViT) layerNorm(x mat, name string) mat {
	w, b := r.w[name+".weight"], r.w[name+".bias"]
	y := newMat(len(x), len(x[0]))
	for i, row := range x {
		mean, v := 0.0, 0.0
		for _, a := range row {
			mean += a
		}
		mean /= float64(len(row))
		for _, a := range row {
			v += (a - mean) * (a - mean)
		}
		v /= float64(len(row))
		for j, a := range row {
			y[i][j] = (a-mean)/math.Sqrt(v+float64(r.cfg.LNEps))*w[j] + b[j]
		}
	}
	return y
}

func act(a native.Activation, x float64) float64 {
	switch a {
	case native.ActGELU:
		return 0.5 * x * (1 + math.Erf(x/math.Sqrt2))
	case native.ActGELUTanh:
		return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
	default:
		return x / (1 + math.Exp(-1.702*x))
	}
}

func (r refViT) attention(x mat, p string) mat {
	h, heads := r.cfg.Hidden, r.cfg.Heads
	dh := h / heads
	q, k, v := r.linear(x, p+"q_proj", h, true), r.linear(x, p+"k_proj", h, true), r.linear(x, p+"v_proj", h, true)
	out := newMat(len(x), h)
	for hd := range heads {
		for i := range x {
			scores := make([]float64, len(x))
			mx := math.Inf(-1)
			for j := range x {
				s := 0.0
				for d := range dh {
					s += q[i][hd*dh+d] * k[j][hd*dh+d]
				}
				scores[j] = s / math.Sqrt(float64(dh))
				mx = math.Max(mx, scores[j])
			}
			sum := 0.0
			for j := range scores {
				scores[j] = math.Exp(scores[j] - mx)
				sum += scores[j]
			}
			for j := range x {
				for d := range dh {
					out[i][hd*dh+d] += scores[j] / sum * v[j][hd*dh+d]
				}
			}
		}
	}
	return r.linear(out, p+"out_proj", h, true)
}

func add(a, b mat) mat {
	for i := range a {
		for j := range a[i] {
			a[i][j] += b[i][j]
		}
	}
	return a
}

// hiddenStates returns HF's hidden_states (embeddings, then each layer's output) and
// last_hidden_state for pixels [C, S, S].
func (r refViT) hiddenStates(pixels []float32) ([]mat, mat) {
	c := r.cfg
	P, S, g := c.PatchSize, c.ImageSize, c.ImageSize/c.PatchSize
	clip := c.Arch == native.ArchCLIP
	pw := r.w[r.prefix+"embeddings.patch_embedding.weight"]
	var x mat
	if clip {
		x = append(x, append([]float64(nil), r.w[r.prefix+"embeddings.class_embedding"]...))
	}
	for gy := range g {
		for gx := range g {
			row := make([]float64, c.Hidden)
			for o := range c.Hidden {
				if !clip {
					row[o] = r.w[r.prefix+"embeddings.patch_embedding.bias"][o]
				}
				for ch := range c.Channels {
					for ky := range P {
						for kx := range P {
							row[o] += float64(pixels[(ch*S+gy*P+ky)*S+gx*P+kx]) * pw[((o*c.Channels+ch)*P+ky)*P+kx]
						}
					}
				}
			}
			x = append(x, row)
		}
	}
	pos := r.w[r.prefix+"embeddings.position_embedding.weight"]
	for i := range x {
		for j := range x[i] {
			x[i][j] += pos[i*c.Hidden+j]
		}
	}
	if clip {
		x = r.layerNorm(x, r.prefix+"pre_layrnorm")
	}
	states := []mat{clone(x)}
	for l := range c.Layers {
		p := r.prefix + "encoder.layers." + strconv.Itoa(l) + "."
		x = add(x, r.attention(r.layerNorm(x, p+"layer_norm1"), p+"self_attn."))
		m := r.linear(r.layerNorm(x, p+"layer_norm2"), p+"mlp.fc1", c.Intermediate, true)
		for i := range m {
			for j := range m[i] {
				m[i][j] = act(c.Act, m[i][j])
			}
		}
		x = add(x, r.linear(m, p+"mlp.fc2", c.Hidden, true))
		states = append(states, clone(x))
	}
	last := x
	if !clip {
		last = r.layerNorm(x, r.prefix+"post_layernorm")
	}
	return states, last
}

// project is the LLaVA projector: linear_1, activation, linear_2.
func (r refViT) project(x mat, root string) mat {
	p := r.cfg.ProjectorDim
	y := r.linear(x, root+"linear_1", p, true)
	for i := range y {
		for j := range y[i] {
			y[i][j] = act(r.cfg.ProjectorAct, y[i][j])
		}
	}
	return r.linear(y, root+"linear_2", p, true)
}

func clone(x mat) mat {
	y := newMat(len(x), len(x[0]))
	for i := range x {
		copy(y[i], x[i])
	}
	return y
}

func flatten(x mat) []float32 {
	var out []float32
	for _, row := range x {
		for _, v := range row {
			out = append(out, float32(v))
		}
	}
	return out
}
