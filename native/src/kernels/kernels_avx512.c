/* AVX-512 (F, BW, VL) + VNNI kernels (Ice Lake, Sapphire Rapids, Zen 4 and later). Built with those
 * flags and only called after cpuid said yes.
 *
 * Everything not overridden here is the AVX2 code of kernels_x86_common.h, recompiled so that each
 * u8 x s8 block dot is one VPDPBUSD. The quantized dots and the gemm below go further: one zmm holds
 * two 32-element blocks, so every instruction of the inner loop does twice the work.
 *
 * VPDPBUSD multiplies unsigned by signed bytes. Q4_1 nibbles are unsigned already. Q4_0 nibbles are
 * used as they are (0..15) and Q8_0 weights are biased by +128; the bias times the activations'
 * 4-byte group sums is subtracted in int32. Each int32 lane thus holds exactly what the AVX2 path's
 * lane holds (the sum of 4 products), and the float steps repeat the AVX2 order, so Q4_1 and Q8_0 dots
 * and gemv give the AVX2 dots' floats bit for bit and the gemm gives the AVX2 gemm's (Q4_0 aside, whose
 * AVX2 gemm corrects the offset in float). Q4_0's single rows go four blocks a step instead (quad_rows,
 * their own order, for every size), matrices repacked by four rows have their own kernel (x4_gemm_q4_0),
 * and the FFN's batches (the strided GEMM) take rows as lanes (kernels_lanes_avx512.c). */
#include "kernels_x86_common.h"

/* Two blocks' packed nibbles -> 64 bytes [lo(q0) hi(q0) lo(q1) hi(q1)], the element order of two
 * consecutive activation blocks. */
static inline __m512i nibbles2(const uint8_t *q0, const uint8_t *q1) {
    __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)q0)),
                                        _mm_loadu_si128((const __m128i *)q1), 1);
    __m512i d = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(t));
    d = _mm512_mask_srli_epi16(d, 0xFF00FF00u, d, 4); /* 128-bit lanes 1 and 3 take the high nibbles */
    return _mm512_and_si512(d, _mm512_set1_epi8(0x0f));
}

static inline __m512i load2(const int8_t *q0, const int8_t *q1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)q0)),
                              _mm256_loadu_si256((const __m256i *)q1), 1);
}

/* bias * (sum of each 4-byte group of a), the amount a biased weight adds to each lane */
static inline __m512i bias_lanes(__m512i a, int bias) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)bias), a);
}

/* [s0 x 8, s1 x 8] from s = [s0, s1, ...] */
static inline __m512 spread2(__m128 s) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(s));
}

static inline __m128 f16x2(pi2_f16 a, pi2_f16 b) {
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)a | (uint32_t)b << 16)));
}

/* [first, second] halves of the 4-byte headers at p0 and p1 (Q4_1's d, m; Q8_1's d, s): 4 floats */
static inline __m128 f16_pairs2(const void *p0, const void *p1) {
    uint32_t u0, u1;
    memcpy(&u0, p0, 4);
    memcpy(&u1, p1, 4);
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)((uint64_t)u1 << 32 | u0)));
}

/* lanes [0 x 8, 2 x 8] of v */
static inline __m512 spread02(__m128 v) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
                                 _mm512_castps128_ps512(v));
}

static inline __m256 lo8(__m512 v) { return _mm512_castps512_ps256(v); }
static inline __m256 hi8(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }

static float dot_q8_0_512(int64_t n, const void *row, const void *act) {
    const pi2_block_q8_0 *w = row, *a = act;
    const int64_t nb = n / PI2_QK;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        const __m512i aq = load2(a[i].qs, a[i + 1].qs);
        const __m512i wq = _mm512_xor_si512(load2(w[i].qs, w[i + 1].qs), _mm512_set1_epi8((char)0x80));
        __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, aq), bias_lanes(aq, 0x80));
        const __m128 s = _mm_mul_ps(f16x2(w[i].d, w[i + 1].d), f16x2(a[i].d, a[i + 1].d));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), spread2(s), acc);
    }
    __m256 acc0 = lo8(acc), acc1 = hi8(acc);
    if (i < nb) {
        __m256 p0 = dot_s8s8(_mm256_loadu_si256((const __m256i *)w[i].qs), _mm256_loadu_si256((const __m256i *)a[i].qs));
        acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), acc0);
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* Q4_1 pairs: v = [d_w d_a, m_w s_a] for both blocks in one conversion; lane 1 of ms adds up the
 * m_w s_a terms two blocks at a time, as the AVX2 dot does. */
static inline __attribute__((always_inline)) __m512 q4_1_pair(const pi2_block_q4_1 *x0, const pi2_block_q4_1 *x1,
                                                             __m512i aq, __m128 ads, __m512 acc, __m128 *ms) {
    const __m128 v = _mm_mul_ps(f16_pairs2(&x0->d, &x1->d), ads);
    const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), nibbles2(x0->qs, x1->qs), aq);
    *ms = _mm_add_ps(*ms, _mm_add_ps(v, _mm_movehl_ps(v, v)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), spread02(v), acc);
}

/* the odd last block, into the low half */
static inline __m256 q4_1_tail(const pi2_block_q4_1 *x, const pi2_block_q8_1 *a, __m256 acc0, __m128 *ms) {
    const __m128 s0 = _mm_mul_ps(h2f_pair(&x->d), h2f_pair(&a->d));
    *ms = _mm_add_ps(*ms, s0);
    return _mm256_fmadd_ps(dot_u8s8(unpack_nibbles(x->qs), _mm256_loadu_si256((const __m256i *)a->qs)),
                           _mm256_broadcastss_ps(s0), acc0);
}

static inline float q4_1_finish(__m256 acc0, __m256 acc1, __m128 ms) {
    return hsum8(_mm256_add_ps(acc0, acc1)) + _mm_cvtss_f32(_mm_shuffle_ps(ms, ms, 1));
}

static float dot_q4_1_512(int64_t n, const void *row, const void *act) {
    const pi2_block_q4_1 *w = row;
    const pi2_block_q8_1 *a = act;
    const int64_t nb = n / PI2_QK;
    __m512 acc = _mm512_setzero_ps();
    __m128 ms = _mm_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2)
        acc = q4_1_pair(&w[i], &w[i + 1], load2(a[i].qs, a[i + 1].qs), f16_pairs2(&a[i].d, &a[i + 1].d), acc, &ms);
    __m256 acc0 = lo8(acc), acc1 = hi8(acc);
    if (i < nb) acc0 = q4_1_tail(&w[i], &a[i], acc0, &ms);
    return q4_1_finish(acc0, acc1, ms);
}

