/* dp_resize.c: Pillow's resampling (ImagingResample, 8 bits a channel), exactly.
 *
 * The weights are computed in double exactly as Pillow computes them (same expressions, same
 * order) and rounded to 22-bit fixed point; both passes accumulate in int32 from 2^21 and clip
 * (acc >> 22) to 0..255, so every variant gives Pillow's bytes. The portable passes loop over
 * taps per output sample; the AVX2 passes do the same integer arithmetic 8 lanes at a time
 * (vertical: 8 consecutive bytes of a row; horizontal, 3 channels: 2 taps x RGB0 per vector). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp_internal.h"
#include "dp_media.h"

#if DP_X86
#include <immintrin.h>
#endif

#define PRECISION_BITS 22 /* 32 - 8 - 2, as in Pillow */

static double bilinear_filter(double x) {
	if (x < 0.0) x = -x;
	if (x < 1.0) return 1.0 - x;
	return 0.0;
}

static double bicubic_filter(double x) {
	const double a = -0.5;
	if (x < 0.0) x = -x;
	if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
	if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
	return 0.0;
}

/* Fixed-point weights of one pass, for outputs [first, first + n) of a resize in -> out. */
typedef struct coeffs {
	int32_t n;      /* outputs described */
	int32_t ksize;  /* taps per output in k (the most any output uses) */
	int32_t *lo;    /* [n] first input index */
	int32_t *taps;  /* [n] taps used */
	int32_t *k;     /* [n][ksize] weights, 0 past taps */
	double *scratch;
} coeffs;

static void coeffs_free(coeffs *c) {
	free(c->lo);
	free(c->taps);
	free(c->k);
	free(c->scratch);
	memset(c, 0, sizeof *c);
}

/* coeffs_init follows Pillow's precompute_coeffs and normalize_coeffs_8bpc. */
static dp_status coeffs_init(coeffs *c, int32_t in_size, int32_t out_size, int32_t first, int32_t n, int32_t filter,
                             char *msg, size_t msg_len) {
	double (*fn)(double) = filter == DP_FILTER_BICUBIC ? bicubic_filter : bilinear_filter;
	double support_unit = filter == DP_FILTER_BICUBIC ? 2.0 : 1.0;
	double scale = (double)((float)in_size - 0.0f) / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
	double support = support_unit * filterscale;
	int32_t ksize = (int32_t)ceil(support) * 2 + 1;
	memset(c, 0, sizeof *c);
	c->n = n;
	c->ksize = ksize;
	c->lo = malloc((size_t)n * sizeof(int32_t));
	c->taps = malloc((size_t)n * sizeof(int32_t));
	c->k = malloc((size_t)n * (size_t)ksize * sizeof(int32_t));
	c->scratch = malloc((size_t)ksize * sizeof(double));
	if (!c->lo || !c->taps || !c->k || !c->scratch) {
		coeffs_free(c);
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "resize: cannot allocate %d x %d weights", n, ksize);
	}
	double ss = 1.0 / filterscale;
	for (int32_t i = 0; i < n; i++) {
		int32_t xx = first + i;
		double center = 0.0 + (xx + 0.5) * scale, ww = 0.0;
		int32_t xmin = (int32_t)(center - support + 0.5), xmax;
		if (xmin < 0) xmin = 0;
		xmax = (int32_t)(center + support + 0.5);
		if (xmax > in_size) xmax = in_size;
		xmax -= xmin;
		double *w = c->scratch;
		for (int32_t x = 0; x < xmax; x++) {
			w[x] = fn((x + xmin - center + 0.5) * ss);
			ww += w[x];
		}
		int32_t *k = c->k + (size_t)i * ksize;
		for (int32_t x = 0; x < ksize; x++) {
			double v = x < xmax ? (ww != 0.0 ? w[x] / ww : w[x]) : 0.0;
			k[x] = v < 0 ? (int32_t)(-0.5 + v * (1 << PRECISION_BITS)) : (int32_t)(0.5 + v * (1 << PRECISION_BITS));
		}
		c->lo[i] = xmin;
		c->taps[i] = xmax;
	}
	return DP_OK;
}

