/* The x86-64 kernels, compiled once per level: kernels_avx2.c (AVX2 + FMA + F16C, Haswell / Zen)
 * and kernels_avx512.c (adds AVX-512 VL/BW and VNNI, which also brings its own gemm). The only
 * difference between the copies below is dot_u8s8(): one VPDPBUSD where VNNI is enabled, otherwise
 * maddubs + madd. Both give the same int32 sums (maddubs cannot saturate on these inputs: |w| <= 128,
 * |a| <= 127), so every level returns the same floats. Each including file defines its own
 * pi2_kernels_fill_* that calls x86_fill(); everything here is static, so the copies never collide.
 *
 * Quantized dots work on one 32-element block at a time: nibbles are unpacked to bytes, multiplied
 * with the int8 activations (u8 x s8 -> int32 lanes), converted to float, and accumulated with the
 * block's scale product by FMA. The gemm reuses each unpacked weight block for 4 tokens and keeps a
 * tile of tokens' activations in cache while every weight row streams past once. */
#ifndef PI2_KERNELS_X86_COMMON_H
#define PI2_KERNELS_X86_COMMON_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernels_impl.h"

static inline float h2f(pi2_f16 h) { return _cvtsh_ss(h); }

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31) */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    __m128i t = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* sum over pairs of u8 * s8, as 8 float lanes */
static inline __m256 dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s));
#else
    __m256i p16 = _mm256_maddubs_epi16(u, s);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
#endif
}