/* ---- gemv over many rows (Q4_1, Q8_0; Q4_0 has quad_rows below) ----
 * The activation is packed once per call (act_pair, below: its bytes, bias lanes and spread scales),
 * and rows go 4 at a time, so the per-row cost is the weight unpack and four vector operations per
 * block pair. Each row's float steps are those of the dots above, so gemv and vec_dot agree bit for
 * bit (the sparse engine computes single neurons with vec_dot, the dense path with gemv). */

typedef struct {
    __m512i q;   /* activation bytes of a block pair */
    __m512i off; /* -128 * group sums (Q8_0; Q4_1: unused) */
    __m512 d;    /* [d0 x 8, d1 x 8] */
    __m128 ds;   /* Q4_1: [d0, s0, d1, s1] */
} act_pair;

enum { KIND_Q4_0_512, KIND_Q4_1_512, KIND_Q8_0_512 };

static inline size_t act_block_bytes(int kind) {
    return kind == KIND_Q4_1_512 ? sizeof(pi2_block_q8_1) : sizeof(pi2_block_q8_0);
}
static inline size_t weight_block_bytes(int kind) {
    return kind == KIND_Q4_0_512 ? sizeof(pi2_block_q4_0)
           : kind == KIND_Q4_1_512 ? sizeof(pi2_block_q4_1)
                                   : sizeof(pi2_block_q8_0);
}

/* One activation (Q8_0 or Q8_1 blocks) as np = ceil(nb / 2) pairs; an odd last block is paired with
 * a zero block of scale 0. */
static void pack_act(int kind, const uint8_t *a, int64_t nb, act_pair *out) {
    const size_t ablock = act_block_bytes(kind);
    const size_t qs_off = kind == KIND_Q4_1_512 ? offsetof(pi2_block_q8_1, qs) : offsetof(pi2_block_q8_0, qs);
    static const int8_t zero_qs[32];
    for (int64_t p = 0; p < (nb + 1) / 2; p++) {
        const uint8_t *a0 = a + (size_t)(2 * p) * ablock, *a1 = a0 + ablock;
        const int has1 = 2 * p + 1 < nb;
        const __m512i q = load2((const int8_t *)(a0 + qs_off), has1 ? (const int8_t *)(a1 + qs_off) : zero_qs);
        pi2_f16 d0, d1 = 0;
        memcpy(&d0, a0, sizeof d0);
        if (has1) memcpy(&d1, a1, sizeof d1);
        out[p].q = q;
        out[p].off = _mm512_sub_epi32(_mm512_setzero_si512(), bias_lanes(q, 0x80)); /* Q8_0's; Q4_1 has none */
        out[p].d = spread2(f16x2(d0, d1));
        out[p].ds = f16_pairs2(a0, has1 ? (const void *)a1 : (const void *)zero_qs);
    }
}

/* Each row's stream is prefetched this far ahead: a core on its own keeps too few misses in flight
 * to read DRAM at full speed from four streams (a 226 MB Q4_0 GEMV on one thread of the dev VM went
 * from ~5.0 to ~7.0 GB/s with 512 bytes; 256 gave ~6.0, 1024 ~6.0, 2048 ~5.4). */
#define PF_DIST 512
/* gemv_rows' distance (Q4_1, Q8_0), measured apart: its four rows are neighbours in memory, and with
 * SmolLM2's short rows (576 columns: 360 B in Q4_1) 512 bytes ahead lands in a row another of the four
 * is already reading. One thread, SmolLM2's matrices (96 MB a token): 11.3-13.9 ms a token at 512,
 * 10.3-11.2 at 256 or 1024, 11.6-11.8 at 768; the engine's decode went from 79 to 88 tok/s. */
#define GEMV_PF_DIST 1024
/* y[r] for NR rows at once, the float steps of dot_*_512 per row */
static inline __attribute__((always_inline)) void gemv_rows(int kind, int NR, const uint8_t *const *wr, int64_t nb,
                                                           const act_pair *ap, const uint8_t *act, float *y) {
    const size_t wblock = weight_block_bytes(kind);
    __m512 acc[4];
    __m128 ms[4];
    for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps(), ms[r] = _mm_setzero_ps();
    int64_t i = 0;
    for (; i + 1 < nb; i += 2, ap++) {
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *w0 = wr[r] + (size_t)i * wblock, *w1 = w0 + wblock;
            __builtin_prefetch(w0 + GEMV_PF_DIST, 0, 3);
            if (kind == KIND_Q8_0_512) {
                const pi2_block_q8_0 *x0 = (const pi2_block_q8_0 *)w0, *x1 = (const pi2_block_q8_0 *)w1;
                const __m512i wq = _mm512_xor_si512(load2(x0->qs, x1->qs), _mm512_set1_epi8((char)0x80));
                const __m512i p = _mm512_dpbusd_epi32(ap->off, wq, ap->q);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(spread2(f16x2(x0->d, x1->d)), ap->d), acc[r]);
            } else {
                acc[r] = q4_1_pair((const pi2_block_q4_1 *)w0, (const pi2_block_q4_1 *)w1, ap->q, ap->ds, acc[r], &ms[r]);
            }
        }
    }
    for (int r = 0; r < NR; r++) {
        __m256 acc0 = lo8(acc[r]), acc1 = hi8(acc[r]);
        if (i < nb) { /* the dots' tail, on the odd last block */
            const uint8_t *wb = wr[r] + (size_t)i * wblock, *ab = act + (size_t)i * act_block_bytes(kind);
            const size_t qs_off = kind == KIND_Q4_1_512 ? offsetof(pi2_block_q8_1, qs) : offsetof(pi2_block_q8_0, qs);
            const __m256i aq = _mm256_loadu_si256((const __m256i *)(ab + qs_off));
            pi2_f16 da;
            memcpy(&da, ab, sizeof da);
            if (kind == KIND_Q8_0_512) {
                const pi2_block_q8_0 *x = (const pi2_block_q8_0 *)wb;
                const __m256 p0 = dot_s8s8(_mm256_loadu_si256((const __m256i *)x->qs), aq);
                acc0 = _mm256_fmadd_ps(p0, _mm256_set1_ps(h2f(x->d) * h2f(da)), acc0);
            } else {
                acc0 = q4_1_tail((const pi2_block_q4_1 *)wb, (const pi2_block_q8_1 *)ab, acc0, &ms[r]);
            }
        }
        y[r] = kind == KIND_Q4_1_512 ? q4_1_finish(acc0, acc1, ms[r]) : hsum8(_mm256_add_ps(acc0, acc1));
    }
}

/* Rows too long for the stack buffer go through the dots one at a time (same floats). */
#define GEMV_MAX_PAIRS 512

