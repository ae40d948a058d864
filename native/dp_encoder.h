/*
 * dp_encoder.h: the C ABI for matrix multiplication and the encoder forward passes (CLIP and
 * SigLIP ViTs, the Whisper encoder), shared by the CPU kernels and the CUDA plugin. The rules
 * of dp.h hold: statuses and messages, never an abort, inputs validated before any store.
 * All compute is f32; weights of any float dtype are converted once, when packed.
 */
#ifndef DP_ENCODER_H
#define DP_ENCODER_H

#include "dp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- GEMM ---- */

/* A weight matrix W [n, k] (PyTorch Linear layout: out x in) packed for the GEMM kernels. */
typedef struct dp_packed dp_packed;

/* dp_pack_weights converts (from any float dtype) and packs w; free with dp_packed_free. */
dp_status dp_pack_weights(const dp_matrix *w, dp_packed **out, char *msg, size_t msg_len);
void dp_packed_free(dp_packed *p);
int64_t dp_packed_rows(const dp_packed *p); /* n */
int64_t dp_packed_cols(const dp_packed *p); /* k */

/*
 * dp_gemm_packed computes C[m, n] = A[m, k] . W^T (+ bias[n]) on f32 row-major data with row
 * strides lda and ldc (in elements). accumulate != 0 adds the product to C instead (a residual
 * connection). Up to n_threads threads.
 */
dp_status dp_gemm_packed(const float *a, int64_t m, int64_t lda, const dp_packed *w, const float *bias, float *c,
                         int64_t ldc, int32_t accumulate, int32_t n_threads, int32_t isa, char *msg, size_t msg_len);

/*
 * dp_gemm computes C[m, n] = A[m, k] . B (trans_b == 0, B is [k, n]) or A . B^T (trans_b != 0,
 * B is [n, k]), all f32 row-major with strides, packing B for the call. For products of two
 * activations (attention scores and mixing).
 */
dp_status dp_gemm(const float *a, int64_t m, int64_t k, int64_t lda, const float *b, int64_t n, int64_t ldb,
                  int32_t trans_b, float *c, int64_t ldc, int32_t accumulate, int32_t n_threads, int32_t isa, char *msg,
                  size_t msg_len);

/* dp_fma_peak runs a register-resident loop of independent FMAs (iters steps on each of
 * n_threads threads) and returns the floating-point operations it did: divided by the wall
 * time it is the machine's measured peak, the ceiling GEMM benchmarks report against. */
double dp_fma_peak(int64_t iters, int32_t n_threads, int32_t isa);

/* ---- encoders ---- */

typedef enum dp_encoder_arch {
	DP_ARCH_CLIP = 1,    /* CLIP ViT: CLS token, pre-LN, post-LN on the pooled token only */
	DP_ARCH_SIGLIP = 2,  /* SigLIP ViT: patch bias, no CLS, no pre-LN, post-LN on every token */
	DP_ARCH_WHISPER = 3, /* Whisper encoder: two convolutions, sinusoid positions, final LN */
} dp_encoder_arch;

typedef enum dp_activation {
	DP_ACT_GELU = 0,       /* x * Phi(x), exact (erf) */
	DP_ACT_GELU_TANH = 1,  /* gelu_pytorch_tanh */
	DP_ACT_QUICK_GELU = 2, /* x * sigmoid(1.702 x) */
} dp_activation;

typedef struct dp_encoder_config {
	int32_t arch;
	int32_t hidden;       /* model width */
	int32_t intermediate; /* MLP width */
	int32_t layers;
	int32_t heads;
	int32_t act;
	float ln_eps;
	int32_t image_size, patch_size, channels; /* ViTs */
	int32_t n_mels, max_positions;            /* Whisper */
	int32_t proj_dim;      /* CLIP visual_projection width; 0: none */
	int32_t projector_dim; /* LLaVA-style projector (linear, act, linear) output width; 0: none */
	int32_t projector_act;
} dp_encoder_config;

