/* dp_nn.h: the element-wise and row-wise pieces of a transformer layer (not ABI). Each has a
 * portable variant, an AVX-512 one and (but LayerNorm) an AVX2 one; isa is already resolved. */
#ifndef DP_NN_H
#define DP_NN_H

#include "dp_encoder.h"
#include "dp_internal.h"

/* y[r] = (x[r] - mean) / sqrt(var + eps) * w + b for rows of d; y may be x. Statistics in f64. */
void dp_layernorm(float *y, const float *x, int64_t rows, int64_t d, const float *w, const float *b, float eps, int32_t isa);

/* dp_activate applies a dp_activation in place to n values. */
void dp_activate(float *x, int64_t n, int32_t act, int32_t isa);

/* dp_softmax_rows replaces each of rows rows of n values (row stride ld) by softmax(scale * row),
 * subtracting the row maximum first so large scores cannot overflow. */
void dp_softmax_rows(float *x, int64_t rows, int64_t n, int64_t ld, float scale, int32_t isa);

/* dp_pack_b packs B for dp_gemm_packed as dp_gemm does (B is [k, n] with row stride ldb, or
 * given transposed as [n, k] when trans_b), so one packing serves many products; NULL when out
 * of memory. Arguments are the caller's to check. */
dp_packed *dp_pack_b(const float *b, int64_t k, int64_t n, int64_t ldb, int32_t trans_b);

#endif /* DP_NN_H */
