/* dp_nn.c: LayerNorm, the GELU family and softmax. The portable variants use libm (erff, tanhf,
 * expf); the AVX2 and AVX-512 ones a vector exp (Cody-Waite range reduction and a degree-6
 * polynomial, ~1 ulp) and, for erf, the Abramowitz-Stegun 7.1.26 form (absolute error <=
 * 1.5e-7, which in x * (1 + erf) is below f32 rounding of the result). The AVX-512 code is the
 * AVX2 code on 16 lanes, with masked loads and stores for the tails instead of scalar loops. */
#include <math.h>

#include "dp_nn.h"

#if DP_X86
#include <immintrin.h>
#endif

static void layernorm_generic(float *y, const float *x, int64_t rows, int64_t d, const float *w, const float *b, float eps) {
	for (int64_t r = 0; r < rows; r++, x += d, y += d) {
		double sum = 0, sq = 0;
		for (int64_t i = 0; i < d; i++) sum += x[i];
		double mean = sum / (double)d;
		for (int64_t i = 0; i < d; i++) {
			double c = x[i] - mean;
			sq += c * c;
		}
		float inv = (float)(1.0 / sqrt(sq / (double)d + (double)eps)), m = (float)mean;
		for (int64_t i = 0; i < d; i++) y[i] = (x[i] - m) * inv * w[i] + b[i];
	}
}

/* ---- portable ---- */

static void act_generic(float *x, int64_t n, int32_t act) {
	switch (act) {
	case DP_ACT_GELU:
		for (int64_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
		break;
	case DP_ACT_GELU_TANH:
		for (int64_t i = 0; i < n; i++) {
			float v = x[i];
			x[i] = 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
		}
		break;
	case DP_ACT_QUICK_GELU:
		for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-1.702f * x[i]));
		break;
	}
}

static void softmax_generic(float *row, int64_t n, float scale) {
	float mx = -INFINITY;
	for (int64_t i = 0; i < n; i++) mx = fmaxf(mx, row[i] * scale);
	double sum = 0;
	for (int64_t i = 0; i < n; i++) {
		row[i] = expf(row[i] * scale - mx);
		sum += row[i];
	}
	float inv = (float)(1.0 / sum);
	for (int64_t i = 0; i < n; i++) row[i] *= inv;
}

/* ---- AVX2 ---- */

#if DP_X86
#define DP_AVX2 __attribute__((target("avx2,fma")))

DP_AVX2 static inline __m256 exp8(__m256 x) {
	x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
	__m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
	                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	/* r = x - n ln2, with ln2 split so n * ln2_hi is exact */
	__m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
	r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
	__m256 p = _mm256_set1_ps(1.9875691500e-4f);
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
	p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* erf(x) for x >= 0 (A&S 7.1.26); the caller restores the sign. */
DP_AVX2 static inline __m256 erf8_pos(__m256 x) {
	__m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), x, _mm256_set1_ps(1.0f)));
	__m256 p = _mm256_set1_ps(1.061405429f);
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
	p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
	p = _mm256_mul_ps(p, t);
	__m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(x, x)));
	return _mm256_fnmadd_ps(p, e, _mm256_set1_ps(1.0f));
}

DP_AVX2 static void act_avx2(float *x, int64_t n, int32_t act) {
	const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
	const __m256 sign = _mm256_set1_ps(-0.0f);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i), y;
		switch (act) {
		case DP_ACT_GELU: {
			__m256 u = _mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f));
			__m256 s = _mm256_and_ps(u, sign);
			__m256 erf = _mm256_or_ps(erf8_pos(_mm256_andnot_ps(sign, u)), s);
			y = _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, erf));
			break;
		}
		case DP_ACT_GELU_TANH: {
			__m256 u = _mm256_mul_ps(_mm256_set1_ps(0.79788456080286536f),
			                         _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), v), _mm256_mul_ps(v, v), v));
			/* 1 + tanh(u) = 2 / (1 + exp(-2u)) */
			__m256 d = _mm256_add_ps(one, exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u)));
			y = _mm256_div_ps(v, d);
			break;
		}
		default: /* DP_ACT_QUICK_GELU */
			y = _mm256_div_ps(v, _mm256_add_ps(one, exp8(_mm256_mul_ps(_mm256_set1_ps(-1.702f), v))));
			break;
		}
		_mm256_storeu_ps(x + i, y);
	}
	act_generic(x + i, n - i, act);
}

DP_AVX2 static void softmax_avx2(float *row, int64_t n, float scale) {
	__m256 vmax = _mm256_set1_ps(-INFINITY), vs = _mm256_set1_ps(scale);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_mul_ps(_mm256_loadu_ps(row + i), vs));
	float m[8], mx = -INFINITY;
	_mm256_storeu_ps(m, vmax);
	for (int k = 0; k < 8; k++) mx = fmaxf(mx, m[k]);
	for (int64_t k = i; k < n; k++) mx = fmaxf(mx, row[k] * scale);
	__m256 vm = _mm256_set1_ps(mx), vsum = _mm256_setzero_ps();
	for (i = 0; i + 8 <= n; i += 8) {
		__m256 e = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(row + i), vs, vm));
		_mm256_storeu_ps(row + i, e);
		vsum = _mm256_add_ps(vsum, e);
	}
	float s8[8];
	_mm256_storeu_ps(s8, vsum);
	double sum = 0;
	for (int k = 0; k < 8; k++) sum += s8[k];
	for (int64_t k = i; k < n; k++) {
		row[k] = expf(row[k] * scale - mx);
		sum += row[k];
	}
	__m256 inv = _mm256_set1_ps((float)(1.0 / sum));
	for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(row + i, _mm256_mul_ps(_mm256_loadu_ps(row + i), inv));
	for (; i < n; i++) row[i] *= (float)(1.0 / sum);
}