/* signed x signed via |w| and a with w's sign */
static inline __m256 dot_s8s8(__m256i w, __m256i a) {
    return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

static float dot_q4_0(int64_t n, const void *row, const void *act) {
    const pi2_block_q4_0 *w = row;
    const pi2_block_q8_0 *a = act;
    const int64_t nb = n / PI2_QK;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256i eight = _mm256_set1_epi8(8);
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        __m256i w0 = _mm256_sub_epi8(unpack_nibbles(w[i].qs), eight);
        __m256i w1 = _mm256_sub_epi8(unpack_nibbles(w[i + 1].qs), eight);
        __m256 p0 = dot_s8s8(w0, _mm256_loadu_si256((const __m256i *)a[i].qs));
        __m256 p1 = dot_s8s8(w1, _mm256_loadu_si256((const __m256i *)a[i + 1].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), acc0);
        acc1 = _mm256_fmadd_ps(p1, _mm256_set1_ps(h2f(w[i + 1].d) * h2f(a[i + 1].d)), acc1);
    }
    for (; i < nb; i++) {
        __m256i w0 = _mm256_sub_epi8(unpack_nibbles(w[i].qs), eight);
        __m256 p0 = dot_s8s8(w0, _mm256_loadu_si256((const __m256i *)a[i].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* Converts a block's adjacent fp16 pair (d, m) or (d, s) in one instruction: lanes [first, second]. */
static inline __m128 h2f_pair(const pi2_f16 *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)u));
}

static float dot_q4_1(int64_t n, const void *row, const void *act) {
    const pi2_block_q4_1 *w = row;
    const pi2_block_q8_1 *a = act;
    const int64_t nb = n / PI2_QK;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m128 ms = _mm_setzero_ps(); /* lane 1 accumulates m_w * s_a */
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        /* [d_w d_a, m_w s_a] for both blocks */
        const __m128 s0 = _mm_mul_ps(h2f_pair(&w[i].d), h2f_pair(&a[i].d));
        const __m128 s1 = _mm_mul_ps(h2f_pair(&w[i + 1].d), h2f_pair(&a[i + 1].d));
        __m256 p0 = dot_u8s8(unpack_nibbles(w[i].qs), _mm256_loadu_si256((const __m256i *)a[i].qs));
        __m256 p1 = dot_u8s8(unpack_nibbles(w[i + 1].qs), _mm256_loadu_si256((const __m256i *)a[i + 1].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_broadcastss_ps(s0), acc0);
        acc1 = _mm256_fmadd_ps(p1, _mm256_broadcastss_ps(s1), acc1);
        ms = _mm_add_ps(ms, _mm_add_ps(s0, s1));
    }
    for (; i < nb; i++) {
        const __m128 s0 = _mm_mul_ps(h2f_pair(&w[i].d), h2f_pair(&a[i].d));
        __m256 p0 = dot_u8s8(unpack_nibbles(w[i].qs), _mm256_loadu_si256((const __m256i *)a[i].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_broadcastss_ps(s0), acc0);
        ms = _mm_add_ps(ms, s0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1)) + _mm_cvtss_f32(_mm_shuffle_ps(ms, ms, 1));
}

static float dot_q8_0(int64_t n, const void *row, const void *act) {
    const pi2_block_q8_0 *w = row, *a = act;
    const int64_t nb = n / PI2_QK;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        __m256 p0 = dot_s8s8(_mm256_loadu_si256((const __m256i *)w[i].qs), _mm256_loadu_si256((const __m256i *)a[i].qs));
        __m256 p1 = dot_s8s8(_mm256_loadu_si256((const __m256i *)w[i + 1].qs),
                             _mm256_loadu_si256((const __m256i *)a[i + 1].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), acc0);
        acc1 = _mm256_fmadd_ps(p1, _mm256_set1_ps(h2f(w[i + 1].d) * h2f(a[i + 1].d)), acc1);
    }
    for (; i < nb; i++) {
        __m256 p0 = dot_s8s8(_mm256_loadu_si256((const __m256i *)w[i].qs), _mm256_loadu_si256((const __m256i *)a[i].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

static float dot_f32(int64_t n, const void *row, const void *act) {
    const float *w = row, *a = act;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), acc[0]);
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) s += w[i] * a[i];
    return s;
}

static inline __m256 load_h8(const pi2_f16 *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* dot_f16's last step, one place for it and rows_f16: the four accumulators' sum, then the
 * elements past the last 8 (i..n) */
static inline __attribute__((always_inline)) float f16_finish(const __m256 *acc, const pi2_f16 *w, const pi2_f16 *a,
                                                             int64_t i, int64_t n) {
    float s = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++) s += _cvtsh_ss(w[i]) * _cvtsh_ss(a[i]);
    return s;
}

static inline __attribute__((always_inline)) float dot_f16(int64_t n, const void *row, const void *act) {
    const pi2_f16 *w = row, *a = act;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) acc[k] = _mm256_fmadd_ps(load_h8(w + i + 8 * k), load_h8(a + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_h8(w + i), load_h8(a + i), acc[0]);
    return f16_finish(acc, w, a, i, n);
}

/* F16 rows against one F16 activation, four rows a step: the activation's pieces are converted once
 * for the four, and each row keeps dot_f16's accumulators and order, so the floats are dot_f16's
 * whichever rows share a step. The predictors' second matrix has rows as short as the predictor's
 * rank (32 on the synthetic shapes, 14336 rows a layer): a call and a conversion of the activation
 * per row cost more than the row's arithmetic. */
static void rows_f16(const void *w, size_t rb, const int32_t *idx, int64_t count, int64_t n, const void *act, float *y) {
    const pi2_f16 *a = act;
    int64_t r = 0;
    for (; r + 4 <= count; r += 4) {
        const pi2_f16 *row[4];
        __m256 acc[4][4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            row[k] = (const pi2_f16 *)((const uint8_t *)w + (size_t)(idx ? idx[r + k] : r + k) * rb);
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) acc[k][q] = _mm256_setzero_ps();
        }
        int64_t i = 0;
        for (; i + 32 <= n; i += 32) {
            __m256 x[4];
#pragma GCC unroll 4
            for (int q = 0; q < 4; q++) x[q] = load_h8(a + i + 8 * q);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++)
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) acc[k][q] = _mm256_fmadd_ps(load_h8(row[k] + i + 8 * q), x[q], acc[k][q]);
        }
        for (; i + 8 <= n; i += 8) {
            const __m256 x = load_h8(a + i);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) acc[k][0] = _mm256_fmadd_ps(load_h8(row[k] + i), x, acc[k][0]);
        }
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) y[r + k] = f16_finish(acc[k], row[k], a, i, n);
    }
    for (; r < count; r++) y[r] = dot_f16(n, (const uint8_t *)w + (size_t)(idx ? idx[r] : r) * rb, act);
}

/* ---- axpy: y += a * dequant(row) ---- */

