/* test_convert.c: every kernel variant this CPU runs gives the same bits as the portable one,
 * for every f32 input (2^32) and every 16-bit pattern. The portable variant itself is checked
 * against an independent reference by the Go tests (native/convert_test.go). */
#include <stdlib.h>
#include <string.h>

#include "../dp.h"
#include "../dp_internal.h"
#include "check.h"

#define CHUNK (1 << 20)

/* same_as_generic converts src with the portable code once, then with every vector variant
 * this CPU runs, and compares the bits. A variant that reuses the one below it for this pair
 * was checked with that one and is skipped. */
static int same_as_generic(int32_t dst_dtype, int32_t src_dtype, const void *src, int64_t n, void *want, void *got) {
	char msg[128];
	size_t ds = dp_dtype_size(dst_dtype);
	CHECK(dp_convert(want, dst_dtype, src, src_dtype, n, DP_ISA_GENERIC, msg, sizeof msg) == DP_OK, "%s", msg);
	for (int32_t isa = DP_ISA_AVX2; isa < DP_ISA_COUNT; isa++) {
		if (!dp_isa_supported(isa) ||
		    (isa > DP_ISA_AVX2 && dp_converter(dst_dtype, src_dtype, isa) == dp_converter(dst_dtype, src_dtype, isa - 1)))
			continue;
		CHECK(dp_convert(got, dst_dtype, src, src_dtype, n, isa, msg, sizeof msg) == DP_OK, "%s", msg);
		if (memcmp(want, got, (size_t)n * ds) == 0) continue;
		for (int64_t i = 0; i < n; i++) {
			if (memcmp((char *)want + i * ds, (char *)got + i * ds, ds) != 0) {
				uint32_t s = 0, w = 0, g = 0;
				memcpy(&s, (const char *)src + i * dp_dtype_size(src_dtype), dp_dtype_size(src_dtype));
				memcpy(&w, (char *)want + i * ds, ds);
				memcpy(&g, (char *)got + i * ds, ds);
				CHECK(0, "isa %d, dtype %d -> %d: input %#x gives %#x, portable %#x", isa, src_dtype, dst_dtype, s, g, w);
				break;
			}
		}
	}
	return check_failures;
}

int main(void) {
	const char *env = getenv("DP_TEST_CHUNK_STRIDE");
	uint64_t stride = env ? strtoull(env, NULL, 10) : 1;
	if (stride == 0) stride = 1;
	uint32_t *in = malloc(CHUNK * 4);
	uint32_t *want = malloc(CHUNK * 4), *got = malloc(CHUNK * 4);
	uint16_t *pat = malloc((1 << 16) * 2);
	if (!in || !want || !got || !pat) return 1;
	for (uint32_t p = 0; p < 1u << 16; p++) pat[p] = (uint16_t)p;

	int variants = 0;
	for (int32_t isa = DP_ISA_AVX2; isa < DP_ISA_COUNT; isa++) {
		if (dp_isa_supported(isa))
			variants++;
		else
			printf("variant %d not supported here: skipped\n", isa);
	}
	/* Every f32 bit pattern (every stride-th chunk under the sanitizers, which are slow),
	 * narrowed to f16 and bf16; the portable result computed once for all variants. */
	for (uint64_t base = 0; variants > 0 && base < (1ull << 32); base += CHUNK * stride) {
		for (uint32_t i = 0; i < CHUNK; i++) in[i] = (uint32_t)(base + i);
		if (same_as_generic(DP_F16, DP_F32, in, CHUNK, want, got)) return check_failures;
		if (same_as_generic(DP_BF16, DP_F32, in, CHUNK, want, got)) return check_failures;
	}
	/* Every 16-bit pattern, widened and converted across. */
	const int32_t pairs[][2] = {{DP_F32, DP_F16}, {DP_F32, DP_BF16}, {DP_BF16, DP_F16}, {DP_F16, DP_BF16}};
	for (size_t k = 0; variants > 0 && k < sizeof pairs / sizeof pairs[0]; k++)
		if (same_as_generic(pairs[k][0], pairs[k][1], pat, 1 << 16, want, got)) return check_failures;

	/* Errors are statuses with messages, never crashes. */
	char msg[64];
	CHECK(dp_convert(got, 7, in, DP_F32, 4, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "unknown dtype");
	CHECK(strstr(msg, "unknown dtype") != NULL, "message: %s", msg);
	CHECK(dp_convert(got, DP_F16, in, DP_F32, -1, DP_ISA_AUTO, NULL, 0) == DP_ERR_INVALID, "negative count");
	CHECK(dp_convert(NULL, DP_F16, in, DP_F32, 4, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "null dst");
	CHECK(dp_convert(got, DP_F16, in, DP_F32, 4, 42, msg, sizeof msg) == DP_ERR_UNSUPPORTED, "unknown isa");
	CHECK(dp_convert(NULL, DP_F16, NULL, DP_F32, 0, DP_ISA_AUTO, msg, 1) == DP_OK, "empty conversion");

	printf("convert: %d vector variant(s) match the portable code on %s2^32 f32 and all 2^16 16-bit inputs\n", variants,
	       stride == 1 ? "all " : "a stride of the ");
	free(in), free(want), free(got), free(pat);
	return check_failures;
}
