/* bench_mel.c: Whisper log-mel of 30 s of audio (3000 frames, 80 mels) on each variant and 1 and
 * 2 threads, beside the dense-DFT version of the same computation in the same run. Prints the
 * median of RUNS and the ratio DFT time / FFT time. */
#include <math.h>
#include <stdlib.h>

#include "../dp_media.h"
#include "bench.h"
#include "check.h"

enum { N = 480000, MELS = 80, RUNS = 31 };

int main(void) {
	float *x = malloc(sizeof(float) * N);
	int64_t frames = dp_log_mel_frames(N);
	float *dst = malloc(sizeof(float) * MELS * frames);
	char msg[160];
	for (int i = 0; i < N; i++) x[i] = (float)(0.3 * sin(2 * M_PI * 220 * i / 16000.0) + 0.01 * sin(i * 1e-3 * i));
	double t_dft[3];
	for (int r = 0; r < 3; r++) {
		double t0 = now();
		if (dp_log_mel_dft(x, N, 0, MELS, dst, MELS * frames, msg, sizeof msg) != DP_OK) return fprintf(stderr, "%s\n", msg), 1;
		t_dft[r] = now() - t0;
	}
	double dft = median(t_dft, 3);
	printf("log-mel of 30 s, %d mels, %lld frames; dense DFT: %.2f ms\n", MELS, (long long)frames, dft * 1e3);
	for (int32_t isa = DP_ISA_GENERIC; isa < DP_ISA_COUNT; isa++) {
		if (!dp_isa_supported(isa)) continue;
		for (int32_t threads = 1; threads <= 2; threads++) {
			double t[RUNS];
			for (int r = 0; r < RUNS; r++) {
				double t0 = now();
				if (dp_log_mel(x, N, 0, MELS, dst, MELS * frames, NULL, threads, isa, msg, sizeof msg) != DP_OK)
					return fprintf(stderr, "%s\n", msg), 1;
				t[r] = now() - t0;
			}
			double m = median(t, RUNS);
			printf("variant %d, %d thread(s): %.3f ms per 30 s  (dft/fft %.1fx)\n", isa, threads, m * 1e3, dft / m);
		}
	}
	free(x);
	free(dst);
	return 0;
}
