/* dp_resample.c: band-limited resampling of mono float audio with a polyphase Kaiser-windowed
 * sinc (the design of ffmpeg's libswresample default: 32 taps at unity ratio, widened by the
 * decimation factor; cutoff 0.97 of the lower Nyquist; Kaiser beta 9).
 *
 * Output sample k sits at input time t = k * in / out = i0 + p / L (L = out / gcd, exact
 * integer arithmetic). Its taps are x[i0 - T/2 + 1 + j], j < T, with weights h(p / L + T/2 - 1 - j),
 * h(d) = fc sinc(fc d) kaiser(d / (T/2)); each phase's weights are normalised to sum 1 (DC gain
 * exactly 1). The portable and AVX2 variants share the source: the dot product keeps 8 partial
 * sums, which the AVX2 build turns into one FMA vector. */
#include <math.h>
#include <stdlib.h>

#include "dp_internal.h"
#include "dp_media.h"

#define MAX_EXACT_PHASES 1024
#define BASE_TAPS 32
#define CUTOFF 0.97
#define KAISER_BETA 9.0
#define MAX_DECIMATION 128 /* in / out at most this: at most 4096 taps */

static int64_t gcd64(int64_t a, int64_t b) {
	while (b != 0) {
		int64_t t = a % b;
		a = b, b = t;
	}
	return a;
}

int64_t dp_resample_len(int64_t n, int32_t rate_in, int32_t rate_out) {
	if (rate_in < 1 || rate_out < 1 || rate_in > DP_RESAMPLE_MAX_RATE || rate_out > DP_RESAMPLE_MAX_RATE || n < 0) return -1;
	if (n > INT64_MAX / rate_out) return -1;
	return (n * rate_out + rate_in - 1) / rate_in;
}

/* bessel_i0 is the modified Bessel function of the first kind, order 0, by its power series. */
static double bessel_i0(double x) {
	double sum = 1.0, term = 1.0, q = x * x / 4.0;
	for (int k = 1; k < 500 && term > 1e-21 * sum; k++) {
		term *= q / ((double)k * k);
		sum += term;
	}
	return sum;
}

typedef struct resampler {
	int64_t step_num, step_den; /* input advance per output: num / den */
	int32_t phases, taps;       /* table: (phases + 1) x taps */
	int exact;                  /* phases == den: no interpolation */
	float *table;
} resampler;

static dp_status build(resampler *r, int32_t in, int32_t out, char *msg, size_t msg_len) {
	int64_t g = gcd64(in, out);
	r->step_num = in / g;
	r->step_den = out / g;
	double f = out < in ? (double)out / in : 1.0, fc = CUTOFF * f;
	int32_t half = ((int32_t)ceil(BASE_TAPS / 2 / f) + 3) / 4 * 4; /* taps a multiple of 8 */
	r->taps = 2 * half;
	r->exact = r->step_den <= MAX_EXACT_PHASES;
	r->phases = r->exact ? (int32_t)r->step_den : MAX_EXACT_PHASES;
	r->table = malloc((size_t)(r->phases + 1) * (size_t)r->taps * sizeof(float));
	double *w = malloc((size_t)r->taps * sizeof(double));
	if (r->table == NULL || w == NULL) {
		free(r->table);
		free(w);
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "resample: cannot allocate %d x %d filter taps", r->phases + 1, r->taps);
	}
	const double i0_beta = bessel_i0(KAISER_BETA);
	for (int32_t p = 0; p <= r->phases; p++) {
		double sum = 0.0;
		for (int32_t j = 0; j < r->taps; j++) {
			double d = (double)p / r->phases + half - 1 - j, u = d / half;
			double x = M_PI * fc * d, sinc = fabs(x) < 1e-12 ? 1.0 : sin(x) / x;
			double win = fabs(u) >= 1.0 ? 0.0 : bessel_i0(KAISER_BETA * sqrt(1.0 - u * u)) / i0_beta;
			w[j] = fc * sinc * win;
			sum += w[j];
		}
		for (int32_t j = 0; j < r->taps; j++) r->table[(size_t)p * r->taps + j] = (float)(w[j] / sum);
	}
	free(w);
	return DP_OK;
}

