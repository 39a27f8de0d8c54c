/* AVX2 + FMA + F16C kernels (x86-64 since Haswell / Zen). Built with -mavx2 -mfma -mf16c and only
 * called after cpuid said yes. The kernels themselves are in kernels_x86_common.h, but for the batch
 * GEMM below (AVX-512 has its own). */
#include "kernels_x86_common.h"

/* ---- the batch GEMM (kernels.h, pi2_batch_gemm): Q4_0 rows as lanes, 8 rows a ymm ----
 * kernels_lanes_avx512.c's arithmetic without VNNI: a group of 8 rows is unpacked once per call into 8
 * ymm a block (ymm j: every row's nibbles 4j..4j+3, unsigned), and a token's 4-byte group j is
 * broadcast against it with VPMADDUBSW. The 8 groups' int16 pair sums add up in int16 (16 products
 * a lane, each |nibble x quant| <= 15 x 127: at most 30480, no overflow: Q8_0 quants are within
 * +-127) and one VPMADDWD finishes the block's int32 per row. Per row and token the floats are the
 * scalar reference's (sum += (float)isum * (d_w * d_a), block after block, no FMA), so prefill gives
 * the same floats at the avx2, avx512 and scalar levels. The GEMM it replaces (gemm_quant) did 29
 * GMAC/s per CPU second in the 7B shape's prefill. */
#define AROWS 8

static void batch_unpack8(const uint8_t *w, size_t row_bytes, int x4, int64_t r0, int nr, int64_t nb, uint32_t *u,
                          float *dw) {
    for (int64_t b = 0; b < nb; b++)
        for (int i = 0; i < AROWS; i++) {
            uint32_t q[4] = {0, 0, 0, 0};
            float d = 0.0f;
            if (i < nr) {
                const int64_t r = r0 + i;
                const uint8_t *qs;
                pi2_f16 h;
                if (x4) { /* pi2_x4_pack: per group of 4 rows and block, the rows' 16 quant bytes, then 4 scales */
                    const uint8_t *rec = w + (size_t)((r / 4) * nb + b) * 4 * sizeof(pi2_block_q4_0);
                    qs = rec + 16 * (r % 4);
                    memcpy(&h, rec + 64 + 2 * (r % 4), sizeof h);
                } else {
                    const pi2_block_q4_0 *x = (const pi2_block_q4_0 *)(w + (size_t)r * row_bytes) + b;
                    qs = x->qs;
                    h = x->d;
                }
                memcpy(q, qs, sizeof q);
                d = h2f(h);
            }
            for (int j = 0; j < 4; j++) {
                u[(b * 8 + j) * AROWS + i] = q[j] & 0x0f0f0f0fu;            /* elements 4j..4j+3 */
                u[(b * 8 + j + 4) * AROWS + i] = (q[j] >> 4) & 0x0f0f0f0fu; /* elements 16 + 4j.. */
            }
            dw[b * AROWS + i] = d;
        }
}

static void batch_tile8(const uint32_t *u, const float *dw, int64_t nb, const pi2_batch_block *a, float *y, int64_t ldy,
                        int nr, int nt) {
    __m256 acc[PI2_BATCH_TILE];
#pragma GCC unroll 8
    for (int t = 0; t < PI2_BATCH_TILE; t++) acc[t] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++, a++) {
        const __m256i *w = (const __m256i *)(u + b * 8 * AROWS);
        const __m256 d = _mm256_loadu_ps(dw + b * AROWS);
#pragma GCC unroll 8
        for (int t = 0; t < PI2_BATCH_TILE; t++) {
            const uint8_t *q = (const uint8_t *)a->qs[t / 2][0][t % 2]; /* group j at q + 16 (j / 2) + 4 (j % 2) */
            __m256i s = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                int32_t v;
                memcpy(&v, q + 16 * (j / 2) + 4 * (j % 2), 4);
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(_mm256_loadu_si256(w + j), _mm256_set1_epi32(v)));
            }
            const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(s, ones), _mm256_set1_epi32(a->nib_off[t]));
            __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(a->d[t])));
            __asm__("" : "+x"(p)); /* keep the multiply apart from the add: no FMA (-mfma lets GCC fuse them) */
            acc[t] = _mm256_add_ps(acc[t], p);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        if (nr == AROWS) {
            _mm256_storeu_ps(y + t * ldy, acc[t]);
        } else {
            float o[AROWS];
            _mm256_storeu_ps(o, acc[t]);
            memcpy(y + t * ldy, o, sizeof(float) * (size_t)nr);
        }
    }
}

static void batch_gemm_q4_0_avx2(const void *w, size_t row_bytes, int x4, int64_t rows, int64_t n,
                                 const pi2_batch_block *batch, int64_t tokens, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK;
    uint32_t *u = aligned_alloc(32, (size_t)nb * 8 * AROWS * sizeof(uint32_t));
    float *dw = aligned_alloc(32, (size_t)nb * AROWS * sizeof(float));
    if (!u || !dw) abort();
    for (int64_t r = 0; r < rows; r += AROWS) {
        const int nr = rows - r < AROWS ? (int)(rows - r) : AROWS;
        batch_unpack8((const uint8_t *)w, row_bytes, x4, r, nr, nb, u, dw);
        for (int64_t t = 0; t < tokens; t += PI2_BATCH_TILE) {
            const int nt = tokens - t < PI2_BATCH_TILE ? (int)(tokens - t) : PI2_BATCH_TILE;
            batch_tile8(u, dw, nb, batch + (t / PI2_BATCH_TILE) * nb, y + t * ldy + r, ldy, nr, nt);
        }
    }
    free(u);
    free(dw);
}

void pi2_kernels_fill_avx2(pi2_kernel_table *t) {
    x86_fill(t);
    t->batch_gemm[PI2_Q4_0] = batch_gemm_q4_0_avx2;
}
