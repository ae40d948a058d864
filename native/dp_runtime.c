/* dp_runtime.c: error messages, sizes and the thread fan-out used by the kernels. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dp_internal.h"

dp_status dp_fail(char *msg, size_t msg_len, dp_status status, const char *fmt, ...) {
	if (msg != NULL && msg_len > 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, msg_len, fmt, ap);
		va_end(ap);
	}
	return status;
}

size_t dp_dtype_size(int32_t dtype) {
	switch (dtype) {
	case DP_F32: return 4;
	case DP_F16:
	case DP_BF16: return 2;
	default: return 0;
	}
}

int64_t dp_matrix_bytes(const dp_matrix *m) {
	size_t es = dp_dtype_size(m->dtype);
	if (es == 0 || m->rows < 0 || m->cols < 0) return -1;
	if (m->cols != 0 && m->rows > (INT64_MAX / 4) / m->cols) return -1; /* the product would overflow */
	return m->rows * m->cols * (int64_t)es;
}

#define DP_MAX_THREADS 256

typedef struct task {
	void (*fn)(void *ctx, int32_t i, int32_t n);
	void *ctx;
	int32_t i, n;
} task;

static void *run_task(void *arg) {
	task *t = arg;
	t->fn(t->ctx, t->i, t->n);
	return NULL;
}

void dp_parallel_for(int32_t n_tasks, void (*fn)(void *ctx, int32_t i, int32_t n), void *ctx) {
	if (n_tasks > DP_MAX_THREADS) n_tasks = DP_MAX_THREADS;
	if (n_tasks <= 1) {
		fn(ctx, 0, 1);
		return;
	}
	task tasks[DP_MAX_THREADS];
	pthread_t threads[DP_MAX_THREADS];
	unsigned char started[DP_MAX_THREADS];
	for (int32_t i = 1; i < n_tasks; i++) {
		tasks[i] = (task){fn, ctx, i, n_tasks};
		started[i] = pthread_create(&threads[i], NULL, run_task, &tasks[i]) == 0;
	}
	fn(ctx, 0, n_tasks);
	for (int32_t i = 1; i < n_tasks; i++) {
		if (started[i])
			pthread_join(threads[i], NULL);
		else
			fn(ctx, i, n_tasks);
	}
}

typedef struct copy_job {
	char *dst;
	const char *src;
	size_t n;
} copy_job;

static void copy_part(void *ctx, int32_t i, int32_t n) {
	copy_job *j = ctx;
	/* Split on 4 KiB boundaries so no two threads write the same page. */
	size_t pages = (j->n + 4095) / 4096;
	size_t lo = pages * (size_t)i / (size_t)n * 4096, hi = pages * (size_t)(i + 1) / (size_t)n * 4096;
	if (hi > j->n) hi = j->n;
	if (lo < hi) memcpy(j->dst + lo, j->src + lo, hi - lo);
}

void dp_copy_parallel(void *dst, const void *src, size_t n, int32_t n_threads) {
	copy_job j = {dst, src, n};
	dp_parallel_for(n_threads, copy_part, &j);
}
