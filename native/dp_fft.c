/* dp_fft.c: mixed-radix FFT plans and the scalar entry points (the log-mel runs the same
 * kernels on 8 frames at a time, dp_mel.c). Twiddles are computed in double and rounded once. */
#include <math.h>
#include <stdlib.h>

#include "dp_fft.h"
#include "dp_media.h"

#define VF float
#define KFN(name) name##_scalar
#define KTGT
#include "dp_fft_kernel.h"
#undef VF
#undef KFN
#undef KTGT

int dp_fft_supported(int32_t n) {
	if (n <= 0) return 0;
	while (n % 2 == 0) n /= 2;
	while (n % 3 == 0) n /= 3;
	while (n % 5 == 0) n /= 5;
	return n == 1;
}

void dp_fft_plan_free(dp_fft_plan *p) {
	free(p->tw_re);
	free(p->tw_im);
	free(p->rt_re);
	free(p->rt_im);
	p->tw_re = p->tw_im = p->rt_re = p->rt_im = NULL;
}

dp_status dp_fft_plan_init(dp_fft_plan *p, int32_t n, char *msg, size_t msg_len) {
	*p = (dp_fft_plan){.n = n};
	if (!dp_fft_supported(n) || n > DP_FFT_MAX)
		return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "fft: %d points (want a product of 2, 3 and 5, at most %d)", n,
		               DP_FFT_MAX);
	int32_t rest = n, tw = 0;
	static const int32_t order[] = {4, 2, 3, 5};
	for (int i = 0; i < 4; i++)
		while (rest % order[i] == 0 && (order[i] != 2 || rest % 4 != 0)) {
			p->radix[p->stages] = order[i];
			p->off[p->stages++] = tw;
			tw += rest / order[i] * (order[i] - 1);
			rest /= order[i];
		}
	p->tw_re = malloc((size_t)(tw + 1) * sizeof(float));
	p->tw_im = malloc((size_t)(tw + 1) * sizeof(float));
	p->rt_re = malloc((size_t)(n + 1) * sizeof(float));
	p->rt_im = malloc((size_t)(n + 1) * sizeof(float));
	if (!p->tw_re || !p->tw_im || !p->rt_re || !p->rt_im) {
		dp_fft_plan_free(p);
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "fft: cannot allocate the tables for %d points", n);
	}
	int32_t len = n;
	for (int32_t s = 0; s < p->stages; s++) {
		int32_t r = p->radix[s], m = len / r;
		for (int32_t q = 0; q < m; q++)
			for (int32_t k = 1; k < r; k++) {
				double a = -2.0 * M_PI * (double)q * (double)k / (double)len;
				p->tw_re[p->off[s] + q * (r - 1) + k - 1] = (float)cos(a);
				p->tw_im[p->off[s] + q * (r - 1) + k - 1] = (float)sin(a);
			}
		len = m;
	}
	for (int32_t k = 0; k <= n; k++) {
		double a = -M_PI * (double)k / (double)n;
		p->rt_re[k] = (float)cos(a);
		p->rt_im[k] = (float)sin(a);
	}
	return DP_OK;
}

dp_status dp_fft(float *re, float *im, int32_t n, char *msg, size_t msg_len) {
	if (re == NULL || im == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "fft: null input");
	dp_fft_plan p;
	dp_status st = dp_fft_plan_init(&p, n, msg, msg_len);
	if (st != DP_OK) return st;
	float *tmp = malloc((size_t)n * 2 * sizeof(float));
	if (tmp == NULL) {
		dp_fft_plan_free(&p);
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "fft: cannot allocate %d points of scratch", n);
	}
	float *rr, *ri;
	fft_scalar(&p, re, im, tmp, tmp + n, &rr, &ri);
	if (rr != re) {
		memcpy(re, rr, (size_t)n * sizeof(float));
		memcpy(im, ri, (size_t)n * sizeof(float));
	}
	free(tmp);
	dp_fft_plan_free(&p);
	return DP_OK;
}

dp_status dp_rfft(const float *x, int32_t n, float *re, float *im, char *msg, size_t msg_len) {
	if (x == NULL || re == NULL || im == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "rfft: null input or output");
	if (n < 2 || n % 2 != 0) return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "rfft: %d points (want an even count)", n);
	int32_t h = n / 2;
	dp_fft_plan p;
	dp_status st = dp_fft_plan_init(&p, h, msg, msg_len);
	if (st != DP_OK) return st;
	float *buf = malloc((size_t)h * 4 * sizeof(float));
	if (buf == NULL) {
		dp_fft_plan_free(&p);
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "rfft: cannot allocate %d points of scratch", n);
	}
	float *zr = buf, *zi = buf + h, *rr, *ri;
	for (int32_t j = 0; j < h; j++) zr[j] = x[2 * j], zi[j] = x[2 * j + 1];
	fft_scalar(&p, zr, zi, buf + 2 * h, buf + 3 * h, &rr, &ri);
	rfft_bins_scalar(&p, rr, ri, re, im);
	free(buf);
	dp_fft_plan_free(&p);
	return DP_OK;
}
