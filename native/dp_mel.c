/* dp_mel.c: Slaney mel filters and Whisper's log-mel spectrogram.
 *
 * Each frame: 400 samples (reflect-padded at the signal's ends) times a periodic Hann window,
 * a 400-point real FFT done as one 200-point complex FFT (radix 4 x 2 x 5 x 5, dp_fft_kernel.h)
 * plus the split step, power, the mel filters as sparse rows (only their non-zero bins), log10.
 * The AVX2 variant runs the same code on 8 consecutive frames at once (one frame per lane), the
 * portable one on one frame; frames are split over threads in runs of 8; the max over all frames
 * is taken before the clamp, as Whisper does. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dp_fft.h"
#include "dp_media.h"

#if DP_X86
#include <immintrin.h>
#endif

/* ---- Slaney mel scale (librosa's hz_to_mel / mel_to_hz with htk=False) ---- */

static const double f_sp = 200.0 / 3, min_log_hz = 1000.0, min_log_mel = 15.0; /* min_log_hz / f_sp */

static double logstep(void) { return log(6.4) / 27.0; }

static double hz_to_mel(double f) { return f >= min_log_hz ? min_log_mel + log(f / min_log_hz) / logstep() : f / f_sp; }

static double mel_to_hz(double m) { return m >= min_log_mel ? min_log_hz * exp(logstep() * (m - min_log_mel)) : f_sp * m; }

dp_status dp_mel_filters(int32_t n_mels, int32_t n_fft, int32_t sample_rate, float *dst, char *msg, size_t msg_len) {
	if (dst == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "mel filters: null destination");
	if (n_mels < 1 || n_mels > 512) return dp_fail(msg, msg_len, DP_ERR_INVALID, "mel filters: %d mels (1..512)", n_mels);
	if (n_fft < 2 || n_fft > DP_FFT_MAX || n_fft % 2 != 0)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "mel filters: n_fft %d (even, 2..%d)", n_fft, DP_FFT_MAX);
	if (sample_rate < 1 || sample_rate > DP_RESAMPLE_MAX_RATE)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "mel filters: sample rate %d", sample_rate);
	const int32_t bins = n_fft / 2 + 1, n_pts = n_mels + 2;
	double *mel_f = malloc((size_t)n_pts * sizeof(double));
	if (mel_f == NULL) return dp_fail(msg, msg_len, DP_ERR_NOMEM, "mel filters: cannot allocate %d points", n_pts);
	/* np.linspace(0, hz_to_mel(sr / 2), n_mels + 2), the last point exact, then to Hz. */
	double max_mel = hz_to_mel(sample_rate / 2.0), step = max_mel / (n_pts - 1);
	for (int32_t i = 0; i < n_pts; i++) mel_f[i] = mel_to_hz(i == n_pts - 1 ? max_mel : i * step);
	for (int32_t m = 0; m < n_mels; m++) {
		double fd_lo = mel_f[m + 1] - mel_f[m], fd_hi = mel_f[m + 2] - mel_f[m + 1];
		double enorm = 2.0 / (mel_f[m + 2] - mel_f[m]);
		for (int32_t k = 0; k < bins; k++) {
			double freq = (double)k * sample_rate / n_fft;
			double lower = -(mel_f[m] - freq) / fd_lo, upper = (mel_f[m + 2] - freq) / fd_hi;
			double wgt = fmax(0.0, fmin(lower, upper));
			/* librosa stores the triangle in float32, then scales it by enorm (in float64) in place. */
			dst[(size_t)m * bins + k] = (float)((double)(float)wgt * enorm);
		}
	}
	free(mel_f);
	return DP_OK;
}

/* ---- the log-mel ---- */

/* The filter bank as sparse rows: mel m has cnt[m] weights w[off[m]..] for bins lo[m].. */
typedef struct mel_bank {
	int32_t n_mels;
	int32_t *lo, *cnt, *off;
	float *w;
} mel_bank;

