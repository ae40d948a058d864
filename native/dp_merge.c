/* dp_merge.c: embedding gather and the merge of text rows and media spans into one sequence. */
#include <stdio.h>
#include <string.h>

#include "dp_internal.h"

#if DP_X86
#include <immintrin.h>
#endif

/* merged_row_of_text returns the merged-sequence row of the i-th text token (for messages). */
static int64_t merged_row_of_text(const dp_merge_plan *p, int64_t i) {
	int64_t row = i;
	for (int64_t k = 0; k < p->n_spans && p->spans[k].dst_row <= row; k++) row += p->spans[k].src.rows;
	return row;
}

/* check_matrix checks one matrix of a plan; what names it in messages, with index k when k >= 0. */
static dp_status check_matrix(const dp_matrix *m, const char *what, int64_t k, int64_t cols, char *msg, size_t msg_len) {
	int64_t bytes = dp_matrix_bytes(m);
	if (bytes >= 0 && m->cols == cols && (bytes == 0 || m->data != NULL)) return DP_OK;
	char name[48];
	if (k >= 0)
		snprintf(name, sizeof name, "%s %lld", what, (long long)k);
	else
		snprintf(name, sizeof name, "%s", what);
	if (bytes < 0)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "%s: bad shape [%lld, %lld] or dtype %d", name, (long long)m->rows,
		               (long long)m->cols, m->dtype);
	if (m->cols != cols)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "%s: %lld columns, the sequence has %lld", name, (long long)m->cols,
		               (long long)cols);
	return dp_fail(msg, msg_len, DP_ERR_INVALID, "%s: null data", name);
}

/* validate checks a whole plan before anything is written. */
static dp_status validate(const dp_merge_plan *p, char *msg, size_t msg_len) {
	const int64_t d = p->dst.cols;
	dp_status st;
	if (d <= 0 && p->dst.rows > 0) return dp_fail(msg, msg_len, DP_ERR_INVALID, "dst: %lld columns", (long long)d);
	if ((st = check_matrix(&p->dst, "dst", -1, d, msg, msg_len)) != DP_OK) return st;
	if ((st = check_matrix(&p->table, "embedding table", -1, d, msg, msg_len)) != DP_OK) return st;
	if (p->n_text < 0 || (p->n_text > 0 && p->text_ids == NULL))
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "text ids: %lld ids, pointer %s", (long long)p->n_text,
		               p->text_ids ? "set" : "null");
	if (p->n_spans < 0 || (p->n_spans > 0 && p->spans == NULL))
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "spans: %lld spans, pointer %s", (long long)p->n_spans,
		               p->spans ? "set" : "null");

	int64_t end = 0, media = 0;
	for (int64_t k = 0; k < p->n_spans; k++) {
		const dp_span *s = &p->spans[k];
		if ((st = check_matrix(&s->src, "span", k, d, msg, msg_len)) != DP_OK) return st;
		if (s->dst_row < 0)
			return dp_fail(msg, msg_len, DP_ERR_BOUNDS, "span %lld: starts at row %lld", (long long)k, (long long)s->dst_row);
		if (s->dst_row < end)
			return dp_fail(msg, msg_len, DP_ERR_INVALID, "span %lld: starts at row %lld, before the end (%lld) of the previous one",
			               (long long)k, (long long)s->dst_row, (long long)end);
		if (s->dst_row > p->dst.rows || s->src.rows > p->dst.rows - s->dst_row)
			return dp_fail(msg, msg_len, DP_ERR_BOUNDS, "span %lld: rows [%lld, %lld) outside the sequence's %lld rows",
			               (long long)k, (long long)s->dst_row, (long long)(s->dst_row + s->src.rows),
			               (long long)p->dst.rows);
		end = s->dst_row + s->src.rows;
		media += s->src.rows;
	}
	if (p->n_text != p->dst.rows - media)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "%lld text ids + %lld media rows != %lld rows in dst",
		               (long long)p->n_text, (long long)media, (long long)p->dst.rows);

	const int64_t vocab = p->table.rows;
	for (int64_t i = 0; i < p->n_text; i++) {
		int32_t id = p->text_ids[i];
		if (id < 0 || id >= vocab)
			return dp_fail(msg, msg_len, DP_ERR_BOUNDS, "text token %lld (row %lld): id %d outside the embedding table's %lld rows",
			               (long long)i, (long long)merged_row_of_text(p, i), id, (long long)vocab);
	}
	return DP_OK;
}

