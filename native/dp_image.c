/* dp_image.c: EXIF orientation and the normalisation of 8-bit RGB to CHW tensors. */
#include <string.h>

#include "dp_internal.h"
#include "dp_media.h"

#if DP_X86
#include <immintrin.h>
#endif

static dp_status check_image(const uint8_t *p, int32_t w, int32_t h, int32_t channels, const char *op, char *msg,
                             size_t msg_len) {
	if (p == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "%s: null image", op);
	if (w < 1 || h < 1 || w > DP_IMAGE_MAX_SIDE || h > DP_IMAGE_MAX_SIDE)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "%s: bad size %dx%d", op, w, h);
	if (channels < 1 || channels > 4) return dp_fail(msg, msg_len, DP_ERR_INVALID, "%s: %d channels (1..4)", op, channels);
	return DP_OK;
}

dp_status dp_image_orient(const uint8_t *src, int32_t w, int32_t h, int32_t ch, int32_t orientation, uint8_t *dst,
                          char *msg, size_t msg_len) {
	dp_status st = check_image(src, w, h, ch, "orient", msg, msg_len);
	if (st != DP_OK) return st;
	if (dst == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "orient: null destination");
	if (orientation < 1 || orientation > 8)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "orient: EXIF orientation %d (1..8)", orientation);
	/* Output pixel (x, y) comes from source (sx0 + ax*x + bx*y, sy0 + ay*x + by*y): {ax, bx, ay, by}. */
	static const int8_t m[9][4] = {
		{0}, {1, 0, 0, 1}, {-1, 0, 0, 1}, {-1, 0, 0, -1}, {1, 0, 0, -1},
		{0, 1, 1, 0}, {0, 1, -1, 0}, {0, -1, -1, 0}, {0, -1, 1, 0},
	};
	const int8_t ax = m[orientation][0], bx = m[orientation][1], ay = m[orientation][2], by = m[orientation][3];
	const int32_t ow = orientation >= 5 ? h : w, oh = orientation >= 5 ? w : h;
	/* The source corner output (0, 0) maps to: the far edge of any axis walked backwards. */
	const int64_t sx0 = (ax < 0 || bx < 0) ? w - 1 : 0, sy0 = (ay < 0 || by < 0) ? h - 1 : 0;
	const int64_t step = ((int64_t)ax + (int64_t)ay * w) * ch, row_step = ((int64_t)bx + (int64_t)by * w) * ch;
	for (int32_t y = 0; y < oh; y++) {
		const uint8_t *s = src + (sy0 * w + sx0) * ch + (int64_t)y * row_step;
		uint8_t *d = dst + (size_t)y * ow * ch;
		if (step == ch) {
			memcpy(d, s, (size_t)ow * ch);
			continue;
		}
		for (int32_t x = 0; x < ow; x++, s += step, d += ch) memcpy(d, s, (size_t)ch);
	}
	return DP_OK;
}

/* The portable normalisation: a table per channel (256 values, the float expression below). */
static void normalize_generic(const uint8_t *src, size_t plane, const float mean[3], const float std[3], float divisor,
                              void *dst, int32_t dtype) {
	float lut[3][256];
	for (int c = 0; c < 3; c++)
		for (int v = 0; v < 256; v++) {
			float x = (float)v / divisor;
			lut[c][v] = (x - mean[c]) / std[c];
		}
	uint16_t lut16[3][256];
	size_t es = dp_dtype_size(dtype);
	if (es == 2) dp_converter(dtype, DP_F32, DP_ISA_GENERIC)(lut16, lut, 3 * 256);
	for (int c = 0; c < 3; c++) {
		const uint8_t *s = src + c;
		if (es == 4) {
			float *d = (float *)dst + (size_t)c * plane;
			for (size_t i = 0; i < plane; i++) d[i] = lut[c][s[3 * i]];
		} else {
			uint16_t *d = (uint16_t *)dst + (size_t)c * plane;
			for (size_t i = 0; i < plane; i++) d[i] = lut16[c][s[3 * i]];
		}
	}
}