/* 32 int8 -> floats, y += q * s + m (s, m: one value in every lane). 16 floats per instruction
 * where AVX-512 is enabled, 8 otherwise; the same arithmetic per element either way. */
static inline void axpy_block_s8(__m256i q, __m256 s, __m256 m, float *y) {
#if defined(__AVX512F__)
    const __m512 s16 = _mm512_broadcastss_ps(_mm256_castps256_ps128(s));
    const __m512 m16 = _mm512_broadcastss_ps(_mm256_castps256_ps128(m));
    const __m512 g0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
    const __m512 g1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
    _mm512_storeu_ps(y, _mm512_add_ps(_mm512_loadu_ps(y), _mm512_fmadd_ps(g0, s16, m16)));
    _mm512_storeu_ps(y + 16, _mm512_add_ps(_mm512_loadu_ps(y + 16), _mm512_fmadd_ps(g1, s16, m16)));
#else
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    __m256 f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    __m256 f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_loadu_ps(y), _mm256_fmadd_ps(f0, s, m)));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_loadu_ps(y + 8), _mm256_fmadd_ps(f1, s, m)));
    _mm256_storeu_ps(y + 16, _mm256_add_ps(_mm256_loadu_ps(y + 16), _mm256_fmadd_ps(f2, s, m)));
    _mm256_storeu_ps(y + 24, _mm256_add_ps(_mm256_loadu_ps(y + 24), _mm256_fmadd_ps(f3, s, m)));
#endif
}

static void axpy_q4_0(int64_t n, float a, const void *row, float *y) {
    const pi2_block_q4_0 *w = row;
    const __m256i eight = _mm256_set1_epi8(8);
    for (int64_t i = 0; i < n / PI2_QK; i++, y += PI2_QK)
        axpy_block_s8(_mm256_sub_epi8(unpack_nibbles(w[i].qs), eight), _mm256_set1_ps(a * h2f(w[i].d)),
                      _mm256_setzero_ps(), y);
}

#if defined(__AVX512F__)
/* The columns' streams are prefetched this far ahead, as the dots' rows are (PF_DIST): a decode chunk's
 * columns sit at random places, and DRAM answers one line at a time without it (the FFN micro-benchmark
 * of 8 layers' waves, one thread: 15.2 -> 11.2 ms a token at 512 bytes; 256 and 1024 gave 11.9 and 12.2). */
#define AXPY_PF_DIST 512

/* axpy_rows_q4_0 at AVX-512 for NR rows. A span of blocks' scales is taken first, a[r] * d as floats
 * (16 blocks' F16 scales gathered at once, converted together), so the main loop broadcasts them from
 * memory; each nibble byte goes to a dword (vpmovzxbd) and through a 16-float table to q - 8
 * (vpermps reads only the index's low 4 bits: the low nibble needs no mask, the high one a shift).
 * Per row and block, (q - 8) * s + 0 is then added to y: the reference's floats, with 6 vector
 * micro-ops where the byte unpack, sign extensions, int -> float conversions and the scale's
 * convert-and-broadcast took ~15. Those two vector ports, not DRAM, bounded the kernel: 4 columns
 * of 4096 in L1, one thread of the 2-vCPU Sapphire Rapids VM, 1487 -> 778 ns a call. */