static void rows512(int kind, pi2_dot_fn dot, const void *w, size_t rb, const int32_t *idx, int64_t count, int64_t n,
                    const void *act, float *y) {
    const int64_t nb = n / PI2_QK;
    if ((nb + 1) / 2 > GEMV_MAX_PAIRS || count < 2) {
        pi2_rows_via_dot(dot, w, rb, idx, count, n, act, y);
        return;
    }
    act_pair packed[GEMV_MAX_PAIRS];
    pack_act(kind, act, nb, packed);
    const uint8_t *base = w;
    int64_t i = 0;
    for (; i < count; i += 4) {
        const int nr = count - i < 4 ? (int)(count - i) : 4;
        const uint8_t *wr[4];
        for (int r = 0; r < nr; r++) wr[r] = base + (size_t)(idx ? idx[i + r] : i + r) * rb;
        switch (kind * 8 + nr) { /* constant kind and row count keep the accumulators in registers */
#define CASE(K, NR) \
    case K * 8 + NR: gemv_rows(K, NR, wr, nb, packed, act, y + i); break;
            CASE(KIND_Q4_1_512, 1) CASE(KIND_Q4_1_512, 2) CASE(KIND_Q4_1_512, 3) CASE(KIND_Q4_1_512, 4)
            CASE(KIND_Q8_0_512, 1) CASE(KIND_Q8_0_512, 2) CASE(KIND_Q8_0_512, 3) CASE(KIND_Q8_0_512, 4)
#undef CASE
        }
    }
}

/* The packed activation of pi2_pack_act: the pairs, then the activation itself (the odd tail block
 * and the Q4_1 per-block terms are read from it). */
static size_t packed_size512(int kind, int64_t n) {
    const int64_t nb = n / PI2_QK;
    return (size_t)((nb + 1) / 2) * sizeof(act_pair) + (size_t)nb * act_block_bytes(kind);
}

static void pack512(int kind, const void *act, int64_t n, void *packed) {
    const int64_t nb = n / PI2_QK;
    pack_act(kind, act, nb, packed);
    memcpy((uint8_t *)packed + (size_t)((nb + 1) / 2) * sizeof(act_pair), act, (size_t)nb * act_block_bytes(kind));
}

/* up to 4 rows at once: gemv_rows on the rows' own pointers */
static inline void dot_packed_rows512(int kind, int64_t n, const uint8_t *const *rows, int count, const void *packed,
                                      float *y) {
    const int64_t nb = n / PI2_QK;
    const uint8_t *raw = (const uint8_t *)packed + (size_t)((nb + 1) / 2) * sizeof(act_pair);
    switch (kind * 8 + count) {
#define CASE(K, NR) \
    case K * 8 + NR: gemv_rows(K, NR, rows, nb, packed, raw, y); break;
        CASE(KIND_Q4_1_512, 1) CASE(KIND_Q4_1_512, 2) CASE(KIND_Q4_1_512, 3) CASE(KIND_Q4_1_512, 4)
        CASE(KIND_Q8_0_512, 1) CASE(KIND_Q8_0_512, 2) CASE(KIND_Q8_0_512, 3) CASE(KIND_Q8_0_512, 4)
#undef CASE
    }
}

static inline float dot_packed512(int kind, int64_t n, const void *row, const void *packed) {
    const uint8_t *rows[1] = {row};
    float y;
    dot_packed_rows512(kind, n, rows, 1, packed, &y);
    return y;
}

#define PACKED(T, K)                                                                                      \
    static size_t packed_size_##T(int64_t n) { return packed_size512(K, n); }                            \
    static void pack_##T(const void *act, int64_t n, void *packed) { pack512(K, act, n, packed); }       \
    static float dot_packed_##T(int64_t n, const void *row, const void *packed) {                        \
        return dot_packed512(K, n, row, packed);                                                          \
    }                                                                                                     \
    static void dot_packed_rows_##T(int64_t n, const uint8_t *const *rows, int count, const void *packed, \
                                    float *y, pi2_ahead *ahead) { /* ahead: asked for after the call */   \
        (void)ahead;                                                                                      \
        dot_packed_rows512(K, n, rows, count, packed, y);                                                 \
    }
PACKED(q4_1, KIND_Q4_1_512)
PACKED(q8_0, KIND_Q8_0_512)
#undef PACKED

static void rows_q4_1_512(const void *w, size_t rb, const int32_t *idx, int64_t count, int64_t n, const void *act,
                          float *y) {
    rows512(KIND_Q4_1_512, dot_q4_1_512, w, rb, idx, count, n, act, y);
}
static void rows_q8_0_512(const void *w, size_t rb, const int32_t *idx, int64_t count, int64_t n, const void *act,
                          float *y) {
    rows512(KIND_Q8_0_512, dot_q8_0_512, w, rb, idx, count, n, act, y);
}

/* ---- Q4_0 rows four blocks at a time ----
 * Decode's single rows (the sparse FFN's gate and up rows, the dense path's packed FFN rows) take
 * 72 bytes per step: one word permute lifts the four blocks' quant bytes into a block per 128-bit
 * lane, another their four scales, so the per-block shuffles and scalar scale loads of the pair
 * loop above are gone. Each lane accumulates one 4-byte group of every fourth block (low nibbles in
 * one register, high in another); a row's float is then the fixed sum of those 32 lanes. Every Q4_0
 * entry point of this level (vec_dot, gemv, the packed dots) goes through it, so they agree bit for
 * bit; the gemm, and rows interleaved by four, keep the per-block order of the AVX2 gemm. Word
 * permutes only (AVX512BW): no VBMI needed. */

typedef struct {
    __m512i lo, hi;         /* activation bytes 0..15 and 16..31 of 4 blocks, a block per 128-bit lane */
    __m512i off_lo, off_hi; /* -8 * each 4-byte group's sum (the bias of unsigned nibbles) */
    __m512 d;               /* each block's scale, in its 4 lanes */
} act_quad;

/* -8 * the sum of 4 activation bytes: what unsigned nibbles (0..15 for -8..7) add to a 4-byte group */
static inline int32_t nibble_bias(const int8_t *q) { return -8 * (q[0] + q[1] + q[2] + q[3]); }

/* nb blocks of Q8_0 activation -> ceil(nb / 4) quads; a last partial quad's missing blocks are zero */
static void pack_quads(const pi2_block_q8_0 *a, int64_t nb, act_quad *out) {
    for (int64_t q = 0; q < (nb + 3) / 4; q++) {
        int8_t lo[64] = {0}, hi[64] = {0};
        int32_t ol[16] = {0}, oh[16] = {0};
        float d[16] = {0};
        for (int k = 0; k < 4 && 4 * q + k < nb; k++) {
            const pi2_block_q8_0 *b = a + 4 * q + k;
            memcpy(lo + 16 * k, b->qs, 16);
            memcpy(hi + 16 * k, b->qs + 16, 16);
            for (int j = 0; j < 4; j++) {
                ol[4 * k + j] = nibble_bias(b->qs + 4 * j);
                oh[4 * k + j] = nibble_bias(b->qs + 16 + 4 * j);
                d[4 * k + j] = h2f(b->d);
            }
        }
        out[q].lo = _mm512_loadu_si512(lo);
        out[q].hi = _mm512_loadu_si512(hi);
        out[q].off_lo = _mm512_loadu_si512(ol);
        out[q].off_hi = _mm512_loadu_si512(oh);
        out[q].d = _mm512_loadu_ps(d);
    }
}

