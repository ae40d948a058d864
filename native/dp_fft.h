/* dp_fft.h: the FFT plan shared by dp_fft.c and dp_mel.c (not part of the ABI). */
#ifndef DP_FFT_H
#define DP_FFT_H

#include "dp_internal.h"

#define DP_FFT_MAX_STAGES 24

/*
 * A plan for complex FFTs of n points as a sequence of Stockham stages (radix 4, 2, 3, 5, in
 * that order), and the twiddles of the real-input FFT of 2n points built on it.
 * Stage s of radix r, entered with sub-transform length L (n for the first stage), has
 * m = L / r and twiddles exp(-2 pi i p k / L) for p < m, k = 1..r-1, stored at tw + off[s] as
 * [p][k-1]. Real FFT: rt[k] = exp(-2 pi i k / 2n) for k = 0..n.
 */
typedef struct dp_fft_plan {
	int32_t n;
	int32_t stages;
	int32_t radix[DP_FFT_MAX_STAGES];
	int32_t off[DP_FFT_MAX_STAGES];
	float *tw_re, *tw_im;
	float *rt_re, *rt_im;
} dp_fft_plan;

/* dp_fft_plan_init builds a plan for n (dp_fft_supported, <= DP_FFT_MAX); DP_ERR_NOMEM if the
 * tables cannot be allocated. dp_fft_plan_free releases them. */
dp_status dp_fft_plan_init(dp_fft_plan *p, int32_t n, char *msg, size_t msg_len);
void dp_fft_plan_free(dp_fft_plan *p);

#endif /* DP_FFT_H */
