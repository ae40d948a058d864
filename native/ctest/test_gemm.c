/* test_gemm.c: the packed and per-call GEMM against a double-precision reference, for shapes
 * around every blocking edge, every kernel variant and several thread counts; every variant
 * of the LayerNorm, activation and softmax loops against the portable one (libm); and the
 * failure rules (statuses, no crash) for bad arguments and encoder configurations; several
 * threads multiplying at once through the shared worker pool. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../dp_encoder.h"
#include "../dp_nn.h"
#include "check.h"

static float frand(void) { return (float)((double)(rng_next() >> 11) / (double)(1ull << 53) * 2.0 - 1.0); }

static int check_shape(int32_t isa, int64_t m, int64_t n, int64_t k, int32_t threads) {
	float *a = malloc((size_t)(m * k) * 4), *w = malloc((size_t)(n * k) * 4), *bias = malloc((size_t)n * 4);
	float *c = malloc((size_t)(m * n) * 4), *c2 = malloc((size_t)(m * n) * 4);
	for (int64_t i = 0; i < m * k; i++) a[i] = frand();
	for (int64_t i = 0; i < n * k; i++) w[i] = frand();
	for (int64_t i = 0; i < n; i++) bias[i] = frand();
	for (int64_t i = 0; i < m * n; i++) c[i] = c2[i] = 1.0f; /* accumulate onto ones */
	dp_matrix wm = {w, n, k, DP_F32};
	dp_packed *p = NULL;
	char msg[128];
	CHECK(dp_pack_weights(&wm, &p, msg, sizeof msg) == DP_OK, "%s", msg);
	CHECK(dp_gemm_packed(a, m, k, p, bias, c, n, 1, threads, isa, msg, sizeof msg) == DP_OK, "%s", msg);
	CHECK(dp_gemm(a, m, k, k, w, n, k, 1, c2, n, 0, threads, isa, msg, sizeof msg) == DP_OK, "%s", msg);
	for (int64_t i = 0; i < m; i++)
		for (int64_t j = 0; j < n; j++) {
			double s = 0, abs = 0;
			for (int64_t q = 0; q < k; q++) {
				s += (double)a[i * k + q] * w[j * k + q];
				abs += fabs((double)a[i * k + q] * w[j * k + q]);
			}
			double bound = (double)(k + 4) * 0x1p-24 * (abs + fabs(bias[j]) + 1) + 1e-30;
			CHECK(fabs(c[i * n + j] - (s + bias[j] + 1.0)) <= bound, "isa %d m%lld n%lld k%lld t%d: C+=AW^T+b at (%lld,%lld) = %g, want %g",
			      isa, (long long)m, (long long)n, (long long)k, threads, (long long)i, (long long)j, c[i * n + j], s + bias[j] + 1);
			CHECK(fabs(c2[i * n + j] - s) <= bound, "dp_gemm trans_b at (%lld,%lld) = %g, want %g", (long long)i, (long long)j,
			      c2[i * n + j], s);
		}
	dp_packed_free(p);
	free(a), free(w), free(bias), free(c), free(c2);
	return check_failures;
}

/* check_nn compares one variant of the dp_nn.h loops with the portable one on lengths around
 * the vector widths, values up to +-scale (large ones reach exp's clamps). */
static int check_nn(int32_t isa, int64_t n, float scale) {
	float *x = malloc((size_t)n * 4), *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
	float *w = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
	for (int64_t i = 0; i < n; i++) x[i] = frand() * scale, w[i] = frand(), b[i] = frand();
	for (int32_t act = DP_ACT_GELU; act <= DP_ACT_QUICK_GELU; act++) {
		memcpy(want, x, (size_t)n * 4), memcpy(got, x, (size_t)n * 4);
		dp_activate(want, n, act, DP_ISA_GENERIC), dp_activate(got, n, act, isa);
		for (int64_t i = 0; i < n; i++)
			CHECK(fabsf(got[i] - want[i]) <= 2e-6f * (1 + fabsf(want[i])), "isa %d act %d n %lld: f(%g) = %g, want %g", isa, act,
			      (long long)n, x[i], got[i], want[i]);
	}
	memcpy(want, x, (size_t)n * 4), memcpy(got, x, (size_t)n * 4);
	dp_softmax_rows(want, 1, n, n, 0.125f, DP_ISA_GENERIC), dp_softmax_rows(got, 1, n, n, 0.125f, isa);
	for (int64_t i = 0; i < n; i++)
		CHECK(fabsf(got[i] - want[i]) <= 1e-5f * want[i] + 1e-30f, "isa %d softmax n %lld at %lld: %g, want %g", isa, (long long)n,
		      (long long)i, got[i], want[i]);
	dp_layernorm(want, x, 1, n, w, b, 1e-5f, DP_ISA_GENERIC), dp_layernorm(got, x, 1, n, w, b, 1e-5f, isa);
	for (int64_t i = 0; i < n; i++)
		CHECK(fabsf(got[i] - want[i]) <= 1e-5f * (1 + fabsf(want[i])), "isa %d layernorm n %lld at %lld: %g, want %g", isa,
		      (long long)n, (long long)i, got[i], want[i]);
	free(x), free(want), free(got), free(w), free(b);
	return check_failures;
}

/* Concurrent callers share the fan-out's worker pool: each multiplies its own A by shared
 * weights many times on 2 to 4 threads and must get the bits a one-thread call gives (every
 * split keeps each element's order of summation). */
enum { CC_CALLERS = 4, CC_M = 100, CC_N = 96, CC_K = 200, CC_CALLS = 25 };

typedef struct cc_caller {
	const dp_packed *p;
	float a[CC_M * CC_K], want[CC_M * CC_N], got[CC_M * CC_N];
	int32_t index, bad;
} cc_caller;