#if DP_X86
/* The vector normalisations work in runs of NORM_RUN pixels, written to the f32 planes or, for
 * 16-bit outputs, to tmp and converted at the run's end. */
enum { NORM_RUN = 256 };

/* normalize_run points out[c] at where run base's channel c goes. */
static inline void normalize_run(void *dst, size_t es, size_t plane, size_t base, float tmp[3][NORM_RUN], float *out[3]) {
	for (int c = 0; c < 3; c++) out[c] = es == 4 ? (float *)dst + (size_t)c * plane + base : tmp[c];
}

/* normalize_pixels does pixels [j, n) of a run at p one at a time: the vector loops' tails. */
static inline void normalize_pixels(const uint8_t *p, size_t j, size_t n, const float mean[3], const float std[3],
                                    float divisor, float *out[3]) {
	for (; j < n; j++)
		for (int c = 0; c < 3; c++) {
			float x = (float)p[3 * j + c] / divisor;
			out[c][j] = (x - mean[c]) / std[c];
		}
}

#define DP_AVX2 __attribute__((target("avx2,fma")))

/* AVX2: 8 pixels a step, the same IEEE operations (divide, subtract, divide) as the table, so the
 * same bits. Two overlapping 16-byte loads cover the 24 bytes of 8 pixels; a shuffle per channel
 * gathers its 8 bytes. 16-bit outputs go through the AVX2 converters in runs of 256. */
DP_AVX2 static void normalize_avx2(const uint8_t *src, size_t plane, const float mean[3], const float std[3],
                                   float divisor, void *dst, int32_t dtype) {
	const size_t es = dp_dtype_size(dtype);
	dp_convert_fn conv = es == 2 ? dp_converter(dtype, DP_F32, DP_ISA_AVX2) : NULL;
	__m128i mlo[3], mhi[3];
	for (int c = 0; c < 3; c++) {
		int8_t lo[16], hi[16];
		for (int j = 0; j < 16; j++) lo[j] = hi[j] = -1;
		for (int j = 0; j < 8; j++) {
			int b = 3 * j + c;
			if (b < 16 && j <= 4) lo[j] = (int8_t)b;
			else hi[j] = (int8_t)(b - 8);
		}
		mlo[c] = _mm_loadu_si128((const __m128i *)lo);
		mhi[c] = _mm_loadu_si128((const __m128i *)hi);
	}
	const __m256 vdiv = _mm256_set1_ps(divisor);
	float tmp[3][NORM_RUN] __attribute__((aligned(32)));
	for (size_t base = 0; base < plane; base += NORM_RUN) {
		size_t n = plane - base < NORM_RUN ? plane - base : NORM_RUN, j = 0;
		const uint8_t *p = src + 3 * base;
		float *out[3];
		normalize_run(dst, es, plane, base, tmp, out);
		for (; j + 8 <= n; j += 8) {
			__m128i a = _mm_loadu_si128((const __m128i *)(p + 3 * j)), b = _mm_loadu_si128((const __m128i *)(p + 3 * j + 8));
			for (int c = 0; c < 3; c++) {
				__m128i bytes = _mm_or_si128(_mm_shuffle_epi8(a, mlo[c]), _mm_shuffle_epi8(b, mhi[c]));
				__m256 x = _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), vdiv);
				x = _mm256_div_ps(_mm256_sub_ps(x, _mm256_set1_ps(mean[c])), _mm256_set1_ps(std[c]));
				_mm256_storeu_ps(out[c] + j, x);
			}
		}
		normalize_pixels(p, j, n, mean, std, divisor, out);
		if (conv)
			for (int c = 0; c < 3; c++) conv((uint16_t *)dst + (size_t)c * plane + base, tmp[c], (int64_t)n);
	}
}