static void bank_free(mel_bank *b) {
	free(b->lo);
	free(b->cnt);
	free(b->off);
	free(b->w);
}

static dp_status bank_init(mel_bank *b, int32_t n_mels, char *msg, size_t msg_len) {
	const int32_t bins = DP_WHISPER_N_FFT / 2 + 1;
	memset(b, 0, sizeof *b);
	float *dense = malloc((size_t)n_mels * bins * sizeof(float));
	b->n_mels = n_mels;
	b->lo = malloc((size_t)n_mels * sizeof(int32_t));
	b->cnt = malloc((size_t)n_mels * sizeof(int32_t));
	b->off = malloc((size_t)n_mels * sizeof(int32_t));
	b->w = malloc((size_t)n_mels * bins * sizeof(float));
	if (!dense || !b->lo || !b->cnt || !b->off || !b->w) {
		free(dense);
		bank_free(b);
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "log-mel: cannot allocate the filter bank");
	}
	dp_status st = dp_mel_filters(n_mels, DP_WHISPER_N_FFT, DP_WHISPER_SAMPLE_RATE, dense, msg, msg_len);
	int32_t at = 0;
	for (int32_t m = 0; st == DP_OK && m < n_mels; m++) {
		const float *row = dense + (size_t)m * bins;
		int32_t lo = 0, hi = bins;
		while (lo < bins && row[lo] == 0) lo++;
		while (hi > lo && row[hi - 1] == 0) hi--;
		b->lo[m] = lo < bins ? lo : 0;
		b->cnt[m] = hi - lo;
		b->off[m] = at;
		for (int32_t k = lo; k < hi; k++) b->w[at++] = row[k];
	}
	free(dense);
	if (st != DP_OK) bank_free(b);
	return st;
}

typedef struct mel_job {
	const float *x;
	int64_t n_samples, n_total, n_frames;
	const dp_fft_plan *plan;
	const float *window;
	mel_bank bank;
	float *dst;
	int32_t isa, n_tasks;
	float gmax;
	float task_max[256];
} mel_job;

/* sample_at is the padded signal at index s of the unpadded one: reflected at both ends of the
 * n_total samples (torch's reflect padding), zeros past the n_samples given. */
static inline float sample_at(const mel_job *j, int64_t s) {
	if (s < 0) s = -s;
	if (s >= j->n_total) s = 2 * (j->n_total - 1) - s;
	return s < j->n_samples ? j->x[s] : 0.0f;
}

#define VF float
#define VI int32_t
#define VW 1
#define KFN(name) name##_generic
#define KTGT
#define VMAX(a, b) ((a) > (b) ? (a) : (b))
#define I2F(v) ((float)(v))
#include "dp_fft_kernel.h"
#include "dp_mel_kernel.h"
#undef VF
#undef VI
#undef VW
#undef KFN
#undef KTGT
#undef VMAX
#undef I2F

#if DP_X86
typedef float v8f __attribute__((vector_size(32), may_alias));
typedef int32_t v8i __attribute__((vector_size(32), may_alias));
#define VF v8f
#define VI v8i
#define VW 8
#define KFN(name) name##_avx2
#define KTGT __attribute__((target("avx2,fma")))
#define VMAX(a, b) ((v8f)_mm256_max_ps((__m256)(a), (__m256)(b)))
#define I2F(v) __builtin_convertvector((v), v8f)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#include "dp_fft_kernel.h"
#include "dp_mel_kernel.h"
#pragma GCC diagnostic pop
#undef VF
#undef VI
#undef VW
#undef KFN
#undef KTGT
#undef VMAX
#undef I2F

