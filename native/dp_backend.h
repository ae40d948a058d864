/*
 * dp_backend.h: a compute backend as one versioned table of entry points. The CPU backend
 * (dp_cpu_backend, in this library) and the CUDA plugin (libdataplane_cuda.so, which exports
 * `const dp_backend *dp_plugin_init(void)`) implement the same table, so the daemon and the
 * conformance tests drive either the same way. The rules of dp.h hold for every entry: a
 * status and a message, never an abort.
 *
 * Memory: "device" buffers belong to the backend (GPU memory for CUDA; host memory for the
 * CPU backend, where device 0 is the host); "host" buffers are page-locked where that matters
 * (cudaHostAlloc) and ordinary aligned memory otherwise. Kernels take device pointers. Work is
 * queued on a stream and runs in order; stream_sync waits for it (the CPU backend runs each
 * call before returning, so its streams are always idle).
 */
#ifndef DP_BACKEND_H
#define DP_BACKEND_H

#include "dp_encoder.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever the table below changes. A plugin built for another version is refused. */
#define DP_BACKEND_ABI_VERSION 1

typedef struct dp_stream dp_stream;

typedef enum dp_copy_kind {
	DP_COPY_H2D = 0,
	DP_COPY_D2H = 1,
	DP_COPY_D2D = 2,
} dp_copy_kind;

typedef struct dp_device_info {
	char name[96];
	int64_t total_bytes, free_bytes;
	int32_t compute_major, compute_minor; /* 0, 0 for the CPU */
} dp_device_info;

typedef struct dp_backend {
	int32_t abi_version; /* DP_BACKEND_ABI_VERSION */
	const char *name;    /* "cpu", "cuda" */

	int32_t (*device_count)(void);
	dp_status (*device_info)(int32_t device, dp_device_info *out, char *msg, size_t msg_len);

	dp_status (*host_alloc)(int64_t bytes, void **out, char *msg, size_t msg_len);
	void (*host_free)(void *p);
	dp_status (*device_alloc)(int32_t device, int64_t bytes, void **out, char *msg, size_t msg_len);
	void (*device_free)(int32_t device, void *p);

	/* threads: CPU worker threads for the stream's kernels (the CUDA backend ignores it). */
	dp_status (*stream_create)(int32_t device, int32_t threads, dp_stream **out, char *msg, size_t msg_len);
	dp_status (*stream_sync)(dp_stream *s, char *msg, size_t msg_len);
	void (*stream_destroy)(dp_stream *s);
	dp_status (*copy)(dp_stream *s, void *dst, const void *src, int64_t bytes, int32_t kind, char *msg, size_t msg_len);

	dp_status (*convert)(dp_stream *s, void *dst, int32_t dst_dtype, const void *src, int32_t src_dtype, int64_t n,
	                     char *msg, size_t msg_len);
	dp_status (*merge)(dp_stream *s, const dp_merge_plan *plan, char *msg, size_t msg_len);

	/* Encoders: weights are host memory (converted and uploaded by create); items' inputs and
	 * outputs are device memory. */
	dp_status (*encoder_create)(int32_t device, const dp_encoder_config *cfg, const dp_matrix *weights, int64_t n_weights,
	                            dp_encoder **out, char *msg, size_t msg_len);
	dp_status (*encoder_forward)(dp_stream *s, dp_encoder *e, const dp_encoder_output *sel, const dp_encoder_item *items,
	                             int64_t n_items, char *msg, size_t msg_len);
	int64_t (*encoder_tokens)(const dp_encoder *e, const dp_encoder_output *sel, int64_t frames);
	int64_t (*encoder_width)(const dp_encoder *e, const dp_encoder_output *sel);
	void (*encoder_free)(dp_encoder *e);
} dp_backend;

/* The name of the symbol a plugin exports, and its type. */
#define DP_PLUGIN_INIT_SYMBOL "dp_plugin_init"
typedef const dp_backend *(*dp_plugin_init_fn)(void);

/* dp_cpu_backend is the backend this library implements. */
const dp_backend *dp_cpu_backend(void);

/* dp_backend_check says what is wrong with a table (a plugin's), or returns DP_OK. */
dp_status dp_backend_check(const dp_backend *b, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif

#endif /* DP_BACKEND_H */
