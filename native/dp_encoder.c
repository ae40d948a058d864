/* dp_encoder.c: CLIP / SigLIP ViT and Whisper encoder forward passes, f32, on the CPU.
 *
 * A batch is one matrix of rows: every item's tokens, concatenated (Whisper items may differ in
 * length). Linear maps run once over all rows (q, k and v fused into one GEMM); attention runs
 * per (item, head) task, tasks spread over the threads. Layers are pre-LN:
 *   x += o(attn(ln1(x)));  x += fc2(act(fc1(ln2(x)))).
 * Numerics follow Hugging Face transformers (CLIPVisionModel, SiglipVisionModel,
 * WhisperEncoder); see native/README.md for the output selections. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dp_nn.h"

typedef struct layer {
	dp_packed *qkv, *o, *fc1, *fc2;
	float *qkv_b, *o_b, *fc1_b, *fc2_b, *ln1_w, *ln1_b, *ln2_w, *ln2_b;
} layer;

struct dp_encoder {
	dp_encoder_config cfg;
	int64_t tokens; /* ViTs: tokens per image (patches, plus CLS for CLIP) */
	dp_packed *patch, *conv1, *conv2, *proj, *mmp1, *mmp2;
	float *patch_b, *cls, *pos, *pre_ln_w, *pre_ln_b, *conv1_b, *conv2_b, *post_ln_w, *post_ln_b, *mmp1_b, *mmp2_b;
	layer *layers;
	float *arena; /* scratch for forward passes, grown as needed */
	size_t arena_floats;
	dp_encoder_stats stats;
};

static const char *global_names[DP_W_GLOBAL_COUNT] = {
	"patch_embedding.weight", "patch_embedding.bias", "class_embedding", "position_embedding", "pre_layrnorm.weight",
	"pre_layrnorm.bias", "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "post_layernorm.weight",
	"post_layernorm.bias", "visual_projection.weight", "projector.linear_1.weight", "projector.linear_1.bias",
	"projector.linear_2.weight", "projector.linear_2.bias",
};
static const char *layer_names[DP_WL_COUNT] = {
	"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias", "out_proj.weight",
	"out_proj.bias", "layer_norm1.weight", "layer_norm1.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
	"layer_norm2.weight", "layer_norm2.bias",
};

static int is_vit(const dp_encoder_config *c) { return c->arch == DP_ARCH_CLIP || c->arch == DP_ARCH_SIGLIP; }

/* ---- creation ---- */

/* A weight's expected shape: rows x cols, or absent (0 x 0); optional ones may be either. */
typedef struct shape {
	int64_t rows, cols;
	int optional;
} shape;

static void expected_shapes(const dp_encoder_config *c, shape *g, shape *l) {
	const int64_t h = c->hidden;
	memset(g, 0, sizeof(shape) * DP_W_GLOBAL_COUNT);
	memset(l, 0, sizeof(shape) * DP_WL_COUNT);
	if (is_vit(c)) {
		int64_t grid = c->image_size / c->patch_size, clip = c->arch == DP_ARCH_CLIP;
		g[DP_W_PATCH_W] = (shape){h, (int64_t)c->channels * c->patch_size * c->patch_size, 0};
		if (!clip) g[DP_W_PATCH_B] = (shape){1, h, 0};
		if (clip) g[DP_W_CLS] = (shape){1, h, 0};
		g[DP_W_POS] = (shape){grid * grid + clip, h, 0};
		if (clip) g[DP_W_PRE_LN_W] = g[DP_W_PRE_LN_B] = (shape){1, h, 0};
		g[DP_W_POST_LN_W] = g[DP_W_POST_LN_B] = (shape){1, h, 1};
		if (clip && c->proj_dim > 0) g[DP_W_PROJ] = (shape){c->proj_dim, h, 0};
	} else {
		g[DP_W_CONV1_W] = (shape){h, (int64_t)c->n_mels * 3, 0};
		g[DP_W_CONV2_W] = (shape){h, h * 3, 0};
		g[DP_W_CONV1_B] = g[DP_W_CONV2_B] = (shape){1, h, 0};
		g[DP_W_POS] = (shape){c->max_positions, h, 0};
		g[DP_W_POST_LN_W] = g[DP_W_POST_LN_B] = (shape){1, h, 0};
	}
	if (c->projector_dim > 0) {
		g[DP_W_MMP1_W] = (shape){c->projector_dim, h, 0};
		g[DP_W_MMP2_W] = (shape){c->projector_dim, c->projector_dim, 0};
		g[DP_W_MMP1_B] = g[DP_W_MMP2_B] = (shape){1, c->projector_dim, 0};
	}
	for (int i = DP_WL_Q_W; i <= DP_WL_O_W; i += 2) l[i] = (shape){h, h, 0};
	for (int i = DP_WL_Q_B; i <= DP_WL_O_B; i += 2) l[i] = (shape){1, h, 1};
	l[DP_WL_LN1_W] = l[DP_WL_LN1_B] = l[DP_WL_LN2_W] = l[DP_WL_LN2_B] = (shape){1, h, 0};
	l[DP_WL_FC1_W] = (shape){c->intermediate, h, 0};
	l[DP_WL_FC1_B] = (shape){1, c->intermediate, 0};
	l[DP_WL_FC2_W] = (shape){h, c->intermediate, 0};
	l[DP_WL_FC2_B] = (shape){1, h, 0};
}