/* Weights come in this order: the DP_W_* entries, then DP_WL_COUNT entries per layer. A weight
 * the architecture lacks (no CLS for SigLIP, no k bias for Whisper, no projector) has data NULL
 * and rows = cols = 0. Linear weights are [out, in]; convolutions are flattened to
 * [out, in * kernel...] (PyTorch's memory order); vectors are [1, n]. */
enum {
	DP_W_PATCH_W, DP_W_PATCH_B, DP_W_CLS, DP_W_POS, DP_W_PRE_LN_W, DP_W_PRE_LN_B,
	DP_W_CONV1_W, DP_W_CONV1_B, DP_W_CONV2_W, DP_W_CONV2_B,
	DP_W_POST_LN_W, DP_W_POST_LN_B, DP_W_PROJ,
	DP_W_MMP1_W, DP_W_MMP1_B, DP_W_MMP2_W, DP_W_MMP2_B,
	DP_W_GLOBAL_COUNT
};
enum {
	DP_WL_Q_W, DP_WL_Q_B, DP_WL_K_W, DP_WL_K_B, DP_WL_V_W, DP_WL_V_B, DP_WL_O_W, DP_WL_O_B,
	DP_WL_LN1_W, DP_WL_LN1_B, DP_WL_FC1_W, DP_WL_FC1_B, DP_WL_FC2_W, DP_WL_FC2_B, DP_WL_LN2_W, DP_WL_LN2_B,
	DP_WL_COUNT
};

typedef struct dp_encoder dp_encoder;

/* dp_encoder_create checks every weight's shape against the config, converts and packs them.
 * The weights' memory is not referenced after it returns. */
dp_status dp_encoder_create(const dp_encoder_config *cfg, const dp_matrix *weights, int64_t n_weights, dp_encoder **out,
                            char *msg, size_t msg_len);
void dp_encoder_free(dp_encoder *e);

/* Which features a forward pass returns. */
typedef enum dp_output_kind {
	DP_OUT_LAST_HIDDEN = 0,  /* HF last_hidden_state: CLIP none, SigLIP post-LN, Whisper final LN */
	DP_OUT_HIDDEN_STATE = 1, /* HF hidden_states[layer] (no final LN); negative counts from the end */
	DP_OUT_POOLED = 2,       /* CLIP: post_layernorm(CLS) . visual_projection^T, one row */
} dp_output_kind;

typedef struct dp_encoder_output {
	int32_t kind;
	int32_t layer;    /* DP_OUT_HIDDEN_STATE */
	int32_t drop_cls; /* CLIP: drop row 0 (LLaVA "default" strategy) */
	int32_t project;  /* apply the LLaVA projector */
} dp_encoder_output;

/* One item of a batch. ViTs: input is f32 [channels, image_size, image_size]; Whisper: f32
 * [n_mels, frames] with 1 <= frames <= 2 * max_positions. out receives the features
 * ([tokens, width], any float dtype; see dp_encoder_tokens). */
typedef struct dp_encoder_item {
	const float *input;
	int64_t frames;
	dp_matrix out;
} dp_encoder_item;

/* dp_encoder_tokens is the number of output rows for an item (frames: Whisper only), and
 * dp_encoder_width their width; both -1 for a selection the model cannot produce. */
int64_t dp_encoder_tokens(const dp_encoder *e, const dp_encoder_output *sel, int64_t frames);
int64_t dp_encoder_width(const dp_encoder *e, const dp_encoder_output *sel);

/* dp_encoder_forward runs a batch: every item's tokens go through each layer's linear maps as
 * one GEMM (that is why batching pays); attention stays within an item. One call at a time per
 * encoder (it owns scratch memory). */
dp_status dp_encoder_forward(dp_encoder *e, const dp_encoder_output *sel, const dp_encoder_item *items, int64_t n_items,
                             int32_t n_threads, int32_t isa, char *msg, size_t msg_len);

/* Time spent by the forward passes so far, for metrics and benchmarks. */
typedef struct dp_encoder_stats {
	int64_t forwards, items;
	int64_t total_ns, gemm_ns, attention_ns;
} dp_encoder_stats;
void dp_encoder_get_stats(const dp_encoder *e, dp_encoder_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* DP_ENCODER_H */