/* AVX-512: 16 frames a vector. load16 fills re/im ([200][16]: sample pair k of frame l at
 * k*16 + l) from 16 frames starting hop samples apart at s0, windowed: blocks of 16 samples of
 * the 16 frames are loaded as rows and transposed in registers (unpack ps, unpack pd, two
 * 128-bit lane shuffles: column c ends in vector c), instead of 6,400 scalar stores. */
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))) static void load16_avx512(const float *s0, const float *w,
                                                                                       float *re, float *im) {
	for (int b = 0; b < DP_WHISPER_N_FFT / 16; b++) {
		__m512 r[16], t[16];
		for (int l = 0; l < 16; l++) r[l] = _mm512_loadu_ps(s0 + (size_t)l * DP_WHISPER_HOP + 16 * b);
		for (int i = 0; i < 8; i++) {
			t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
			t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
		}
		for (int i = 0; i < 4; i++) {
			__m512d a = _mm512_castps_pd(t[4 * i]), c = _mm512_castps_pd(t[4 * i + 2]);
			__m512d a1 = _mm512_castps_pd(t[4 * i + 1]), c1 = _mm512_castps_pd(t[4 * i + 3]);
			r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
			r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
			r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, c1));
			r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, c1));
		}
		for (int i = 0; i < 2; i++)
			for (int k = 0; k < 4; k++) {
				t[8 * i + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
				t[8 * i + 4 + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0xdd);
			}
		for (int k = 0; k < 8; k++) {
			r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
			r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
		}
		for (int c = 0; c < 16; c += 2) {
			int n = 16 * b + c;
			_mm512_store_ps(re + (size_t)(n / 2) * 16, _mm512_mul_ps(r[c], _mm512_set1_ps(w[n])));
			_mm512_store_ps(im + (size_t)(n / 2) * 16, _mm512_mul_ps(r[c + 1], _mm512_set1_ps(w[n + 1])));
		}
	}
}
#define KLOAD(s0, w, re, im) load16_avx512((s0), (w), (re), (im))

/* AVX-512: 16 frames a vector. */
typedef float v16f __attribute__((vector_size(64), may_alias));
typedef int32_t v16i __attribute__((vector_size(64), may_alias));
#define VF v16f
#define VI v16i
#define VW 16
#define KFN(name) name##_avx512
#define KTGT __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma")))
#define VMAX(a, b) ((v16f)_mm512_max_ps((__m512)(a), (__m512)(b)))
#define I2F(v) __builtin_convertvector((v), v16f)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#include "dp_fft_kernel.h"
#include "dp_mel_kernel.h"
#pragma GCC diagnostic pop
#undef VF
#undef VI
#undef VW
#undef KFN
#undef KTGT
#undef VMAX
#undef I2F
#undef KLOAD
#endif

/* Task i of n handles frames [i F / n, (i + 1) F / n), boundaries on multiples of 8. */
static void task_range(const mel_job *j, int32_t i, int32_t n, int64_t *f0, int64_t *f1) {
	int64_t groups = (j->n_frames + 7) / 8;
	*f0 = groups * i / n * 8;
	*f1 = groups * (i + 1) / n * 8;
	if (*f1 > j->n_frames) *f1 = j->n_frames;
	if (*f0 > *f1) *f0 = *f1;
}

static void compute_task(void *ctx, int32_t i, int32_t n) {
	mel_job *j = ctx;
	int64_t f0, f1, done = 0;
	task_range(j, i, n, &f0, &f1);
	float mx = -INFINITY, m2 = -INFINITY;
#if DP_X86
	float m16 = -INFINITY;
	if (j->isa >= DP_ISA_AVX512) done = mel_frames_avx512(j, f0, f1, &m16);
	if (j->isa >= DP_ISA_AVX2) done += mel_frames_avx2(j, f0 + done, f1, &mx);
	mx = m16 > mx ? m16 : mx;
#endif
	mel_frames_generic(j, f0 + done, f1, &m2);
	j->task_max[i] = mx > m2 ? mx : m2;
}

/* clamp applies max(x, gmax - 8) and (x + 4) / 4 (one pass; cheap beside the FFTs, so on the
 * calling thread). */
static void clamp(float *x, int64_t n, float gmax) {
	const float lo = gmax - 8.0f;
	for (int64_t i = 0; i < n; i++) {
		float v = x[i] < lo ? lo : x[i];
		x[i] = (v + 4.0f) / 4.0f;
	}
}

