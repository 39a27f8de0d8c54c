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
 * (d_w * d_a) block after block (Q4_1: + m_w * s_a, added first as there), no FMA; isum exact in int32
 * (Q4_0 and Q4_1 nibbles 0..15 and Q8_0 weights + 128 as u8; Q4_0 and Q8_0 minus bias * the activation
 * block's sum). A row's result does not depend on which rows share
 * its call (a last group of fewer than 16 rows is padded with zero rows and stored masked). */
#include <immintrin.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_impl.h"

#define LROWS 16 /* rows per group: one per int32 lane */
#define LTOK 8   /* tokens per register tile: 8 independent dpbusd chains hide its latency */

enum { LK_Q4_0, LK_Q4_1, LK_Q8_0, LK_Q4_0_X4 };

static inline float h2f_l(pi2_f16 h) { return _cvtsh_ss(h); }

/* rows 0..nr of w (row_bytes apart) -> u[b * 8 + j]: lane r = row r's u8 bytes 4j..4j+3 of block b;
 * dw[b * 16 + r] its scale, dm its m (Q4_1). Rows past nr are zero with scale 0. One gather per 4-byte
 * group of the 16 rows (row_bytes * 16 < 2^31: bundles are a few KiB). */
static void unpack_lanes(int kind, const uint8_t *w, size_t row_bytes, int nr, int64_t nb, __m512i *u, float *dw,
                         float *dm) {
    const __mmask16 live = (__mmask16)((1u << nr) - 1);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i zero = _mm512_setzero_si512(), m4 = _mm512_set1_epi8(0x0f);
    __m512i rows, drows; /* each lane's offset of its quants and of its scale in block 0 */
    size_t wblock, qs = 0;
    int dshift = 0;
    if (kind == LK_Q4_0_X4) {
        /* pi2_x4_pack's layout: per group of 4 rows, one 72-byte record per block (the 4 rows' 16
         * quant bytes, then their 4 F16 scales). The scale is read as the high half of the 4 bytes
         * before it, which stay inside the record (the low half of bytes at the scale could run past
         * the matrix's end). */
        const __m512i group = _mm512_mullo_epi32(_mm512_srli_epi32(lane, 2), _mm512_set1_epi32((int)(4 * row_bytes)));
        const __m512i in4 = _mm512_and_si512(lane, _mm512_set1_epi32(3));
        rows = _mm512_add_epi32(group, _mm512_slli_epi32(in4, 4));
        drows = _mm512_add_epi32(group, _mm512_add_epi32(_mm512_set1_epi32(62), _mm512_slli_epi32(in4, 1)));
        wblock = 4 * sizeof(pi2_block_q4_0), dshift = 16;
    } else {
        rows = drows = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)row_bytes));
        wblock = kind == LK_Q4_0 ? sizeof(pi2_block_q4_0)
                 : kind == LK_Q4_1 ? sizeof(pi2_block_q4_1)
                                   : sizeof(pi2_block_q8_0);
        qs = kind == LK_Q4_1 ? offsetof(pi2_block_q4_1, qs) : offsetof(pi2_block_q4_0, qs);
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * wblock; /* d (and m), then qs; x4: the block's record */
        const __m512i d = _mm512_srli_epi32(_mm512_mask_i32gather_epi32(zero, live, drows, blk, 1), dshift);
        _mm512_store_ps(dw + b * LROWS, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)));
        if (kind == LK_Q4_1) _mm512_store_ps(dm + b * LROWS, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(d, 16))));
        __m512i *ub = u + b * 8;
        if (kind != LK_Q8_0)
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_mask_i32gather_epi32(zero, live, rows, blk + qs + 4 * j, 1);
                ub[j] = _mm512_and_si512(v, m4);                           /* elements 4j..4j+3 */
                ub[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4); /* elements 16+4j.. */
            }
        else
            for (int j = 0; j < 8; j++) /* + 128 per byte; a padded row's bytes do not matter (scale 0) */
                ub[j] = _mm512_xor_si512(_mm512_mask_i32gather_epi32(zero, live, rows, blk + qs + 4 * j, 1),
                                         _mm512_set1_epi8((char)0x80));
    }
}

/* Per token and block: the int32 the dot starts from (-bias * the block's sum), d_a and (Q4_1) s_a. */
typedef struct {
    int32_t bias;
    float d, s;
} lane_act;

/* y[t * ldy + r] for NT tokens (quants of block b at q[t] + b * ablock, their lane_act la[t][b]) and
 * the group's 16 rows (mask: those stored) */