static dp_status check_config(const dp_encoder_config *c, char *msg, size_t msg_len) {
	if (!is_vit(c) && c->arch != DP_ARCH_WHISPER) return dp_fail(msg, msg_len, DP_ERR_INVALID, "unknown architecture %d", c->arch);
	if (c->hidden <= 0 || c->intermediate <= 0 || c->layers <= 0 || c->heads <= 0 || c->hidden % c->heads != 0)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "bad sizes: hidden %d, intermediate %d, layers %d, heads %d", c->hidden,
		               c->intermediate, c->layers, c->heads);
	if (c->act < DP_ACT_GELU || c->act > DP_ACT_QUICK_GELU || c->projector_act < DP_ACT_GELU ||
	    c->projector_act > DP_ACT_QUICK_GELU)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "unknown activation");
	if (!(c->ln_eps > 0 && c->ln_eps < 1)) return dp_fail(msg, msg_len, DP_ERR_INVALID, "layer norm eps %g", c->ln_eps);
	if (c->proj_dim < 0 || c->projector_dim < 0) return dp_fail(msg, msg_len, DP_ERR_INVALID, "negative projection width");
	/* The patch convolution has stride patch_size and no padding: a remainder of the image
	 * size is cut off (SigLIP so400m: 384 px, 14 px patches, 27 x 27 grid). */
	if (is_vit(c) && (c->patch_size <= 0 || c->channels <= 0 || c->image_size < c->patch_size || c->image_size > 8192))
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "image size %d, patch size %d, channels %d", c->image_size,
		               c->patch_size, c->channels);
	if (!is_vit(c) && (c->n_mels <= 0 || c->max_positions <= 0))
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "n_mels %d, max_positions %d", c->n_mels, c->max_positions);
	return DP_OK;
}

static void weight_name(char *buf, size_t n, int64_t i) {
	if (i < DP_W_GLOBAL_COUNT)
		snprintf(buf, n, "%s", global_names[i]);
	else
		snprintf(buf, n, "layers.%lld.%s", (long long)((i - DP_W_GLOBAL_COUNT) / DP_WL_COUNT),
		         layer_names[(i - DP_W_GLOBAL_COUNT) % DP_WL_COUNT]);
}

static dp_status check_weights(const dp_encoder_config *c, const dp_matrix *w, int64_t n, char *msg, size_t msg_len) {
	if (n != DP_W_GLOBAL_COUNT + (int64_t)c->layers * DP_WL_COUNT)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "%lld weights for %d layers, want %lld", (long long)n, c->layers,
		               (long long)(DP_W_GLOBAL_COUNT + (int64_t)c->layers * DP_WL_COUNT));
	shape g[DP_W_GLOBAL_COUNT], l[DP_WL_COUNT];
	expected_shapes(c, g, l);
	for (int64_t i = 0; i < n; i++) {
		shape s = i < DP_W_GLOBAL_COUNT ? g[i] : l[(i - DP_W_GLOBAL_COUNT) % DP_WL_COUNT];
		int present = w[i].data != NULL;
		char name[96];
		weight_name(name, sizeof name, i);
		if (!present && s.rows > 0 && !s.optional) return dp_fail(msg, msg_len, DP_ERR_INVALID, "missing weight %s", name);
		if (present && s.rows == 0) return dp_fail(msg, msg_len, DP_ERR_INVALID, "weight %s not used by this architecture", name);
		if (present && (dp_matrix_bytes(&w[i]) < 0 || w[i].rows != s.rows || w[i].cols != s.cols))
			return dp_fail(msg, msg_len, DP_ERR_INVALID, "weight %s is [%lld, %lld] (dtype %d), want [%lld, %lld]", name,
			               (long long)w[i].rows, (long long)w[i].cols, w[i].dtype, (long long)s.rows, (long long)s.cols);
	}
	return DP_OK;
}