static inline __attribute__((always_inline)) void axpy_rows_q4_0_nr(int NR, int64_t n, const float *a,
                                                                   const uint8_t *const *rows, float *y,
                                                                   pi2_ahead *ahead) {
    enum { AXPY_SPAN = 64 };
    const int64_t nb = n / PI2_QK;
    const __m512 q_minus_8 = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512 zero = _mm512_setzero_ps();
    const __m512i d_at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)sizeof(pi2_block_q4_0))); /* scale offsets */
    float sc[4][AXPY_SPAN];
    pi2_ahead_pace(ahead, nb);
    for (int64_t i0 = 0; i0 < nb; i0 += AXPY_SPAN) {
        const int64_t span = nb - i0 < AXPY_SPAN ? nb - i0 : AXPY_SPAN;
        for (int r = 0; r < NR; r++) {
            const pi2_block_q4_0 *w = (const pi2_block_q4_0 *)rows[r] + i0;
            const __m512 ar = _mm512_set1_ps(a[r]);
            for (int64_t k = 0; k < span; k += 16) { /* 16 blocks' scales, masked past the row's end */
                const __mmask16 m = span - k >= 16 ? 0xffff : (__mmask16)((1u << (span - k)) - 1);
                const __m512i dw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, d_at, w + k, 1);
                _mm512_storeu_ps(&sc[r][k], _mm512_mul_ps(ar, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dw))));
            }
        }
        for (int64_t i = 0; i < span; i++) {
            pi2_ahead_step(ahead);
            float *yb = y + (i0 + i) * PI2_QK;
            __m512 y0 = _mm512_loadu_ps(yb), y1 = _mm512_loadu_ps(yb + 16);
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const pi2_block_q4_0 *w = (const pi2_block_q4_0 *)rows[r] + i0 + i;
                __builtin_prefetch((const uint8_t *)w + AXPY_PF_DIST, 0, 3);
                const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)w->qs));
                const __m512 s = _mm512_set1_ps(sc[r][i]);
                y0 = _mm512_add_ps(y0, _mm512_fmadd_ps(_mm512_permutexvar_ps(q, q_minus_8), s, zero));
                y1 = _mm512_add_ps(y1, _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), q_minus_8), s, zero));
            }
            _mm512_storeu_ps(yb, y0);
            _mm512_storeu_ps(yb + 16, y1);
        }
    }
}
#endif

/* y += a[0] * row 0 + ... + a[count-1] * row count-1 (count <= 4), block by block with y held in
 * registers: the rows are added in order exactly as axpy_q4_0 adds them one call after another (y +
 * (q * s + 0) per row), so the floats are the same, but y is read and written once per group. */
static void axpy_rows_q4_0(int64_t n, const float *a, const uint8_t *const *rows, int count, float *y,
                           pi2_ahead *ahead) {
#if defined(__AVX512F__)
    switch (count) {
    case 1: axpy_rows_q4_0_nr(1, n, a, rows, y, ahead); break;
    case 2: axpy_rows_q4_0_nr(2, n, a, rows, y, ahead); break;
    case 3: axpy_rows_q4_0_nr(3, n, a, rows, y, ahead); break;
    default: axpy_rows_q4_0_nr(4, n, a, rows, y, ahead); break;
    }
#else
    const __m256i eight = _mm256_set1_epi8(8);
    const __m256 zero = _mm256_setzero_ps();
    pi2_ahead_pace(ahead, n / PI2_QK);
    for (int64_t i = 0; i < n / PI2_QK; i++, y += PI2_QK) {
        pi2_ahead_step(ahead);
        __m256 acc[4];
        for (int k = 0; k < 4; k++) acc[k] = _mm256_loadu_ps(y + 8 * k);
        for (int r = 0; r < count; r++) {
            const pi2_block_q4_0 *w = (const pi2_block_q4_0 *)rows[r] + i;
            const __m256i q = _mm256_sub_epi8(unpack_nibbles(w->qs), eight);
            const __m256 s = _mm256_set1_ps(a[r] * h2f(w->d));
            const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
            const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
            for (int k = 0; k < 4; k++)
                acc[k] = _mm256_add_ps(acc[k], _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[k])), s, zero));
        }
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(y + 8 * k, acc[k]);
    }
#endif
}

/* ---- axpy over a batch: prefill's down pass (kernels_axpy_batch.h's driver around these two) ---- */

/* block w's 32 weights as floats, q - 8 (exact) */
static inline void axb_unpack(const pi2_block_q4_0 *w, float *f) {
    const __m256i q = _mm256_sub_epi8(unpack_nibbles(w->qs), _mm256_set1_epi8(8));
#if defined(__AVX512F__)
    _mm512_store_ps(f, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))));
    _mm512_store_ps(f + 16, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))));
#else
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_store_ps(f, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)));
    _mm256_store_ps(f + 8, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))));
    _mm256_store_ps(f + 16, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)));
    _mm256_store_ps(f + 24, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))));
#endif
}