static inline __attribute__((always_inline)) void lanes_tile(int kind, int NT, const __m512i *u, const float *dw,
                                                            const float *dm, int64_t nb, const uint8_t *const *q,
                                                            size_t ablock, const lane_act *const *la, float *y,
                                                            int64_t ldy, __mmask16 mask) {
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
            const uint8_t *ab = q[t] + (size_t)b * ablock;
            const lane_act *a = la[t] + b;
            __m512i s = _mm512_set1_epi32(a->bias);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                int32_t v;
                memcpy(&v, ab + 4 * j, 4);
                s = _mm512_dpbusd_epi32(s, w[j], _mm512_set1_epi32(v));
            }
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a->d));
            /* the rounding-mode forms: GCC may fuse a plain mul and add into an FMA (-ffp-contract) */
            __m512 p = _mm512_mul_round_ps(_mm512_cvtepi32_ps(s), scale, _MM_FROUND_CUR_DIRECTION);
            if (kind == LK_Q4_1)
                p = _mm512_add_round_ps(p, _mm512_mul_ps(_mm512_load_ps(dm + b * LROWS), _mm512_set1_ps(a->s)),
                                        _MM_FROUND_CUR_DIRECTION);
            acc[t] = _mm512_add_round_ps(acc[t], p, _MM_FROUND_CUR_DIRECTION);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; t++) _mm512_mask_storeu_ps(y + t * ldy, mask, acc[t]);
}

static void gemm_lanes(int layout, const void *w, size_t row_bytes, int64_t rows, int64_t n, const void *acts,
                       size_t act_bytes, int64_t tokens, float *y, int64_t ldy) {
    const int kind = layout == LK_Q4_0_X4 ? LK_Q4_0 : layout; /* the arithmetic; layout: where the bytes are */
    const int64_t nb = n / PI2_QK;
    const int bias_mul = kind == LK_Q4_0 ? 8 : kind == LK_Q8_0 ? 128 : 0;
    const size_t ablock = kind == LK_Q4_1 ? sizeof(pi2_block_q8_1) : sizeof(pi2_block_q8_0);
    const size_t qs_off = kind == LK_Q4_1 ? offsetof(pi2_block_q8_1, qs) : offsetof(pi2_block_q8_0, qs);
    __m512i *u = aligned_alloc(64, (size_t)nb * 8 * sizeof(__m512i));
    float *dw = aligned_alloc(64, (size_t)nb * LROWS * sizeof(float) * 2), *dm = dw + nb * LROWS;
    lane_act *la = malloc((size_t)(tokens * nb + 1) * sizeof(lane_act));
    if (!u || !dw || !la) abort();
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *ab = (const uint8_t *)acts + (size_t)t * act_bytes + (size_t)b * ablock;
            const int8_t *aq = (const int8_t *)(ab + qs_off);
            int32_t s = 0;
            for (int k = 0; k < PI2_QK; k++) s += aq[k];
            pi2_f16 h[2];
            memcpy(h, ab, sizeof h); /* d, and Q8_1's s */
            la[t * nb + b] = (lane_act){-bias_mul * s, h2f_l(h[0]), kind == LK_Q4_1 ? h2f_l(h[1]) : 0.0f};
        }
    for (int64_t r = 0; r < rows; r += LROWS) {
        const int nr = rows - r < LROWS ? (int)(rows - r) : LROWS;
        const __mmask16 mask = (__mmask16)((1u << nr) - 1);
        unpack_lanes(layout, (const uint8_t *)w + (size_t)r * row_bytes, row_bytes, nr, nb, u, dw, dm);
        for (int64_t t = 0; t < tokens; t += LTOK) {
            const int nt = tokens - t < LTOK ? (int)(tokens - t) : LTOK;
            const uint8_t *q[LTOK];
            const lane_act *a[LTOK];
            for (int k = 0; k < nt; k++) {
                q[k] = (const uint8_t *)acts + (size_t)(t + k) * act_bytes + qs_off;
                a[k] = la + (t + k) * nb;
            }
            float *out = y + t * ldy + r;
            switch (kind * 8 + nt - 1) { /* constant kind and token count keep the tile in registers */
#define CASE(K, NT) \
    case K * 8 + NT - 1: lanes_tile(K, NT, u, dw, dm, nb, q, ablock, a, out, ldy, mask); break;
#define CASES(K) CASE(K, 1) CASE(K, 2) CASE(K, 3) CASE(K, 4) CASE(K, 5) CASE(K, 6) CASE(K, 7) CASE(K, 8)
                CASES(LK_Q4_0) CASES(LK_Q4_1) CASES(LK_Q8_0)
#undef CASES
#undef CASE
            }
        }
    }
    free(u);
    free(dw);
    free(la);
}

PI2_GEMM_OF_KIND(gemm_lanes_q4_0, gemm_lanes, LK_Q4_0)
PI2_GEMM_OF_KIND(gemm_lanes_q4_1, gemm_lanes, LK_Q4_1)
PI2_GEMM_OF_KIND(gemm_lanes_q8_0, gemm_lanes, LK_Q8_0)

/* Q4_0 batches of PI2_LANES_MIN_TOKENS or more, plain rows and rows interleaved by four alike (the
 * dense path's attention matrices; same floats from either layout): called by kernels_avx512.c's
 * gemm and x4_gemm, which keep gemm512's order below the threshold. */