/* vec copies a [1, n] weight to f32, or returns NULL for an absent one (*ok stays 1). */
static float *vec(const dp_matrix *m, int *ok) {
	if (m->data == NULL) return NULL;
	float *v = malloc((size_t)(m->rows * m->cols) * 4 + 4);
	if (v == NULL) {
		*ok = 0;
		return NULL;
	}
	dp_converter(DP_F32, m->dtype, dp_isa_best())(v, m->data, m->rows * m->cols);
	return v;
}

static dp_packed *pack(const dp_matrix *m, int *ok) {
	if (m->data == NULL) return NULL;
	dp_packed *p = NULL;
	if (dp_pack_weights(m, &p, NULL, 0) != DP_OK) *ok = 0;
	return p;
}

/* pack_qkv packs q, k and v ([h, h] each) as one [3h, h] matrix, and their biases as one
 * vector (an absent bias is zeros). */
static dp_packed *pack_qkv(const dp_matrix *w, int64_t h, float **bias, int *ok) {
	float *all = malloc((size_t)(3 * h * h) * 4);
	float *b = calloc((size_t)(3 * h), 4);
	dp_packed *p = NULL;
	if (all == NULL || b == NULL) goto fail;
	for (int i = 0; i < 3; i++) {
		const dp_matrix *wm = &w[DP_WL_Q_W + 2 * i], *bm = &w[DP_WL_Q_B + 2 * i];
		dp_converter(DP_F32, wm->dtype, dp_isa_best())(all + i * h * h, wm->data, h * h);
		if (bm->data) dp_converter(DP_F32, bm->dtype, dp_isa_best())(b + i * h, bm->data, h);
	}
	dp_matrix m = {all, 3 * h, h, DP_F32};
	if (dp_pack_weights(&m, &p, NULL, 0) != DP_OK) goto fail;
	free(all);
	*bias = b;
	return p;
fail:
	free(all), free(b);
	*ok = 0;
	return NULL;
}

void dp_encoder_free(dp_encoder *e) {
	if (e == NULL) return;
	dp_packed *packed[] = {e->patch, e->conv1, e->conv2, e->proj, e->mmp1, e->mmp2};
	float *vecs[] = {e->patch_b, e->cls, e->pos, e->pre_ln_w, e->pre_ln_b, e->conv1_b, e->conv2_b, e->post_ln_w, e->post_ln_b,
	                 e->mmp1_b, e->mmp2_b};
	for (size_t i = 0; i < sizeof packed / sizeof packed[0]; i++) dp_packed_free(packed[i]);
	for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) free(vecs[i]);
	for (int32_t i = 0; e->layers && i < e->cfg.layers; i++) {
		layer *l = &e->layers[i];
		dp_packed_free(l->qkv), dp_packed_free(l->o), dp_packed_free(l->fc1), dp_packed_free(l->fc2);
		free(l->qkv_b), free(l->o_b), free(l->fc1_b), free(l->fc2_b);
		free(l->ln1_w), free(l->ln1_b), free(l->ln2_w), free(l->ln2_b);
	}
	free(e->layers);
	free(e->arena);
	free(e);
}