/* y[r] = dot(row r, activation) for NR rows of nb Q4_0 blocks; ahead (may be NULL) paced over the steps */
static inline __attribute__((always_inline)) void quad_rows(int NR, const uint8_t *const *wr, int64_t nb,
                                                           const act_quad *aq, float *y, pi2_ahead *ahead) {
    /* word m of the quant bytes: block m / 8's word 1 + m % 8 (a block is 9 words: scale, 8 of quants) */
    static const uint16_t qs_words[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12, 13, 14, 15, 16, 17,
                                          19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31, 32, 33, 34, 35};
    static const uint16_t d_words[32] = {0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27};
    const __m512i qs_idx = _mm512_loadu_si512(qs_words), d_idx = _mm512_loadu_si512(d_words);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 lo[4], hi[4];
    for (int r = 0; r < NR; r++) lo[r] = hi[r] = _mm512_setzero_ps();
    /* The loop's prefetches run PF_DIST ahead; the lines before that are asked for here, all rows at
     * once: the sparse FFN's rows start at scattered places, where each first line waits for DRAM. */
    for (int r = 0; r < NR; r++)
        for (int l = 64; l < PF_DIST && l < nb * (int64_t)sizeof(pi2_block_q4_0); l += 64) __builtin_prefetch(wr[r] + l, 0, 3);
    pi2_ahead_pace(ahead, (nb + 3) / 4);
    for (int64_t b = 0; b < nb; b += 4, aq++) {
        pi2_ahead_step(ahead);
        const int nblk = nb - b < 4 ? (int)(nb - b) : 4;
        /* bytes of this step: 72, or 18 per block of a partial last step (masked: nothing past the row) */
        const __mmask64 m0 = nblk == 4 ? ~(__mmask64)0 : (((__mmask64)1 << (18 * nblk)) - 1);
        const __mmask64 m1 = nblk == 4 ? 0xff : 0;
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const uint8_t *w = wr[r] + (size_t)b * sizeof(pi2_block_q4_0);
            __builtin_prefetch(w + PF_DIST, 0, 3);
            __builtin_prefetch(w + PF_DIST + 71, 0, 3);
            const __m512i v0 = _mm512_maskz_loadu_epi8(m0, w), v1 = _mm512_maskz_loadu_epi8(m1, w + 64);
            const __m512i q = _mm512_permutex2var_epi16(v0, qs_idx, v1);
            const __m512 dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(d_idx, v0)));
            const __m512 sc = _mm512_mul_ps(dw, aq->d);
            const __m512i sl = _mm512_dpbusd_epi32(aq->off_lo, _mm512_and_si512(q, m4), aq->lo);
            const __m512i sh = _mm512_dpbusd_epi32(aq->off_hi, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4), aq->hi);
            lo[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl), sc, lo[r]);
            hi[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sh), sc, hi[r]);
        }
    }
    for (int r = 0; r < NR; r++) {
        const __m512 s = _mm512_add_ps(lo[r], hi[r]);
        y[r] = hsum8(_mm256_add_ps(lo8(s), hi8(s)));
    }
}

static inline void quad_rows_n(int count, const uint8_t *const *wr, int64_t nb, const act_quad *aq, float *y,
                               pi2_ahead *ahead) {
    switch (count) {
    case 1: quad_rows(1, wr, nb, aq, y, ahead); break;
    case 2: quad_rows(2, wr, nb, aq, y, ahead); break;
    case 3: quad_rows(3, wr, nb, aq, y, ahead); break;
    default: quad_rows(4, wr, nb, aq, y, ahead); break;
    }
}

#define QUADS_STACK 256 /* packed on the stack for rows up to 32768, on the heap beyond */

/* rows 0..count-1 of w (or rows idx[0..count)) against one activation, 4 at a time */
static void rows_q4_0_quad(const void *w, size_t rb, const int32_t *idx, int64_t count, int64_t n, const void *act,
                           float *y) {
    const int64_t nb = n / PI2_QK;
    act_quad stack[QUADS_STACK], *aq = stack;
    if ((nb + 3) / 4 > QUADS_STACK && !(aq = aligned_alloc(64, sizeof(act_quad) * (size_t)((nb + 3) / 4)))) abort();
    pack_quads(act, nb, aq);
    for (int64_t i = 0; i < count; i += 4) {
        const int nr = count - i < 4 ? (int)(count - i) : 4;
        const uint8_t *wr[4];
        for (int r = 0; r < nr; r++) wr[r] = (const uint8_t *)w + (size_t)(idx ? idx[i + r] : i + r) * rb;
        quad_rows_n(nr, wr, nb, aq, y + i, NULL);
    }
    if (aq != stack) free(aq);
}

static float dot_q4_0_quad(int64_t n, const void *row, const void *act) {
    float y;
    rows_q4_0_quad(row, 0, NULL, 1, n, act, &y);
    return y;
}

static size_t packed_size_q4_0_quad(int64_t n) { return (size_t)((n / PI2_QK + 3) / 4) * sizeof(act_quad); }
static void pack_q4_0_quad(const void *act, int64_t n, void *packed) { pack_quads(act, n / PI2_QK, packed); }
static float dot_packed_q4_0_quad(int64_t n, const void *row, const void *packed) {
    const uint8_t *wr[1] = {row};
    float y;
    quad_rows(1, wr, n / PI2_QK, packed, &y, NULL);
    return y;
}
static void dot_packed_rows_q4_0_quad(int64_t n, const uint8_t *const *rows, int count, const void *packed, float *y,
                                      pi2_ahead *ahead) {
    quad_rows_n(count, rows, n / PI2_QK, packed, y, ahead);
}

/* ---- gemm ----
 * Here a zmm holds one block of two tokens, not two blocks of one token: each half then accumulates
 * one token's blocks in sequence, the order of the AVX2 gemm and of llama.cpp's own per-row dots, so
 * prefill keeps matching llama.cpp token for token where the AVX2 level does. Per tile of tokens, the
 * activations are packed once per token pair and block (pair_block: both tokens' 32 bytes, the
 * negated bias lanes the dpbusd starts from, the spread scales). A register tile of up to 4 rows x 4
 * token pairs walks the blocks: each group of 4 weight rows is unpacked once per tile of tokens
 * (unpack_rows) and each packed activation block is loaded once for 4 rows. Per row, token pair and block: one dpbusd, one conversion, one
 * multiply and one FMA for 64 products. */

