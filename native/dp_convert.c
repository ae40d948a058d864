/* dp_convert.c: f32 <-> f16 <-> bf16, round to nearest even: a portable variant, an AVX2/F16C
 * one and an AVX-512 one (16 lanes, masked tails).
 *
 * The AVX-512 f32 -> bf16 path rounds in integers like the AVX2 one rather than with
 * AVX512_BF16's vcvtneps2bf16, which treats subnormal inputs as zero (and so breaks the
 * round-to-nearest rule for them); the conversion is memory-bound either way.
 *
 * NaN handling is the same in all variants and matches the F16C instructions: narrowing keeps
 * the sign and the top payload bits and sets the quiet bit; f16 -> f32 also sets the quiet bit
 * (vcvtph2ps quiets a signalling NaN); bf16 -> f32 is a plain 16-bit shift. */
#include <string.h>

#include "dp_internal.h"

#if DP_X86
#include <immintrin.h>
#endif

static inline uint16_t f32_to_f16(uint32_t x) {
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t ax = x & 0x7fffffffu;
	if (ax > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x3ffu); /* NaN */
	if (ax >= 0x477ff000u) return sign | 0x7c00u; /* >= 65520 (or Inf) rounds to Inf */
	if (ax >= 0x38800000u) {                      /* normal in f16: >= 2^-14 */
		uint32_t m = ax - ((uint32_t)(127 - 15) << 23);
		m += 0xfffu + ((m >> 13) & 1u);
		return sign | (uint16_t)(m >> 13);
	}
	uint32_t e = ax >> 23;
	if (e < 102) return sign; /* < 2^-25, or exactly 2^-25 (a tie to 0) */
	/* Subnormal in f16: round the value, in units of 2^-24, to an integer. */
	uint32_t m = (ax & 0x7fffffu) | 0x800000u;
	uint32_t shift = 126 - e; /* 14..24 */
	uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
	if (rem > half || (rem == half && (r & 1u))) r++;
	return sign | (uint16_t)r; /* r == 0x400 is the smallest normal: still correct */
}

static inline uint32_t f16_to_f32(uint16_t h) {
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
	if (exp == 0x1f) return sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0); /* Inf, NaN */
	if (exp == 0) {
		if (man == 0) return sign;
		/* Subnormal: shift the leading 1 up to bit 10 and lower the exponent to match. */
		uint32_t s = (uint32_t)__builtin_clz(man) - 21;
		return sign | ((113 - s) << 23) | (((man << s) & 0x3ffu) << 13);
	}
	return sign | ((exp + 112) << 23) | (man << 13);
}

static inline uint16_t f32_to_bf16(uint32_t x) {
	if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* NaN, quieted */
	return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* ---- portable variants ----
 * Buffers may be views at any byte offset (a span inside a larger region), so elements are
 * loaded and stored through memcpy, which compilers turn into plain moves. */

static inline uint32_t load32(const char *p) {
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

static inline uint16_t load16(const char *p) {
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

static inline void store32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void store16(char *p, uint16_t v) { memcpy(p, &v, 2); }

static void f32_f16_generic(void *dst, const void *src, int64_t n) {
	char *d = dst;
	const char *s = src;
	for (int64_t i = 0; i < n; i++) store16(d + 2 * i, f32_to_f16(load32(s + 4 * i)));
}

static void f16_f32_generic(void *dst, const void *src, int64_t n) {
	char *d = dst;
	const char *s = src;
	for (int64_t i = 0; i < n; i++) store32(d + 4 * i, f16_to_f32(load16(s + 2 * i)));
}

static void f32_bf16_generic(void *dst, const void *src, int64_t n) {
	char *d = dst;
	const char *s = src;
	for (int64_t i = 0; i < n; i++) store16(d + 2 * i, f32_to_bf16(load32(s + 4 * i)));
}

static void bf16_f32_generic(void *dst, const void *src, int64_t n) {
	char *d = dst;
	const char *s = src;
	for (int64_t i = 0; i < n; i++) store32(d + 4 * i, (uint32_t)load16(s + 2 * i) << 16);
}

static void f16_bf16_generic(void *dst, const void *src, int64_t n) {
	char *d = dst;
	const char *s = src;
	for (int64_t i = 0; i < n; i++) store16(d + 2 * i, f32_to_bf16(f16_to_f32(load16(s + 2 * i)))); /* f16 -> f32 is exact */
}

static void bf16_f16_generic(void *dst, const void *src, int64_t n) {
	char *d = dst;
	const char *s = src;
	for (int64_t i = 0; i < n; i++) store16(d + 2 * i, f32_to_f16((uint32_t)load16(s + 2 * i) << 16));
}

/* ---- AVX2 + F16C variants: 8 or 16 elements a step, the tail by the portable code ---- */

#if DP_X86
#define DP_AVX2 __attribute__((target("avx2,f16c,fma")))

DP_AVX2 static void f32_f16_avx2(void *dst, const void *src, int64_t n) {
	uint16_t *d = dst;
	const float *s = src;
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		_mm_storeu_si128((__m128i *)(d + i), h);
	}
	f32_f16_generic(d + i, s + i, n - i);
}

DP_AVX2 static void f16_f32_avx2(void *dst, const void *src, int64_t n) {
	float *d = dst;
	const uint16_t *s = src;
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
	f16_f32_generic(d + i, s + i, n - i);
}

/* 8 f32 bit patterns -> 8 bf16 in the low halves of 32-bit lanes. */
DP_AVX2 static inline __m256i bf16_round8(__m256i x) {
	const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
	__m256i rounded = _mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
	__m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
	__m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x400000));
	return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
}