dp_status dp_encoder_create(const dp_encoder_config *cfg, const dp_matrix *w, int64_t n_weights, dp_encoder **out,
                            char *msg, size_t msg_len) {
	if (cfg == NULL || out == NULL || (n_weights > 0 && w == NULL)) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null argument");
	dp_status st = check_config(cfg, msg, msg_len);
	if (st == DP_OK) st = check_weights(cfg, w, n_weights, msg, msg_len);
	if (st != DP_OK) return st;
	dp_encoder *e = calloc(1, sizeof *e);
	if (e == NULL || (e->layers = calloc((size_t)cfg->layers, sizeof(layer))) == NULL) {
		free(e);
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "no memory for the encoder");
	}
	e->cfg = *cfg;
	if (is_vit(cfg)) {
		int64_t grid = cfg->image_size / cfg->patch_size;
		e->tokens = grid * grid + (cfg->arch == DP_ARCH_CLIP);
	}
	int ok = 1;
	e->patch = pack(&w[DP_W_PATCH_W], &ok), e->conv1 = pack(&w[DP_W_CONV1_W], &ok), e->conv2 = pack(&w[DP_W_CONV2_W], &ok);
	e->proj = pack(&w[DP_W_PROJ], &ok), e->mmp1 = pack(&w[DP_W_MMP1_W], &ok), e->mmp2 = pack(&w[DP_W_MMP2_W], &ok);
	e->patch_b = vec(&w[DP_W_PATCH_B], &ok), e->cls = vec(&w[DP_W_CLS], &ok), e->pos = vec(&w[DP_W_POS], &ok);
	e->pre_ln_w = vec(&w[DP_W_PRE_LN_W], &ok), e->pre_ln_b = vec(&w[DP_W_PRE_LN_B], &ok);
	e->conv1_b = vec(&w[DP_W_CONV1_B], &ok), e->conv2_b = vec(&w[DP_W_CONV2_B], &ok);
	e->post_ln_w = vec(&w[DP_W_POST_LN_W], &ok), e->post_ln_b = vec(&w[DP_W_POST_LN_B], &ok);
	e->mmp1_b = vec(&w[DP_W_MMP1_B], &ok), e->mmp2_b = vec(&w[DP_W_MMP2_B], &ok);
	for (int32_t i = 0; i < cfg->layers && ok; i++) {
		const dp_matrix *lw = &w[DP_W_GLOBAL_COUNT + (int64_t)i * DP_WL_COUNT];
		layer *l = &e->layers[i];
		l->qkv = pack_qkv(lw, cfg->hidden, &l->qkv_b, &ok);
		l->o = pack(&lw[DP_WL_O_W], &ok), l->fc1 = pack(&lw[DP_WL_FC1_W], &ok), l->fc2 = pack(&lw[DP_WL_FC2_W], &ok);
		l->o_b = vec(&lw[DP_WL_O_B], &ok), l->fc1_b = vec(&lw[DP_WL_FC1_B], &ok), l->fc2_b = vec(&lw[DP_WL_FC2_B], &ok);
		l->ln1_w = vec(&lw[DP_WL_LN1_W], &ok), l->ln1_b = vec(&lw[DP_WL_LN1_B], &ok);
		l->ln2_w = vec(&lw[DP_WL_LN2_W], &ok), l->ln2_b = vec(&lw[DP_WL_LN2_B], &ok);
	}
	if (!ok) {
		dp_encoder_free(e);
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "no memory for the weights");
	}
	*out = e;
	return DP_OK;
}

/* ---- shapes of the outputs ---- */

/* hidden_index resolves an HF hidden_states index (0 = embeddings, layers = last layer;
 * negative counts from the end); -1 if out of range. */
static int32_t hidden_index(const dp_encoder *e, int32_t layer) {
	int32_t n = e->cfg.layers + 1, i = layer < 0 ? n + layer : layer;
	return i >= 0 && i < n ? i : -1;
}

static int64_t base_tokens(const dp_encoder *e, int64_t frames) {
	if (is_vit(&e->cfg)) return e->tokens;
	if (frames < 1 || frames > 2 * (int64_t)e->cfg.max_positions) return -1;
	return (frames + 1) / 2; /* conv2 has stride 2 and padding 1 */
}

/* check_selection says why a selection cannot be produced, or returns DP_OK. */
static dp_status check_selection(const dp_encoder *e, const dp_encoder_output *s, char *msg, size_t msg_len) {
	const dp_encoder_config *c = &e->cfg;
	switch (s->kind) {
	case DP_OUT_LAST_HIDDEN:
		if (c->arch == DP_ARCH_SIGLIP && e->post_ln_w == NULL)
			return dp_fail(msg, msg_len, DP_ERR_INVALID, "SigLIP last_hidden_state needs post_layernorm weights");
		break;
	case DP_OUT_HIDDEN_STATE:
		if (hidden_index(e, s->layer) < 0)
			return dp_fail(msg, msg_len, DP_ERR_INVALID, "hidden state %d outside [-%d, %d]", s->layer, c->layers + 1, c->layers);
		break;
	case DP_OUT_POOLED:
		if (c->arch != DP_ARCH_CLIP || e->proj == NULL || e->post_ln_w == NULL)
			return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "pooled output needs a CLIP model with post_layernorm and visual_projection");
		if (s->drop_cls || s->project) return dp_fail(msg, msg_len, DP_ERR_INVALID, "pooled output takes no drop_cls or projector");
		break;
	default:
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "unknown output kind %d", s->kind);
	}
	if (s->drop_cls && c->arch != DP_ARCH_CLIP) return dp_fail(msg, msg_len, DP_ERR_INVALID, "drop_cls: the model has no CLS token");
	if (s->project && e->mmp1 == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "the model has no projector");
	return DP_OK;
}

int64_t dp_encoder_tokens(const dp_encoder *e, const dp_encoder_output *s, int64_t frames) {
	if (e == NULL || s == NULL || check_selection(e, s, NULL, 0) != DP_OK) return -1;
	if (s->kind == DP_OUT_POOLED) return 1;
	int64_t n = base_tokens(e, frames);
	return n < 0 ? -1 : n - (s->drop_cls != 0);
}

