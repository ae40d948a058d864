/* dp_backend_cpu.c: the CPU backend's table. Device 0 is the host; a stream is a thread count,
 * and every call finishes before it returns. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dp_backend.h"
#include "dp_internal.h"

struct dp_stream {
	int32_t threads;
};

static int32_t cpu_device_count(void) { return 1; }

static dp_status cpu_device_info(int32_t device, dp_device_info *out, char *msg, size_t msg_len) {
	if (device != 0 || out == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "no CPU device %d", device);
	memset(out, 0, sizeof *out);
	strncpy(out->name, "cpu", sizeof out->name - 1);
	long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
	out->total_bytes = pages > 0 && size > 0 ? (int64_t)pages * size : 0;
	out->free_bytes = avail > 0 && size > 0 ? (int64_t)avail * size : 0;
	return DP_OK;
}

static dp_status cpu_alloc(int64_t bytes, void **out, char *msg, size_t msg_len) {
	if (out == NULL || bytes < 0) return dp_fail(msg, msg_len, DP_ERR_INVALID, "alloc: bad arguments (%lld bytes)", (long long)bytes);
	void *p = NULL;
	if (posix_memalign(&p, 4096, (size_t)(bytes > 0 ? bytes : 1)) != 0)
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "alloc: no memory for %lld bytes", (long long)bytes);
	*out = p;
	return DP_OK;
}

static void cpu_free(void *p) { free(p); }

static dp_status cpu_device_alloc(int32_t device, int64_t bytes, void **out, char *msg, size_t msg_len) {
	if (device != 0) return dp_fail(msg, msg_len, DP_ERR_INVALID, "no CPU device %d", device);
	return cpu_alloc(bytes, out, msg, msg_len);
}

static void cpu_device_free(int32_t device, void *p) {
	(void)device;
	free(p);
}

static dp_status cpu_stream_create(int32_t device, int32_t threads, dp_stream **out, char *msg, size_t msg_len) {
	if (device != 0 || out == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "no CPU device %d", device);
	dp_stream *s = malloc(sizeof *s);
	if (s == NULL) return dp_fail(msg, msg_len, DP_ERR_NOMEM, "no memory for a stream");
	s->threads = threads > 0 ? threads : 1;
	*out = s;
	return DP_OK;
}

static dp_status cpu_stream_sync(dp_stream *s, char *msg, size_t msg_len) {
	return s == NULL ? dp_fail(msg, msg_len, DP_ERR_INVALID, "null stream") : DP_OK;
}

static void cpu_stream_destroy(dp_stream *s) { free(s); }

static dp_status cpu_copy(dp_stream *s, void *dst, const void *src, int64_t bytes, int32_t kind, char *msg, size_t msg_len) {
	if (s == NULL || bytes < 0 || kind < DP_COPY_H2D || kind > DP_COPY_D2D || (bytes > 0 && (dst == NULL || src == NULL)))
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "copy: bad arguments (%lld bytes, kind %d)", (long long)bytes, kind);
	if (bytes > 0) dp_copy_parallel(dst, src, (size_t)bytes, (int32_t)(bytes >= (4 << 20) ? s->threads : 1));
	return DP_OK;
}

static dp_status cpu_convert(dp_stream *s, void *dst, int32_t dt, const void *src, int32_t st, int64_t n, char *msg,
                             size_t msg_len) {
	if (s == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null stream");
	return dp_convert(dst, dt, src, st, n, DP_ISA_AUTO, msg, msg_len);
}

static dp_status cpu_merge(dp_stream *s, const dp_merge_plan *p, char *msg, size_t msg_len) {
	if (s == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null stream");
	return dp_merge(p, s->threads, DP_ISA_AUTO, msg, msg_len);
}

static dp_status cpu_encoder_create(int32_t device, const dp_encoder_config *cfg, const dp_matrix *w, int64_t n,
                                    dp_encoder **out, char *msg, size_t msg_len) {
	if (device != 0) return dp_fail(msg, msg_len, DP_ERR_INVALID, "no CPU device %d", device);
	return dp_encoder_create(cfg, w, n, out, msg, msg_len);
}

static dp_status cpu_encoder_forward(dp_stream *s, dp_encoder *e, const dp_encoder_output *sel, const dp_encoder_item *items,
                                     int64_t n, char *msg, size_t msg_len) {
	if (s == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null stream");
	return dp_encoder_forward(e, sel, items, n, s->threads, DP_ISA_AUTO, msg, msg_len);
}

static const dp_backend cpu = {
	.abi_version = DP_BACKEND_ABI_VERSION,
	.name = "cpu",
	.device_count = cpu_device_count,
	.device_info = cpu_device_info,
	.host_alloc = cpu_alloc,
	.host_free = cpu_free,
	.device_alloc = cpu_device_alloc,
	.device_free = cpu_device_free,
	.stream_create = cpu_stream_create,
	.stream_sync = cpu_stream_sync,
	.stream_destroy = cpu_stream_destroy,
	.copy = cpu_copy,
	.convert = cpu_convert,
	.merge = cpu_merge,
	.encoder_create = cpu_encoder_create,
	.encoder_forward = cpu_encoder_forward,
	.encoder_tokens = dp_encoder_tokens,
	.encoder_width = dp_encoder_width,
	.encoder_free = dp_encoder_free,
};

const dp_backend *dp_cpu_backend(void) { return &cpu; }

dp_status dp_backend_check(const dp_backend *b, char *msg, size_t msg_len) {
	if (b == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null backend table");
	if (b->abi_version != DP_BACKEND_ABI_VERSION)
		return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "backend ABI version %d, this build needs %d", b->abi_version,
		               DP_BACKEND_ABI_VERSION);
	const void *entries[] = {b->name, b->device_count, b->device_info, b->host_alloc, b->host_free, b->device_alloc,
	                         b->device_free, b->stream_create, b->stream_sync, b->stream_destroy, b->copy, b->convert,
	                         b->merge, b->encoder_create, b->encoder_forward, b->encoder_tokens, b->encoder_width,
	                         b->encoder_free};
	for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
		if (entries[i] == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "backend table entry %zu is null", i);
	return DP_OK;
}
