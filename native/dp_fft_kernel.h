/* dp_fft_kernel.h: the FFT and real-FFT kernels, written once over an element type VF that is
 * either float or a GCC vector of floats (then every element is an independent transform, e.g.
 * 8 STFT frames side by side). Included by a .c file after it defines:
 *   VF    the element type;   KFN(name)  the function name for this instantiation;
 *   KTGT  the function attributes (a target(...) for a vector instantiation, or nothing).
 * Arithmetic between VF and float broadcasts the float, so the same code serves both. */

#include <string.h>

/* One Stockham stage of radix r: x (length L = r*m, stride s) -> y. See dp_fft.h. */
KTGT __attribute__((unused)) static void KFN(fft_stage)(int32_t r, int32_t m, int32_t s, const float *twr, const float *twi, const VF *xr,
                                const VF *xi, VF *yr, VF *yi) {
	const float c5a = 0.309016994374947424f, c5b = -0.809016994374947424f; /* cos(2pi/5), cos(4pi/5) */
	const float s5a = 0.951056516295153572f, s5b = 0.587785252292473129f; /* sin(2pi/5), sin(4pi/5) */
	const float s3 = 0.866025403784438647f;                                 /* sin(2pi/3) */
	for (int32_t p = 0; p < m; p++) {
		const float *wr = twr + (size_t)p * (r - 1), *wi = twi + (size_t)p * (r - 1);
		for (int32_t q = 0; q < s; q++) {
			const VF *ar = xr + q + (size_t)s * p, *ai = xi + q + (size_t)s * p;
			const size_t st = (size_t)s * m; /* from input j to j + 1 */
			VF br[5], bi[5];
			if (r == 2) {
				br[0] = ar[0] + ar[st], bi[0] = ai[0] + ai[st];
				br[1] = ar[0] - ar[st], bi[1] = ai[0] - ai[st];
			} else if (r == 4) {
				VF t0r = ar[0] + ar[2 * st], t0i = ai[0] + ai[2 * st];
				VF t1r = ar[0] - ar[2 * st], t1i = ai[0] - ai[2 * st];
				VF t2r = ar[st] + ar[3 * st], t2i = ai[st] + ai[3 * st];
				VF t3r = ai[st] - ai[3 * st], t3i = ar[3 * st] - ar[st]; /* -i (a1 - a3) */
				br[0] = t0r + t2r, bi[0] = t0i + t2i;
				br[2] = t0r - t2r, bi[2] = t0i - t2i;
				br[1] = t1r + t3r, bi[1] = t1i + t3i;
				br[3] = t1r - t3r, bi[3] = t1i - t3i;
			} else if (r == 3) {
				VF sr = ar[st] + ar[2 * st], si = ai[st] + ai[2 * st];
				VF dr = ar[st] - ar[2 * st], di = ai[st] - ai[2 * st];
				VF tr = ar[0] - 0.5f * sr, ti = ai[0] - 0.5f * si;
				br[0] = ar[0] + sr, bi[0] = ai[0] + si;
				br[1] = tr + s3 * di, bi[1] = ti - s3 * dr; /* t - i s3 d */
				br[2] = tr - s3 * di, bi[2] = ti + s3 * dr;
			} else { /* r == 5 */
				VF s1r = ar[st] + ar[4 * st], s1i = ai[st] + ai[4 * st];
				VF d1r = ar[st] - ar[4 * st], d1i = ai[st] - ai[4 * st];
				VF s2r = ar[2 * st] + ar[3 * st], s2i = ai[2 * st] + ai[3 * st];
				VF d2r = ar[2 * st] - ar[3 * st], d2i = ai[2 * st] - ai[3 * st];
				VF t1r = ar[0] + c5a * s1r + c5b * s2r, t1i = ai[0] + c5a * s1i + c5b * s2i;
				VF t2r = ar[0] + c5b * s1r + c5a * s2r, t2i = ai[0] + c5b * s1i + c5a * s2i;
				VF u1r = s5a * d1r + s5b * d2r, u1i = s5a * d1i + s5b * d2i; /* y1 = t1 - i u1 */
				VF u2r = s5b * d1r - s5a * d2r, u2i = s5b * d1i - s5a * d2i; /* y2 = t2 - i u2 */
				br[0] = ar[0] + s1r + s2r, bi[0] = ai[0] + s1i + s2i;
				br[1] = t1r + u1i, bi[1] = t1i - u1r;
				br[4] = t1r - u1i, bi[4] = t1i + u1r;
				br[2] = t2r + u2i, bi[2] = t2i - u2r;
				br[3] = t2r - u2i, bi[3] = t2i + u2r;
			}
			VF *or_ = yr + q + (size_t)s * r * p, *oi = yi + q + (size_t)s * r * p;
			or_[0] = br[0], oi[0] = bi[0];
			for (int32_t k = 1; k < r; k++) {
				float c = wr[k - 1], d = wi[k - 1];
				or_[(size_t)s * k] = br[k] * c - bi[k] * d;
				oi[(size_t)s * k] = br[k] * d + bi[k] * c;
			}
		}
	}
}