static inline uint8_t clip8(int32_t v) {
	v >>= PRECISION_BITS;
	return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* ---- portable passes ---- */

/* hpass resizes rows [0, rows) of src (stride src_stride bytes) horizontally into dst. */
static void hpass_generic(const uint8_t *src, size_t src_stride, int32_t rows, int32_t ch, const coeffs *cx, uint8_t *dst,
                          size_t dst_stride) {
	for (int32_t y = 0; y < rows; y++) {
		const uint8_t *in = src + (size_t)y * src_stride;
		uint8_t *out = dst + (size_t)y * dst_stride;
		for (int32_t i = 0; i < cx->n; i++) {
			const int32_t *k = cx->k + (size_t)i * cx->ksize;
			const uint8_t *p = in + (size_t)cx->lo[i] * ch;
			for (int32_t c = 0; c < ch; c++) {
				int32_t acc = 1 << (PRECISION_BITS - 1);
				for (int32_t t = 0; t < cx->taps[i]; t++) acc += p[t * ch + c] * k[t];
				out[i * ch + c] = clip8(acc);
			}
		}
	}
}

/* vpass_columns writes bytes [x, width) of an output row from taps rows at base, weights k: the
 * portable pass, and the vector passes' last columns. */
static inline void vpass_columns(const uint8_t *base, size_t src_stride, const int32_t *k, int32_t taps, uint8_t *out,
                                 int32_t x, int32_t width) {
	for (; x < width; x++) {
		int32_t acc = 1 << (PRECISION_BITS - 1);
		for (int32_t t = 0; t < taps; t++) acc += base[(size_t)t * src_stride + x] * k[t];
		out[x] = clip8(acc);
	}
}

/* vpass writes output rows [0, cy->n): row i combines rows lo[i].. of src (width bytes each). */
static void vpass_generic(const uint8_t *src, size_t src_stride, int32_t width, const coeffs *cy, uint8_t *dst,
                          size_t dst_stride) {
	for (int32_t i = 0; i < cy->n; i++)
		vpass_columns(src + (size_t)cy->lo[i] * src_stride, src_stride, cy->k + (size_t)i * cy->ksize, cy->taps[i],
		              dst + (size_t)i * dst_stride, 0, width);
}

/* ---- AVX2 passes ---- */

#if DP_X86
#define DP_AVX2 __attribute__((target("avx2,fma")))

/* 8 int32 accumulators -> 8 clipped bytes at out. */
DP_AVX2 static inline void store8_clipped(uint8_t *out, __m256i acc) {
	__m256i v = _mm256_srai_epi32(acc, PRECISION_BITS);
	__m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	_mm_storel_epi64((__m128i *)out, _mm_packus_epi16(w, w)); /* saturation is the clip to 0..255 */
}

DP_AVX2 static void vpass_avx2(const uint8_t *src, size_t src_stride, int32_t width, const coeffs *cy, uint8_t *dst,
                               size_t dst_stride) {
	const __m256i half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
	for (int32_t i = 0; i < cy->n; i++) {
		const int32_t *k = cy->k + (size_t)i * cy->ksize;
		const uint8_t *base = src + (size_t)cy->lo[i] * src_stride;
		uint8_t *out = dst + (size_t)i * dst_stride;
		int32_t taps = cy->taps[i], x = 0;
		for (; x + 32 <= width; x += 32) {
			__m256i a0 = half, a1 = half, a2 = half, a3 = half;
			for (int32_t t = 0; t < taps; t++) {
				const uint8_t *p = base + (size_t)t * src_stride + x;
				__m256i kt = _mm256_set1_epi32(k[t]);
				a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)), kt));
				a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))), kt));
				a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 16))), kt));
				a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 24))), kt));
			}
			store8_clipped(out + x, a0);
			store8_clipped(out + x + 8, a1);
			store8_clipped(out + x + 16, a2);
			store8_clipped(out + x + 24, a3);
		}
		for (; x + 8 <= width; x += 8) {
			__m256i a = half;
			for (int32_t t = 0; t < taps; t++) {
				__m256i px = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(base + (size_t)t * src_stride + x)));
				a = _mm256_add_epi32(a, _mm256_mullo_epi32(px, _mm256_set1_epi32(k[t])));
			}
			store8_clipped(out + x, a);
		}
		vpass_columns(base, src_stride, k, taps, out, x, width);
	}
}

