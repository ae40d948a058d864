/* bench.h: what the C benchmarks share: a monotonic clock and the median of a run's times. */
#ifndef DP_BENCH_H
#define DP_BENCH_H

#include <stdlib.h>
#include <time.h>

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* median sorts v in place and returns its middle element. */
static double median(double *v, int n) {
	qsort(v, (size_t)n, sizeof *v, cmp_double);
	return v[n / 2];
}

#endif