/* y[0..32) += a[k] * (qf[c] * d[c]) for k < count, c = ix[k] - c0, as axpy_q4_0: y + (q * (a * d) + 0) */
static inline void axb_add(float *y, const float *qf, const float *d, const int32_t *ix, int32_t c0, const float *a,
                           int32_t count) {
#if defined(__AVX512F__)
    const __m512 zero = _mm512_setzero_ps();
    __m512 y0 = _mm512_load_ps(y), y1 = _mm512_load_ps(y + 16);
    for (int32_t k = 0; k < count; k++) {
        const int32_t c = ix[k] - c0;
        const float *f = qf + c * PI2_QK;
        const __m512 s = _mm512_set1_ps(a[k] * d[c]);
        y0 = _mm512_add_ps(y0, _mm512_fmadd_ps(_mm512_load_ps(f), s, zero));
        y1 = _mm512_add_ps(y1, _mm512_fmadd_ps(_mm512_load_ps(f + 16), s, zero));
    }
    _mm512_store_ps(y, y0);
    _mm512_store_ps(y + 16, y1);
#else
    const __m256 zero = _mm256_setzero_ps();
    __m256 acc[4];
    for (int i = 0; i < 4; i++) acc[i] = _mm256_load_ps(y + 8 * i);
    for (int32_t k = 0; k < count; k++) {
        const int32_t c = ix[k] - c0;
        const float *f = qf + c * PI2_QK;
        const __m256 s = _mm256_set1_ps(a[k] * d[c]);
        for (int i = 0; i < 4; i++) acc[i] = _mm256_add_ps(acc[i], _mm256_fmadd_ps(_mm256_load_ps(f + 8 * i), s, zero));
    }
    for (int i = 0; i < 4; i++) _mm256_store_ps(y + 8 * i, acc[i]);
#endif
}

#include "kernels_axpy_batch.h"

static void axpy_q4_1(int64_t n, float a, const void *row, float *y) {
    const pi2_block_q4_1 *w = row;
    for (int64_t i = 0; i < n / PI2_QK; i++, y += PI2_QK)
        axpy_block_s8(unpack_nibbles(w[i].qs), _mm256_set1_ps(a * h2f(w[i].d)), _mm256_set1_ps(a * h2f(w[i].m)), y);
}

static void axpy_q8_0(int64_t n, float a, const void *row, float *y) {
    const pi2_block_q8_0 *w = row;
    for (int64_t i = 0; i < n / PI2_QK; i++, y += PI2_QK)
        axpy_block_s8(_mm256_loadu_si256((const __m256i *)w[i].qs), _mm256_set1_ps(a * h2f(w[i].d)),
                      _mm256_setzero_ps(), y);
}

static void axpy_f32(int64_t n, float a, const void *row, float *y) {
    const float *w = row;
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(va, _mm256_loadu_ps(w + i))));
    for (; i < n; i++) y[i] += a * w[i];
}

static inline __attribute__((always_inline)) void axpy_f16(int64_t n, float a, const void *row, float *y) {
    const pi2_f16 *w = row;
    const __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_mul_ps(va, load_h8(w + i))));
    for (; i < n; i++) y[i] += a * _cvtsh_ss(w[i]);
}

#include "kernels_att.h"

/* ---- activation quantizers: llama.cpp's x86 quantize_row_q8_0/q8_1 semantics ---- */

static inline float block_amax(const float *x, __m256 v[4]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

/* rounds x * id to nearest even, packs to 32 int8 in order; returns the int sum */
static inline int quantize_block(const __m256 v[4], float id, int8_t *out) {
    const __m256 mul = _mm256_set1_ps(id);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[0], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[1], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[2], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[3], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    /* packs work within 128-bit lanes; the permute restores element order */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)out, p);
    return _mm_cvtsi128_si32(s4);
}

static void act_q8_0(const float *x, void *out, int64_t n) {
    pi2_block_q8_0 *y = out;
    __m256 v[4];
    for (int64_t i = 0; i < n / PI2_QK; i++, x += PI2_QK) {
        const float amax = block_amax(x, v), d = amax / 127.0f;
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        quantize_block(v, amax != 0.0f ? 127.0f / amax : 0.0f, y[i].qs);
    }
}