/* Table rows are read in token order, so they are scattered over a table far larger than the
 * caches and the TLB. Touching the first lines (DP_PREFETCH_SPAN bytes) of each 4 KiB of a row
 * two rows ahead starts the page walk and the hardware prefetcher early: gather went from ~12 to
 * ~15 GB/s on a 256 MiB table with 4 KiB pages (memcpy: ~18). With the table in 2 MiB pages
 * (native.MapPages) and streaming stores, rows 2 ahead and 256 bytes a page still measured best
 * (4, 8 rows ahead; 1 KiB, whole rows: no better, some worse; 2026-11-24). */
#define DP_PREFETCH_ROWS 2
#define DP_PREFETCH_SPAN 256

static inline void prefetch_row(const char *row, size_t bytes) {
	for (size_t page = 0; page < bytes; page += 4096)
		for (size_t line = 0; line < DP_PREFETCH_SPAN && page + line < bytes; line += 64) __builtin_prefetch(row + page + line);
}

typedef struct merge_job {
	const dp_merge_plan *p;
	dp_convert_fn text_fn; /* table dtype -> dst dtype */
	int32_t isa;
	int stream; /* copy text rows with stream_row */
} merge_job;

/* A destination far larger than the caches is written with non-temporal stores, as memcpy does
 * for large copies: regular stores first read every destination line (read for ownership),
 * a third more memory traffic for a gather. Rows are whole 64-byte lines at 64-byte offsets
 * (checked in run_plan); the stores are fenced when a thread's rows are done. */
#define DP_STREAM_MIN_BYTES (16 << 20)
#if DP_X86
__attribute__((target("avx2"))) static void stream_row(char *dst, const char *src, size_t bytes) {
	for (size_t i = 0; i < bytes; i += 64) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(src + i)), b = _mm256_loadu_si256((const __m256i *)(src + i + 32));
		_mm256_stream_si256((__m256i *)(dst + i), a);
		_mm256_stream_si256((__m256i *)(dst + i + 32), b);
	}
}
/* stream_rows2 copies two rows at once, a line of each in turn, so that two rows' DRAM streams
 * are in flight, as glibc's large memcpy interleaves pages: the 32K-row gather went from
 * 0.91-0.97x memcpy to 1.02-1.05x on one thread (2026-11-24, Zen 5, 5 alternating runs). */
__attribute__((target("avx2"))) static void stream_rows2(char *d0, const char *s0, char *d1, const char *s1, size_t bytes) {
	for (size_t i = 0; i < bytes; i += 64) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(s0 + i)), b = _mm256_loadu_si256((const __m256i *)(s0 + i + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(s1 + i)), e = _mm256_loadu_si256((const __m256i *)(s1 + i + 32));
		_mm256_stream_si256((__m256i *)(d0 + i), a);
		_mm256_stream_si256((__m256i *)(d0 + i + 32), b);
		_mm256_stream_si256((__m256i *)(d1 + i), c);
		_mm256_stream_si256((__m256i *)(d1 + i + 32), e);
	}
}
#endif

