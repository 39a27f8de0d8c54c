/* AVX-512 VNNI GEMM with weight rows as lanes: the FFN's gate and up passes of a batch (prefill), which
 * reach the kernels through pi2_gemm_strided (rows inside bundles, or the packed FFN).
 *
 * gemm512 gives each (row, token pair) a zmm of 8 int32 lanes per block (one per 4-byte group), so each
 * 64 products cost a dpbusd, a conversion, a multiply and an FMA. Here a zmm holds 16 rows of one
 * token: per block, 16 rows are unpacked once per call into 8 zmm (zmm j: every row's bytes 4j..4j+3,
 * u8) and each token's 4-byte group j is broadcast against it, so 8 dpbusd sum whole blocks of 16 rows
 * in int32, and one conversion, two multiplies and one add finish 512 products: about a third of
 * gemm512's instructions per product.
 *
 * Per row and token, the floats are the scalar reference's (kernels_scalar.c): sum += (float)isum *
 * (d_w * d_a) block after block, no FMA; isum exact in int32 (Q4_0 nibbles 0..15 and Q8_0 weights + 128
 * as u8, minus bias * the activation block's sum). A row's result does not depend on which rows share
 * its call (a last group of fewer than 16 rows is padded with zero rows and stored masked). */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_impl.h"

#define LROWS 16 /* rows per group: one per int32 lane */
#define LTOK 8   /* tokens per register tile: 8 independent dpbusd chains hide its latency */

static inline float h2f_l(pi2_f16 h) { return _cvtsh_ss(h); }

/* rows 0..nr of w (row_bytes apart) -> u[b * 8 + j]: lane r = row r's u8 bytes 4j..4j+3 of block b;
 * dw[b * 16 + r] its scale. Rows past nr are zero with scale 0. One gather per 4-byte group of the 16
 * rows (row_bytes * 16 < 2^31: bundles are a few KiB). */
static void unpack_lanes(int q4, const uint8_t *w, size_t row_bytes, int nr, int64_t nb, __m512i *u, float *dw) {
    const __mmask16 live = (__mmask16)((1u << nr) - 1);
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)row_bytes));
    const __m512i zero = _mm512_setzero_si512(), m4 = _mm512_set1_epi8(0x0f);
    const size_t wblock = q4 ? sizeof(pi2_block_q4_0) : sizeof(pi2_block_q8_0);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * wblock; /* d, then qs */
        const __m512i d = _mm512_mask_i32gather_epi32(zero, live, rows, blk, 1);
        _mm512_store_ps(dw + b * LROWS, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)));
        __m512i *ub = u + b * 8;
        if (q4)
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_mask_i32gather_epi32(zero, live, rows, blk + 2 + 4 * j, 1);
                ub[j] = _mm512_and_si512(v, m4);                           /* elements 4j..4j+3 */
                ub[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4); /* elements 16+4j.. */
            }
        else
            for (int j = 0; j < 8; j++) /* + 128 per byte; a padded row's zeros stay zero (its scale is 0) */
                ub[j] = _mm512_xor_si512(_mm512_mask_i32gather_epi32(zero, live, rows, blk + 2 + 4 * j, 1),
                                         _mm512_set1_epi8((char)0x80));
    }
}

/* y[t * ldy + r] for NT tokens (activation blocks a[t]) and the group's 16 rows (mask: those stored) */
static inline __attribute__((always_inline)) void lanes_tile(int NT, const __m512i *u, const float *dw, int64_t nb,
                                                            const pi2_block_q8_0 *const *a, const int32_t *const *bias,
                                                            const float *const *da, float *y, int64_t ldy,
                                                            __mmask16 mask) {
    __m512 acc[LTOK];
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i w[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) w[j] = u[b * 8 + j];
        const __m512 d = _mm512_load_ps(dw + b * LROWS);
#pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            const pi2_block_q8_0 *ab = a[t] + b;
            __m512i s = _mm512_set1_epi32(bias[t][b]);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                int32_t q;
                memcpy(&q, ab->qs + 4 * j, 4);
                s = _mm512_dpbusd_epi32(s, w[j], _mm512_set1_epi32(q));
            }
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(da[t][b]));
            /* the rounding-mode forms: GCC may fuse a plain mul and add into an FMA (-ffp-contract) */
            const __m512 p = _mm512_mul_round_ps(_mm512_cvtepi32_ps(s), scale, _MM_FROUND_CUR_DIRECTION);
            acc[t] = _mm512_add_round_ps(acc[t], p, _MM_FROUND_CUR_DIRECTION);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + t * ldy, mask, acc[t]);
}