/* Horizontal, 3 channels: each 16-byte load at a tap holds pixels t..t+3 (12 bytes used); a
 * shuffle spreads them to RGB0 RGB0 | RGB0 RGB0, widened to two vectors of 2 taps each, multiplied
 * by weights laid out the same way ({k_t x3, 0, k_t+1 x3, 0}). The loads may read up to 4 bytes
 * past the last tap's pixel; the caller guarantees they are inside the buffer (hpass_avx2_rgb). */
DP_AVX2 static void hpass_avx2_rgb_rows(const uint8_t *src, size_t src_stride, int32_t y0, int32_t y1, const coeffs *cx,
                                        const int32_t *wx, int32_t groups, uint8_t *dst, size_t dst_stride) {
	const __m128i spread = _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
	/* The rounding half goes in once: the two 128-bit halves are summed at the end. */
	const __m256i half = _mm256_setr_epi32(1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1), 1 << (PRECISION_BITS - 1), 0, 0, 0, 0, 0);
	for (int32_t y = y0; y < y1; y++) {
		const uint8_t *in = src + (size_t)y * src_stride;
		uint8_t *out = dst + (size_t)y * dst_stride;
		for (int32_t i = 0; i < cx->n; i++) {
			const uint8_t *p = in + (size_t)cx->lo[i] * 3;
			const int32_t *w = wx + (size_t)i * groups * 16;
			int32_t n4 = (cx->taps[i] + 3) / 4;
			__m256i a0 = half, a1 = _mm256_setzero_si256();
			for (int32_t g = 0; g < n4; g++) {
				__m128i px = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + g * 12)), spread);
				__m256i lo = _mm256_cvtepu8_epi32(px), hi = _mm256_cvtepu8_epi32(_mm_srli_si128(px, 8));
				a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(lo, _mm256_loadu_si256((const __m256i *)(w + g * 16))));
				a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(hi, _mm256_loadu_si256((const __m256i *)(w + g * 16 + 8))));
			}
			__m256i a = _mm256_add_epi32(a0, a1);
			__m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1)); /* R G B 0 */
			int32_t v[4];
			_mm_storeu_si128((__m128i *)v, s);
			out[i * 3 + 0] = clip8(v[0]);
			out[i * 3 + 1] = clip8(v[1]);
			out[i * 3 + 2] = clip8(v[2]);
		}
	}
}

static void hpass_avx2_rgb(const uint8_t *src, size_t src_stride, size_t src_len, int32_t rows, const coeffs *cx,
                           int32_t *wx, int32_t groups, uint8_t *dst, size_t dst_stride) {
	/* Spread weights: group g of output i holds taps 4g..4g+3 as {k k k 0 k k k 0 | k k k 0 k k k 0}. */
	for (int32_t i = 0; i < cx->n; i++) {
		const int32_t *k = cx->k + (size_t)i * cx->ksize;
		int32_t *w = wx + (size_t)i * groups * 16;
		for (int32_t t = 0; t < groups * 4; t++) {
			int32_t kt = t < cx->taps[i] ? k[t] : 0;
			int32_t *slot = w + (t / 4) * 16 + (t % 4 >= 2 ? 8 : 0) + (t % 2) * 4;
			slot[0] = slot[1] = slot[2] = kt;
			slot[3] = 0;
		}
	}
	/* A row's last tap group reads up to `need` bytes from the row's start: rows for which that
	 * would pass the end of the buffer (src_len bytes from src) are resized from a padded copy. */
	size_t need = 0;
	for (int32_t i = 0; i < cx->n; i++) {
		size_t end = (size_t)cx->lo[i] * 3 + (size_t)((cx->taps[i] + 3) / 4) * 12 + 4;
		if (end > need) need = end;
	}
	int32_t safe = rows;
	while (safe > 0 && (size_t)(safe - 1) * src_stride + need > src_len) safe--;
	hpass_avx2_rgb_rows(src, src_stride, 0, safe, cx, wx, groups, dst, dst_stride);
	if (safe == rows) return;
	uint8_t *row = malloc(need > src_stride ? need : src_stride);
	for (int32_t y = safe; y < rows; y++) {
		const uint8_t *in = src + (size_t)y * src_stride;
		uint8_t *out = dst + (size_t)y * dst_stride;
		if (row == NULL) { /* cannot pad: the portable pass reads no slack */
			hpass_generic(in, src_stride, 1, 3, cx, out, dst_stride);
			continue;
		}
		memset(row, 0, need > src_stride ? need : src_stride);
		memcpy(row, in, src_stride);
		hpass_avx2_rgb_rows(row, src_stride, 0, 1, cx, wx, groups, out, dst_stride);
	}
	free(row);
}