/* fft runs every stage of the plan on (xr, xi), using (yr, yi) as the other half of the ping-pong;
 * res_r and res_i receive whichever pair holds the result. */
KTGT __attribute__((unused)) static void KFN(fft)(const dp_fft_plan *pl, VF *xr, VF *xi, VF *yr, VF *yi, VF **res_r, VF **res_i) {
	int32_t len = pl->n, s = 1;
	for (int32_t st = 0; st < pl->stages; st++) {
		int32_t r = pl->radix[st], m = len / r;
		KFN(fft_stage)(r, m, s, pl->tw_re + pl->off[st], pl->tw_im + pl->off[st], xr, xi, yr, yi);
		VF *t = xr;
		xr = yr, yr = t;
		t = xi, xi = yi, yi = t;
		len = m, s *= r;
	}
	*res_r = xr, *res_i = xi;
}

/* rfft_power turns Z = FFT_n(x[2j] + i x[2j+1]) into |X[k]|^2, k = 0..n, of the 2n real x. */
KTGT __attribute__((unused)) static void KFN(rfft_power)(const dp_fft_plan *pl, const VF *zr, const VF *zi, VF *power) {
	const int32_t n = pl->n;
	for (int32_t k = 0; k <= n; k++) {
		int32_t a = k == n ? 0 : k, b = k == 0 ? 0 : n - k;
		VF er = 0.5f * (zr[a] + zr[b]), ei = 0.5f * (zi[a] - zi[b]);
		VF or_ = 0.5f * (zi[a] + zi[b]), oi = -0.5f * (zr[a] - zr[b]); /* -i (Z[a] - conj Z[b]) / 2 */
		float c = pl->rt_re[k], d = pl->rt_im[k];
		VF xr = er + (c * or_ - d * oi), xi = ei + (c * oi + d * or_);
		power[k] = xr * xr + xi * xi;
	}
}

/* rfft_bins is rfft_power's complex form (for tests and dp_rfft): X[k] for k = 0..n. */
KTGT __attribute__((unused)) static void KFN(rfft_bins)(const dp_fft_plan *pl, const VF *zr, const VF *zi, VF *xr, VF *xi) {
	const int32_t n = pl->n;
	for (int32_t k = 0; k <= n; k++) {
		int32_t a = k == n ? 0 : k, b = k == 0 ? 0 : n - k;
		VF er = 0.5f * (zr[a] + zr[b]), ei = 0.5f * (zi[a] - zi[b]);
		VF or_ = 0.5f * (zi[a] + zi[b]), oi = -0.5f * (zr[a] - zr[b]);
		float c = pl->rt_re[k], d = pl->rt_im[k];
		xr[k] = er + (c * or_ - d * oi), xi[k] = ei + (c * oi + d * or_);
	}
}