int64_t dp_encoder_width(const dp_encoder *e, const dp_encoder_output *s) {
	if (e == NULL || s == NULL || check_selection(e, s, NULL, 0) != DP_OK) return -1;
	if (s->kind == DP_OUT_POOLED) return e->cfg.proj_dim;
	return s->project ? e->cfg.projector_dim : e->cfg.hidden;
}

void dp_encoder_get_stats(const dp_encoder *e, dp_encoder_stats *out) { *out = e->stats; }

/* ---- the forward pass ---- */

static int64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

typedef struct fwd {
	dp_encoder *e;
	int32_t threads, isa;
	int64_t n_items, rows;      /* rows: all items' tokens */
	const dp_encoder_item *items;
	int64_t *off, *len;         /* each item's first row and token count */
	float *x, *y, *qkv, *mlp;   /* [rows, h], [rows, h], [rows, 3h], [rows, max(inter, ...)] */
	float *scores;              /* threads x max_len^2 */
	int64_t max_len;
	int failed;
	char *msg;
	size_t msg_len;
} fwd;

static dp_status gemm(fwd *f, const float *a, int64_t m, int64_t lda, const dp_packed *w, const float *bias, float *c,
                      int64_t ldc, int accumulate) {
	int64_t t0 = now_ns();
	dp_status st = dp_gemm_packed(a, m, lda, w, bias, c, ldc, accumulate, f->threads, f->isa, f->msg, f->msg_len);
	f->e->stats.gemm_ns += now_ns() - t0;
	return st;
}

/* Element-wise work split over the threads in row ranges. */
typedef struct rows_job {
	fwd *f;
	float *x;
	int64_t rows, width;
	const float *w, *b; /* layer norm */
	float *out;
	int32_t act; /* -1: layer norm */
} rows_job;

static void rows_part(void *ctx, int32_t t, int32_t n) {
	rows_job *j = ctx;
	int64_t r0 = j->rows * t / n, r1 = j->rows * (t + 1) / n;
	if (j->act < 0)
		dp_layernorm(j->out + r0 * j->width, j->x + r0 * j->width, r1 - r0, j->width, j->w, j->b, j->f->e->cfg.ln_eps, j->f->isa);
	else
		dp_activate(j->x + r0 * j->width, (r1 - r0) * j->width, j->act, j->f->isa);
}

static int32_t threads_for(const fwd *f, int64_t values) {
	int64_t most = values / 16384 + 1; /* at least 16K values a thread */
	return (int32_t)(most < f->threads ? most : f->threads);
}

static void layernorm(fwd *f, float *out, float *x, int64_t rows, const float *w, const float *b) {
	rows_job j = {f, x, rows, f->e->cfg.hidden, w, b, out, -1};
	dp_parallel_for(threads_for(f, rows * f->e->cfg.hidden), rows_part, &j);
}

static void activate(fwd *f, float *x, int64_t rows, int64_t width, int32_t act) {
	rows_job j = {f, x, rows, width, NULL, NULL, NULL, act};
	dp_parallel_for(threads_for(f, rows * width), rows_part, &j);
}

/* attention: one task per (item, head): S = q k^T / sqrt(dh), softmax, out = S v. K and V are
 * packed once per task; the queries go ATT_ROWS at a time so that a block of scores (at most
 * 96 x 1500 floats, 563 KiB for Whisper) stays in L2 between the three passes over it, where a
 * whole len x len matrix (8.6 MiB) streamed through memory five times. */
enum { ATT_ROWS = 96 };

static void attention_part(void *ctx, int32_t t, int32_t n) {
	fwd *f = ctx;
	const int64_t h = f->e->cfg.hidden, heads = f->e->cfg.heads, dh = h / heads;
	float *s = f->scores + (int64_t)t * ATT_ROWS * f->max_len;
	const float scale = (float)(1.0 / sqrt((double)dh));
	char msg[128];
	for (int64_t task = t; task < f->n_items * heads; task += n) {
		int64_t item = task / heads, head = task % heads, len = f->len[item];
		const float *q = f->qkv + f->off[item] * 3 * h + head * dh, *k = q + h, *v = q + 2 * h;
		float *out = f->y + f->off[item] * h + head * dh;
		dp_packed *kp = dp_pack_b(k, dh, len, 3 * h, 1), *vp = dp_pack_b(v, len, dh, 3 * h, 0);
		int ok = kp != NULL && vp != NULL;
		for (int64_t r0 = 0; ok && r0 < len; r0 += ATT_ROWS) {
			int64_t rows = len - r0 < ATT_ROWS ? len - r0 : ATT_ROWS;
			ok = dp_gemm_packed(q + r0 * 3 * h, rows, 3 * h, kp, NULL, s, len, 0, 1, f->isa, msg, sizeof msg) == DP_OK;
			if (!ok) break;
			dp_softmax_rows(s, rows, len, len, scale, f->isa);
			ok = dp_gemm_packed(s, rows, len, vp, NULL, out + r0 * h, h, 0, 1, f->isa, msg, sizeof msg) == DP_OK;
		}
		dp_packed_free(kp), dp_packed_free(vp);
		if (!ok) {
			__atomic_store_n(&f->failed, 1, __ATOMIC_RELAXED);
			return;
		}
	}
}