/* AVX-512 (with VBMI's byte permutes): 16 pixels a step, 48 bytes in one masked load (never past
 * the image), one permute per channel gathering its 16 bytes; then the same IEEE operations as
 * the table, so the same bits. */
#define DP_AVX512VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi")))

DP_AVX512VBMI static void normalize_avx512(const uint8_t *src, size_t plane, const float mean[3], const float std[3],
                                           float divisor, void *dst, int32_t dtype) {
	const size_t es = dp_dtype_size(dtype);
	dp_convert_fn conv = es == 2 ? dp_converter(dtype, DP_F32, DP_ISA_AVX512) : NULL;
	__m512i gather[3];
	for (int c = 0; c < 3; c++) {
		uint8_t idx[64] = {0};
		for (int j = 0; j < 16; j++) idx[j] = (uint8_t)(3 * j + c);
		gather[c] = _mm512_loadu_si512(idx);
	}
	const __m512 vdiv = _mm512_set1_ps(divisor);
	const __mmask64 bytes48 = (1ull << 48) - 1;
	float tmp[3][NORM_RUN] __attribute__((aligned(64)));
	for (size_t base = 0; base < plane; base += NORM_RUN) {
		size_t n = plane - base < NORM_RUN ? plane - base : NORM_RUN, j = 0;
		const uint8_t *p = src + 3 * base;
		float *out[3];
		normalize_run(dst, es, plane, base, tmp, out);
		for (; j + 16 <= n; j += 16) {
			__m512i px = _mm512_maskz_loadu_epi8(bytes48, p + 3 * j);
			for (int c = 0; c < 3; c++) {
				__m128i b = _mm512_castsi512_si128(_mm512_permutexvar_epi8(gather[c], px));
				__m512 x = _mm512_div_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)), vdiv);
				x = _mm512_div_ps(_mm512_sub_ps(x, _mm512_set1_ps(mean[c])), _mm512_set1_ps(std[c]));
				_mm512_storeu_ps(out[c] + j, x);
			}
		}
		normalize_pixels(p, j, n, mean, std, divisor, out);
		if (conv)
			for (int c = 0; c < 3; c++) conv((uint16_t *)dst + (size_t)c * plane + base, tmp[c], (int64_t)n);
	}
}
#endif

dp_status dp_image_normalize(const uint8_t *src, int32_t w, int32_t h, const float mean[3], const float std[3],
                             float divisor, void *dst, int32_t dtype, int32_t isa, char *msg, size_t msg_len) {
	dp_status st = check_image(src, w, h, 3, "normalize", msg, msg_len);
	if (st != DP_OK) return st;
	if (dst == NULL || mean == NULL || std == NULL)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "normalize: null destination, mean or std");
	if (dp_dtype_size(dtype) == 0) return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "normalize: unknown dtype %d", dtype);
	if (!(divisor > 0)) return dp_fail(msg, msg_len, DP_ERR_INVALID, "normalize: divisor %g", (double)divisor);
	for (int c = 0; c < 3; c++)
		if (!(std[c] != 0) || mean[c] != mean[c])
			return dp_fail(msg, msg_len, DP_ERR_INVALID, "normalize: channel %d: mean %g, std %g", c, (double)mean[c],
			               (double)std[c]);
	int32_t v = dp_isa_resolve(isa);
	if (v < 0) return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "normalize: kernel variant %d not supported here", isa);
	const size_t plane = (size_t)w * (size_t)h;
#if DP_X86
	if (v >= DP_ISA_AVX512 && dp_avx512vbmi_usable()) {
		normalize_avx512(src, plane, mean, std, divisor, dst, dtype);
		return DP_OK;
	}
	if (v >= DP_ISA_AVX2) {
		normalize_avx2(src, plane, mean, std, divisor, dst, dtype);
		return DP_OK;
	}
#endif
	normalize_generic(src, plane, mean, std, divisor, dst, dtype);
	return DP_OK;
}