/* merge_rows writes dst rows [r0, r1). */
static void merge_rows(const merge_job *j, int64_t r0, int64_t r1) {
	const dp_merge_plan *p = j->p;
	const int64_t d = p->dst.cols;
	const size_t dst_row = (size_t)d * dp_dtype_size(p->dst.dtype);
	const size_t table_row = (size_t)d * dp_dtype_size(p->table.dtype);
	char *dst = p->dst.data;
	const char *table = p->table.data;

	/* Find the first span that ends after r0 and the number of media rows before r0. */
	int64_t k = 0, media_before = 0;
	for (; k < p->n_spans && p->spans[k].dst_row + p->spans[k].src.rows <= r0; k++) media_before += p->spans[k].src.rows;
	if (k < p->n_spans && p->spans[k].dst_row < r0) media_before += r0 - p->spans[k].dst_row;
	int64_t t = r0 - media_before; /* next text id */

	int64_t r = r0;
	while (r < r1) {
		if (k < p->n_spans && r >= p->spans[k].dst_row) {
			const dp_span *s = &p->spans[k];
			int64_t span_end = s->dst_row + s->src.rows;
			int64_t n = (span_end < r1 ? span_end : r1) - r;
			size_t src_row = (size_t)d * dp_dtype_size(s->src.dtype);
			dp_convert_fn fn = dp_converter(p->dst.dtype, s->src.dtype, j->isa);
			fn(dst + (size_t)r * dst_row, (const char *)s->src.data + (size_t)(r - s->dst_row) * src_row, n * d);
			r += n;
			if (r == span_end) k++;
			continue;
		}
		int64_t text_end = k < p->n_spans ? p->spans[k].dst_row : p->dst.rows;
		if (text_end > r1) text_end = r1;
		for (; r < text_end; r++, t++) {
			if (r + DP_PREFETCH_ROWS < text_end) prefetch_row(table + (size_t)p->text_ids[t + DP_PREFETCH_ROWS] * table_row, table_row);
#if DP_X86
			if (j->stream && r + 1 < text_end) {
				if (r + 1 + DP_PREFETCH_ROWS < text_end) prefetch_row(table + (size_t)p->text_ids[t + 1 + DP_PREFETCH_ROWS] * table_row, table_row);
				stream_rows2(dst + (size_t)r * dst_row, table + (size_t)p->text_ids[t] * table_row, dst + (size_t)(r + 1) * dst_row,
				             table + (size_t)p->text_ids[t + 1] * table_row, dst_row);
				r++, t++;
				continue;
			}
			if (j->stream) {
				stream_row(dst + (size_t)r * dst_row, table + (size_t)p->text_ids[t] * table_row, dst_row);
				continue;
			}
#endif
			j->text_fn(dst + (size_t)r * dst_row, table + (size_t)p->text_ids[t] * table_row, d);
		}
	}
#if DP_X86
	if (j->stream) _mm_sfence();
#endif
}

typedef struct split_job {
	const merge_job *job;
	int64_t rows;
} split_job;

static void merge_part(void *ctx, int32_t i, int32_t n) {
	const split_job *s = ctx;
	merge_rows(s->job, s->rows * i / n, s->rows * (i + 1) / n);
}

static dp_status run_plan(const dp_merge_plan *p, int32_t n_threads, int32_t isa, char *msg, size_t msg_len) {
	int32_t v = dp_isa_resolve(isa);
	if (v < 0) return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "instruction set %d not supported here", isa);
	dp_status st = validate(p, msg, msg_len);
	if (st != DP_OK) return st;
	merge_job job = {p, dp_converter(p->dst.dtype, p->table.dtype, v), v, 0};
	int64_t bytes = dp_matrix_bytes(&p->dst);
	size_t row_bytes = (size_t)p->dst.cols * dp_dtype_size(p->dst.dtype);
	job.stream = DP_X86 && v >= DP_ISA_AVX2 && p->dst.dtype == p->table.dtype && bytes >= DP_STREAM_MIN_BYTES &&
	             row_bytes % 64 == 0 && (uintptr_t)p->dst.data % 64 == 0;
	int64_t most = bytes / DP_MERGE_MIN_BYTES_PER_THREAD;
	if (n_threads > most) n_threads = (int32_t)most;
	if (n_threads > p->dst.rows) n_threads = (int32_t)p->dst.rows;
	if (n_threads < 1) n_threads = 1;
	split_job s = {&job, p->dst.rows};
	dp_parallel_for(n_threads, merge_part, &s);
	return DP_OK;
}

dp_status dp_merge(const dp_merge_plan *plan, int32_t n_threads, int32_t isa, char *msg, size_t msg_len) {
	if (plan == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null plan");
	return run_plan(plan, n_threads, isa, msg, msg_len);
}

dp_status dp_gather(const dp_matrix *dst, const dp_matrix *table, const int32_t *ids, int64_t n_ids,
                    int32_t n_threads, int32_t isa, char *msg, size_t msg_len) {
	if (dst == NULL || table == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null matrix");
	if (dst->rows != n_ids)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "%lld ids for %lld dst rows", (long long)n_ids,
		               (long long)dst->rows);
	dp_merge_plan p = {.dst = *dst, .table = *table, .text_ids = ids, .n_text = n_ids};
	return run_plan(&p, n_threads, isa, msg, msg_len);
}
