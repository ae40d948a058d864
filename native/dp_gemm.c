/* dp_gemm.c: f32 matrix multiplication, blocked and packed (the BLIS scheme), with a 12x32
 * AVX-512 micro-kernel, a 6x16 AVX2/FMA one and a portable one over the same packed layouts.
 *
 * B (the weights, or the second activation) is packed once into KC-row blocks of NR-column
 * panels: [k block][panel][kc][NR], zero-padded to a multiple of NR columns; the 16-wide
 * kernels take a panel in two halves. Each thread packs the rows of A it needs into mr-row
 * panels ([panel][kc][mr], zero-padded; mr is the kernel's) one block of about MC x KC at a
 * time, then runs the micro-kernel over its share of the tiles. A micro-panel of B (32 x 256
 * floats, 32 KiB) and one of A (12 x 256, 12 KiB) fit Zen 5's 48 KiB L1; the A block (240 x 256,
 * 240 KiB: twice the 120 rows of the AVX2 days, which measured ~5% better here) in L2. */
#include <stdlib.h>
#include <string.h>

#include "dp_encoder.h"
#include "dp_internal.h"

#if DP_X86
#include <immintrin.h>
#endif

/* NR: the packed panel width (every kernel's nr divides it); MR_MAX: the tallest kernel. */
enum { NR = 32, KC = 256, MC = 240, MR_MAX = 12 };

/* Threads over many rows take chunks of ROW_CHUNK rows (a multiple of every kernel's mr).
 * Blocks of at most DIRECT_PANELS column panels read A in place where the kernel can. */
enum { ROW_CHUNK = 96, DIRECT_PANELS = 4 };

struct dp_packed {
	int64_t n, k, npanels;
	float *data; /* [ceil(k/KC)][npanels][kc][NR] */
};

int64_t dp_packed_rows(const dp_packed *p) { return p->n; }
int64_t dp_packed_cols(const dp_packed *p) { return p->k; }

void dp_packed_free(dp_packed *p) {
	if (p == NULL) return;
	free(p->data);
	free(p);
}

/* pack_b fills p from a source whose element (row p of B, column j) is src[j*sj + p*sp]. Whole
 * panels copy rows of NR (sj == 1) or walk each column along k (sp == 1: reads in order). */
static void pack_b(dp_packed *p, const float *src, int64_t sj, int64_t sp) {
	float *dst = p->data;
	for (int64_t p0 = 0; p0 < p->k; p0 += KC) {
		int64_t kc = p->k - p0 < KC ? p->k - p0 : KC;
		for (int64_t panel = 0; panel < p->npanels; panel++, dst += kc * NR) {
			int64_t j0 = panel * NR;
			const float *s0 = src + j0 * sj + p0 * sp;
			if (j0 + NR <= p->n && sj == 1) {
				for (int64_t q = 0; q < kc; q++) memcpy(dst + q * NR, s0 + q * sp, NR * 4);
			} else if (j0 + NR <= p->n && sp == 1) {
				for (int64_t j = 0; j < NR; j++)
					for (int64_t q = 0; q < kc; q++) dst[q * NR + j] = s0[j * sj + q];
			} else {
				for (int64_t q = 0; q < kc; q++)
					for (int64_t j = 0; j < NR; j++) dst[q * NR + j] = j0 + j < p->n ? s0[j * sj + q * sp] : 0.0f;
			}
		}
	}
}

static dp_packed *packed_alloc(int64_t n, int64_t k) {
	dp_packed *p = calloc(1, sizeof *p);
	if (p == NULL) return NULL;
	p->n = n, p->k = k, p->npanels = (n + NR - 1) / NR;
	p->data = aligned_alloc(64, (size_t)((p->npanels * NR * k * 4 + 63) / 64 * 64) + 64);
	if (p->data == NULL) {
		free(p);
		return NULL;
	}
	return p;
}