/* ---- AVX-512 horizontal pass (AVX512-VBMI byte permutes), any channel count ----
 *
 * Output bytes are taken 16 at a time (o = i*ch + c for output pixel i, channel c). For each
 * group the source bytes all its taps read lie in a 128-byte window from base[g] (checked when
 * planning: a downscale wide enough to break this uses the AVX2/portable pass); for tap t one
 * two-table byte permute (vpermt2b, zero-masked to every fourth byte) places the 16 source
 * bytes straight into the low bytes of 16 int32 lanes, one vpmulld by the 16 weights, one add.
 * Same integer sums in the same order as the portable pass, so the same bytes. */
#define DP_AVX512VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")))

typedef struct hplan {
	int32_t groups, taps, nout; /* 16-byte output groups, taps a group runs, output bytes a row */
	int32_t *base;              /* [groups] first source byte of the group's window */
	uint8_t *idx;               /* [groups][taps][64] permute indices (bytes 4j hold lane j's) */
	int32_t *w;                 /* [groups][taps][16] weights, 0 past an output's taps */
	size_t need;                /* bytes from a row's start the loads read */
} hplan;

static void hplan_free(hplan *p) {
	free(p->base);
	free(p->idx);
	free(p->w);
	memset(p, 0, sizeof *p);
}

/* hplan_init returns 0 when every group's taps fit its window (and memory was had). */
static int hplan_init(hplan *p, const coeffs *cx, int32_t ch) {
	memset(p, 0, sizeof *p);
	p->nout = cx->n * ch;
	p->groups = (p->nout + 15) / 16;
	for (int32_t i = 0; i < cx->n; i++)
		if (cx->taps[i] > p->taps) p->taps = cx->taps[i];
	p->base = malloc((size_t)p->groups * sizeof(int32_t));
	p->idx = calloc((size_t)p->groups * p->taps, 64);
	p->w = calloc((size_t)p->groups * p->taps * 16, sizeof(int32_t));
	if (!p->base || !p->idx || !p->w) goto fail;
	for (int32_t g = 0; g < p->groups; g++) {
		int32_t base = cx->lo[(16 * g) / ch] * ch;
		p->base[g] = base;
		if ((size_t)base + 128 > p->need) p->need = (size_t)base + 128;
		for (int32_t j = 0; j < 16 && 16 * g + j < p->nout; j++) {
			int32_t o = 16 * g + j, i = o / ch, c = o % ch;
			const int32_t *k = cx->k + (size_t)i * cx->ksize;
			for (int32_t t = 0; t < cx->taps[i]; t++) {
				int32_t b = (cx->lo[i] + t) * ch + c - base;
				if (b < 0 || b >= 128) goto fail;
				p->idx[((size_t)g * p->taps + t) * 64 + 4 * j] = (uint8_t)b;
				p->w[((size_t)g * p->taps + t) * 16 + j] = k[t];
			}
		}
	}
	return 0;
fail:
	hplan_free(p);
	return -1;
}

DP_AVX512VBMI static void hpass_avx512_rows(const uint8_t *src, size_t src_stride, int32_t y0, int32_t y1, const hplan *p,
                                            uint8_t *dst, size_t dst_stride) {
	const __m512i half = _mm512_set1_epi32(1 << (PRECISION_BITS - 1)), zero = _mm512_setzero_si512();
	const __mmask64 lanes = 0x1111111111111111ull;
	const int32_t full = p->nout / 16, taps = p->taps;
	const __mmask16 tail = (__mmask16)((1u << (p->nout % 16)) - 1);
	for (int32_t y = y0; y < y1; y++) {
		const uint8_t *in = src + (size_t)y * src_stride;
		uint8_t *out = dst + (size_t)y * dst_stride;
		for (int32_t g = 0; g < p->groups; g++) {
			const uint8_t *q = in + p->base[g];
			__m512i lo = _mm512_loadu_si512(q), hi = _mm512_loadu_si512(q + 64), acc = half;
			const uint8_t *ix = p->idx + (size_t)g * taps * 64;
			const int32_t *w = p->w + (size_t)g * taps * 16;
			for (int32_t t = 0; t < taps; t++) {
				__m512i px = _mm512_maskz_permutex2var_epi8(lanes, lo, _mm512_loadu_si512(ix + 64 * t), hi);
				acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(px, _mm512_loadu_si512(w + 16 * t)));
			}
			__m512i v = _mm512_max_epi32(_mm512_srai_epi32(acc, PRECISION_BITS), zero);
			if (g < full)
				_mm_storeu_si128((__m128i *)(out + 16 * g), _mm512_cvtusepi32_epi8(v));
			else
				_mm512_mask_cvtusepi32_storeu_epi8(out + 16 * g, tail, v);
		}
	}
}