/* The FFT plan, the window and the filter banks are the same for every call (~0.2 ms to build,
 * a seventh of a 30 s log-mel): built on first use and kept for the process, read-only after;
 * banks for up to DP_MEL_BANKS mel counts (80 and 128 in practice), others built per call. */
#define DP_MEL_BANKS 4
static pthread_mutex_t setup_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
	int ready;
	dp_fft_plan plan;
	float window[DP_WHISPER_N_FFT];
	int32_t n_banks;
	mel_bank banks[DP_MEL_BANKS];
} setup;

/* setup_get fills j's plan, window and bank; *owned: the bank is j's to free. */
static dp_status setup_get(mel_job *j, int32_t n_mels, int *owned, char *msg, size_t msg_len) {
	dp_status st = DP_OK;
	*owned = 0;
	pthread_mutex_lock(&setup_mu);
	if (!setup.ready) {
		st = dp_fft_plan_init(&setup.plan, DP_WHISPER_N_FFT / 2, msg, msg_len);
		for (int k = 0; k < DP_WHISPER_N_FFT; k++) setup.window[k] = (float)(0.5 - 0.5 * cos(2.0 * M_PI * k / DP_WHISPER_N_FFT));
		setup.ready = st == DP_OK;
	}
	if (st == DP_OK) {
		j->plan = &setup.plan;
		j->window = setup.window;
		int32_t i = 0;
		while (i < setup.n_banks && setup.banks[i].n_mels != n_mels) i++;
		if (i < setup.n_banks) {
			j->bank = setup.banks[i];
		} else if (setup.n_banks < DP_MEL_BANKS) {
			if ((st = bank_init(&setup.banks[i], n_mels, msg, msg_len)) == DP_OK) j->bank = setup.banks[setup.n_banks++];
		} else {
			st = bank_init(&j->bank, n_mels, msg, msg_len);
			*owned = st == DP_OK;
		}
	}
	pthread_mutex_unlock(&setup_mu);
	return st;
}

int64_t dp_log_mel_frames(int64_t n_total) { return n_total < 0 ? 0 : n_total / DP_WHISPER_HOP; }

dp_status dp_log_mel(const float *samples, int64_t n_samples, int64_t n_zeros, int32_t n_mels, float *dst,
                     int64_t dst_len, float *max_out, int32_t n_threads, int32_t isa, char *msg, size_t msg_len) {
	if (n_samples < 0 || n_zeros < 0 || n_samples > ((int64_t)1 << 40) || n_zeros > ((int64_t)1 << 40))
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "log-mel: bad lengths %lld + %lld", (long long)n_samples,
		               (long long)n_zeros);
	if (samples == NULL && n_samples > 0) return dp_fail(msg, msg_len, DP_ERR_INVALID, "log-mel: null samples");
	int64_t total = n_samples + n_zeros;
	if (total <= DP_WHISPER_N_FFT / 2)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "log-mel: %lld samples in all, reflect padding needs at least %d",
		               (long long)total, DP_WHISPER_N_FFT / 2 + 1);
	if (n_mels < 1 || n_mels > 512) return dp_fail(msg, msg_len, DP_ERR_INVALID, "log-mel: %d mels (1..512)", n_mels);
	int64_t frames = dp_log_mel_frames(total);
	if (dst == NULL || dst_len / n_mels < frames)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "log-mel: destination holds %lld floats, %d x %lld needed",
		               (long long)dst_len, n_mels, (long long)frames);
	int32_t v = dp_isa_resolve(isa);
	if (v < 0) return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "log-mel: kernel variant %d not supported here", isa);

	mel_job j = {.x = samples, .n_samples = n_samples, .n_total = total, .n_frames = frames, .dst = dst, .isa = v};
	int owned = 0;
	dp_status st = setup_get(&j, n_mels, &owned, msg, msg_len);
	if (st != DP_OK) return st;
	int64_t groups = (frames + 7) / 8;
	int32_t tasks = n_threads < 1 ? 1 : n_threads > 256 ? 256 : n_threads;
	if (tasks > groups) tasks = (int32_t)groups;
	j.n_tasks = tasks;
	dp_parallel_for(tasks, compute_task, &j);
	j.gmax = -INFINITY;
	for (int32_t i = 0; i < tasks; i++) j.gmax = j.task_max[i] > j.gmax ? j.task_max[i] : j.gmax;
	clamp(dst, (int64_t)n_mels * frames, j.gmax);
	if (max_out) *max_out = j.gmax;
	if (owned) bank_free(&j.bank);
	return DP_OK;
}