typedef struct {
    __m512i q;   /* block b of tokens t and t+1 */
    __m512i off; /* -bias * group sums (Q4_0: 8, Q8_0: 128; Q4_1: unused) */
    __m512 d;    /* [d_t x 8, d_t+1 x 8] */
} pair_block;

#define TILE_PAIRS 4 /* token pairs per register tile */

static void pack_token_pair(int kind, const uint8_t *a0, const uint8_t *a1, int64_t nb, pair_block *out) {
    const size_t ablock = act_block_bytes(kind);
    const size_t qs_off = kind == KIND_Q4_1_512 ? offsetof(pi2_block_q8_1, qs) : offsetof(pi2_block_q8_0, qs);
    const int bias = kind == KIND_Q4_0_512 ? 8 : 0x80;
    static const int8_t zero_qs[32];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *x0 = a0 + (size_t)b * ablock, *x1 = a1 ? a1 + (size_t)b * ablock : NULL;
        const __m512i q = load2((const int8_t *)(x0 + qs_off), x1 ? (const int8_t *)(x1 + qs_off) : zero_qs);
        pi2_f16 d0, d1 = 0;
        memcpy(&d0, x0, sizeof d0);
        if (x1) memcpy(&d1, x1, sizeof d1);
        out[b].q = q;
        out[b].off = kind == KIND_Q4_1_512 ? _mm512_setzero_si512()
                                          : _mm512_sub_epi32(_mm512_setzero_si512(), bias_lanes(q, bias));
        out[b].d = spread2(f16x2(d0, d1));
    }
}

/* A group of up to 4 weight rows, unpacked once per tile of tokens: per row and block the 32 bytes the
 * dpbusd takes (nibbles as bytes, or Q8_0 biased by 128), its scale d and, for Q4_1, its m. The
 * register tiles then load them (broadcasts from memory cost no shuffle) for every group of tokens. */
typedef struct {
    __m256i *q; /* [4][nb] */
    float *d, *m; /* [4][nb] */
} row_group;

static void unpack_rows(int kind, const uint8_t *const *wr, int nr, size_t wblock, int64_t nb, row_group *g) {
    for (int r = 0; r < nr; r++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *wb = wr[r] + (size_t)b * wblock;
            __m256i w8;
            if (kind == KIND_Q4_0_512) {
                w8 = unpack_nibbles(((const pi2_block_q4_0 *)wb)->qs);
                g->d[r * nb + b] = h2f(((const pi2_block_q4_0 *)wb)->d);
            } else if (kind == KIND_Q4_1_512) {
                const pi2_block_q4_1 *x = (const pi2_block_q4_1 *)wb;
                w8 = unpack_nibbles(x->qs);
                g->d[r * nb + b] = h2f(x->d);
                g->m[r * nb + b] = h2f(x->m);
            } else {
                w8 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)((const pi2_block_q8_0 *)wb)->qs),
                                      _mm256_set1_epi8((char)0x80));
                g->d[r * nb + b] = h2f(((const pi2_block_q8_0 *)wb)->d);
            }
            _mm256_store_si256(&g->q[r * nb + b], w8);
        }
}

static inline __attribute__((always_inline)) void gemm512_tile(int kind, int NR, int NP, const row_group *g,
                                                              int64_t nb, const pair_block *const *tp,
                                                              const float *s8, int ntok, float *out, int64_t ldo) {
    __m512 acc[4][TILE_PAIRS];
    __m256 corr[4]; /* Q4_1: m_w * s_a per token, up to 8 tokens in lanes */
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        corr[r] = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        __m512i wq[4];
        __m512 dws[4];
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            wq[r] = _mm512_broadcast_i64x4(_mm256_load_si256(&g->q[r * nb + b]));
            dws[r] = _mm512_set1_ps(g->d[r * nb + b]);
            if (kind == KIND_Q4_1_512)
                corr[r] = _mm256_fmadd_ps(_mm256_set1_ps(g->m[r * nb + b]), _mm256_loadu_ps(s8 + b * 8), corr[r]);
        }
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const pair_block *ap = tp[p] + b;
#pragma GCC unroll 4
            for (int r = 0; r < NR; r++) {
                const __m512i sum = _mm512_dpbusd_epi32(ap->off, wq[r], ap->q);
                acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dws[r], ap->d), acc[r][p]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++) {
        float c[8];
        _mm256_storeu_ps(c, corr[r]);
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            out[(2 * p) * ldo + r] = hsum8(lo8(acc[r][p])) + (kind == KIND_Q4_1_512 ? c[2 * p] : 0.0f);
            if (2 * p + 1 < ntok)
                out[(2 * p + 1) * ldo + r] = hsum8(hi8(acc[r][p])) + (kind == KIND_Q4_1_512 ? c[2 * p + 1] : 0.0f);
        }
    }
}

