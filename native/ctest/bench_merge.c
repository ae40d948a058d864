/* bench_merge.c: the merge of the seed's worked example and of a 32K-token sequence (fp16,
 * d = 4096), each beside memcpy of the same bytes on the same threads, in the same run.
 * Prints the median of N runs and the ratio merge/memcpy throughput. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../dp.h"
#include "bench.h"
#include "check.h"

enum { D = 4096, VOCAB = 32000, RUNS = 15 };

/* bench lays out segments (n > 0 text tokens, n < 0 a media span) and times merge vs memcpy. */
static void bench(const char *name, const int *seg, int n_seg, const void *table, int32_t threads) {
	int64_t rows = 0, n_text = 0;
	dp_span spans[64];
	int64_t n_spans = 0;
	for (int i = 0; i < n_seg; i++) rows += seg[i] > 0 ? seg[i] : -seg[i];
	size_t row = D * 2, bytes = (size_t)rows * row;
	char *dst = malloc(bytes), *src = malloc(bytes), *media = malloc(bytes);
	int32_t *ids = malloc((size_t)rows * 4);
	fill_random(src, bytes);
	fill_random(media, bytes);
	int64_t at = 0;
	for (int i = 0; i < n_seg; i++) {
		if (seg[i] > 0) {
			for (int k = 0; k < seg[i]; k++) ids[n_text++] = (int32_t)(rng_next() % VOCAB);
			at += seg[i];
		} else {
			spans[n_spans++] = (dp_span){at, {media + at * row, -seg[i], D, DP_F16}};
			at += -seg[i];
		}
	}
	dp_merge_plan p = {{dst, rows, D, DP_F16}, {(void *)table, VOCAB, D, DP_F16}, ids, n_text, spans, n_spans};
	double tm[RUNS], tc[RUNS];
	char msg[128];
	dp_copy_parallel(dst, src, bytes, threads);
	for (int i = 0; i < RUNS; i++) {
		double t0 = now();
		if (dp_merge(&p, threads, DP_ISA_AUTO, msg, sizeof msg) != DP_OK) {
			fprintf(stderr, "%s\n", msg);
			exit(1);
		}
		double t1 = now();
		dp_copy_parallel(dst, src, bytes, threads);
		double t2 = now();
		tm[i] = t1 - t0, tc[i] = t2 - t1;
	}
	double m = median(tm, RUNS), c = median(tc, RUNS);
	printf("%-10s threads=%d  %6lld rows %6.1f MiB  merge %6.2f ms %5.1f GB/s  memcpy %6.2f ms %5.1f GB/s  merge/memcpy %.2fx\n",
	       name, threads, (long long)rows, (double)bytes / (1 << 20), m * 1e3, (double)bytes / m / 1e9, c * 1e3,
	       (double)bytes / c / 1e9, c / m);
	free(dst), free(src), free(media), free(ids);
}

int main(void) {
	rng_state = 42;
	size_t tbytes = (size_t)VOCAB * D * 2;
	void *table = malloc(tbytes);
	fill_random(table, tbytes);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int32_t many = ncpu > 8 ? 8 : (int32_t)ncpu;
	const int seed_example[] = {12, -1024, 4, -3840, 3};
	/* 32K: 16 x (784 text tokens + a 1,024-token image), then a 3,840-token video. */
	int seg_32k[33];
	for (int i = 0; i < 16; i++) seg_32k[2 * i] = 784, seg_32k[2 * i + 1] = -1024;
	seg_32k[32] = -3840;
	const int text_32k[] = {32768};
	const int32_t thread_counts[] = {1, many};
	for (int i = 0; i < (many > 1 ? 2 : 1); i++) {
		bench("seed-4883", seed_example, 5, table, thread_counts[i]);
		bench("32k", seg_32k, 33, table, thread_counts[i]);
		bench("gather-32k", text_32k, 1, table, thread_counts[i]);
	}
	free(table);
	return 0;
}
