/* test_resize.c: every resize variant this CPU runs gives the portable variant's bytes (which
 * the Go tests check against Pillow's), on random images, sizes, crops and channel counts; and
 * bad jobs fail with a status, leaving dst untouched. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../dp_media.h"
#include "check.h"

static int32_t rnd(int32_t lo, int32_t hi) { return lo + (int32_t)(rng_next() % (uint64_t)(hi - lo + 1)); }

static int one_case(int32_t isa) {
	dp_resize_job j;
	memset(&j, 0, sizeof j);
	j.channels = rnd(1, 4);
	if (rng_next() % 2) j.channels = 3;
	j.src_w = rnd(1, 300), j.src_h = rnd(1, 300);
	int big = rng_next() % 4 == 0; /* sometimes strong downscales: many taps */
	j.out_w = big ? rnd(1, 20) : rnd(1, 400), j.out_h = big ? rnd(1, 20) : rnd(1, 400);
	if (rng_next() % 5 == 0) j.out_w = j.src_w; /* a skipped pass */
	if (rng_next() % 5 == 0) j.out_h = j.src_h;
	j.crop_w = rnd(1, j.out_w), j.crop_h = rnd(1, j.out_h);
	j.crop_x = rnd(0, j.out_w - j.crop_w), j.crop_y = rnd(0, j.out_h - j.crop_h);
	j.filter = (int32_t)(rng_next() % 2);
	size_t n_src = (size_t)j.src_w * j.src_h * j.channels, n_dst = (size_t)j.crop_w * j.crop_h * j.channels;
	uint8_t *src = malloc(n_src), *want = malloc(n_dst), *got = malloc(n_dst);
	if (!src || !want || !got) return 1;
	fill_random(src, n_src);
	if (rng_next() % 3 == 0) /* sharp edges: saturating values exercise the clip */
		for (size_t i = 0; i < n_src; i++) src[i] = src[i] & 0x80 ? 255 : 0;
	char msg[160];
	j.src = src;
	j.dst = want;
	CHECK(dp_resize(&j, DP_ISA_GENERIC, msg, sizeof msg) == DP_OK, "%s", msg);
	j.dst = got;
	CHECK(dp_resize(&j, isa, msg, sizeof msg) == DP_OK, "%s", msg);
	CHECK(memcmp(want, got, n_dst) == 0, "isa %d: %dx%dx%d -> %dx%d crop %dx%d+%d+%d filter %d differs from portable", isa,
	      j.src_w, j.src_h, j.channels, j.out_w, j.out_h, j.crop_w, j.crop_h, j.crop_x, j.crop_y, j.filter);
	/* The crop equals the same window of the full resize. */
	dp_resize_job full = j;
	full.crop_x = full.crop_y = 0, full.crop_w = j.out_w, full.crop_h = j.out_h;
	uint8_t *all = malloc((size_t)j.out_w * j.out_h * j.channels);
	if (!all) return 1;
	full.dst = all;
	CHECK(dp_resize(&full, isa, msg, sizeof msg) == DP_OK, "%s", msg);
	for (int32_t y = 0; y < j.crop_h; y++)
		CHECK(memcmp(got + (size_t)y * j.crop_w * j.channels,
		             all + ((size_t)(y + j.crop_y) * j.out_w + j.crop_x) * j.channels, (size_t)j.crop_w * j.channels) == 0,
		      "crop row %d differs from the full resize's", y);
	free(all);
	free(src);
	free(want);
	free(got);
	return check_failures;
}

static int bad_jobs(void) {
	uint8_t src[12] = {0}, dst[12];
	char msg[160];
	dp_resize_job ok = {src, 2, 2, 3, 1, 1, 0, 0, 1, 1, dst, DP_FILTER_BICUBIC};
	dp_resize_job cases[7];
	for (int i = 0; i < 7; i++) cases[i] = ok;
	cases[0].src = NULL;
	cases[1].channels = 5;
	cases[2].src_w = 0;
	cases[3].out_h = 70000;
	cases[4].crop_x = 1;
	cases[5].filter = 9;
	cases[6].crop_w = 0;
	for (int i = 0; i < 7; i++) {
		memset(dst, 0xa5, sizeof dst);
		msg[0] = 0;
		CHECK(dp_resize(&cases[i], DP_ISA_AUTO, msg, sizeof msg) != DP_OK, "bad job %d accepted", i);
		CHECK(msg[0] != 0, "bad job %d: no message", i);
		CHECK(dst[0] == 0xa5, "bad job %d wrote dst", i);
	}
	CHECK(dp_resize(NULL, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "null job");
	CHECK(dp_resize(&ok, DP_ISA_AUTO, NULL, 0) == DP_OK, "a good job without a message buffer");
	return check_failures;
}

int main(void) {
	rng_state = (uint64_t)time(NULL);
	printf("seed %llu\n", (unsigned long long)rng_state);
	if (bad_jobs()) return check_failures;
	int variants = 0;
	for (int32_t isa = DP_ISA_GENERIC; isa < DP_ISA_COUNT; isa++) {
		if (!dp_isa_supported(isa)) {
			printf("variant %d not supported here: skipped\n", isa);
			continue;
		}
		variants++;
		for (int i = 0; i < 300; i++)
			if (one_case(isa)) return check_failures;
	}
	printf("%d variants checked\n", variants);
	return check_failures;
}