static void gemm512(int kind, const void *w, size_t row_bytes, int64_t rows, int64_t n, const void *acts,
                    size_t act_bytes, int64_t tokens, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK;
    const size_t wblock = weight_block_bytes(kind);
    const int tile_tokens = 2 * TILE_PAIRS;
    /* a tile's packed activations: up to ~768 KiB, a multiple of the register tile's tokens */
    const size_t per_pair = (size_t)nb * sizeof(pair_block);
    int64_t tile = (int64_t)((768u << 10) / per_pair) * 2;
    tile = tile < tile_tokens ? tile_tokens : tile > 64 ? 64 : tile / tile_tokens * tile_tokens;
    pair_block *packed = aligned_alloc(64, per_pair * (size_t)(tile / 2));
    float *s8 = calloc((size_t)(tile / tile_tokens) * (size_t)nb * 8 + 1, sizeof(float));
    row_group group = {aligned_alloc(64, ((size_t)4 * nb * sizeof(__m256i) + 63) / 64 * 64),
                       calloc((size_t)8 * nb + 1, sizeof(float)), NULL};
    if (!packed || !s8 || !group.q || !group.d) abort();
    group.m = group.d + 4 * nb;
    const uint8_t *ab = acts;
    for (int64_t t0 = 0; t0 < tokens; t0 += tile) {
        const int64_t tn = tokens - t0 < tile ? tokens - t0 : tile;
        for (int64_t t = 0; t < tn; t += 2) {
            const uint8_t *a0 = ab + (size_t)(t0 + t) * act_bytes;
            pack_token_pair(kind, a0, t + 1 < tn ? a0 + act_bytes : NULL, nb, packed + (t / 2) * nb);
        }
        if (kind == KIND_Q4_1_512) /* d*s per block, the tokens of a register tile side by side */
            for (int64_t t = 0; t < tn; t++)
                for (int64_t k = 0; k < nb; k++)
                    s8[((t / tile_tokens) * nb + k) * 8 + t % tile_tokens] =
                        h2f(((const pi2_block_q8_1 *)(ab + (size_t)(t0 + t) * act_bytes))[k].s);
        for (int64_t r = 0; r < rows; r += 4) {
            const int nr = rows - r < 4 ? (int)(rows - r) : 4;
            const uint8_t *wr[4];
            for (int k = 0; k < nr; k++) wr[k] = (const uint8_t *)w + (size_t)(r + k) * row_bytes;
            unpack_rows(kind, wr, nr, wblock, nb, &group);
            for (int64_t t = 0; t < tn; t += tile_tokens) {
                const int ntok = tn - t < tile_tokens ? (int)(tn - t) : tile_tokens, np = (ntok + 1) / 2;
                const pair_block *tp[TILE_PAIRS];
                for (int k = 0; k < np; k++) tp[k] = packed + (t / 2 + k) * nb;
                const float *s8g = s8 + (t / tile_tokens) * nb * 8;
                float *out = y + (t0 + t) * ldy + r;
                /* constant kind, rows and pairs keep the tile in registers; 2 or 3 rows left over go
                 * one at a time */
                const int nr1 = nr == 4 ? 4 : 1;
                for (int k = 0; k < nr; k += nr1) {
                    const row_group gk = {group.q + k * nb, group.d + k * nb, group.m + k * nb};
                    switch (kind * 16 + nr1 * 4 + np - 1) {
#define CASE(K, NR, NP) \
    case K * 16 + NR * 4 + NP - 1: gemm512_tile(K, NR, NP, &gk, nb, tp, s8g, ntok, out + k, ldy); break;
#define CASES(K) CASE(K, 1, 1) CASE(K, 1, 2) CASE(K, 1, 3) CASE(K, 1, 4) CASE(K, 4, 1) CASE(K, 4, 2) CASE(K, 4, 3) CASE(K, 4, 4)
                        CASES(KIND_Q4_0_512) CASES(KIND_Q4_1_512) CASES(KIND_Q8_0_512)
#undef CASES
#undef CASE
                    }
                }
            }
        }
    }
    free(packed);
    free(s8);
    free(group.q);
    free(group.d);
}

static void gemm_q4_0_512(const void *w, size_t rb, int64_t rows, int64_t n, const void *acts, size_t ab,
                          int64_t tokens, float *y, int64_t ldy) {
    if (tokens >= PI2_LANES_MIN_TOKENS) pi2_lanes_gemm_q4_0(w, rb, rows, n, acts, ab, tokens, y, ldy);
    else gemm512(KIND_Q4_0_512, w, rb, rows, n, acts, ab, tokens, y, ldy);
}
PI2_GEMM_OF_KIND(gemm_q4_1_512, gemm512, KIND_Q4_1_512)
PI2_GEMM_OF_KIND(gemm_q8_0_512, gemm512, KIND_Q8_0_512)

/* ---- Q4_0 rows interleaved by four (pi2_x4_pack) ----
 * One 72-byte record per group of 4 rows and block: the rows' 16 quant bytes (one zmm, a row per
 * 128-bit lane), then their 4 F16 scales. A record's low nibbles meet the block's first 16 activation
 * bytes broadcast to every lane, the high nibbles the last 16, so each row's 8 int32 lanes are
 * gemm512's (one per 4-byte group) without any shuffle of weights, and one scale conversion serves
 * four rows. Per row and token the float steps are gemm512's (lane by lane FMA over the blocks, then
 * hsum8's order), so the results equal pi2_gemm's bit for bit, for one token as for many. */

#define X4_RECORD (4 * sizeof(pi2_block_q4_0)) /* 72 */

typedef struct {
    int32_t off[8]; /* -8 * each 4-byte group's sum: the bias of unsigned nibbles, as in gemm512 */
    float d;
} x4_act;

static void x4_pack_act(const pi2_block_q8_0 *a, int64_t nb, x4_act *out) {
    for (int64_t b = 0; b < nb; b++) {
        for (int j = 0; j < 8; j++) out[b].off[j] = nibble_bias(a[b].qs + 4 * j);
        out[b].d = h2f(a[b].d);
    }
}

static inline __m512i bcast16(const void *p) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)); }

/* A record's 4 rows: low and high nibbles (a row per 128-bit lane) and the 4 scales spread to their lanes. */
static inline __attribute__((always_inline)) void x4_record(const uint8_t *r, __m512i *wl, __m512i *wh, __m512 *dw) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), w = _mm512_loadu_si512(r);
    *wl = _mm512_and_si512(w, m4), *wh = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
    *dw = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                _mm512_castps128_ps512(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(r + 64)))));
}

/* The group's 4 dots from its accumulators into y[0..3]: per row, lanes j + (j + 4), then
 * (0 + 2) + (1 + 3), hsum8's order (so the floats are pi2_gemm's). */
static inline __attribute__((always_inline)) void x4_store(__m512 lo, __m512 hi, float *y) {
    const __m512 s = _mm512_add_ps(lo, hi);
    const __m512 u = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
    float lanes[16];
    _mm512_storeu_ps(lanes, v);
    for (int r = 0; r < 4; r++) y[r] = lanes[4 * r];
}

/* y[t * ldy + r] for the group's 4 rows and NT tokens; the stream asked for pf bytes ahead (0: not) */
static inline __attribute__((always_inline)) void x4_tile(int NT, const uint8_t *g, int64_t nb,
                                                         const pi2_block_q8_0 *const *a, const x4_act *const *pa,
                                                         float *y, int64_t ldy, int pf) {
    __m512 lo[4], hi[4];
    for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, g += X4_RECORD) {
        if (pf) __builtin_prefetch(g + pf, 0, 3);
        __m512i wl, wh;
        __m512 dw;
        x4_record(g, &wl, &wh, &dw);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const pi2_block_q8_0 *ab = a[t] + b;
            const x4_act *p = pa[t] + b;
            const __m512i sl = _mm512_dpbusd_epi32(bcast16(p->off), wl, bcast16(ab->qs));
            const __m512i sh = _mm512_dpbusd_epi32(bcast16(p->off + 4), wh, bcast16(ab->qs + 16));
            const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(p->d));
            lo[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl), s, lo[t]);
            hi[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sh), s, hi[t]);
        }
    }
    for (int t = 0; t < NT; t++) x4_store(lo[t], hi[t], y + t * ldy);
}

/* One token over S groups at once (decode), `ss` bytes apart: block by block, each group's record in
 * turn, so the core reads S streams side by side instead of one. A row's float steps are x4_tile's,
 * so the results are the same bits; the block's activation lanes are loaded once for all S. */
