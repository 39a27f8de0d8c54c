/* Scalar reference kernels: the semantics every SIMD level is tested against, and the path used on
 * cores without SIMD support. Integer dot products per block, then one float multiply-add with the
 * block scales, exactly as ggml's generic vec_dot_* do. */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "kernels_impl.h"

static float dot_f32(int64_t n, const void *row, const void *act) {
    const float *w = row, *a = act;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(w[i] * a[i]);
    return (float)sum;
}

static inline __attribute__((always_inline)) float dot_f16(int64_t n, const void *row, const void *act) {
    const pi2_f16 *w = row, *a = act;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)(pi2_f16_to_f32(w[i]) * pi2_f16_to_f32(a[i]));
    return (float)sum;
}

/* One block's integer dot: its 32 4-bit values (low nibbles first, ggml's layout) less `zero`, times
 * the activation's 32 int8 values. Exact in an int, so Q4_0 (zero 8) and Q4_1 (zero 0) can share it. */
static inline int q4_block_isum(const uint8_t *qs, const int8_t *a, int zero) {
    int isum = 0;
    for (int j = 0; j < PI2_QK / 2; j++) {
        isum += ((qs[j] & 0xf) - zero) * a[j];
        isum += ((qs[j] >> 4) - zero) * a[j + PI2_QK / 2];
    }
    return isum;
}

static float dot_q4_0(int64_t n, const void *row, const void *act) {
    const pi2_block_q4_0 *w = row;
    const pi2_block_q8_0 *a = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / PI2_QK; i++) {
        sum += (float)q4_block_isum(w[i].qs, a[i].qs, 8) * (pi2_f16_to_f32(w[i].d) * pi2_f16_to_f32(a[i].d));
    }
    return sum;
}

static float dot_q4_1(int64_t n, const void *row, const void *act) {
    const pi2_block_q4_1 *w = row;
    const pi2_block_q8_1 *a = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / PI2_QK; i++) {
        /* sum_j (d_w q_j + m)(d_a a_j) = d_w d_a sum q_j a_j + m * (d_a sum a_j), and s = d_a sum a_j */
        sum += (float)q4_block_isum(w[i].qs, a[i].qs, 0) * (pi2_f16_to_f32(w[i].d) * pi2_f16_to_f32(a[i].d)) +
               pi2_f16_to_f32(w[i].m) * pi2_f16_to_f32(a[i].s);
    }
    return sum;
}

static float dot_q8_0(int64_t n, const void *row, const void *act) {
    const pi2_block_q8_0 *w = row, *a = act;
    float sum = 0.0f;
    for (int64_t i = 0; i < n / PI2_QK; i++) {
        int isum = 0;
        for (int j = 0; j < PI2_QK; j++) isum += w[i].qs[j] * a[i].qs[j];
        sum += (float)isum * (pi2_f16_to_f32(w[i].d) * pi2_f16_to_f32(a[i].d));
    }
    return sum;
}

static void axpy_f32(int64_t n, float a, const void *row, float *y) {
    const float *w = row;
    for (int64_t i = 0; i < n; i++) y[i] += a * w[i];
}

static inline __attribute__((always_inline)) void axpy_f16(int64_t n, float a, const void *row, float *y) {
    const pi2_f16 *w = row;
    for (int64_t i = 0; i < n; i++) y[i] += a * pi2_f16_to_f32(w[i]);
}

#include "kernels_att.h"

static void axpy_q4_0(int64_t n, float a, const void *row, float *y) {
    const pi2_block_q4_0 *w = row;
    for (int64_t i = 0; i < n / PI2_QK; i++, y += PI2_QK) {
        const float s = a * pi2_f16_to_f32(w[i].d);
        for (int j = 0; j < PI2_QK / 2; j++) {
            y[j] += s * (float)((w[i].qs[j] & 0xf) - 8);
            y[j + PI2_QK / 2] += s * (float)((w[i].qs[j] >> 4) - 8);
        }
    }
}

static void axpy_q4_1(int64_t n, float a, const void *row, float *y) {
    const pi2_block_q4_1 *w = row;
    for (int64_t i = 0; i < n / PI2_QK; i++, y += PI2_QK) {
        const float s = a * pi2_f16_to_f32(w[i].d), m = a * pi2_f16_to_f32(w[i].m);
        for (int j = 0; j < PI2_QK / 2; j++) {
            y[j] += s * (float)(w[i].qs[j] & 0xf) + m;
            y[j + PI2_QK / 2] += s * (float)(w[i].qs[j] >> 4) + m;
        }
    }
}

