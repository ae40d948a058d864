package native

/*
#cgo LDFLAGS: -lm
#include "dp_encoder.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// EncoderArch is the architecture of an encoder.
type EncoderArch int32

const (
	ArchCLIP    EncoderArch = C.DP_ARCH_CLIP
	ArchSigLIP  EncoderArch = C.DP_ARCH_SIGLIP
	ArchWhisper EncoderArch = C.DP_ARCH_WHISPER
)

func (a EncoderArch) String() string {
	switch a {
	case ArchCLIP:
		return "clip"
	case ArchSigLIP:
		return "siglip"
	case ArchWhisper:
		return "whisper"
	}
	return fmt.Sprintf("arch(%d)", int32(a))
}

// Activation is an MLP nonlinearity.
type Activation int32

const (
	ActGELU      Activation = C.DP_ACT_GELU       // exact (erf): HF "gelu"
	ActGELUTanh  Activation = C.DP_ACT_GELU_TANH  // HF "gelu_pytorch_tanh"
	ActQuickGELU Activation = C.DP_ACT_QUICK_GELU // x * sigmoid(1.702 x)
)

// EncoderConfig is the shape of an encoder (see dp_encoder.h).
type EncoderConfig struct {
	Arch                           EncoderArch
	Hidden, Intermediate           int
	Layers, Heads                  int
	Act                            Activation
	LNEps                          float32
	ImageSize, PatchSize, Channels int // ViTs
	NMels, MaxPositions            int // Whisper
	ProjDim                        int // CLIP visual_projection width (0: none)
	ProjectorDim                   int // LLaVA-style projector output width (0: none)
	ProjectorAct                   Activation
}

// Weight slots, in the order NewEncoder takes them: the global ones, then LayerWeights per
// layer (slot WeightCount(l) + LayerXxx for layer l).
const (
	WeightPatch       = C.DP_W_PATCH_W
	WeightPatchBias   = C.DP_W_PATCH_B
	WeightCLS         = C.DP_W_CLS
	WeightPositions   = C.DP_W_POS
	WeightPreLN       = C.DP_W_PRE_LN_W
	WeightPreLNBias   = C.DP_W_PRE_LN_B
	WeightConv1       = C.DP_W_CONV1_W
	WeightConv1Bias   = C.DP_W_CONV1_B
	WeightConv2       = C.DP_W_CONV2_W
	WeightConv2Bias   = C.DP_W_CONV2_B
	WeightPostLN      = C.DP_W_POST_LN_W
	WeightPostLNBias  = C.DP_W_POST_LN_B
	WeightProj        = C.DP_W_PROJ
	WeightProjector1  = C.DP_W_MMP1_W
	WeightProjector1B = C.DP_W_MMP1_B
	WeightProjector2  = C.DP_W_MMP2_W
	WeightProjector2B = C.DP_W_MMP2_B
	GlobalWeights     = C.DP_W_GLOBAL_COUNT

	LayerQ       = C.DP_WL_Q_W
	LayerQBias   = C.DP_WL_Q_B
	LayerK       = C.DP_WL_K_W
	LayerKBias   = C.DP_WL_K_B
	LayerV       = C.DP_WL_V_W
	LayerVBias   = C.DP_WL_V_B
	LayerO       = C.DP_WL_O_W
	LayerOBias   = C.DP_WL_O_B
	LayerLN1     = C.DP_WL_LN1_W
	LayerLN1Bias = C.DP_WL_LN1_B
	LayerFC1     = C.DP_WL_FC1_W
	LayerFC1Bias = C.DP_WL_FC1_B
	LayerFC2     = C.DP_WL_FC2_W
	LayerFC2Bias = C.DP_WL_FC2_B
	LayerLN2     = C.DP_WL_LN2_W
	LayerLN2Bias = C.DP_WL_LN2_B
	LayerWeights = C.DP_WL_COUNT
)

// WeightCount is the number of weight slots for an encoder with n layers; the slots of layer
// l start at WeightCount(l).
func WeightCount(layers int) int { return GlobalWeights + layers*LayerWeights }

// OutputKind selects which features a forward pass returns.
type OutputKind int32

const (
	OutputLastHidden  OutputKind = C.DP_OUT_LAST_HIDDEN  // HF last_hidden_state
	OutputHiddenState OutputKind = C.DP_OUT_HIDDEN_STATE // HF hidden_states[Layer]
	OutputPooled      OutputKind = C.DP_OUT_POOLED       // CLIP image_embeds
)

// OutputSelection is what a forward pass returns per item.
type OutputSelection struct {
	Kind    OutputKind
	Layer   int  // OutputHiddenState: 0 = embeddings, negative counts from the end (-2: penultimate)
	DropCLS bool // CLIP: drop the class token (LLaVA's "default" strategy)
	Project bool // apply the model's projector
}

// String names the selection as HF does: last_hidden_state, hidden_states[N], image_embeds.
func (s OutputSelection) String() string {
	var out string
	switch s.Kind {
	case OutputLastHidden:
		out = "last_hidden_state"
	case OutputHiddenState:
		out = fmt.Sprintf("hidden_states[%d]", s.Layer)
	case OutputPooled:
		out = "image_embeds"
	default:
		out = fmt.Sprintf("output(%d)", int32(s.Kind))
	}
	if s.DropCLS {
		out += " without CLS"
	}
	if s.Project {
		out += " through the projector"
	}
	return out
}

func (s OutputSelection) c() C.dp_encoder_output {
	return C.dp_encoder_output{kind: C.int32_t(s.Kind), layer: C.int32_t(s.Layer), drop_cls: cbool(s.DropCLS), project: cbool(s.Project)}
}

// Encoder is a loaded encoder: converted, packed weights and scratch memory in C. Forward
// passes are serialised (the encoder owns its scratch); Close frees everything.
type Encoder struct {
	mu  sync.Mutex
	e   *C.dp_encoder
	cfg EncoderConfig
}

// NewEncoder checks the weights (WeightCount(cfg.Layers) slots; an absent one has nil Data and
// zero shape) against cfg, then converts and packs them; weights' memory is not used after it
// returns.
func NewEncoder(cfg EncoderConfig, weights []Matrix) (*Encoder, error) {
	const op = "NewEncoder"
	cw, cc, pin, err := encoderArgs(op, cfg, weights)
	defer pin.Unpin()
	if err != nil {
		return nil, err
	}
	var msg msgBuf
	var e *C.dp_encoder
	if err := errorOf(op, C.dp_encoder_create(&cc, cw, C.int64_t(len(weights)), &e, msg.ptr(), msg.len()), &msg); err != nil {
		return nil, err
	}
	return &Encoder{e: e, cfg: cfg}, nil
}

// encoderArgs checks the weights and builds the C config and weight list (pinned until the
// caller unpins, after the C call).
func encoderArgs(op string, cfg EncoderConfig, weights []Matrix) (*C.dp_matrix, C.dp_encoder_config, *runtime.Pinner, error) {
	pin := new(runtime.Pinner)
	if len(weights) != WeightCount(cfg.Layers) {
		return nil, C.dp_encoder_config{}, pin, invalid(op, "%d weights, %d layers need %d", len(weights), cfg.Layers, WeightCount(cfg.Layers))
	}
	cw := make([]C.dp_matrix, len(weights)+1) // +1: never empty
	for i, w := range weights {
		if w.Data == nil {
			continue
		}
		if err := w.check(op, fmt.Sprintf("weight %d", i)); err != nil {
			return nil, C.dp_encoder_config{}, pin, err
		}
		cw[i] = w.c(pin)
	}
	cc := C.dp_encoder_config{
		arch: C.int32_t(cfg.Arch), hidden: C.int32_t(cfg.Hidden), intermediate: C.int32_t(cfg.Intermediate),
		layers: C.int32_t(cfg.Layers), heads: C.int32_t(cfg.Heads), act: C.int32_t(cfg.Act), ln_eps: C.float(cfg.LNEps),
		image_size: C.int32_t(cfg.ImageSize), patch_size: C.int32_t(cfg.PatchSize), channels: C.int32_t(cfg.Channels),
		n_mels: C.int32_t(cfg.NMels), max_positions: C.int32_t(cfg.MaxPositions), proj_dim: C.int32_t(cfg.ProjDim),
		projector_dim: C.int32_t(cfg.ProjectorDim), projector_act: C.int32_t(cfg.ProjectorAct),
	}
	return &cw[0], cc, pin, nil
}

// Config is the configuration the encoder was built with.
func (e *Encoder) Config() EncoderConfig { return e.cfg }

// Tokens is the number of feature rows an item gives (frames: Whisper input frames; ignored
// for ViTs), and Width their width; an error for a selection the model cannot produce.
func (e *Encoder) Tokens(sel OutputSelection, frames int) (int, error) {
	cs := sel.c()
	n := int(C.dp_encoder_tokens(e.e, &cs, C.int64_t(frames)))
	if n < 0 {
		return 0, e.selectionError(sel, frames)
	}
	return n, nil
}

func (e *Encoder) Width(sel OutputSelection) (int, error) {
	cs := sel.c()
	n := int(C.dp_encoder_width(e.e, &cs))
	if n < 0 {
		return 0, e.selectionError(sel, 1)
	}
	return n, nil
}

// selectionError asks the C side why a selection or frame count is refused.
func (e *Encoder) selectionError(sel OutputSelection, frames int) error {
	if e.cfg.Arch == ArchWhisper && (frames < 1 || frames > 2*e.cfg.MaxPositions) {
		return invalid("Encoder", "%d input frames, want 1..%d", frames, 2*e.cfg.MaxPositions)
	}
	// A forward with no items validates the selection and says what is wrong.
	cs := sel.c()
	var msg msgBuf
	if err := errorOf("Encoder", C.dp_encoder_forward(e.e, &cs, nil, 0, 1, ISAAuto.c(), msg.ptr(), msg.len()), &msg); err != nil {
		return err
	}
	return invalid("Encoder", "selection %+v not available", sel)
}

// EncoderItem is one input of a batch: ViTs take f32 [channels, size, size] pixels, Whisper
// f32 [n_mels, Frames] log-mel. Out receives [Tokens, Width] features in any float dtype.
type EncoderItem struct {
	Input  []float32
	Frames int // Whisper only
	Out    Matrix
}

// Forward runs one batch; every item's output is written or the call fails as a whole.
func (e *Encoder) Forward(sel OutputSelection, items []EncoderItem, threadCount int, isa ISA) error {
	const op = "Forward"
	var pin runtime.Pinner
	defer pin.Unpin()
	ci := make([]C.dp_encoder_item, len(items))
	for i, it := range items {
		want := e.cfg.Channels * e.cfg.ImageSize * e.cfg.ImageSize
		if e.cfg.Arch == ArchWhisper {
			want = e.cfg.NMels * it.Frames
		}
		if len(it.Input) != want || want == 0 {
			return invalid(op, "item %d: input has %d values, want %d", i, len(it.Input), want)
		}
		if err := it.Out.check(op, fmt.Sprintf("item %d output", i)); err != nil {
			return err
		}
		in := unsafe.Pointer(unsafe.SliceData(it.Input))
		pin.Pin(in)
		ci[i] = C.dp_encoder_item{input: (*C.float)(in), frames: C.int64_t(it.Frames), out: it.Out.c(&pin)}
	}
	var ip *C.dp_encoder_item
	if len(ci) > 0 {
		ip = unsafe.SliceData(ci)
	}
	cs := sel.c()
	e.mu.Lock()
	defer e.mu.Unlock()
	var msg msgBuf
	st := C.dp_encoder_forward(e.e, &cs, ip, C.int64_t(len(ci)), C.int32_t(threads(threadCount)), isa.c(), msg.ptr(), msg.len())
	return errorOf(op, st, &msg)
}

// EncoderStats is where forward passes spent their time.
type EncoderStats struct {
	Forwards, Items        int64
	Total, GEMM, Attention time.Duration
}

func (e *Encoder) Stats() EncoderStats {
	var s C.dp_encoder_stats
	e.mu.Lock()
	C.dp_encoder_get_stats(e.e, &s)
	e.mu.Unlock()
	return EncoderStats{Forwards: int64(s.forwards), Items: int64(s.items), Total: time.Duration(s.total_ns),
		GEMM: time.Duration(s.gemm_ns), Attention: time.Duration(s.attention_ns)}
}

// Close frees the encoder's C memory.
func (e *Encoder) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	C.dp_encoder_free(e.e)
	e.e = nil
}