static inline __attribute__((always_inline)) void x4_streams(int S, const uint8_t *g, size_t ss, int64_t nb,
                                                            const pi2_block_q8_0 *a, const x4_act *pa, float *y,
                                                            int64_t ys, int pf) {
    __m512 lo[8], hi[8];
    for (int s = 0; s < S; s++) lo[s] = hi[s] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m512i al = bcast16(a[b].qs), ah = bcast16(a[b].qs + 16);
        const __m512i ol = bcast16(pa[b].off), oh = bcast16(pa[b].off + 4);
        const __m512 d = _mm512_set1_ps(pa[b].d);
#pragma GCC unroll 8
        for (int s = 0; s < S; s++) {
            const uint8_t *r = g + s * ss + (size_t)b * X4_RECORD;
            if (pf) __builtin_prefetch(r + pf, 0, 3);
            __m512i wl, wh;
            __m512 dw;
            x4_record(r, &wl, &wh, &dw);
            const __m512 sc = _mm512_mul_ps(dw, d);
            lo[s] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(ol, wl, al)), sc, lo[s]);
            hi[s] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(oh, wh, ah)), sc, hi[s]);
        }
    }
    for (int s = 0; s < S; s++) x4_store(lo[s], hi[s], y + s * ys);
}

/* Streams closer than this are not worth it: on the Zen 4 VM, four streams 4-9 KiB apart read DRAM at
 * 60-80% of one stream's rate, and from 36 KiB apart at 90-120% (membw, pairs alternated). */
#define X4_STREAM_GAP (32 << 10)

/* decode: the rows' groups as S runs read side by side (S from pi2_kernels_x4_streams, fewer when the
 * runs would be closer than X4_STREAM_GAP), then what is left one group at a time */
static void x4_gemv_streams(const uint8_t *w, int64_t rows, int64_t nb, const pi2_block_q8_0 *a,
                            const x4_act *pa, float *y, int S, int pf) {
    const int64_t groups = rows / 4;
    const size_t gb = (size_t)nb * X4_RECORD;
    while (S > 1 && (size_t)(groups / S) * gb < X4_STREAM_GAP) S /= 2;
    const int64_t run = groups / S; /* groups per stream */
    const size_t ss = (size_t)run * gb;
    for (int64_t i = 0; S > 1 && i < run; i++) {
        const uint8_t *g = w + (size_t)i * gb;
        float *out = y + 4 * i;
        switch (S) {
        case 2: x4_streams(2, g, ss, nb, a, pa, out, 4 * run, pf); break;
        case 4: x4_streams(4, g, ss, nb, a, pa, out, 4 * run, pf); break;
        default: x4_streams(8, g, ss, nb, a, pa, out, 4 * run, pf); break;
        }
    }
    for (int64_t gi = S > 1 ? S * run : 0; gi < groups; gi++)
        x4_streams(1, w + (size_t)gi * gb, 0, nb, a, pa, y + 4 * gi, 0, pf);
}

#define X4_STACK_BLOCKS 1024 /* activation records kept on the stack: 4 tokens of rows up to 32768 */

static void x4_gemm_q4_0(const void *w, int64_t rows, int64_t n, const void *acts, int64_t tokens, float *y,
                         int64_t ldy) {
    if (tokens >= PI2_LANES_MIN_TOKENS) { /* the plain GEMM's switch, so both layouts give the same floats */
        pi2_lanes_x4_gemm_q4_0(w, rows, n, acts, tokens, y, ldy);
        return;
    }
    const int64_t nb = n / PI2_QK;
    const size_t ab = (size_t)nb * sizeof(pi2_block_q8_0);
    x4_act stack[X4_STACK_BLOCKS], *pa = stack;
    if (tokens * nb > X4_STACK_BLOCKS && !(pa = malloc(sizeof(x4_act) * (size_t)(tokens * nb)))) abort();
    for (int64_t t = 0; t < tokens; t++) x4_pack_act((const pi2_block_q8_0 *)((const uint8_t *)acts + t * ab), nb, pa + t * nb);
    const int pf = pi2_kernels_x4_prefetch();
    const int S = pi2_kernels_x4_streams();
    if (tokens == 1 && S > 1) x4_gemv_streams(w, rows, nb, acts, pa, y, S, pf);
    /* else each group's records (nb * 72 bytes) stay in L1 while the tokens go by four at a time */
    else for (int64_t r = 0; r < rows; r += 4) {
        const uint8_t *g = (const uint8_t *)w + (size_t)(r / 4) * nb * X4_RECORD;
        for (int64_t t = 0; t < tokens; t += 4) {
            const int nt = tokens - t < 4 ? (int)(tokens - t) : 4;
            const pi2_block_q8_0 *a[4];
            const x4_act *p[4];
            for (int k = 0; k < nt; k++)
                a[k] = (const pi2_block_q8_0 *)((const uint8_t *)acts + (t + k) * ab), p[k] = pa + (t + k) * nb;
            float *out = y + t * ldy + r;
            switch (nt) {
            case 1: x4_tile(1, g, nb, a, p, out, ldy, pf); break;
            case 2: x4_tile(2, g, nb, a, p, out, ldy, pf); break;
            case 3: x4_tile(3, g, nb, a, p, out, ldy, pf); break;
            default: x4_tile(4, g, nb, a, p, out, ldy, pf); break;
            }
        }
    }
    if (pa != stack) free(pa);
}

/* ---- attention, head sizes 64 and 128 ----
 * The generic kernel (kernels_att.h) pays a horizontal reduction per score and reads and writes
 * the V accumulator through memory per position. Here a key row is converted to floats once for the
 * whole group, scores are reduced four positions at a time, and the V sums stay in registers (up to
 * 24 zmm: the group's heads in chunks). Same two-pass softmax; summation order is this kernel's own,
 * tested against the double softmax like every level. */
enum { ATT512_MAX_GROUP = 16 };

static inline __m512 load_h16(const pi2_f16 *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* [sum(a), sum(b), sum(c), sum(d)] */
static inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m256 a8 = _mm256_add_ps(lo8(a), hi8(a)), b8 = _mm256_add_ps(lo8(b), hi8(b));
    const __m256 c8 = _mm256_add_ps(lo8(c), hi8(c)), d8 = _mm256_add_ps(lo8(d), hi8(d));
    const __m256 ab = _mm256_hadd_ps(a8, b8), cd = _mm256_hadd_ps(c8, d8); /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    const __m256 abcd = _mm256_hadd_ps(ab, cd);                             /* a b c d | a' b' c' d' */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* att_softmax_exp (kernels_att.h) 16 lanes at a time: the same polynomial and clamp (the compiler
 * vectorises the generic loop only 8 wide here), the tail under a mask */
static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_setzero_ps()); /* as att_exp */
    const __m512i n = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                                        _mm512_set1_ps(0.5f)));
    const __m512 nf = _mm512_cvtepi32_ps(n);
    __m512 r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(1.42860682030941723212e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

static float softmax_exp512(float *p, int64_t n, float m) {
    const __m512 mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t s = 0; s < n; s += 16) {
        const __mmask16 k = n - s >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - s)) - 1);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p + s), mv));
        _mm512_mask_storeu_ps(p + s, k, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(sum);
}