/* ---- AVX-512 ---- */

#define DP_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))

static inline __mmask16 tail16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

DP_AVX512 static inline __m512 exp16(__m512 x) {
	x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
	__m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
	                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
	r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
	__m512 p = _mm512_set1_ps(1.9875691500e-4f);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
	p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
	__m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
	return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

DP_AVX512 static inline __m512 erf16_pos(__m512 x) {
	__m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), x, _mm512_set1_ps(1.0f)));
	__m512 p = _mm512_set1_ps(1.061405429f);
	p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
	p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
	p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
	p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
	p = _mm512_mul_ps(p, t);
	__m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(x, x)));
	return _mm512_fnmadd_ps(p, e, _mm512_set1_ps(1.0f));
}

DP_AVX512 static void act_avx512(float *x, int64_t n, int32_t act) {
	const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = tail16(n - i);
		__m512 v = _mm512_maskz_loadu_ps(m, x + i), y;
		switch (act) {
		case DP_ACT_GELU: {
			__m512 u = _mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f));
			__m512 erf = erf16_pos(_mm512_abs_ps(u));
			erf = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(erf),
			                                          _mm512_and_si512(_mm512_castps_si512(u), _mm512_set1_epi32(INT32_MIN))));
			y = _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, erf));
			break;
		}
		case DP_ACT_GELU_TANH: {
			__m512 u = _mm512_mul_ps(_mm512_set1_ps(0.79788456080286536f),
			                         _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), v), _mm512_mul_ps(v, v), v));
			y = _mm512_div_ps(v, _mm512_add_ps(one, exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u))));
			break;
		}
		default: /* DP_ACT_QUICK_GELU */
			y = _mm512_div_ps(v, _mm512_add_ps(one, exp16(_mm512_mul_ps(_mm512_set1_ps(-1.702f), v))));
			break;
		}
		_mm512_mask_storeu_ps(x + i, m, y);
	}
}

DP_AVX512 static void softmax_avx512(float *row, int64_t n, float scale) {
	__m512 vmax = _mm512_set1_ps(-INFINITY), vs = _mm512_set1_ps(scale);
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = tail16(n - i);
		vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + i), vs));
	}
	__m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
	__m512d s0 = _mm512_setzero_pd(), s1 = s0; /* the sum in f64, as the other variants keep it */
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = tail16(n - i);
		__m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, row + i), vs, vm)));
		_mm512_mask_storeu_ps(row + i, m, e);
		s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
		s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
	}
	__m512 inv = _mm512_set1_ps((float)(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(s0, s1))));
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = tail16(n - i);
		_mm512_mask_storeu_ps(row + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + i), inv));
	}
}

/* The statistics in f64 as in the portable code (8 lanes of double per half of a zmm of x). */
DP_AVX512 static void layernorm_avx512(float *y, const float *x, int64_t rows, int64_t d, const float *w, const float *b,
                                       float eps) {
	for (int64_t r = 0; r < rows; r++, x += d, y += d) {
		__m512d s0 = _mm512_setzero_pd(), s1 = s0;
		for (int64_t i = 0; i < d; i += 16) {
			__m512 v = _mm512_maskz_loadu_ps(tail16(d - i), x + i);
			s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
			s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
		}
		double mean = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1)) / (double)d;
		__m512d md = _mm512_set1_pd(mean);
		s0 = _mm512_setzero_pd(), s1 = s0;
		for (int64_t i = 0; i < d; i += 16) {
			__mmask16 m = tail16(d - i);
			__m512 v = _mm512_maskz_loadu_ps(m, x + i);
			__m512d c0 = _mm512_maskz_sub_pd((__mmask8)m, _mm512_cvtps_pd(_mm512_castps512_ps256(v)), md);
			__m512d c1 = _mm512_maskz_sub_pd((__mmask8)(m >> 8),
			                                 _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))), md);
			s0 = _mm512_fmadd_pd(c0, c0, s0), s1 = _mm512_fmadd_pd(c1, c1, s1);
		}
		double sq = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
		__m512 inv = _mm512_set1_ps((float)(1.0 / sqrt(sq / (double)d + (double)eps))), mf = _mm512_set1_ps((float)mean);
		for (int64_t i = 0; i < d; i += 16) {
			__mmask16 m = tail16(d - i);
			__m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mf), inv);
			v = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, b + i));
			_mm512_mask_storeu_ps(y + i, m, v);
		}
	}
}
#endif

void dp_layernorm(float *y, const float *x, int64_t rows, int64_t d, const float *w, const float *b, float eps, int32_t isa) {
#if DP_X86
	if (isa >= DP_ISA_AVX512) {
		layernorm_avx512(y, x, rows, d, w, b, eps);
		return;
	}
#endif
	(void)isa;
	layernorm_generic(y, x, rows, d, w, b, eps);
}

void dp_activate(float *x, int64_t n, int32_t act, int32_t isa) {
#if DP_X86
	if (isa >= DP_ISA_AVX512) {
		act_avx512(x, n, act);
		return;
	}
	if (isa >= DP_ISA_AVX2) {
		act_avx2(x, n, act);
		return;
	}
#endif
	(void)isa;
	act_generic(x, n, act);
}

void dp_softmax_rows(float *x, int64_t rows, int64_t n, int64_t ld, float scale, int32_t isa) {
	for (int64_t r = 0; r < rows; r++) {
#if DP_X86
		if (isa >= DP_ISA_AVX512) {
			softmax_avx512(x + r * ld, n, scale);
			continue;
		}
		if (isa >= DP_ISA_AVX2) {
			softmax_avx2(x + r * ld, n, scale);
			continue;
		}
#endif
		(void)isa;
		softmax_generic(x + r * ld, n, scale);
	}
}