/* hpass_avx512 runs rows [0, rows); rows whose 128-byte loads would pass src_len are resized
 * from a zero-padded copy. -1 (nothing written) when that copy cannot be allocated. */
static int hpass_avx512(const uint8_t *src, size_t src_stride, size_t src_len, int32_t rows, const hplan *p, uint8_t *dst,
                        size_t dst_stride) {
	int32_t safe = rows;
	while (safe > 0 && (size_t)(safe - 1) * src_stride + p->need > src_len) safe--;
	uint8_t *row = NULL;
	size_t n = p->need > src_stride ? p->need : src_stride;
	if (safe < rows && (row = calloc(n, 1)) == NULL) return -1;
	hpass_avx512_rows(src, src_stride, 0, safe, p, dst, dst_stride);
	for (int32_t y = safe; y < rows; y++) {
		memcpy(row, src + (size_t)y * src_stride, src_stride);
		hpass_avx512_rows(row, src_stride, 0, 1, p, dst + (size_t)y * dst_stride, dst_stride);
	}
	free(row);
	return 0;
}

/* ---- AVX-512 vertical pass ----
 *
 * vpass_avx2 with 16 int32 lanes: 64 output bytes a step, each tap's 16 source bytes widened,
 * multiplied by the tap's weight and added, in the portable pass's order; the clip is a max with
 * 0 and an unsigned saturating narrow. */
#define DP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

DP_AVX512 static inline __m512i vpass_tap16(__m512i acc, const uint8_t *p, __m512i kt) {
	return _mm512_add_epi32(acc, _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)), kt));
}

DP_AVX512 static inline void store16_clipped(uint8_t *out, __m512i acc) {
	__m512i v = _mm512_max_epi32(_mm512_srai_epi32(acc, PRECISION_BITS), _mm512_setzero_si512());
	_mm_storeu_si128((__m128i *)out, _mm512_cvtusepi32_epi8(v));
}

DP_AVX512 static void vpass_avx512(const uint8_t *src, size_t src_stride, int32_t width, const coeffs *cy, uint8_t *dst,
                                   size_t dst_stride) {
	const __m512i half = _mm512_set1_epi32(1 << (PRECISION_BITS - 1));
	for (int32_t i = 0; i < cy->n; i++) {
		const int32_t *k = cy->k + (size_t)i * cy->ksize;
		const uint8_t *base = src + (size_t)cy->lo[i] * src_stride;
		uint8_t *out = dst + (size_t)i * dst_stride;
		int32_t taps = cy->taps[i], x = 0;
		for (; x + 64 <= width; x += 64) {
			__m512i a0 = half, a1 = half, a2 = half, a3 = half;
			for (int32_t t = 0; t < taps; t++) {
				const uint8_t *p = base + (size_t)t * src_stride + x;
				__m512i kt = _mm512_set1_epi32(k[t]);
				a0 = vpass_tap16(a0, p, kt);
				a1 = vpass_tap16(a1, p + 16, kt);
				a2 = vpass_tap16(a2, p + 32, kt);
				a3 = vpass_tap16(a3, p + 48, kt);
			}
			store16_clipped(out + x, a0);
			store16_clipped(out + x + 16, a1);
			store16_clipped(out + x + 32, a2);
			store16_clipped(out + x + 48, a3);
		}
		for (; x + 16 <= width; x += 16) {
			__m512i a = half;
			for (int32_t t = 0; t < taps; t++) a = vpass_tap16(a, base + (size_t)t * src_stride + x, _mm512_set1_epi32(k[t]));
			store16_clipped(out + x, a);
		}
		vpass_columns(base, src_stride, k, taps, out, x, width);
	}
}

#endif

/* ---- the resize ---- */