void pi2_lanes_gemm_q4_0(const void *w, size_t row_bytes, int64_t rows, int64_t n, const void *acts, size_t act_bytes,
                         int64_t tokens, float *y, int64_t ldy) {
    gemm_lanes(LK_Q4_0, w, row_bytes, rows, n, acts, act_bytes, tokens, y, ldy);
}
void pi2_lanes_x4_gemm_q4_0(const void *w, int64_t rows, int64_t n, const void *acts, int64_t tokens, float *y,
                            int64_t ldy) {
    gemm_lanes(LK_Q4_0_X4, w, pi2_row_size(PI2_Q4_0, n), rows, n, acts, pi2_row_size(PI2_Q8_0, n), tokens, y, ldy);
}

/* ---- the batch GEMM (kernels.h, pi2_batch_gemm): Q4_0 rows as lanes over a packed batch ----
 * lanes_tile's arithmetic, with the tile's tokens read through one pointer at fixed offsets (a
 * pi2_batch_block per block) instead of eight token pointers and their per-call block sums: the
 * compiler keeps the tile without spilling its addresses, and a call costs its rows' unpack only.
 * Each token's 8 dpbusd go in two chains of 4 (the int32 sums are exact, so the floats do not
 * change): one chain of 8 left the dpbusd port idle while it waited on its own latency. The
 * padding tokens of the last tile are computed (zeros) and not stored. */
static inline __attribute__((always_inline)) void batch_tile(const __m512i *u, const float *dw, int64_t nb,
                                                            const pi2_batch_block *a, float *y, int64_t ldy,
                                                            __mmask16 mask, int nt) {
    __m512 acc[PI2_BATCH_TILE];
#pragma GCC unroll 8
    for (int t = 0; t < PI2_BATCH_TILE; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, a++) {
        __m512i w[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) w[j] = u[b * 8 + j];
        const __m512 d = _mm512_load_ps(dw + b * LROWS);
#pragma GCC unroll 8
        for (int t = 0; t < PI2_BATCH_TILE; t++) {
            const uint8_t *q = (const uint8_t *)a->qs[t / 2][0][t % 2]; /* group j at q + 16 (j / 2) + 4 (j % 2) */
            __m512i s0 = _mm512_set1_epi32(a->nib_off[t]), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int j = 0; j < 8; j += 2) {
                int32_t v0, v1;
                memcpy(&v0, q + 8 * j, 4);
                memcpy(&v1, q + 8 * j + 4, 4);
                s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(v0));
                s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_set1_epi32(v1));
            }
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a->d[t]));
            const __m512 p = _mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), scale,
                                                 _MM_FROUND_CUR_DIRECTION);
            acc[t] = _mm512_add_round_ps(acc[t], p, _MM_FROUND_CUR_DIRECTION);
        }
    }
    for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + t * ldy, mask, acc[t]);
}

static void batch_gemm_q4_0(const void *w, size_t row_bytes, int x4, int64_t rows, int64_t n,
                            const pi2_batch_block *batch, int64_t tokens, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK;
    __m512i *u = aligned_alloc(64, (size_t)nb * 8 * sizeof(__m512i));
    float *dw = aligned_alloc(64, (size_t)nb * LROWS * sizeof(float));
    if (!u || !dw) abort();
    for (int64_t r = 0; r < rows; r += LROWS) {
        const int nr = rows - r < LROWS ? (int)(rows - r) : LROWS;
        const __mmask16 mask = (__mmask16)((1u << nr) - 1);
        unpack_lanes(x4 ? LK_Q4_0_X4 : LK_Q4_0, (const uint8_t *)w + (size_t)r * row_bytes, row_bytes, nr, nb, u, dw, NULL);
        for (int64_t t = 0; t < tokens; t += PI2_BATCH_TILE) {
            const int nt = tokens - t < PI2_BATCH_TILE ? (int)(tokens - t) : PI2_BATCH_TILE;
            batch_tile(u, dw, nb, batch + (t / PI2_BATCH_TILE) * nb, y + t * ldy + r, ldy, mask, nt);
        }
    }
    free(u);
    free(dw);
}

/* The batch GEMM's unpack for other levels on this core (kernels_amx.c): rows r0.. of a Q4_0 matrix as
 * unpack_lanes lays them out, the same bytes the avx512 batch GEMM reads. */
void pi2_lanes_unpack_q4_0(const uint8_t *w, size_t row_bytes, int x4, int nr, int64_t nb, void *u, float *dw) {
    unpack_lanes(x4 ? LK_Q4_0_X4 : LK_Q4_0, w, row_bytes, nr, nb, u, dw, NULL);
}

/* Q4_1 and Q8_0 take it for every GEMM (attention, a dense down copy, the output matrix): no
 * interleaved layout has to agree with their plain GEMM. Q4_0's plain GEMM and its x4 layout take it
 * from PI2_LANES_MIN_TOKENS tokens (pi2_lanes_gemm_q4_0 above). */
void pi2_kernels_fill_lanes_avx512(pi2_kernel_table *t) {
    t->gemm_strided[PI2_Q4_0] = gemm_lanes_q4_0;
    t->batch_gemm[PI2_Q4_0] = batch_gemm_q4_0;
    t->gemm[PI2_Q4_1] = t->gemm_strided[PI2_Q4_1] = gemm_lanes_q4_1;
    t->gemm[PI2_Q8_0] = t->gemm_strided[PI2_Q8_0] = gemm_lanes_q8_0;
}
