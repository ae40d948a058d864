/* dp_runtime.c: error messages, sizes and the thread fan-out used by the kernels. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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

/* The fan-out runs on a pool of worker threads started on first need and kept for the life of
 * the process (never joined: they hold no memory and sleep when idle; the OS ends them at exit).
 * Creating threads per call cost tens of microseconds, a few percent of a one-image GEMM.
 *
 * A call posts a job (fn, ctx, n tasks) on a list; idle workers claim its tasks one index at a
 * time, and so does the caller after running task 0, so a call finishes even when every worker
 * is busy with another caller's job (several goroutines call kernels at once) or could not be
 * started, and a task may itself fan out. Claims and completions happen under one mutex; the
 * job lives on the caller's stack and is touched by workers only under it, and the caller
 * returns only once every task is done. An idle worker spins a short while (kernels of a
 * forward pass follow each other within microseconds) before it sleeps on a condition variable.
 * The pool grows to the largest fan-out asked for, at most DP_MAX_THREADS - 1 workers. */
typedef struct job {
	void (*fn)(void *ctx, int32_t i, int32_t n);
	void *ctx;
	int32_t n, next, pending; /* tasks; the next to claim; those claimed by others not yet done */
	pthread_cond_t done;
	struct job *link;
} job;

static struct {
	pthread_mutex_t mu;
	pthread_cond_t work;
	job *head;        /* jobs with tasks left to claim, oldest first */
	int32_t workers;  /* started */
	int32_t sleepers; /* waiting on work */
	uint32_t posted;  /* bumped on every post; what spinning workers watch */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0};

enum { SPIN_NS = 100000 };

static int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* claim takes the next task of j (pool.mu held), unlinking j once none is left. */
static int32_t claim(job *j) {
	int32_t i = j->next++;
	if (j->next >= j->n) {
		job **p = &pool.head;
		while (*p != j) p = &(*p)->link;
		*p = j->link;
	}
	return i;
}

static void *worker(void *arg) {
	(void)arg;
	pthread_mutex_lock(&pool.mu);
	for (;;) {
		job *j = pool.head;
		if (j == NULL) {
			/* Spin unlocked on the post counter, then sleep. */
			uint32_t seen = __atomic_load_n(&pool.posted, __ATOMIC_RELAXED);
			pthread_mutex_unlock(&pool.mu);
			int64_t until = now_ns() + SPIN_NS;
			for (int spins = 0; __atomic_load_n(&pool.posted, __ATOMIC_ACQUIRE) == seen; spins++) {
				cpu_relax();
				if ((spins & 255) == 255 && now_ns() > until) break;
			}
			pthread_mutex_lock(&pool.mu);
			if (pool.head == NULL) {
				pool.sleepers++;
				pthread_cond_wait(&pool.work, &pool.mu);
				pool.sleepers--;
			}
			continue;
		}
		int32_t i = claim(j);
		j->pending++;
		pthread_mutex_unlock(&pool.mu);
		j->fn(j->ctx, i, j->n); /* fn, ctx and n stay valid: j's caller waits for this task */
		pthread_mutex_lock(&pool.mu);
		if (--j->pending == 0) pthread_cond_signal(&j->done);
	}
	return NULL;
}

void dp_parallel_for(int32_t n_tasks, void (*fn)(void *ctx, int32_t i, int32_t n), void *ctx) {
	if (n_tasks > DP_MAX_THREADS) n_tasks = DP_MAX_THREADS;
	if (n_tasks <= 1) {
		fn(ctx, 0, 1);
		return;
	}
	job j = {fn, ctx, n_tasks, 1, 0, PTHREAD_COND_INITIALIZER, NULL};
	pthread_mutex_lock(&pool.mu);
	/* Grow the pool to n_tasks - 1 workers; a worker that cannot be started leaves its share
	 * to the others and the caller. */
	while (pool.workers < n_tasks - 1) {
		pthread_t t;
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		int ok = pthread_create(&t, &attr, worker, NULL) == 0;
		pthread_attr_destroy(&attr);
		if (!ok) break;
		pool.workers++;
	}
	job **tail = &pool.head;
	while (*tail != NULL) tail = &(*tail)->link;
	*tail = &j;
	__atomic_fetch_add(&pool.posted, 1, __ATOMIC_RELEASE);
	for (int32_t w = 0; w < pool.sleepers && w < n_tasks - 1; w++) pthread_cond_signal(&pool.work);
	pthread_mutex_unlock(&pool.mu);

	fn(ctx, 0, n_tasks);

	pthread_mutex_lock(&pool.mu);
	while (j.next < j.n) { /* tasks no worker has claimed yet */
		int32_t i = claim(&j);
		pthread_mutex_unlock(&pool.mu);
		fn(ctx, i, n_tasks);
		pthread_mutex_lock(&pool.mu);
	}
	while (j.pending > 0) pthread_cond_wait(&j.done, &pool.mu);
	pthread_mutex_unlock(&pool.mu);
	pthread_cond_destroy(&j.done);
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