static dp_status validate(const dp_resize_job *j, char *msg, size_t msg_len) {
	if (j == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "resize: null job");
	if (j->dst == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "resize: null dst");
	if (j->channels < 1 || j->channels > 4) return dp_fail(msg, msg_len, DP_ERR_INVALID, "resize: %d channels (1..4)", j->channels);
	if (j->src_w < 1 || j->src_h < 1 || j->src_w > DP_IMAGE_MAX_SIDE || j->src_h > DP_IMAGE_MAX_SIDE)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "resize: bad source size %dx%d", j->src_w, j->src_h);
	if (j->out_w < 1 || j->out_h < 1 || j->out_w > DP_IMAGE_MAX_SIDE || j->out_h > DP_IMAGE_MAX_SIDE)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "resize: bad output size %dx%d", j->out_w, j->out_h);
	if (j->crop_w < 1 || j->crop_h < 1 || j->crop_x < 0 || j->crop_y < 0 || j->crop_x > j->out_w - j->crop_w ||
	    j->crop_y > j->out_h - j->crop_h)
		return dp_fail(msg, msg_len, DP_ERR_BOUNDS, "resize: crop %dx%d at (%d, %d) outside the %dx%d output", j->crop_w,
		               j->crop_h, j->crop_x, j->crop_y, j->out_w, j->out_h);
	if (j->filter != DP_FILTER_BILINEAR && j->filter != DP_FILTER_BICUBIC)
		return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "resize: unknown filter %d", j->filter);
	return DP_OK;
}

/* The source window [x0, x1) x [y0, y1) a validated job reads: the taps of the cropped outputs
 * (or the crop itself on an axis that is not resized). */
static dp_status source_window(const dp_resize_job *j, int32_t win[4], char *msg, size_t msg_len) {
	win[0] = j->crop_x, win[1] = j->crop_y, win[2] = j->crop_x + j->crop_w, win[3] = j->crop_y + j->crop_h;
	for (int axis = 0; axis < 2; axis++) {
		int32_t in = axis ? j->src_h : j->src_w, out = axis ? j->out_h : j->out_w;
		int32_t first = axis ? j->crop_y : j->crop_x, n = axis ? j->crop_h : j->crop_w;
		if (in == out) continue;
		coeffs c;
		dp_status st = coeffs_init(&c, in, out, first, n, j->filter, msg, msg_len);
		if (st != DP_OK) return st;
		win[axis] = c.lo[0];
		win[axis + 2] = c.lo[0] + c.taps[0];
		for (int32_t i = 1; i < n; i++)
			if (c.lo[i] + c.taps[i] > win[axis + 2]) win[axis + 2] = c.lo[i] + c.taps[i];
		coeffs_free(&c);
	}
	return DP_OK;
}

dp_status dp_resize_window(const dp_resize_job *j, int32_t win[4], char *msg, size_t msg_len) {
	dp_status st = validate(j, msg, msg_len);
	return st != DP_OK ? st : source_window(j, win, msg, msg_len);
}

dp_status dp_resize(const dp_resize_job *j, int32_t isa, char *msg, size_t msg_len) {
	dp_status st = validate(j, msg, msg_len);
	if (st != DP_OK) return st;
	if (j->src == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "resize: null src");
	return dp_resize_region(j, j->src, 0, 0, j->src_w, j->src_h, isa, msg, msg_len);
}

/* dp_resize_region is dp_resize reading the source from reg, which holds only the window
 * [rx, rx + rw) x [ry, ry + rh) of the src_w x src_h image (packed, rw * channels bytes a row);
 * the window must contain source_window's. j->src is not read. */