static dp_status run_layer(fwd *f, const layer *l) {
	const dp_encoder_config *c = &f->e->cfg;
	const int64_t h = c->hidden, R = f->rows;
	dp_status st;
	layernorm(f, f->y, f->x, R, l->ln1_w, l->ln1_b);
	if ((st = gemm(f, f->y, R, h, l->qkv, l->qkv_b, f->qkv, 3 * h, 0)) != DP_OK) return st;
	int64_t t0 = now_ns();
	int32_t tasks = (int32_t)(f->n_items * c->heads);
	dp_parallel_for(tasks < f->threads ? tasks : f->threads, attention_part, f);
	f->e->stats.attention_ns += now_ns() - t0;
	if (f->failed) return dp_fail(f->msg, f->msg_len, DP_ERR_NOMEM, "attention: no memory to pack a matrix");
	if ((st = gemm(f, f->y, R, h, l->o, l->o_b, f->x, h, 1)) != DP_OK) return st;
	layernorm(f, f->y, f->x, R, l->ln2_w, l->ln2_b);
	if ((st = gemm(f, f->y, R, h, l->fc1, l->fc1_b, f->mlp, c->intermediate, 0)) != DP_OK) return st;
	activate(f, f->mlp, R, c->intermediate, c->act);
	return gemm(f, f->mlp, R, c->intermediate, l->fc2, l->fc2_b, f->x, h, 1);
}

/* vit_embed writes patches (+ CLS) + positions into x, then CLIP's pre-LN. im2col goes to mlp. */
static dp_status vit_embed(fwd *f) {
	const dp_encoder *e = f->e;
	const dp_encoder_config *c = &e->cfg;
	const int64_t h = c->hidden, P = c->patch_size, S = c->image_size, grid = S / P, C = c->channels;
	const int64_t cols = C * P * P, cls = c->arch == DP_ARCH_CLIP;
	float *col = f->mlp;
	for (int64_t i = 0; i < f->n_items; i++) {
		const float *img = f->items[i].input;
		for (int64_t p = 0; p < grid * grid; p++) {
			float *dst = col + (i * grid * grid + p) * cols;
			int64_t gy = p / grid, gx = p % grid;
			for (int64_t ch = 0; ch < C; ch++)
				for (int64_t ky = 0; ky < P; ky++)
					memcpy(dst + (ch * P + ky) * P, img + (ch * S + gy * P + ky) * S + gx * P, (size_t)P * 4);
		}
	}
	for (int64_t i = 0; i < f->n_items; i++) {
		float *x = f->x + f->off[i] * h;
		if (cls) memcpy(x, e->cls, (size_t)h * 4);
		dp_status st = gemm(f, col + i * grid * grid * cols, grid * grid, cols, e->patch, e->patch_b, x + cls * h, h, 0);
		if (st != DP_OK) return st;
		for (int64_t t = 0; t < e->tokens; t++)
			for (int64_t d = 0; d < h; d++) x[t * h + d] += e->pos[t * h + d];
	}
	if (cls) layernorm(f, f->x, f->x, f->rows, e->pre_ln_w, e->pre_ln_b);
	return DP_OK;
}

/* whisper_embed: conv1 (k3, pad 1) + GELU, conv2 (k3, stride 2, pad 1) + GELU, + positions. Each
 * convolution is an im2col into mlp and a GEMM; conv1's output goes to qkv (free until the
 * first layer). */
