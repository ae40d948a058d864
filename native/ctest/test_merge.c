/* test_merge.c: the merge against a row-by-row reference for random layouts and thread counts,
 * and the failure rules of the ABI (status + message, nothing written, no abort). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../dp.h"
#include "check.h"

enum { MAX_SPANS = 64 };

typedef struct layout {
	dp_merge_plan plan;
	dp_span spans[MAX_SPANS];
	int32_t *ids;
	void *table, *dst, *media;
} layout;

/* random_layout builds a plan of rows rows of width d, with dtypes picked at random. */
static void random_layout(layout *l, int64_t rows, int64_t d, int64_t vocab) {
	int32_t tdt = (int32_t)(rng_next() % 3), ddt = (int32_t)(rng_next() % 3);
	memset(l, 0, sizeof *l);
	l->table = malloc((size_t)(vocab * d * 4));
	l->dst = malloc((size_t)(rows * d * 4));
	l->media = malloc((size_t)(rows * d * 4));
	l->ids = malloc((size_t)rows * 4);
	fill_random(l->table, (size_t)(vocab * d * 4));
	fill_random(l->media, (size_t)(rows * d * 4));
	int64_t n_text = 0, n_spans = 0, media_off = 0;
	for (int64_t r = 0; r < rows;) {
		int64_t n = 1 + (int64_t)(rng_next() % (uint64_t)(rows / 6 + 1));
		if (n > rows - r) n = rows - r;
		if (n_spans < MAX_SPANS && rng_next() % 2) {
			int32_t mdt = (int32_t)(rng_next() % 3);
			l->spans[n_spans++] = (dp_span){r, {(char *)l->media + media_off, n, d, mdt}};
			media_off += n * d * (int64_t)dp_dtype_size(mdt);
		} else {
			for (int64_t i = 0; i < n; i++) l->ids[n_text++] = (int32_t)(rng_next() % (uint64_t)vocab);
		}
		r += n;
	}
	l->plan = (dp_merge_plan){
		.dst = {l->dst, rows, d, ddt},
		.table = {l->table, vocab, d, tdt},
		.text_ids = l->ids,
		.n_text = n_text,
		.spans = l->spans,
		.n_spans = n_spans,
	};
}

static void free_layout(layout *l) { free(l->table), free(l->dst), free(l->media), free(l->ids); }

/* reference writes the merged rows one by one with the portable converter. */
static void reference(const dp_merge_plan *p, char *out) {
	size_t es = dp_dtype_size(p->dst.dtype), row = (size_t)p->dst.cols * es;
	int64_t t = 0, k = 0;
	for (int64_t r = 0; r < p->dst.rows; r++) {
		const dp_span *s = k < p->n_spans ? &p->spans[k] : NULL;
		if (s && r >= s->dst_row) {
			size_t srow = (size_t)p->dst.cols * dp_dtype_size(s->src.dtype);
			dp_convert(out + r * row, p->dst.dtype, (char *)s->src.data + (size_t)(r - s->dst_row) * srow, s->src.dtype,
			           p->dst.cols, DP_ISA_GENERIC, NULL, 0);
			if (r == s->dst_row + s->src.rows - 1) k++;
		} else {
			size_t trow = (size_t)p->dst.cols * dp_dtype_size(p->table.dtype);
			dp_convert(out + r * row, p->dst.dtype, (char *)p->table.data + (size_t)p->text_ids[t++] * trow,
			           p->table.dtype, p->dst.cols, DP_ISA_GENERIC, NULL, 0);
		}
	}
}

static int check_random_merges(void) {
	const int64_t shapes[][3] = {{1, 1, 1}, {7, 3, 5}, {300, 33, 40}, {2048, 512, 100}, {3000, 1024, 500}};
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		for (int32_t threads = 1; threads <= 8; threads++) {
			layout l;
			random_layout(&l, shapes[s][0], shapes[s][1], shapes[s][2]);
			size_t bytes = (size_t)(l.plan.dst.rows * l.plan.dst.cols) * dp_dtype_size(l.plan.dst.dtype);
			char *want = malloc(bytes);
			reference(&l.plan, want);
			for (int poison = 0xa5; poison <= 0xff; poison += 0x5a) { /* two poisons: every byte is written */
				memset(l.dst, poison, bytes);
				char msg[128] = "";
				CHECK(dp_merge(&l.plan, threads, DP_ISA_AUTO, msg, sizeof msg) == DP_OK, "%s", msg);
				CHECK(memcmp(want, l.dst, bytes) == 0, "shape %zu, %d threads, %lld spans: differs from the reference",
				      s, threads, (long long)l.plan.n_spans);
			}
			free(want);
			free_layout(&l);
		}
	}
	return check_failures;
}

static int check_failures_leave_dst(void) {
	layout l;
	random_layout(&l, 64, 8, 10);
	size_t bytes = (size_t)(64 * 8) * dp_dtype_size(l.plan.dst.dtype);
	char *clean = malloc(bytes);
	memset(clean, 0x3c, bytes);
	char msg[160];

	dp_merge_plan p = l.plan;
	if (p.n_text > 0) {
		int32_t saved = l.ids[p.n_text - 1];
		l.ids[p.n_text - 1] = 10;
		memcpy(l.dst, clean, bytes);
		CHECK(dp_merge(&p, 4, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_BOUNDS, "id out of range");
		CHECK(strstr(msg, "id 10 outside the embedding table's 10 rows") != NULL, "message: %s", msg);
		CHECK(memcmp(l.dst, clean, bytes) == 0, "a failed merge wrote dst");
		/* A tiny buffer gets a truncated, terminated message; a null one is fine. */
		char tiny[6];
		memset(tiny, 'x', sizeof tiny);
		CHECK(dp_merge(&p, 1, DP_ISA_AUTO, tiny, sizeof tiny) == DP_ERR_BOUNDS, "tiny buffer");
		CHECK(tiny[5] == '\0', "message not terminated");
		CHECK(dp_merge(&p, 1, DP_ISA_AUTO, NULL, 0) == DP_ERR_BOUNDS, "null buffer");
		l.ids[p.n_text - 1] = saved;
	}
	p.n_text++;
	CHECK(dp_merge(&p, 1, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "count mismatch");
	CHECK(strstr(msg, "media rows") != NULL, "message: %s", msg);
	p = l.plan;
	p.dst.dtype = 9;
	CHECK(dp_merge(&p, 1, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "bad dtype");
	p = l.plan;
	p.dst.rows = INT64_MAX / 2;
	CHECK(dp_merge(&p, 1, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "overflowing shape");
	CHECK(dp_merge(NULL, 1, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "null plan");
	CHECK(memcmp(l.dst, clean, bytes) == 0, "a failed merge wrote dst");
	free(clean);
	free_layout(&l);
	return check_failures;
}

int main(void) {
	uint64_t seed = (uint64_t)time(NULL);
	printf("merge: random seed %llu\n", (unsigned long long)seed);
	rng_state = seed;
	if (check_random_merges()) return check_failures;
	if (check_failures_leave_dst()) return check_failures;
	printf("merge: ok\n");
	return check_failures;
}