dp_status dp_pack_weights(const dp_matrix *w, dp_packed **out, char *msg, size_t msg_len) {
	if (w == NULL || out == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null argument");
	if (dp_matrix_bytes(w) <= 0 || w->data == NULL)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "weights: bad shape [%lld, %lld] or dtype %d", (long long)w->rows,
		               (long long)w->cols, w->dtype);
	float *f32 = (float *)w->data;
	float *tmp = NULL;
	if (w->dtype != DP_F32) {
		tmp = malloc((size_t)(w->rows * w->cols) * 4);
		if (tmp == NULL) return dp_fail(msg, msg_len, DP_ERR_NOMEM, "weights: no memory to convert");
		dp_converter(DP_F32, w->dtype, dp_isa_best())(tmp, w->data, w->rows * w->cols);
		f32 = tmp;
	}
	dp_packed *p = packed_alloc(w->rows, w->cols);
	if (p == NULL) {
		free(tmp);
		return dp_fail(msg, msg_len, DP_ERR_NOMEM, "weights: no memory to pack [%lld, %lld]", (long long)w->rows,
		               (long long)w->cols);
	}
	pack_b(p, f32, w->cols, 1); /* B = W^T: B[q][j] = W[j][q] */
	free(tmp);
	*out = p;
	return DP_OK;
}

/* ---- micro-kernels: C[mr x nr] (+)= A panel . B panel over kc; the first k block may add a
 * bias and either store or accumulate, later blocks always accumulate. ---- */

/* b advances by ldb floats per step of k (the packed panel width NR), a by the kernel's mr. */
typedef void (*kernel_fn)(int64_t kc, const float *a, const float *b, int64_t ldb, float *c, int64_t ldc, const float *bias,
                          int add);

enum { GMR = 6, GNR = 16 }; /* the generic and AVX2 tiles */

static void kernel_generic(int64_t kc, const float *a, const float *b, int64_t ldb, float *c, int64_t ldc, const float *bias,
                           int add) {
	float acc[GMR][GNR] = {{0}};
	for (int64_t q = 0; q < kc; q++, a += GMR, b += ldb)
		for (int i = 0; i < GMR; i++)
			for (int j = 0; j < GNR; j++) acc[i][j] += a[i] * b[j];
	for (int i = 0; i < GMR; i++)
		for (int j = 0; j < GNR; j++) {
			float v = acc[i][j] + (bias ? bias[j] : 0.0f);
			c[i * ldc + j] = add ? c[i * ldc + j] + v : v;
		}
}

#if DP_X86
#define DP_AVX2 __attribute__((target("avx2,fma")))

DP_AVX2 static void kernel_avx2(int64_t kc, const float *a, const float *b, int64_t ldb, float *c, int64_t ldc, const float *bias,
                                int add) {
	__m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
	__m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
	for (int64_t q = 0; q < kc; q++, a += GMR, b += ldb) {
		__m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), x;
		x = _mm256_broadcast_ss(a + 0), c00 = _mm256_fmadd_ps(x, b0, c00), c01 = _mm256_fmadd_ps(x, b1, c01);
		x = _mm256_broadcast_ss(a + 1), c10 = _mm256_fmadd_ps(x, b0, c10), c11 = _mm256_fmadd_ps(x, b1, c11);
		x = _mm256_broadcast_ss(a + 2), c20 = _mm256_fmadd_ps(x, b0, c20), c21 = _mm256_fmadd_ps(x, b1, c21);
		x = _mm256_broadcast_ss(a + 3), c30 = _mm256_fmadd_ps(x, b0, c30), c31 = _mm256_fmadd_ps(x, b1, c31);
		x = _mm256_broadcast_ss(a + 4), c40 = _mm256_fmadd_ps(x, b0, c40), c41 = _mm256_fmadd_ps(x, b1, c41);
		x = _mm256_broadcast_ss(a + 5), c50 = _mm256_fmadd_ps(x, b0, c50), c51 = _mm256_fmadd_ps(x, b1, c51);
	}
	__m256 acc[GMR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
	__m256 bias0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
	__m256 bias1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
	for (int i = 0; i < GMR; i++) {
		float *row = c + i * ldc;
		__m256 v0 = _mm256_add_ps(acc[i][0], bias0), v1 = _mm256_add_ps(acc[i][1], bias1);
		if (add) v0 = _mm256_add_ps(v0, _mm256_loadu_ps(row)), v1 = _mm256_add_ps(v1, _mm256_loadu_ps(row + 8));
		_mm256_storeu_ps(row, v0);
		_mm256_storeu_ps(row + 8, v1);
	}
}