static void axpy_q8_0(int64_t n, float a, const void *row, float *y) {
    const pi2_block_q8_0 *w = row;
    for (int64_t i = 0; i < n / PI2_QK; i++, y += PI2_QK) {
        const float s = a * pi2_f16_to_f32(w[i].d);
        for (int j = 0; j < PI2_QK; j++) y[j] += s * (float)w[i].qs[j];
    }
}

void pi2_rows_via_dot(pi2_dot_fn dot, const void *w, size_t row_bytes, const int32_t *idx, int64_t count,
                      int64_t n, const void *act, float *y) {
    const char *base = w;
    for (int64_t i = 0; i < count; i++) {
        int64_t r = idx ? idx[i] : i;
        y[i] = dot(n, base + (size_t)r * row_bytes, act);
    }
}

void pi2_gemm_via_dot(pi2_dot_fn dot, const void *w, size_t row_bytes, int64_t rows, int64_t n,
                      const void *acts, size_t act_bytes, int64_t tokens, float *y, int64_t ldy) {
    const char *wb = w, *ab = acts;
    for (int64_t t0 = 0; t0 < tokens; t0 += PI2_GEMM_TILE_TOKENS) {
        int64_t t1 = t0 + PI2_GEMM_TILE_TOKENS < tokens ? t0 + PI2_GEMM_TILE_TOKENS : tokens;
        for (int64_t r = 0; r < rows; r++) {
            const char *wr = wb + (size_t)r * row_bytes;
            for (int64_t t = t0; t < t1; t++) y[t * ldy + r] = dot(n, wr, ab + (size_t)t * act_bytes);
        }
    }
}

#define SCALAR_DRIVERS(T) PI2_ROWS_VIA_DOT(T) PI2_GEMM_VIA_DOT(T)

SCALAR_DRIVERS(f32)
SCALAR_DRIVERS(f16)
SCALAR_DRIVERS(q4_0)
SCALAR_DRIVERS(q4_1)
SCALAR_DRIVERS(q8_0)

/* The batch GEMM's reference (kernels.h, pi2_batch_gemm): each row and token as dot_q4_0 sums them,
 * block after block, the weights read from plain rows or from rows interleaved by four (pi2_x4_pack:
 * per group of 4 rows and block, the rows' 16 quant bytes, then their 4 scales). */
static void batch_gemm_q4_0(const void *w, size_t row_stride, int x4, int64_t rows, int64_t n,
                            const pi2_batch_block *batch, int64_t tokens, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t t = 0; t < tokens; t++) {
            const pi2_batch_block *a = batch + (t / PI2_BATCH_TILE) * nb;
            const int i = (int)(t % PI2_BATCH_TILE);
            float sum = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *qs, *d;
                if (x4) {
                    const uint8_t *rec = (const uint8_t *)w + (size_t)((r / 4) * nb + b) * 4 * sizeof(pi2_block_q4_0);
                    qs = rec + 16 * (r % 4), d = rec + 64 + 2 * (r % 4);
                } else {
                    const pi2_block_q4_0 *x = (const pi2_block_q4_0 *)((const uint8_t *)w + (size_t)r * row_stride) + b;
                    qs = x->qs, d = (const uint8_t *)&x->d;
                }
                int isum = 0; /* sum (q - 8) a as sum q a + the batch's offset: the same integer */
                const int8_t(*q)[2][8] = a[b].qs[i / 2]; /* element k at q[k / 8][i % 2][k % 8] */
                for (int j = 0; j < PI2_QK / 2; j++)
                    isum += (qs[j] & 0xf) * q[j / 8][i % 2][j % 8] + (qs[j] >> 4) * q[2 + j / 8][i % 2][j % 8];
                isum += a[b].nib_off[i];
                pi2_f16 dw;
                memcpy(&dw, d, sizeof dw);
                sum += (float)isum * (pi2_f16_to_f32(dw) * a[b].d[i]);
            }
            y[t * ldy + r] = sum;
        }
}

void pi2_kernels_fill_scalar(pi2_kernel_table *t) {
    memset(t, 0, sizeof *t);
    PI2_KERNELS_SET_COMMON(t);
    t->act_q8_0 = pi2_act_quantize_q8_0_scalar;
    t->act_q8_1 = pi2_act_quantize_q8_1_scalar;
    t->act_f16 = pi2_act_convert_f16_scalar;
    t->batch_gemm[PI2_Q4_0] = batch_gemm_q4_0;
}