/* ---- the straightforward version: a dense DFT per frame (benchmarks and cross-checks) ---- */

dp_status dp_log_mel_dft(const float *samples, int64_t n_samples, int64_t n_zeros, int32_t n_mels, float *dst,
                         int64_t dst_len, char *msg, size_t msg_len) {
	enum { N = DP_WHISPER_N_FFT, BINS = N / 2 + 1 };
	if (n_samples < 0 || n_zeros < 0 || n_samples + n_zeros <= N / 2 || (samples == NULL && n_samples > 0))
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "log-mel dft: bad input (%lld + %lld samples)", (long long)n_samples,
		               (long long)n_zeros);
	if (n_mels < 1 || n_mels > 512) return dp_fail(msg, msg_len, DP_ERR_INVALID, "log-mel dft: %d mels (1..512)", n_mels);
	int64_t frames = dp_log_mel_frames(n_samples + n_zeros);
	if (dst == NULL || dst_len / n_mels < frames)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "log-mel dft: destination holds %lld floats, %d x %lld needed",
		               (long long)dst_len, n_mels, (long long)frames);
	float *cs = malloc(sizeof(float) * N * BINS * 2), *filters = malloc(sizeof(float) * (size_t)n_mels * BINS);
	if (cs == NULL || filters == NULL) {
		free(cs);
		free(filters);
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "log-mel dft: cannot allocate the DFT matrix");
	}
	dp_status st = dp_mel_filters(n_mels, N, DP_WHISPER_SAMPLE_RATE, filters, msg, msg_len);
	float *c = cs, *s = cs + N * BINS; /* [j][k]: cos and -sin of 2 pi j k / N */
	for (int j = 0; j < N; j++)
		for (int k = 0; k < BINS; k++) {
			double a = 2.0 * M_PI * (double)((j * k) % N) / N;
			c[j * BINS + k] = (float)cos(a);
			s[j * BINS + k] = (float)-sin(a);
		}
	mel_job j = {.x = samples, .n_samples = n_samples, .n_total = n_samples + n_zeros};
	float gmax = -INFINITY;
	for (int64_t f = 0; st == DP_OK && f < frames; f++) {
		float x[N], re[BINS] = {0}, im[BINS] = {0}, pw[BINS];
		for (int k = 0; k < N; k++)
			x[k] = sample_at(&j, f * DP_WHISPER_HOP - N / 2 + k) * (float)(0.5 - 0.5 * cos(2.0 * M_PI * k / N));
		for (int jj = 0; jj < N; jj++)
			for (int k = 0; k < BINS; k++) {
				re[k] += x[jj] * c[jj * BINS + k];
				im[k] += x[jj] * s[jj * BINS + k];
			}
		for (int k = 0; k < BINS; k++) pw[k] = re[k] * re[k] + im[k] * im[k];
		for (int32_t m = 0; m < n_mels; m++) {
			float acc = 0;
			for (int k = 0; k < BINS; k++) acc += filters[m * BINS + k] * pw[k];
			float v = log10f(acc > 1e-10f ? acc : 1e-10f);
			dst[m * frames + f] = v;
			gmax = v > gmax ? v : gmax;
		}
	}
	if (st == DP_OK) clamp(dst, (int64_t)n_mels * frames, gmax);
	free(cs);
	free(filters);
	return st;
}