static void act_q8_1(const float *x, void *out, int64_t n) {
    pi2_block_q8_1 *y = out;
    __m256 v[4];
    for (int64_t i = 0; i < n / PI2_QK; i++, x += PI2_QK) {
        const float amax = block_amax(x, v), d = amax / 127.0f;
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        int sum = quantize_block(v, amax != 0.0f ? 127.0f / amax : 0.0f, y[i].qs);
        y[i].s = _cvtss_sh(d * (float)sum, _MM_FROUND_TO_NEAREST_INT);
    }
}

static void act_f16(const float *x, void *out, int64_t n) {
    pi2_f16 *h = out;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) h[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

/* ---- gemm: the tiling driver (kernels_gemm_tiles.h) around this level's micro-kernel ---- */

/* Q4_0's nibbles are unpacked as 0..15: the -8 comes back as a per-token term, 8 * d * the block's sum. */
static inline int block_sum_s8(const int8_t *qs) {
    __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256((const __m256i *)qs));
    __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    return _mm_cvtsi128_si32(s4);
}
#define PI2_GEMM_ACT uint8_t
#define PI2_GEMM_Q4_0_OFFSET(q) (8.0f * h2f((q)->d) * (float)block_sum_s8((q)->qs))
#include "kernels_gemm_tiles.h"

/* One 128-bit load gives a block's scales for the whole micro-tile. */
static inline __attribute__((always_inline)) void gemm_row_micro(int kind, int nt, const void *wrow, int64_t nb,
                                                                 const PI2_GEMM_ACT *const *acts, size_t ablock,
                                                                 const float *da, const float *ca, float *out) {
    __m256 acc[MICRO];
    __m128 corr = _mm_setzero_ps();
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i wq;
        float dw, cw = 0.0f;
        if (kind == KIND_Q4_0) {
            const pi2_block_q4_0 *w = (const pi2_block_q4_0 *)wrow + b;
            wq = unpack_nibbles(w->qs); /* 0..15; the -8 comes back through the offset term */
            dw = h2f(w->d);
            cw = -dw;
        } else if (kind == KIND_Q4_1) {
            const pi2_block_q4_1 *w = (const pi2_block_q4_1 *)wrow + b;
            wq = unpack_nibbles(w->qs);
            dw = h2f(w->d);
            cw = h2f(w->m);
        } else {
            const pi2_block_q8_0 *w = (const pi2_block_q8_0 *)wrow + b;
            wq = _mm256_loadu_si256((const __m256i *)w->qs);
            dw = h2f(w->d);
        }
        float scale[MICRO];
        _mm_storeu_ps(scale, _mm_mul_ps(_mm_set1_ps(dw), _mm_loadu_ps(da + b * MICRO)));
        if (kind != KIND_Q8_0) corr = _mm_fmadd_ps(_mm_set1_ps(cw), _mm_loadu_ps(ca + b * MICRO), corr);
        const __m256i wabs = kind == KIND_Q8_0 ? _mm256_sign_epi8(wq, wq) : wq;
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            __m256i aq = _mm256_loadu_si256((const __m256i *)(acts[t] + b * ablock));
            if (kind == KIND_Q8_0) aq = _mm256_sign_epi8(aq, wq);
            acc[t] = _mm256_fmadd_ps(dot_u8s8(wabs, aq), _mm256_broadcast_ss(&scale[t]), acc[t]);
        }
    }
    float c[MICRO];
    _mm_storeu_ps(c, corr);
    for (int t = 0; t < nt; t++) out[t] = hsum8(acc[t]) + c[t];
}


PI2_ROWS_VIA_DOT(f32)
PI2_ROWS_VIA_DOT(q4_0)
PI2_ROWS_VIA_DOT(q4_1)
PI2_ROWS_VIA_DOT(q8_0)
PI2_GEMM_VIA_DOT(f32)
PI2_GEMM_VIA_DOT(f16)

static void x86_fill(pi2_kernel_table *t) {
    PI2_KERNELS_SET_COMMON(t);
    t->axpy_rows[PI2_Q4_0] = axpy_rows_q4_0;
    t->axpy_batch[PI2_Q4_0] = axpy_batch_q4_0;
    t->act_q8_0 = act_q8_0;
    t->act_q8_1 = act_q8_1;
    t->act_f16 = act_f16;
}

#endif