DP_AVX2 static void f32_bf16_avx2(void *dst, const void *src, int64_t n) {
	uint16_t *d = dst;
	const float *s = src;
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		__m256i lo = bf16_round8(_mm256_loadu_si256((const __m256i *)(s + i)));
		__m256i hi = bf16_round8(_mm256_loadu_si256((const __m256i *)(s + i + 8)));
		/* packus works per 128-bit lane; put the quarters back in order. */
		__m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
		_mm256_storeu_si256((__m256i *)(d + i), packed);
	}
	f32_bf16_generic(d + i, s + i, n - i);
}

DP_AVX2 static void bf16_f32_avx2(void *dst, const void *src, int64_t n) {
	float *d = dst;
	const uint16_t *s = src;
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
		_mm256_storeu_si256((__m256i *)(d + i), _mm256_slli_epi32(w, 16));
	}
	bf16_f32_generic(d + i, s + i, n - i);
}

DP_AVX2 static void f16_bf16_avx2(void *dst, const void *src, int64_t n) {
	uint16_t *d = dst;
	const uint16_t *s = src;
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		__m256i lo = bf16_round8(_mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i)))));
		__m256i hi = bf16_round8(_mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i + 8)))));
		_mm256_storeu_si256((__m256i *)(d + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8));
	}
	f16_bf16_generic(d + i, s + i, n - i);
}

DP_AVX2 static void bf16_f16_avx2(void *dst, const void *src, int64_t n) {
	uint16_t *d = dst;
	const uint16_t *s = src;
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i))), 16);
		__m128i h = _mm256_cvtps_ph(_mm256_castsi256_ps(w), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		_mm_storeu_si128((__m128i *)(d + i), h);
	}
	bf16_f16_generic(d + i, s + i, n - i);
}

/* ---- AVX-512 variants: 16 elements a step, the tail under a mask ---- */

#define DP_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c,fma")))

static inline __mmask16 tail16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

DP_AVX512 static inline __m256i bf16_round16(__m512i x) {
	const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
	__m512i r = _mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
	__mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, abs_mask), inf);
	r = _mm512_mask_or_epi32(r, nan, x, _mm512_set1_epi32(0x400000));
	return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

DP_AVX512 static void f32_f16_avx512(void *dst, const void *src, int64_t n) {
	uint16_t *d = dst;
	const float *s = src;
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = tail16(n - i);
		__m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		_mm256_mask_storeu_epi16(d + i, m, h);
	}
}

DP_AVX512 static void f16_f32_avx512(void *dst, const void *src, int64_t n) {
	float *d = dst;
	const uint16_t *s = src;
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = tail16(n - i);
		_mm512_mask_storeu_ps(d + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
	}
}

