/* dp_internal.h: helpers shared by the native kernels; not part of the ABI. */
#ifndef DP_INTERNAL_H
#define DP_INTERNAL_H

#include "dp.h"

#if defined(__x86_64__) || defined(__i386__)
#define DP_X86 1
#else
#define DP_X86 0
#endif

/* dp_fail formats a message into msg (if any) and returns status. */
dp_status dp_fail(char *msg, size_t msg_len, dp_status status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* dp_isa_resolve maps DP_ISA_AUTO to the best variant; -1 when isa is unknown or unsupported. */
int32_t dp_isa_resolve(int32_t isa);

/* dp_avx512vbmi_usable: the AVX-512 variant may also use AVX512-VBMI's byte permutes. */
int dp_avx512vbmi_usable(void);

/* A row converter: n elements from src to dst. Both dtypes known, isa already resolved. */
typedef void (*dp_convert_fn)(void *dst, const void *src, int64_t n);

/* dp_converter returns the function converting src_dtype to dst_dtype with the given isa
 * (a plain copy when the dtypes are equal); NULL for an unknown dtype. */
dp_convert_fn dp_converter(int32_t dst_dtype, int32_t src_dtype, int32_t isa);

/* dp_matrix_bytes is rows*cols*size(dtype), or -1 if the matrix is malformed or too large. */
int64_t dp_matrix_bytes(const dp_matrix *m);

/* dp_parallel_for runs fn(ctx, i, n_tasks) for i in [0, n_tasks) and returns when all are
 * done: task 0 on the calling thread, the others on a process-wide pool of worker threads
 * (dp_runtime.c), and on the calling thread for any no worker has claimed by the time task 0
 * is done, so every task runs exactly once, whatever other callers are doing. Safe to call
 * from several threads at once and from inside a task. */
void dp_parallel_for(int32_t n_tasks, void (*fn)(void *ctx, int32_t i, int32_t n), void *ctx);

/* dp_resize_window validates a resize job and gives the source window [x0, x1) x [y0, y1) it
 * reads (win = {x0, y0, x1, y1}); dp_resize_region runs the job from a buffer holding only a
 * window of the source (rw x rh at (rx, ry), packed) that contains it. (dp_resize.c) */
struct dp_resize_job;
dp_status dp_resize_window(const struct dp_resize_job *j, int32_t win[4], char *msg, size_t msg_len);
dp_status dp_resize_region(const struct dp_resize_job *j, const uint8_t *reg, int32_t rx, int32_t ry, int32_t rw, int32_t rh,
                           int32_t isa, char *msg, size_t msg_len);

#endif /* DP_INTERNAL_H */