static void gemm_lanes(int q4, const void *w, size_t row_bytes, int64_t rows, int64_t n, const void *acts,
                       size_t act_bytes, int64_t tokens, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK;
    const int bias_mul = q4 ? 8 : 128;
    __m512i *u = aligned_alloc(64, (size_t)nb * 8 * sizeof(__m512i));
    float *dw = aligned_alloc(64, (size_t)nb * LROWS * sizeof(float));
    int32_t *bias = malloc((size_t)(tokens * nb + 1) * sizeof(int32_t));
    float *da = malloc((size_t)(tokens * nb + 1) * sizeof(float));
    if (!u || !dw || !bias || !da) abort();
    for (int64_t t = 0; t < tokens; t++) { /* -bias * each activation block's sum and its scale, per token */
        const pi2_block_q8_0 *a = (const pi2_block_q8_0 *)((const uint8_t *)acts + (size_t)t * act_bytes);
        for (int64_t b = 0; b < nb; b++) {
            int32_t s = 0;
            for (int k = 0; k < PI2_QK; k++) s += a[b].qs[k];
            bias[t * nb + b] = -bias_mul * s;
            da[t * nb + b] = h2f_l(a[b].d);
        }
    }
    for (int64_t r = 0; r < rows; r += LROWS) {
        const int nr = rows - r < LROWS ? (int)(rows - r) : LROWS;
        const __mmask16 mask = (__mmask16)((1u << nr) - 1);
        unpack_lanes(q4, (const uint8_t *)w + (size_t)r * row_bytes, row_bytes, nr, nb, u, dw);
        for (int64_t t = 0; t < tokens; t += LTOK) {
            const int nt = tokens - t < LTOK ? (int)(tokens - t) : LTOK;
            const pi2_block_q8_0 *a[LTOK];
            const int32_t *bi[LTOK];
            const float *dk[LTOK];
            for (int k = 0; k < nt; k++) {
                a[k] = (const pi2_block_q8_0 *)((const uint8_t *)acts + (size_t)(t + k) * act_bytes);
                bi[k] = bias + (t + k) * nb;
                dk[k] = da + (t + k) * nb;
            }
            float *out = y + t * ldy + r;
            switch (nt) { /* a constant token count keeps the tile in registers */
            case 1: lanes_tile(1, u, dw, nb, a, bi, dk, out, ldy, mask); break;
            case 2: lanes_tile(2, u, dw, nb, a, bi, dk, out, ldy, mask); break;
            case 3: lanes_tile(3, u, dw, nb, a, bi, dk, out, ldy, mask); break;
            case 4: lanes_tile(4, u, dw, nb, a, bi, dk, out, ldy, mask); break;
            case 5: lanes_tile(5, u, dw, nb, a, bi, dk, out, ldy, mask); break;
            case 6: lanes_tile(6, u, dw, nb, a, bi, dk, out, ldy, mask); break;
            case 7: lanes_tile(7, u, dw, nb, a, bi, dk, out, ldy, mask); break;
            default: lanes_tile(8, u, dw, nb, a, bi, dk, out, ldy, mask); break;
            }
        }
    }
    free(u);
    free(dw);
    free(bias);
    free(da);
}

static void gemm_lanes_q4_0(const void *w, size_t rb, int64_t rows, int64_t n, const void *acts, size_t ab,
                            int64_t tokens, float *y, int64_t ldy) {
    gemm_lanes(1, w, rb, rows, n, acts, ab, tokens, y, ldy);
}

static void gemm_lanes_q8_0(const void *w, size_t rb, int64_t rows, int64_t n, const void *acts, size_t ab,
                            int64_t tokens, float *y, int64_t ldy) {
    gemm_lanes(0, w, rb, rows, n, acts, ab, tokens, y, ldy);
}

void pi2_kernels_fill_lanes_avx512(pi2_kernel_table *t) {
    t->gemm_strided[PI2_Q4_0] = gemm_lanes_q4_0;
    t->gemm_strided[PI2_Q8_0] = gemm_lanes_q8_0;
}