DP_AVX512 static void f32_bf16_avx512(void *dst, const void *src, int64_t n) {
	uint16_t *d = dst;
	const float *s = src;
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = tail16(n - i);
		_mm256_mask_storeu_epi16(d + i, m, bf16_round16(_mm512_maskz_loadu_epi32(m, s + i)));
	}
}

DP_AVX512 static void bf16_f32_avx512(void *dst, const void *src, int64_t n) {
	float *d = dst;
	const uint16_t *s = src;
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = tail16(n - i);
		__m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i)), 16);
		_mm512_mask_storeu_epi32(d + i, m, w);
	}
}

DP_AVX512 static void f16_bf16_avx512(void *dst, const void *src, int64_t n) {
	uint16_t *d = dst;
	const uint16_t *s = src;
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = tail16(n - i);
		__m512 f = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)); /* exact */
		_mm256_mask_storeu_epi16(d + i, m, bf16_round16(_mm512_castps_si512(f)));
	}
}

DP_AVX512 static void bf16_f16_avx512(void *dst, const void *src, int64_t n) {
	uint16_t *d = dst;
	const uint16_t *s = src;
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = tail16(n - i);
		__m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i)), 16);
		__m256i h = _mm512_cvtps_ph(_mm512_castsi512_ps(w), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		_mm256_mask_storeu_epi16(d + i, m, h);
	}
}
#endif /* DP_X86 */

static void copy_f32(void *dst, const void *src, int64_t n) {
	if (dst != src) memcpy(dst, src, (size_t)n * 4);
}

static void copy_16(void *dst, const void *src, int64_t n) {
	if (dst != src) memcpy(dst, src, (size_t)n * 2);
}

/* Indexed [isa][dst][src]. */
static const dp_convert_fn converters[DP_ISA_COUNT][3][3] = {
	[DP_ISA_GENERIC] = {
		[DP_F32] = {copy_f32, f16_f32_generic, bf16_f32_generic},
		[DP_F16] = {f32_f16_generic, copy_16, bf16_f16_generic},
		[DP_BF16] = {f32_bf16_generic, f16_bf16_generic, copy_16},
	},
#if DP_X86
	[DP_ISA_AVX2] = {
		[DP_F32] = {copy_f32, f16_f32_avx2, bf16_f32_avx2},
		[DP_F16] = {f32_f16_avx2, copy_16, bf16_f16_avx2},
		[DP_BF16] = {f32_bf16_avx2, f16_bf16_avx2, copy_16},
	},
	[DP_ISA_AVX512] = {
		[DP_F32] = {copy_f32, f16_f32_avx512, bf16_f32_avx512},
		[DP_F16] = {f32_f16_avx512, copy_16, bf16_f16_avx512},
		[DP_BF16] = {f32_bf16_avx512, f16_bf16_avx512, copy_16},
	},
#endif
};

dp_convert_fn dp_converter(int32_t dst_dtype, int32_t src_dtype, int32_t isa) {
	if (dp_dtype_size(dst_dtype) == 0 || dp_dtype_size(src_dtype) == 0 || isa < 0 || isa >= DP_ISA_COUNT) return NULL;
	return converters[isa][dst_dtype][src_dtype];
}

dp_status dp_convert(void *dst, int32_t dst_dtype, const void *src, int32_t src_dtype, int64_t n,
                     int32_t isa, char *msg, size_t msg_len) {
	int32_t v = dp_isa_resolve(isa);
	if (v < 0) return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "instruction set %d not supported here", isa);
	dp_convert_fn fn = dp_converter(dst_dtype, src_dtype, v);
	if (fn == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "unknown dtype (dst %d, src %d)", dst_dtype, src_dtype);
	if (n < 0) return dp_fail(msg, msg_len, DP_ERR_INVALID, "negative count %lld", (long long)n);
	if (n > 0 && (dst == NULL || src == NULL)) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null buffer");
	if (n > 0 && dst == src && dst_dtype != src_dtype)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "in-place conversion between dtypes");
	fn(dst, src, n);
	return DP_OK;
}
