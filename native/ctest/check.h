/* check.h: the few helpers the C tests share. A failed check prints and counts; main returns
 * the count so ctest sees the failure. */
#ifndef DP_CHECK_H
#define DP_CHECK_H

#include <stdint.h>
#include <stdio.h>

static int check_failures __attribute__((unused));

#define CHECK(cond, ...)                                                  \
	do {                                                                  \
		if (!(cond)) {                                                    \
			fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                 \
			fputc('\n', stderr);                                          \
			if (++check_failures > 20) return check_failures;             \
		}                                                                 \
	} while (0)

/* splitmix64: a small, good generator; the seed is printed so a failure can be replayed. */
static uint64_t rng_state;

static inline uint64_t rng_next(void) {
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline void fill_random(void *p, size_t n) {
	unsigned char *b = p;
	for (size_t i = 0; i < n; i++) b[i] = (unsigned char)rng_next();
	if (n > 0) b[0] |= 1; /* never all zeros */
}

#endif