/* V sums of GN heads (a constant after inlining, so the accumulators stay in registers) */
static inline __attribute__((always_inline)) void att512_v(const int NV, const int GN, const pi2_f16 *v, int64_t stride,
                                                          int64_t n_pos, const float *p, float *out) {
    __m512 acc[24];
#pragma GCC unroll 24
    for (int i = 0; i < GN * NV; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t t = 0; t < n_pos; t++) {
        __m512 vz[8];
#pragma GCC unroll 8
        for (int j = 0; j < NV; j++) vz[j] = load_h16(v + t * stride + 16 * j);
#pragma GCC unroll 6
        for (int g = 0; g < GN; g++) {
            const __m512 w = _mm512_set1_ps(p[g * n_pos + t]);
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++) acc[g * NV + j] = _mm512_fmadd_ps(vz[j], w, acc[g * NV + j]);
        }
    }
#pragma GCC unroll 6
    for (int g = 0; g < GN; g++)
#pragma GCC unroll 8
        for (int j = 0; j < NV; j++) _mm512_storeu_ps(out + g * 16 * NV + 16 * j, acc[g * NV + j]);
}

static inline __attribute__((always_inline)) void att512_body(const int NV, int group, const pi2_f16 *q,
                                                             const pi2_f16 *k, const pi2_f16 *v, int64_t stride,
                                                             int64_t n_pos, float scale, float *p, float *out,
                                                             float *m, float *l) {
    const int64_t hd = 16 * NV;
    for (int g = 0; g < group; g++) m[g] = -3.0e38f;
    /* scores, four positions at a time */
    int64_t s = 0;
    for (; s + 4 <= n_pos; s += 4) {
        __m512 kz[4][8];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++) kz[i][j] = load_h16(k + (s + i) * stride + 16 * j);
        for (int g = 0; g < group; g++) {
            __m512 acc[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                acc[i] = _mm512_mul_ps(kz[i][0], load_h16(q + g * hd));
#pragma GCC unroll 8
                for (int j = 1; j < NV; j++) acc[i] = _mm512_fmadd_ps(kz[i][j], load_h16(q + g * hd + 16 * j), acc[i]);
            }
            const __m128 sc = _mm_mul_ps(reduce4(acc[0], acc[1], acc[2], acc[3]), _mm_set1_ps(scale));
            _mm_storeu_ps(p + g * n_pos + s, sc);
            const __m128 mx = _mm_max_ps(sc, _mm_movehl_ps(sc, sc));
            const float m4 = _mm_cvtss_f32(_mm_max_ss(mx, _mm_movehdup_ps(mx)));
            m[g] = m4 > m[g] ? m4 : m[g];
        }
    }
    for (; s < n_pos; s++)
        for (int g = 0; g < group; g++) {
            __m512 acc = _mm512_setzero_ps();
#pragma GCC unroll 8
            for (int j = 0; j < NV; j++)
                acc = _mm512_fmadd_ps(load_h16(k + s * stride + 16 * j), load_h16(q + g * hd + 16 * j), acc);
            const float sc = _mm512_reduce_add_ps(acc) * scale;
            p[g * n_pos + s] = sc;
            m[g] = sc > m[g] ? sc : m[g];
        }
    for (int g = 0; g < group; g++) l[g] = softmax_exp512(p + g * n_pos, n_pos, m[g]);
    /* V: heads in chunks whose accumulators fit in 24 registers */
    const int chunk = 24 / NV;
    for (int g0 = 0; g0 < group; g0 += chunk) {
        const float *pg = p + g0 * n_pos;
        float *og = out + g0 * hd;
        switch (group - g0 < chunk ? group - g0 : chunk) {
        /* the guards are constant once NV is: no copy whose accumulators would not fit is made */
        case 1: att512_v(NV, 1, v, stride, n_pos, pg, og); break;
        case 2: att512_v(NV, 2, v, stride, n_pos, pg, og); break;
        case 3: att512_v(NV, 3, v, stride, n_pos, pg, og); break;
        case 4: if (4 * NV <= 24) att512_v(NV, 4, v, stride, n_pos, pg, og); break;
        case 5: if (5 * NV <= 24) att512_v(NV, 5, v, stride, n_pos, pg, og); break;
        default: if (6 * NV <= 24) att512_v(NV, 6, v, stride, n_pos, pg, og); break;
        }
    }
}

static void att_f16_512(int64_t hd, int group, const pi2_f16 *q, const pi2_f16 *k, const pi2_f16 *v, int64_t stride,
                        int64_t n_pos, float scale, float *p, float *out, float *m, float *l) {
    if (hd == 64) att512_body(4, group, q, k, v, stride, n_pos, scale, p, out, m, l);
    else if (hd == 128) att512_body(8, group, q, k, v, stride, n_pos, scale, p, out, m, l);
    else att_f16(hd, group, q, k, v, stride, n_pos, scale, p, out, m, l);
}

void pi2_kernels_fill_avx512(pi2_kernel_table *t) {
    x86_fill(t);
    t->dot[PI2_Q4_0] = dot_q4_0_quad;
    t->dot[PI2_Q4_1] = dot_q4_1_512;
    t->dot[PI2_Q8_0] = dot_q8_0_512;
    t->rows[PI2_Q4_0] = rows_q4_0_quad;
    t->rows[PI2_Q4_1] = rows_q4_1_512;
    t->rows[PI2_Q8_0] = rows_q8_0_512;
    t->gemm[PI2_Q4_0] = gemm_q4_0_512;
    t->gemm[PI2_Q4_1] = gemm_q4_1_512;
    t->gemm[PI2_Q8_0] = gemm_q8_0_512;
    t->x4_gemm[PI2_Q4_0] = x4_gemm_q4_0;
    t->att_f16 = att_f16_512;
    pi2_kernels_fill_lanes_avx512(t); /* the FFN's batches: rows as lanes (kernels_lanes_avx512.c) */
#define SET_PACKED(ID, T)               \
    t->packed_size[ID] = packed_size_##T; \
    t->pack[ID] = pack_##T;               \
    t->dot_packed[ID] = dot_packed_##T; \
    t->dot_packed_rows[ID] = dot_packed_rows_##T;
    SET_PACKED(PI2_Q4_0, q4_0_quad) /* Q4_0's single rows: four blocks a step; its gemm stays gemm512 */
    SET_PACKED(PI2_Q4_1, q4_1)
    SET_PACKED(PI2_Q8_0, q8_0)
#undef SET_PACKED
}