DP_AVX2 static float fma_loop_avx2(int64_t iters) {
	/* Twelve independent chains with distinct starting values, so the compiler cannot fold
	 * them into one; the empty asm keeps them in registers and the loop from being elided. */
	__m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(1e-8f);
	__m256 c0 = _mm256_set1_ps(0), c1 = _mm256_set1_ps(1), c2 = _mm256_set1_ps(2), c3 = _mm256_set1_ps(3);
	__m256 c4 = _mm256_set1_ps(4), c5 = _mm256_set1_ps(5), c6 = _mm256_set1_ps(6), c7 = _mm256_set1_ps(7);
	__m256 c8 = _mm256_set1_ps(8), c9 = _mm256_set1_ps(9), c10 = _mm256_set1_ps(10), c11 = _mm256_set1_ps(11);
	for (int64_t i = 0; i < iters; i++) {
		c0 = _mm256_fmadd_ps(a, b, c0), c1 = _mm256_fmadd_ps(a, b, c1), c2 = _mm256_fmadd_ps(a, b, c2);
		c3 = _mm256_fmadd_ps(a, b, c3), c4 = _mm256_fmadd_ps(a, b, c4), c5 = _mm256_fmadd_ps(a, b, c5);
		c6 = _mm256_fmadd_ps(a, b, c6), c7 = _mm256_fmadd_ps(a, b, c7), c8 = _mm256_fmadd_ps(a, b, c8);
		c9 = _mm256_fmadd_ps(a, b, c9), c10 = _mm256_fmadd_ps(a, b, c10), c11 = _mm256_fmadd_ps(a, b, c11);
		__asm__ volatile("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5));
		__asm__ volatile("" : "+x"(c6), "+x"(c7), "+x"(c8), "+x"(c9), "+x"(c10), "+x"(c11));
	}
	__m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
	                         _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
	s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
	float out[8];
	_mm256_storeu_ps(out, s);
	return out[0];
}

#define DP_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")))
enum { XMR = 12 }; /* the AVX-512 tile: 12 rows x 32 columns, 24 zmm accumulators */

/* A tile's accumulators (+ bias) (+= C) into C's rows: the AVX-512 kernels' one epilogue. */
DP_AVX512 static inline __attribute__((always_inline)) void store_tile_avx512(int rows, __m512 acc[][2], float *c, int64_t ldc,
                                                                             const float *bias, int add) {
	__m512 bias0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
	__m512 bias1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 12
	for (int i = 0; i < rows; i++) {
		float *row = c + i * ldc;
		__m512 v0 = _mm512_add_ps(acc[i][0], bias0), v1 = _mm512_add_ps(acc[i][1], bias1);
		if (add) v0 = _mm512_add_ps(v0, _mm512_loadu_ps(row)), v1 = _mm512_add_ps(v1, _mm512_loadu_ps(row + 16));
		_mm512_storeu_ps(row, v0);
		_mm512_storeu_ps(row + 16, v1);
	}
}

/* A tile of `rows` (at most 12) rows x 32 columns, 2 x rows zmm accumulators. Per step of k:
 * two loads of B, `rows` broadcasts of A (folded into the FMAs as {1to16} operands) and 2 x rows
 * FMAs: with 12 rows Zen 5's two 512-bit FMA pipes stay busy with loads to spare, and 24
 * independent chains cover its 4-cycle FMA latency three times over. `rows` is a constant in
 * each caller (always inlined), so the loops unroll: the full tile (kernel_avx512) and the last
 * tile of fewer rows (197 = 16 x 12 + 5 for one ViT image), stored straight into C so a 5-row
 * tile costs 5/12 of a full one instead of a full one through a scratch tile. C's rows (a tile
 * of a large C is in no cache) start loading before the k loop, not at the end where the adds
 * and stores would wait for them. */
DP_AVX512 static inline __attribute__((always_inline)) void tile_avx512(int rows, int64_t kc, const float *a, const float *b,
                                                                       int64_t ldb, float *c, int64_t ldc, const float *bias, int add) {
	__m512 acc[XMR][2];
#pragma GCC unroll 12
	for (int i = 0; i < rows; i++) _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0), _mm_prefetch((const char *)(c + i * ldc + 16), _MM_HINT_T0);
#pragma GCC unroll 12
	for (int i = 0; i < rows; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
	for (int64_t q = 0; q < kc; q++, a += XMR, b += ldb) {
		__m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
		for (int i = 0; i < rows; i++) {
			__m512 x = _mm512_set1_ps(a[i]);
			acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);
			acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
		}
	}
	store_tile_avx512(rows, acc, c, ldc, bias, add);
}