dp_status dp_resize_region(const dp_resize_job *j, const uint8_t *reg, int32_t rx, int32_t ry, int32_t rw, int32_t rh,
                           int32_t isa, char *msg, size_t msg_len) {
	dp_status st = validate(j, msg, msg_len);
	if (st != DP_OK) return st;
	if (reg == NULL || rx < 0 || ry < 0 || rw < 1 || rh < 1 || rx > j->src_w - rw || ry > j->src_h - rh)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "resize: bad source region %dx%d at (%d, %d)", rw, rh, rx, ry);
	int32_t v = dp_isa_resolve(isa);
	if (v < 0) return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "resize: kernel variant %d not supported here", isa);
	const int32_t ch = j->channels;
	const size_t src_stride = (size_t)rw * ch, out_stride = (size_t)j->crop_w * ch;
	int need_h = j->out_w != j->src_w, need_v = j->out_h != j->src_h;

	coeffs cx = {0}, cy = {0};
	uint8_t *tmp = NULL;
	int32_t *wx = NULL;
	if (need_h && (st = coeffs_init(&cx, j->src_w, j->out_w, j->crop_x, j->crop_w, j->filter, msg, msg_len)) != DP_OK) goto out;
	if (need_v && (st = coeffs_init(&cy, j->src_h, j->out_h, j->crop_y, j->crop_h, j->filter, msg, msg_len)) != DP_OK) goto out;
	/* Indices relative to the region, which must hold every tap. */
	int32_t win[4] = {j->crop_x, j->crop_y, j->crop_x + j->crop_w, j->crop_y + j->crop_h};
	if (need_h) {
		win[0] = cx.lo[0], win[2] = 0;
		for (int32_t i = 0; i < cx.n; i++) {
			if (cx.lo[i] + cx.taps[i] > win[2]) win[2] = cx.lo[i] + cx.taps[i];
			cx.lo[i] -= rx;
		}
	}
	if (need_v) win[1] = cy.lo[0], win[3] = cy.lo[cy.n - 1] + cy.taps[cy.n - 1];
	if (win[0] < rx || win[1] < ry || win[2] > rx + rw || win[3] > ry + rh) {
		st = dp_fail(msg, msg_len, DP_ERR_INVALID, "resize: source region %dx%d at (%d, %d) misses the window [%d, %d) x [%d, %d)",
		             rw, rh, rx, ry, win[0], win[2], win[1], win[3]);
		goto out;
	}

	/* The source rows the vertical pass reads (or, without one, the rows cropped). */
	int32_t y_first = win[1], y_last = win[3];
	if (need_v)
		for (int32_t i = 0; i < cy.n; i++) cy.lo[i] -= y_first;
	const uint8_t *vsrc = reg + (size_t)(y_first - ry) * src_stride + (size_t)(j->crop_x - rx) * ch;
	size_t vstride = src_stride;
	if (need_h) {
		int32_t rows = y_last - y_first;
		uint8_t *hdst = j->dst;
		if (need_v) {
			tmp = malloc((size_t)rows * out_stride);
			if (tmp == NULL) {
				st = dp_fail(msg, msg_len, DP_ERR_NOMEM, "resize: cannot allocate the %dx%d intermediate", j->crop_w, rows);
				goto out;
			}
			hdst = tmp;
		}
		const uint8_t *hsrc = reg + (size_t)(y_first - ry) * src_stride;
#if DP_X86
		int32_t groups = (cx.ksize + 3) / 4;
		hplan hp;
		int done = 0;
		if (v >= DP_ISA_AVX512 && dp_avx512vbmi_usable() && hplan_init(&hp, &cx, ch) == 0) {
			done = hpass_avx512(hsrc, src_stride, (size_t)(ry + rh - y_first) * src_stride, rows, &hp, hdst, out_stride) == 0;
			hplan_free(&hp);
		}
		if (done) {
		} else if (v >= DP_ISA_AVX2 && ch == 3 && (wx = malloc((size_t)cx.n * groups * 16 * sizeof(int32_t))) != NULL)
			hpass_avx2_rgb(hsrc, src_stride, (size_t)(ry + rh - y_first) * src_stride, rows, &cx, wx, groups, hdst, out_stride);
		else
#endif
			hpass_generic(hsrc, src_stride, rows, ch, &cx, hdst, out_stride);
		vsrc = tmp;
		vstride = out_stride;
	}
	if (need_v) {
#if DP_X86
		if (v >= DP_ISA_AVX512)
			vpass_avx512(vsrc, vstride, (int32_t)out_stride, &cy, j->dst, out_stride);
		else if (v >= DP_ISA_AVX2)
			vpass_avx2(vsrc, vstride, (int32_t)out_stride, &cy, j->dst, out_stride);
		else
#endif
			vpass_generic(vsrc, vstride, (int32_t)out_stride, &cy, j->dst, out_stride);
	} else if (!need_h) {
		for (int32_t y = 0; y < j->crop_h; y++) memcpy(j->dst + (size_t)y * out_stride, vsrc + (size_t)y * vstride, out_stride);
	}
out:
	coeffs_free(&cx);
	coeffs_free(&cy);
	free(tmp);
	free(wx);
	return st;
}