static dp_status whisper_embed(fwd *f) {
	const dp_encoder *e = f->e;
	const dp_encoder_config *c = &e->cfg;
	const int64_t h = c->hidden, M = c->n_mels;
	for (int64_t i = 0; i < f->n_items; i++) {
		const float *mel = f->items[i].input; /* [M, T] */
		const int64_t T = f->items[i].frames, T2 = f->len[i];
		float *col = f->mlp, *h1 = f->qkv;
		for (int64_t t = 0; t < T; t++) /* col[t][m*3 + k] = mel[m][t + k - 1] */
			for (int64_t m = 0; m < M; m++)
				for (int64_t k = 0; k < 3; k++) {
					int64_t s = t + k - 1;
					col[t * M * 3 + m * 3 + k] = s >= 0 && s < T ? mel[m * T + s] : 0.0f;
				}
		dp_status st = gemm(f, col, T, M * 3, e->conv1, e->conv1_b, h1, h, 0);
		if (st != DP_OK) return st;
		activate(f, h1, T, h, DP_ACT_GELU);
		for (int64_t t = 0; t < T2; t++) /* col[t][d*3 + k] = h1[2t + k - 1][d] */
			for (int64_t d = 0; d < h; d++)
				for (int64_t k = 0; k < 3; k++) {
					int64_t s = 2 * t + k - 1;
					col[t * h * 3 + d * 3 + k] = s >= 0 && s < T ? h1[s * h + d] : 0.0f;
				}
		float *x = f->x + f->off[i] * h;
		if ((st = gemm(f, col, T2, h * 3, e->conv2, e->conv2_b, x, h, 0)) != DP_OK) return st;
		activate(f, x, T2, h, DP_ACT_GELU);
		for (int64_t t = 0; t < T2; t++)
			for (int64_t d = 0; d < h; d++) x[t * h + d] += e->pos[t * h + d];
	}
	return DP_OK;
}

static dp_status check_items(const dp_encoder *e, const dp_encoder_output *sel, const dp_encoder_item *items, int64_t n,
                             char *msg, size_t msg_len) {
	int64_t width = dp_encoder_width(e, sel);
	for (int64_t i = 0; i < n; i++) {
		const dp_encoder_item *it = &items[i];
		int64_t tokens = dp_encoder_tokens(e, sel, it->frames);
		if (it->input == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "item %lld: null input", (long long)i);
		if (tokens < 0)
			return dp_fail(msg, msg_len, DP_ERR_INVALID, "item %lld: %lld frames, want 1..%d", (long long)i,
			               (long long)it->frames, 2 * e->cfg.max_positions);
		if (dp_matrix_bytes(&it->out) < 0 || it->out.rows != tokens || it->out.cols != width || it->out.data == NULL)
			return dp_fail(msg, msg_len, DP_ERR_INVALID, "item %lld: output is [%lld, %lld], want [%lld, %lld]", (long long)i,
			               (long long)it->out.rows, (long long)it->out.cols, (long long)tokens, (long long)width);
	}
	return DP_OK;
}

/* arena_get returns n floats of scratch, growing the encoder's arena when needed. */
static float *arena_get(dp_encoder *e, size_t n) {
	if (n > e->arena_floats) {
		free(e->arena);
		e->arena = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
		e->arena_floats = e->arena ? n : 0;
	}
	return e->arena;
}

/* finish writes the selected features of every item, converted, into its output. */
static dp_status finish(fwd *f, const dp_encoder_output *sel) {
	dp_encoder *e = f->e;
	const dp_encoder_config *c = &e->cfg;
	const int64_t h = c->hidden;
	float *feat = f->x; /* [rows, h] */
	if (sel->kind == DP_OUT_LAST_HIDDEN && c->arch != DP_ARCH_CLIP) {
		layernorm(f, f->y, f->x, f->rows, e->post_ln_w, e->post_ln_b);
		feat = f->y;
	}
	if (sel->kind == DP_OUT_POOLED) {
		for (int64_t i = 0; i < f->n_items; i++) {
			float *cls = f->y + i * h, *out = f->mlp + i * c->proj_dim;
			dp_layernorm(cls, f->x + f->off[i] * h, 1, h, e->post_ln_w, e->post_ln_b, c->ln_eps, f->isa);
			dp_status st = gemm(f, cls, 1, h, e->proj, NULL, out, c->proj_dim, 0);
			if (st != DP_OK) return st;
			dp_converter(f->items[i].out.dtype, DP_F32, f->isa)(f->items[i].out.data, out, c->proj_dim);
		}
		return DP_OK;
	}
	int64_t skip = sel->drop_cls != 0;
	if (sel->project) { /* compact the selected rows into y, then linear, act, linear */
		int64_t r = 0;
		for (int64_t i = 0; i < f->n_items; i++)
			for (int64_t t = skip; t < f->len[i]; t++, r++) memmove(f->y + r * h, feat + (f->off[i] + t) * h, (size_t)h * 4);
		const int64_t p = c->projector_dim;
		float *p1 = f->mlp, *p2 = f->qkv; /* sized for the projector in dp_encoder_forward */
		dp_status st = gemm(f, f->y, r, h, e->mmp1, e->mmp1_b, p1, p, 0);
		if (st != DP_OK) return st;
		activate(f, p1, r, p, c->projector_act);
		if ((st = gemm(f, p1, r, p, e->mmp2, e->mmp2_b, p2, p, 0)) != DP_OK) return st;
		r = 0;
		for (int64_t i = 0; i < f->n_items; i++) {
			int64_t n = f->len[i] - skip;
			dp_converter(f->items[i].out.dtype, DP_F32, f->isa)(f->items[i].out.data, p2 + r * p, n * p);
			r += n;
		}
		return DP_OK;
	}
	for (int64_t i = 0; i < f->n_items; i++)
		dp_converter(f->items[i].out.dtype, DP_F32, f->isa)(f->items[i].out.data, feat + (f->off[i] + skip) * h,
		                                                     (f->len[i] - skip) * h);
	return DP_OK;
}