DP_AVX512 static void kernel_avx512(int64_t kc, const float *a, const float *b, int64_t ldb, float *c, int64_t ldc,
                                    const float *bias, int add) {
	tile_avx512(XMR, kc, a, b, ldb, c, ldc, bias, add);
}

DP_AVX512 static void kernel_avx512_rows(int64_t rows, int64_t kc, const float *a, const float *b, int64_t ldb, float *c,
                                         int64_t ldc, const float *bias, int add) {
	switch (rows) {
#define DP_TAIL(r) \
	case r: tile_avx512(r, kc, a, b, ldb, c, ldc, bias, add); break;
		DP_TAIL(1) DP_TAIL(2) DP_TAIL(3) DP_TAIL(4) DP_TAIL(5) DP_TAIL(6)
		DP_TAIL(7) DP_TAIL(8) DP_TAIL(9) DP_TAIL(10) DP_TAIL(11)
#undef DP_TAIL
	default: break;
	}
}

/* The same tile reading A in place (row i at a + i*lda) instead of from a packed panel: for
 * products with few columns (attention's scores . V, 64 wide), where packing A would cost as
 * much as a good part of the multiplication. Twelve row streams, each read in order. */
DP_AVX512 static void kernel_avx512_direct(int64_t kc, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                                           int64_t ldc, const float *bias, int add) {
	__m512 acc[XMR][2];
#pragma GCC unroll 12
	for (int i = 0; i < XMR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
	for (int64_t q = 0; q < kc; q++, a++, b += ldb) {
		__m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
		for (int i = 0; i < XMR; i++) {
			__m512 x = _mm512_set1_ps(a[i * lda]);
			acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);
			acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
		}
	}
	store_tile_avx512(XMR, acc, c, ldc, bias, add);
}

