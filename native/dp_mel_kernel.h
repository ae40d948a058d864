/* dp_mel_kernel.h: the log-mel of a run of STFT frames, written once over VF (float, or a vector
 * of VW floats holding VW consecutive frames). Included by dp_mel.c after dp_fft_kernel.h with
 * VF, VI (the integer type of VF's width), VW, KFN, KTGT, VMAX(a, b) and I2F(v) defined. */

/* log10 of max(x, 1e-10) without libm, so it vectorises: x = 2^e m with m in [sqrt(1/2),
 * sqrt(2)), ln m = 2 atanh(t), t = (m - 1)/(m + 1), |t| <= 0.172, by its series to t^9
 * (truncation < 3e-9), e ln 2 in two parts. Error ~1 ulp of the result. */
KTGT __attribute__((unused)) static inline VF KFN(log10)(VF x) {
	const VF floor = (VF){0} + 1e-10f;
	x = VMAX(x, floor);
	VI i;
	memcpy(&i, &x, sizeof i);
	i = i - 0x3f3504f3;
	VI e = i >> 23, mi = (i & 0x7fffff) + 0x3f3504f3;
	VF m;
	memcpy(&m, &mi, sizeof m);
	VF t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
	VF ln_m = 2.0f * t * (1.0f + t2 * (1.0f / 3 + t2 * (1.0f / 5 + t2 * (1.0f / 7 + t2 * (1.0f / 9)))));
	VF ef = I2F(e);
	VF ln = ef * 0.693145751953125f + (ef * 1.42860682030941723212e-6f + ln_m); /* ln 2 = hi + lo */
	return ln * 0.434294481903251827651f;
}

/* mel_frames writes log10 mel values for frames [f0, f1) of j, VW at a time; frames past the
 * last whole group are left to the caller. Returns the count done; *vmax holds their maximum. */
KTGT __attribute__((unused)) static int64_t KFN(mel_frames)(const mel_job *j, int64_t f0, int64_t f1, float *vmax_out) {
	enum { H = DP_WHISPER_N_FFT / 2, BINS = H + 1 };
	float re[H * VW] __attribute__((aligned(64))), im[H * VW] __attribute__((aligned(64)));
	float tr[H * VW] __attribute__((aligned(64))), ti[H * VW] __attribute__((aligned(64)));
	float pw[BINS * VW] __attribute__((aligned(64)));
	const float *w = j->window, *x = j->x;
	VF vmax = (VF){0} - INFINITY;
	int64_t f = f0;
	for (; f + VW <= f1; f += VW) {
#ifdef KLOAD
		/* All VW frames inside the signal: a vector load of them (KLOAD: transposes in registers). */
		int64_t first = f * DP_WHISPER_HOP - H, last = (f + VW - 1) * DP_WHISPER_HOP - H;
		if (first >= 0 && last + DP_WHISPER_N_FFT <= j->n_samples)
			KLOAD(x + first, w, re, im);
		else
#endif
		for (int l = 0; l < VW; l++) {
			int64_t base = (f + l) * DP_WHISPER_HOP - H;
			if (base >= 0 && base + DP_WHISPER_N_FFT <= j->n_samples) {
				const float *s = x + base;
				for (int k = 0; k < H; k++) {
					re[k * VW + l] = s[2 * k] * w[2 * k];
					im[k * VW + l] = s[2 * k + 1] * w[2 * k + 1];
				}
			} else {
				for (int k = 0; k < H; k++) {
					re[k * VW + l] = sample_at(j, base + 2 * k) * w[2 * k];
					im[k * VW + l] = sample_at(j, base + 2 * k + 1) * w[2 * k + 1];
				}
			}
		}
		VF *zr, *zi;
		KFN(fft)(j->plan, (VF *)re, (VF *)im, (VF *)tr, (VF *)ti, &zr, &zi);
		KFN(rfft_power)(j->plan, zr, zi, (VF *)pw);
		const VF *p = (const VF *)pw;
		for (int32_t m = 0; m < j->bank.n_mels; m++) {
			const float *wm = j->bank.w + j->bank.off[m];
			const VF *pm = p + j->bank.lo[m];
			VF acc = (VF){0};
			for (int32_t t = 0; t < j->bank.cnt[m]; t++) acc += wm[t] * pm[t];
			VF v = KFN(log10)(acc);
			vmax = VMAX(vmax, v);
			memcpy(j->dst + (size_t)m * j->n_frames + f, &v, sizeof v);
		}
	}
	float mx = -INFINITY;
	const float *lanes = (const float *)&vmax;
	for (int l = 0; l < VW; l++) mx = lanes[l] > mx ? lanes[l] : mx;
	*vmax_out = mx;
	return f - f0;
}