dp_status dp_encoder_forward(dp_encoder *e, const dp_encoder_output *sel, const dp_encoder_item *items, int64_t n_items,
                             int32_t n_threads, int32_t isa, char *msg, size_t msg_len) {
	if (e == NULL || sel == NULL || (n_items > 0 && items == NULL)) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null argument");
	int32_t v = dp_isa_resolve(isa);
	if (v < 0) return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "instruction set %d not supported here", isa);
	dp_status st = check_selection(e, sel, msg, msg_len);
	if (st == DP_OK) st = check_items(e, sel, items, n_items, msg, msg_len);
	if (st != DP_OK || n_items == 0) return st;
	int64_t t_start = now_ns();
	const dp_encoder_config *c = &e->cfg;
	const int64_t h = c->hidden;
	if (n_threads < 1) n_threads = 1;

	fwd f = {.e = e, .threads = n_threads, .isa = v, .n_items = n_items, .items = items, .msg = msg, .msg_len = msg_len};
	int64_t *lens = malloc((size_t)n_items * 2 * sizeof(int64_t));
	if (lens == NULL) return dp_fail(msg, msg_len, DP_ERR_NOMEM, "no memory");
	f.off = lens, f.len = lens + n_items;
	int64_t max_frames = 0;
	for (int64_t i = 0; i < n_items; i++) {
		f.off[i] = f.rows;
		f.len[i] = base_tokens(e, items[i].frames);
		f.rows += f.len[i];
		if (f.len[i] > f.max_len) f.max_len = f.len[i];
		if (items[i].frames > max_frames) max_frames = items[i].frames;
	}
	/* Scratch: x, y [rows, h]; qkv [rows, 3h]; mlp: the widest of the MLP, the im2col matrices
	 * and the projector; attention scores, one ATT_ROWS x max_len block per thread. */
	int64_t R = f.rows, mlp = R * c->intermediate, qkv = R * 3 * h;
	if (is_vit(c)) {
		int64_t patches = R * c->channels * c->patch_size * c->patch_size;
		if (patches > mlp) mlp = patches;
	} else {
		if (max_frames * c->n_mels * 3 > mlp) mlp = max_frames * c->n_mels * 3;
		if (R * h * 3 > mlp) mlp = R * h * 3;
		if (max_frames * h > qkv) qkv = max_frames * h;
	}
	if (R * c->projector_dim > mlp) mlp = R * c->projector_dim;
	if (R * c->projector_dim > qkv) qkv = R * c->projector_dim;
	if (n_items * c->proj_dim > mlp) mlp = n_items * c->proj_dim;
	int32_t att_threads = n_threads < n_items * c->heads ? n_threads : (int32_t)(n_items * c->heads);
	size_t total = (size_t)(2 * R * h + qkv + mlp + att_threads * ATT_ROWS * f.max_len);
	float *a = arena_get(e, total);
	if (a == NULL) {
		free(lens);
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "no memory for %zu MiB of activations", total * 4 >> 20);
	}
	f.x = a, f.y = a + R * h, f.qkv = f.y + R * h, f.mlp = f.qkv + qkv, f.scores = f.mlp + mlp;

	int32_t stop = c->layers;
	if (sel->kind == DP_OUT_HIDDEN_STATE) stop = hidden_index(e, sel->layer);
	st = is_vit(c) ? vit_embed(&f) : whisper_embed(&f);
	for (int32_t l = 0; l < stop && st == DP_OK; l++) st = run_layer(&f, &e->layers[l]);
	if (st == DP_OK) st = finish(&f, sel);
	free(lens);
	e->stats.forwards++;
	e->stats.items += n_items;
	e->stats.total_ns += now_ns() - t_start;
	return st;
}