DP_AVX512 static float fma_loop_avx512(int64_t iters) {
	/* Sixteen chains: twice the 2 pipes x 4 cycles of latency Zen 5 needs in flight. */
	__m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-8f);
	__m512 c0 = _mm512_set1_ps(0), c1 = _mm512_set1_ps(1), c2 = _mm512_set1_ps(2), c3 = _mm512_set1_ps(3);
	__m512 c4 = _mm512_set1_ps(4), c5 = _mm512_set1_ps(5), c6 = _mm512_set1_ps(6), c7 = _mm512_set1_ps(7);
	__m512 c8 = _mm512_set1_ps(8), c9 = _mm512_set1_ps(9), c10 = _mm512_set1_ps(10), c11 = _mm512_set1_ps(11);
	__m512 c12 = _mm512_set1_ps(12), c13 = _mm512_set1_ps(13), c14 = _mm512_set1_ps(14), c15 = _mm512_set1_ps(15);
	for (int64_t i = 0; i < iters; i++) {
		c0 = _mm512_fmadd_ps(a, b, c0), c1 = _mm512_fmadd_ps(a, b, c1), c2 = _mm512_fmadd_ps(a, b, c2);
		c3 = _mm512_fmadd_ps(a, b, c3), c4 = _mm512_fmadd_ps(a, b, c4), c5 = _mm512_fmadd_ps(a, b, c5);
		c6 = _mm512_fmadd_ps(a, b, c6), c7 = _mm512_fmadd_ps(a, b, c7), c8 = _mm512_fmadd_ps(a, b, c8);
		c9 = _mm512_fmadd_ps(a, b, c9), c10 = _mm512_fmadd_ps(a, b, c10), c11 = _mm512_fmadd_ps(a, b, c11);
		c12 = _mm512_fmadd_ps(a, b, c12), c13 = _mm512_fmadd_ps(a, b, c13), c14 = _mm512_fmadd_ps(a, b, c14);
		c15 = _mm512_fmadd_ps(a, b, c15);
		__asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), "+v"(c7));
		__asm__ volatile("" : "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11), "+v"(c12), "+v"(c13), "+v"(c14), "+v"(c15));
	}
	__m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
	                         _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
	s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));
	s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(c12, c13), _mm512_add_ps(c14, c15)));
	return _mm512_reduce_add_ps(s);
}
#endif

enum { GCHAINS = GMR * GNR };

static float fma_loop_generic(int64_t iters) {
	float c[GCHAINS], a = 1.0f, b = 1e-8f;
	for (int j = 0; j < GCHAINS; j++) c[j] = (float)j; /* distinct: no folding */
	for (int64_t i = 0; i < iters; i++) {
		for (int j = 0; j < GCHAINS; j++) c[j] += a * b;
		__asm__ volatile("" : : "r"(c) : "memory");
	}
	float s = 0;
	for (int j = 0; j < GCHAINS; j++) s += c[j];
	return s;
}

typedef struct peak_job {
	int64_t iters;
	int32_t isa;
	volatile double sink; /* the loops' sums land here, so the compiler cannot drop them */
} peak_job;

static void peak_part(void *ctx, int32_t i, int32_t n) {
	(void)i, (void)n;
	peak_job *j = ctx;
#if DP_X86
	if (j->isa >= DP_ISA_AVX512) {
		j->sink = fma_loop_avx512(j->iters);
		return;
	}
	if (j->isa >= DP_ISA_AVX2) {
		j->sink = fma_loop_avx2(j->iters);
		return;
	}
#endif
	j->sink = fma_loop_generic(j->iters);
}

double dp_fma_peak(int64_t iters, int32_t n_threads, int32_t isa) {
	int32_t v = dp_isa_resolve(isa);
	if (v < 0 || iters <= 0) return 0;
	if (n_threads < 1) n_threads = 1;
	peak_job j = {iters, v, 0};
	dp_parallel_for(n_threads, peak_part, &j);
#if DP_X86
	if (v >= DP_ISA_AVX512) return (double)iters * 16 * 16 * 2 * n_threads;
	if (v >= DP_ISA_AVX2) return (double)iters * 12 * 8 * 2 * n_threads;
#endif
	return (double)iters * GCHAINS * 2 * n_threads;
}

/* ---- the driver ---- */

typedef void (*direct_fn)(int64_t kc, const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                          const float *bias, int add);

typedef void (*rows_fn)(int64_t rows, int64_t kc, const float *a, const float *b, int64_t ldb, float *c, int64_t ldc,
                        const float *bias, int add);