/* The shared source of both variants (see the top of the file). */
#define RESAMPLE_BODY                                                                                    \
	{                                                                                                    \
		float coef[4096];                                                                                \
		const int32_t T = r->taps, half = T / 2;                                                         \
		for (int64_t k = 0; k < n_dst; k++) {                                                            \
			int64_t pos = k * r->step_num, i0 = pos / r->step_den, rem = pos % r->step_den;              \
			const float *c;                                                                              \
			if (r->exact) {                                                                              \
				c = r->table + (size_t)rem * T;                                                          \
			} else {                                                                                     \
				double ph = (double)rem * r->phases / r->step_den;                                       \
				int32_t pi = (int32_t)ph;                                                                \
				float a = (float)(ph - pi);                                                              \
				const float *c0 = r->table + (size_t)pi * T, *c1 = c0 + T;                               \
				for (int32_t t = 0; t < T; t++) coef[t] = c0[t] + a * (c1[t] - c0[t]);                   \
				c = coef;                                                                                \
			}                                                                                            \
			int64_t first = i0 - half + 1;                                                               \
			float acc[8] = {0};                                                                          \
			if (first >= 0 && first + T <= n_src) {                                                      \
				const float *x = src + first;                                                            \
				for (int32_t t = 0; t < T; t += 8)                                                       \
					for (int l = 0; l < 8; l++) acc[l] += c[t + l] * x[t + l];                           \
			} else {                                                                                     \
				for (int32_t t = 0; t < T; t++) {                                                        \
					int64_t i = first + t;                                                               \
					if (i >= 0 && i < n_src) acc[t % 8] += c[t] * src[i];                                \
				}                                                                                        \
			}                                                                                            \
			dst[k] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));  \
		}                                                                                                \
	}

static void run_generic(const resampler *r, const float *src, int64_t n_src, float *dst, int64_t n_dst) RESAMPLE_BODY

#if DP_X86
__attribute__((target("avx2,fma"))) static void run_avx2(const resampler *r, const float *src, int64_t n_src, float *dst,
                                                         int64_t n_dst) RESAMPLE_BODY
#endif

dp_status dp_resample(const float *src, int64_t n_src, int32_t rate_in, int32_t rate_out, float *dst, int64_t dst_len,
                      int32_t isa, char *msg, size_t msg_len) {
	int64_t n_dst = dp_resample_len(n_src, rate_in, rate_out);
	if (n_dst < 0)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "resample: %lld samples from %d Hz to %d Hz (rates 1..%d)",
		               (long long)n_src, rate_in, rate_out, DP_RESAMPLE_MAX_RATE);
	if (rate_in / rate_out >= MAX_DECIMATION)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "resample: %d Hz to %d Hz decimates by more than %d", rate_in, rate_out,
		               MAX_DECIMATION);
	if ((src == NULL && n_src > 0) || (dst == NULL && n_dst > 0))
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "resample: null src or dst");
	if (dst_len < n_dst)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "resample: destination holds %lld samples, %lld needed",
		               (long long)dst_len, (long long)n_dst);
	int32_t v = dp_isa_resolve(isa);
	if (v < 0) return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "resample: kernel variant %d not supported here", isa);
	resampler r;
	dp_status st = build(&r, rate_in, rate_out, msg, msg_len);
	if (st != DP_OK) return st;
#if DP_X86
	if (v >= DP_ISA_AVX2)
		run_avx2(&r, src, n_src, dst, n_dst);
	else
#endif
		run_generic(&r, src, n_src, dst, n_dst);
	free(r.table);
	return DP_OK;
}
