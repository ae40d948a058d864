/*
 * dp.h: the C ABI shared by the CPU kernels (native/) and the CUDA plugin (cuda/).
 *
 * Rules every entry point follows:
 *   - it never aborts, never prints, and never keeps a pointer it was given after it returns;
 *   - it returns a dp_status and, on failure, writes a NUL-terminated message into the caller's
 *     buffer (msg may be NULL, msg_len may be 0);
 *   - on failure nothing has been written to the destination unless the message says so
 *     (all inputs are validated before the first store).
 * Memory is row-major and contiguous: a [rows, cols] matrix of dtype t has rows*cols*size(t)
 * bytes, row r starting at byte r*cols*size(t).
 */
#ifndef DP_H
#define DP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct layout or a signature below changes. */
#define DP_ABI_VERSION 1

typedef enum dp_status {
	DP_OK = 0,
	DP_ERR_INVALID = 1,     /* malformed arguments: null pointers, bad sizes, unsorted spans */
	DP_ERR_BOUNDS = 2,      /* an index (token id, row) outside its range */
	DP_ERR_UNSUPPORTED = 3, /* a dtype or feature this build does not have */
	DP_ERR_NOMEM = 4,       /* an allocation failed */
} dp_status;

typedef enum dp_dtype {
	DP_F32 = 0,
	DP_F16 = 1,  /* IEEE 754 binary16 */
	DP_BF16 = 2, /* bfloat16: the top 16 bits of a binary32 */
} dp_dtype;

/* Instruction-set variants of the kernels. DP_ISA_AUTO picks the best the CPU and OS support. */
typedef enum dp_isa {
	DP_ISA_AUTO = -1,
	DP_ISA_GENERIC = 0, /* portable C */
	DP_ISA_AVX2 = 1,    /* x86-64 AVX2 + F16C, with OS support for YMM state */
	DP_ISA_AVX512 = 2,  /* AVX2 plus AVX-512 F, BW, DQ and VL, with OS support for ZMM and opmask state */
	DP_ISA_COUNT = 3,   /* one past the last variant */
} dp_isa;

/* dp_dtype_size returns the element size in bytes, 0 for an unknown dtype. */
size_t dp_dtype_size(int32_t dtype);

/* dp_isa_supported reports whether this CPU and OS can run the variant (1) or not (0). */
int dp_isa_supported(int32_t isa);

/* dp_isa_best is the variant DP_ISA_AUTO resolves to. */
int32_t dp_isa_best(void);

/*
 * dp_convert converts n elements from src (src_dtype) to dst (dst_dtype); dst and src must
 * not overlap unless they are the same pointer with the same dtype. Narrowing rounds to
 * nearest, ties to even; values beyond the target's range become +-Inf; NaN stays NaN with
 * its sign and the top bits of its payload, quieted. Widening is exact (bf16 -> f32 keeps a
 * signalling NaN signalling: it is a plain shift).
 */
dp_status dp_convert(void *dst, int32_t dst_dtype, const void *src, int32_t src_dtype, int64_t n,
                     int32_t isa, char *msg, size_t msg_len);

/* A matrix view: data points at rows*cols elements of dtype. */
typedef struct dp_matrix {
	void *data;
	int64_t rows;
	int64_t cols;
	int32_t dtype;
} dp_matrix;

/*
 * dp_gather writes row ids[i] of table into row i of dst, converting dtype if they differ.
 * dst must have n_ids rows and table's cols. Every id is checked against table.rows before
 * anything is written. Threads as for dp_merge.
 */
dp_status dp_gather(const dp_matrix *dst, const dp_matrix *table, const int32_t *ids, int64_t n_ids,
                    int32_t n_threads, int32_t isa, char *msg, size_t msg_len);

/* A media span of the merged sequence: rows [dst_row, dst_row + src.rows) come from src. */
typedef struct dp_span {
	int64_t dst_row;
	dp_matrix src;
} dp_span;

/*
 * A merge plan. dst is the merged [L, d] sequence. Spans are sorted by dst_row and do not
 * overlap; every row no span covers is a text row, filled in order from text_ids (so
 * n_text + sum of span rows == L) by gathering rows of table.
 */
typedef struct dp_merge_plan {
	dp_matrix dst;
	dp_matrix table;
	const int32_t *text_ids;
	int64_t n_text;
	const dp_span *spans;
	int64_t n_spans;
} dp_merge_plan;

/*
 * dp_merge executes a plan on up to n_threads threads (<= 1: the calling thread only; plans
 * smaller than DP_MERGE_MIN_BYTES_PER_THREAD per thread use fewer). If threads cannot be
 * started the calling thread does the work.
 */
#define DP_MERGE_MIN_BYTES_PER_THREAD ((int64_t)1 << 20)
dp_status dp_merge(const dp_merge_plan *plan, int32_t n_threads, int32_t isa, char *msg, size_t msg_len);

/* dp_copy_parallel is memcpy split over n_threads threads: the ceiling merge is measured
 * against. */
void dp_copy_parallel(void *dst, const void *src, size_t n, int32_t n_threads);

#ifdef __cplusplus
}
#endif

#endif /* DP_H */