typedef struct kernel {
	kernel_fn fn;
	direct_fn direct; /* the same tile on unpacked A, or NULL */
	rows_fn rows;     /* the same tile on fewer than mr rows (whole columns), or NULL */
	int64_t mr, nr;   /* the tile; nr divides NR */
} kernel;

typedef struct gemm_job {
	const float *a;
	int64_t m, lda;
	const dp_packed *b;
	const float *bias;
	float *c;
	int64_t ldc;
	int accumulate;
	kernel k;
	int split_n;      /* threads split the column panels (else they take row chunks) */
	int64_t next_row; /* the next row chunk to take */
	int failed;  /* a thread could not get its packing buffer */
} gemm_job;

/* pack_a copies rows [i0, i0+mc) x columns [p0, p0+kc) of A into mr-row panels. */
static void pack_a(float *dst, int64_t mr, const float *a, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc) {
	for (int64_t ir = 0; ir < mc; ir += mr) {
		int64_t rows = mc - ir < mr ? mc - ir : mr;
		const float *src = a + (i0 + ir) * lda + p0;
		if (rows == mr) {
			for (int64_t q = 0; q < kc; q++, dst += mr)
				for (int64_t i = 0; i < mr; i++) dst[i] = src[i * lda + q];
			continue;
		}
		for (int64_t q = 0; q < kc; q++, dst += mr) {
			int64_t i = 0;
			for (; i < rows; i++) dst[i] = src[i * lda + q];
			for (; i < mr; i++) dst[i] = 0.0f;
		}
	}
}

/* tile runs the micro-kernel over one mr-row panel of A (packed at ap, or in place at a when
 * a is not NULL) and one NR-column panel of B, through a scratch tile at the edges of C. */
static void tile(const gemm_job *j, int64_t kc, const float *ap, const float *a, const float *bp, int64_t row, int64_t col0,
                 const float *bias, int add) {
	const kernel *k = &j->k;
	int64_t rows = j->m - row < k->mr ? j->m - row : k->mr;
	for (int64_t jr = 0; jr < NR; jr += k->nr) {
		int64_t col = col0 + jr, cols = j->b->n - col < k->nr ? j->b->n - col : k->nr;
		if (cols <= 0) return;
		float *c = j->c + row * j->ldc + col, *cc = c;
		int64_t ldc = j->ldc;
		const float *bb = bias ? bias + jr : NULL;
		if (rows < k->mr && cols == k->nr && a == NULL && k->rows != NULL) {
			k->rows(rows, kc, ap, bp + jr, NR, c, ldc, bb, add);
			continue;
		}
		float t[MR_MAX * NR], tb[NR];
		if (rows < k->mr || cols < k->nr) {
			if (bb != NULL) {
				memset(tb, 0, sizeof tb);
				memcpy(tb, bb, (size_t)cols * 4);
				bb = tb;
			}
			for (int64_t i = 0; i < rows; i++) memcpy(t + i * k->nr, c + i * j->ldc, (size_t)cols * 4);
			cc = t, ldc = k->nr;
		}
		if (a != NULL)
			k->direct(kc, a, j->lda, bp + jr, NR, cc, ldc, bb, add);
		else
			k->fn(kc, ap, bp + jr, NR, cc, ldc, bb, add);
		if (cc == t)
			for (int64_t i = 0; i < rows; i++) memcpy(c + i * j->ldc, t + i * k->nr, (size_t)cols * 4);
	}
}

/* run_block computes C rows [row0, row1) x panels [panel0, panel1) over all of k. With few
 * column panels and a kernel that has the form, A is read in place rather than packed (all but
 * a last panel of fewer than mr rows, which could not be read past the end of A). */