static void *cc_run(void *arg) {
	cc_caller *c = arg;
	char msg[128];
	for (int32_t it = 0; it < CC_CALLS && !c->bad; it++) {
		memset(c->got, 0, sizeof c->got);
		c->bad = dp_gemm_packed(c->a, CC_M, CC_K, c->p, NULL, c->got, CC_N, 0, 2 + (c->index + it) % 3, DP_ISA_AUTO, msg, sizeof msg) != DP_OK ||
		         memcmp(c->got, c->want, sizeof c->want) != 0;
	}
	return NULL;
}

static int check_concurrent(void) {
	static float w[CC_N * CC_K];
	static cc_caller callers[CC_CALLERS];
	for (int64_t i = 0; i < CC_N * CC_K; i++) w[i] = frand();
	dp_matrix wm = {w, CC_N, CC_K, DP_F32};
	dp_packed *p = NULL;
	char msg[128];
	CHECK(dp_pack_weights(&wm, &p, msg, sizeof msg) == DP_OK, "%s", msg);
	for (int32_t t = 0; t < CC_CALLERS; t++) {
		cc_caller *c = &callers[t];
		c->p = p, c->index = t, c->bad = 0;
		for (int64_t i = 0; i < CC_M * CC_K; i++) c->a[i] = frand();
		CHECK(dp_gemm_packed(c->a, CC_M, CC_K, p, NULL, c->want, CC_N, 0, 1, DP_ISA_AUTO, msg, sizeof msg) == DP_OK, "%s", msg);
	}
	pthread_t th[CC_CALLERS];
	for (int32_t t = 0; t < CC_CALLERS; t++) CHECK(pthread_create(&th[t], NULL, cc_run, &callers[t]) == 0, "pthread_create");
	for (int32_t t = 0; t < CC_CALLERS; t++) pthread_join(th[t], NULL);
	for (int32_t t = 0; t < CC_CALLERS; t++) CHECK(!callers[t].bad, "concurrent caller %d: result differs from one thread's", t);
	dp_packed_free(p);
	return check_failures;
}

int main(void) {
	uint64_t seed = (uint64_t)time(NULL);
	printf("gemm: random seed %llu\n", (unsigned long long)seed);
	rng_state = seed;
	const int64_t shapes[][3] = {{1, 1, 1}, {6, 16, 256}, {7, 17, 257}, {121, 33, 513}, {5, 200, 30}, {250, 40, 64}, {12, 32, 256}, {25, 65, 40}, {800, 33, 70}};
	for (int32_t isa = DP_ISA_GENERIC; isa < DP_ISA_COUNT; isa++) {
		if (!dp_isa_supported(isa)) continue;
		for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
			for (int32_t t = 1; t <= 3; t++)
				if (check_shape(isa, shapes[s][0], shapes[s][1], shapes[s][2], t)) return check_failures;
		const int64_t lens[] = {1, 7, 8, 15, 16, 17, 33, 197, 768, 1500};
		for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
			if (check_nn(isa, lens[i], 4) || check_nn(isa, lens[i], 120)) return check_failures;
	}

	if (check_concurrent()) return check_failures;

	/* Bad arguments are statuses. */
	char msg[128];
	float x[16] = {0};
	dp_matrix bad = {x, 2, 3, 9};
	dp_packed *p = NULL;
	CHECK(dp_pack_weights(&bad, &p, msg, sizeof msg) == DP_ERR_INVALID && p == NULL, "bad dtype");
	CHECK(dp_gemm(x, 2, 3, 2, x, 2, 3, 1, x, 2, 0, 1, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "lda < k");
	CHECK(strstr(msg, "row strides") != NULL, "message: %s", msg);
	CHECK(dp_gemm_packed(x, 1, 1, NULL, NULL, x, 1, 0, 1, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "null weights");

	/* Encoder configurations and weight lists that do not fit are refused with the weight's name. */
	dp_encoder_config cfg = {.arch = DP_ARCH_WHISPER, .hidden = 8, .intermediate = 16, .layers = 1, .heads = 2,
	                         .act = DP_ACT_GELU, .ln_eps = 1e-5f, .n_mels = 4, .max_positions = 6};
	dp_matrix w[DP_W_GLOBAL_COUNT + DP_WL_COUNT];
	memset(w, 0, sizeof w);
	dp_encoder *e = NULL;
	CHECK(dp_encoder_create(&cfg, w, DP_W_GLOBAL_COUNT + DP_WL_COUNT, &e, msg, sizeof msg) == DP_ERR_INVALID && e == NULL, "no weights");
	CHECK(strstr(msg, "missing weight position_embedding") != NULL, "message: %s", msg);
	float big[8 * 16];
	w[DP_W_POS] = (dp_matrix){big, 6, 8, DP_F32};
	w[DP_W_CONV1_W] = (dp_matrix){big, 8, 5, DP_F32};
	CHECK(dp_encoder_create(&cfg, w, DP_W_GLOBAL_COUNT + DP_WL_COUNT, &e, msg, sizeof msg) == DP_ERR_INVALID, "wrong shape");
	CHECK(strstr(msg, "conv1.weight is [8, 5]") != NULL, "message: %s", msg);
	cfg.hidden = 7;
	CHECK(dp_encoder_create(&cfg, w, DP_W_GLOBAL_COUNT + DP_WL_COUNT, &e, msg, sizeof msg) == DP_ERR_INVALID, "hidden not divisible by heads");
	CHECK(dp_encoder_create(&cfg, w, 3, &e, NULL, 0) == DP_ERR_INVALID, "short list, no message buffer");
	printf("gemm: ok\n");
	return check_failures;
}
