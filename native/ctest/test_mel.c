/* test_mel.c: the FFT against a double-precision DFT, the log-mel variants against each other
 * and against the dense-DFT version, the resampler's variants against each other, and bad
 * arguments failing with a status. (The Go tests check the results against Whisper's.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../dp_media.h"
#include "check.h"

static double gauss(void) { /* Box-Muller */
	double u = ((double)(rng_next() >> 11) + 1) / 9007199254740993.0, v = (double)(rng_next() >> 11) / 9007199254740992.0;
	return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static int fft_sizes(void) {
	const int32_t sizes[] = {1, 2, 3, 4, 5, 8, 12, 25, 60, 200, 400, 480, 1000};
	char msg[160];
	for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
		int32_t n = sizes[s];
		float *re = malloc(sizeof(float) * n), *im = malloc(sizeof(float) * n);
		double *xr = malloc(sizeof(double) * n), *xi = malloc(sizeof(double) * n);
		for (int32_t j = 0; j < n; j++) xr[j] = re[j] = (float)gauss(), xi[j] = im[j] = (float)gauss();
		CHECK(dp_fft(re, im, n, msg, sizeof msg) == DP_OK, "%s", msg);
		double worst = 0;
		for (int32_t k = 0; k < n; k++) {
			double sr = 0, si = 0;
			for (int32_t j = 0; j < n; j++) {
				double a = -2 * M_PI * (double)((int64_t)j * k % n) / n;
				sr += xr[j] * cos(a) - xi[j] * sin(a);
				si += xr[j] * sin(a) + xi[j] * cos(a);
			}
			double d = hypot(re[k] - sr, im[k] - si);
			worst = d > worst ? d : worst;
		}
		CHECK(worst < 1e-5 * sqrt(n) * (2 + log2(n)), "fft %d: error %g", n, worst);
		free(re), free(im), free(xr), free(xi);
	}
	float re[7], im[7];
	CHECK(dp_fft(re, im, 7, msg, sizeof msg) == DP_ERR_UNSUPPORTED, "7 points accepted");
	CHECK(dp_fft(NULL, im, 8, msg, sizeof msg) == DP_ERR_INVALID, "null accepted");
	return check_failures;
}

static double max_diff(const float *a, const float *b, size_t n) {
	double w = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - b[i]);
		if (d > w || d != d) w = d;
	}
	return w;
}

static int log_mel(void) {
	char msg[160];
	int64_t n = 16000 * 2 + (int64_t)(rng_next() % 5000), zeros = (int64_t)(rng_next() % 3000);
	int64_t frames = dp_log_mel_frames(n + zeros);
	float *x = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * 80 * frames), *got = malloc(sizeof(float) * 80 * frames);
	for (int64_t i = 0; i < n; i++) x[i] = (float)(0.1 * gauss());
	CHECK(dp_log_mel_dft(x, n, zeros, 80, ref, 80 * frames, msg, sizeof msg) == DP_OK, "%s", msg);
	for (int32_t isa = DP_ISA_GENERIC; isa < DP_ISA_COUNT; isa++) {
		if (!dp_isa_supported(isa)) continue;
		for (int32_t threads = 1; threads <= 3; threads++) {
			CHECK(dp_log_mel(x, n, zeros, 80, got, 80 * frames, NULL, threads, isa, msg, sizeof msg) == DP_OK, "%s", msg);
			double d = max_diff(ref, got, (size_t)(80 * frames));
			CHECK(d < 1e-4, "isa %d threads %d: %g from the dense DFT", isa, threads, d);
		}
	}
	/* Bad arguments: a status and a message, nothing written. */
	got[0] = 12345;
	CHECK(dp_log_mel(x, 100, 0, 80, got, 80 * frames, NULL, 1, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "short");
	CHECK(dp_log_mel(x, n, zeros, 0, got, 80 * frames, NULL, 1, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "0 mels");
	CHECK(dp_log_mel(x, n, zeros, 80, got, 10, NULL, 1, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "small dst");
	CHECK(dp_log_mel(NULL, n, zeros, 80, got, 80 * frames, NULL, 1, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "null");
	CHECK(got[0] == 12345, "a refused call wrote dst");
	free(x), free(ref), free(got);
	return check_failures;
}

static int resample(void) {
	char msg[160];
	const int32_t rates[][2] = {{44100, 16000}, {48000, 16000}, {8000, 16000}, {22050, 16000}, {44056, 16000}, {16000, 16000}};
	int64_t n = 20000;
	float *x = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * 3 * n), *b = malloc(sizeof(float) * 3 * n);
	for (int64_t i = 0; i < n; i++) x[i] = (float)(0.3 * gauss());
	for (size_t r = 0; r < sizeof rates / sizeof rates[0]; r++) {
		int64_t m = dp_resample_len(n, rates[r][0], rates[r][1]);
		CHECK(m > 0 && m <= 3 * n, "length %lld", (long long)m);
		CHECK(dp_resample(x, n, rates[r][0], rates[r][1], a, m, DP_ISA_GENERIC, msg, sizeof msg) == DP_OK, "%s", msg);
		for (int32_t isa = DP_ISA_AVX2; isa < DP_ISA_COUNT; isa++) {
			if (!dp_isa_supported(isa)) continue;
			CHECK(dp_resample(x, n, rates[r][0], rates[r][1], b, m, isa, msg, sizeof msg) == DP_OK, "%s", msg);
			double d = max_diff(a, b, (size_t)m);
			CHECK(d < 1e-5, "%d -> %d: variant %d differs by %g", rates[r][0], rates[r][1], isa, d);
		}
	}
	CHECK(dp_resample(x, n, 0, 16000, a, n, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "rate 0");
	CHECK(dp_resample(x, n, 768000, 1000, a, n, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "decimation 768");
	CHECK(dp_resample(x, n, 8000, 16000, a, 10, DP_ISA_AUTO, msg, sizeof msg) == DP_ERR_INVALID, "small dst");
	free(x), free(a), free(b);
	return check_failures;
}

int main(void) {
	rng_state = (uint64_t)time(NULL);
	printf("seed %llu\n", (unsigned long long)rng_state);
	if (fft_sizes() || log_mel() || resample()) return check_failures;
	return check_failures;
}