static void run_block(const gemm_job *j, float *abuf, int64_t row0, int64_t row1, int64_t panel0, int64_t panel1) {
	const dp_packed *b = j->b;
	int64_t mr = j->k.mr, mc_max = MC / mr * mr;
	int direct = j->k.direct != NULL && panel1 - panel0 <= DIRECT_PANELS;
	const float *bblock = b->data;
	for (int64_t p0 = 0; p0 < b->k; p0 += KC) {
		int64_t kc = b->k - p0 < KC ? b->k - p0 : KC;
		int first = p0 == 0;
		for (int64_t i0 = row0; i0 < row1; i0 += mc_max) {
			int64_t mc = row1 - i0 < mc_max ? row1 - i0 : mc_max;
			int64_t whole = direct ? mc / mr * mr : 0; /* rows read in place */
			if (whole < mc) pack_a(abuf, mr, j->a, j->lda, i0 + whole, mc - whole, p0, kc);
			for (int64_t panel = panel0; panel < panel1; panel++) {
				const float *bp = bblock + panel * kc * NR;
				const float *bias = first && j->bias ? j->bias + panel * NR : NULL;
				for (int64_t ir = 0; ir < mc; ir += mr) {
					const float *a = ir < whole ? j->a + (i0 + ir) * j->lda + p0 : NULL;
					tile(j, kc, abuf + (ir - whole) * kc, a, bp, i0 + ir, panel * NR, bias, first ? j->accumulate : 1);
				}
			}
		}
		bblock += kc * b->npanels * NR;
	}
}

static void gemm_part(void *ctx, int32_t t, int32_t n_threads) {
	gemm_job *j = ctx;
	/* The packing buffer only as large as this product needs: attention's small blocks then
	 * take a few KiB from the heap instead of 240 KiB. */
	int64_t mr = j->k.mr, rows = (j->m + mr - 1) / mr * mr, mc = MC / mr * mr, kc = j->b->k < KC ? j->b->k : KC;
	float *abuf = aligned_alloc(64, (size_t)((rows < mc ? rows : mc) * kc * 4 + 63) / 64 * 64);
	if (abuf == NULL) {
		__atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
		return;
	}
	if (j->split_n) { /* a fixed share of the column panels, all rows */
		int64_t panel0 = j->b->npanels * t / n_threads, panel1 = j->b->npanels * (t + 1) / n_threads;
		if (panel0 < panel1) run_block(j, abuf, 0, j->m, panel0, panel1);
	} else { /* row chunks taken in turn: a thread slowed by other work on the machine takes fewer */
		for (;;) {
			int64_t row0 = __atomic_fetch_add(&j->next_row, ROW_CHUNK, __ATOMIC_RELAXED);
			if (row0 >= j->m) break;
			run_block(j, abuf, row0, row0 + ROW_CHUNK < j->m ? row0 + ROW_CHUNK : j->m, 0, j->b->npanels);
		}
	}
	free(abuf);
}

static dp_status run_gemm(gemm_job *j, int32_t n_threads, int32_t isa, char *msg, size_t msg_len) {
	int32_t v = dp_isa_resolve(isa);
	if (v < 0) return dp_fail(msg, msg_len, DP_ERR_UNSUPPORTED, "instruction set %d not supported here", isa);
	j->k = (kernel){kernel_generic, NULL, NULL, GMR, GNR};
#if DP_X86
	if (v >= DP_ISA_AVX2) j->k = (kernel){kernel_avx2, NULL, NULL, GMR, GNR};
	if (v >= DP_ISA_AVX512) j->k = (kernel){kernel_avx512, kernel_avx512_direct, kernel_avx512_rows, XMR, NR};
#endif
	if (j->m == 0 || j->b->n == 0) return DP_OK;
	if (j->b->k == 0) { /* an empty sum: C = bias (or unchanged when accumulating) */
		for (int64_t i = 0; i < j->m && !j->accumulate; i++)
			for (int64_t c = 0; c < j->b->n; c++) j->c[i * j->ldc + c] = j->bias ? j->bias[c] : 0.0f;
		return DP_OK;
	}
	/* Enough work for each thread: at least ~1 MFLOP. */
	double flops = 2.0 * (double)j->m * (double)j->b->n * (double)j->b->k;
	if (n_threads > flops / 1e6) n_threads = (int32_t)(flops / 1e6);
	if (n_threads < 1) n_threads = 1;
	/* Many rows (a batch): chunks of rows, each packed once, B shared. Few rows (one image,
	 * an attention block): fixed shares of the columns, each thread packing all of A. */
	j->split_n = n_threads == 1 || j->m < 4 * ROW_CHUNK * (int64_t)n_threads;
	dp_parallel_for(n_threads, gemm_part, j);
	if (j->failed) return dp_fail(msg, msg_len, DP_ERR_NOMEM, "no memory for a packing buffer");
	return DP_OK;
}

static dp_status check_gemm_args(const float *a, int64_t m, int64_t k, int64_t lda, const float *c, int64_t n, int64_t ldc,
                                 char *msg, size_t msg_len) {
	if (m < 0 || n < 0 || k < 0) return dp_fail(msg, msg_len, DP_ERR_INVALID, "negative size (m %lld, n %lld, k %lld)",
		                                            (long long)m, (long long)n, (long long)k);
	if (lda < k || ldc < n)
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "row strides (lda %lld, ldc %lld) shorter than rows (k %lld, n %lld)",
		               (long long)lda, (long long)ldc, (long long)k, (long long)n);
	if ((m > 0 && k > 0 && a == NULL) || (m > 0 && n > 0 && c == NULL)) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null matrix");
	return DP_OK;
}

dp_status dp_gemm_packed(const float *a, int64_t m, int64_t lda, const dp_packed *w, const float *bias, float *c,
                         int64_t ldc, int32_t accumulate, int32_t n_threads, int32_t isa, char *msg, size_t msg_len) {
	if (w == NULL) return dp_fail(msg, msg_len, DP_ERR_INVALID, "null weights");
	dp_status st = check_gemm_args(a, m, w->k, lda, c, w->n, ldc, msg, msg_len);
	if (st != DP_OK) return st;
	gemm_job j = {.a = a, .m = m, .lda = lda, .b = w, .bias = bias, .c = c, .ldc = ldc, .accumulate = accumulate != 0};
	return run_gemm(&j, n_threads, isa, msg, msg_len);
}

dp_packed *dp_pack_b(const float *b, int64_t k, int64_t n, int64_t ldb, int32_t trans_b) {
	dp_packed *p = packed_alloc(n, k);
	if (p == NULL) return NULL;
	if (trans_b)
		pack_b(p, b, ldb, 1); /* B^T given as [n, k]: B[q][j] = b[j*ldb + q] */
	else
		pack_b(p, b, 1, ldb); /* B given as [k, n]: B[q][j] = b[q*ldb + j] */
	return p;
}

dp_status dp_gemm(const float *a, int64_t m, int64_t k, int64_t lda, const float *b, int64_t n, int64_t ldb,
                  int32_t trans_b, float *c, int64_t ldc, int32_t accumulate, int32_t n_threads, int32_t isa, char *msg,
                  size_t msg_len) {
	dp_status st = check_gemm_args(a, m, k, lda, c, n, ldc, msg, msg_len);
	if (st != DP_OK) return st;
	if (ldb < (trans_b ? k : n) || (k > 0 && n > 0 && b == NULL))
		return dp_fail(msg, msg_len, DP_ERR_INVALID, "B: null or row stride %lld too short", (long long)ldb);
	dp_packed *p = dp_pack_b(b, k, n, ldb, trans_b);
	if (p == NULL) return dp_fail(msg, msg_len, DP_ERR_NOMEM, "no memory to pack B [%lld, %lld]", (long long)k, (long long)n);
	gemm_job j = {.a = a, .m = m, .lda = lda, .b = p, .c = c, .ldc = ldc, .accumulate = accumulate != 0};
	st = run_gemm(&j, n_threads, isa, msg, msg_len);
	dp_packed_free(p);
	return st;
}
