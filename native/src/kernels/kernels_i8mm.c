/* arm64 with int8 matrix multiply (SMMLA, ARMv8.6: Cortex-A510/A710/X2 and later). Everything of the
 * dotprod level (the shared body is built here with +i8mm), plus a gemm on vmmlaq_s32: one SMMLA
 * multiplies a 2x8 int8 tile of two weight rows with an 8x2 tile of two tokens into the 2x2 int32
 * block [r0t0 r0t1 r1t0 r1t1], i.e. 32 multiply-adds per instruction where SDOT does 16.
 *
 * Per tile of tokens, activations are repacked once into token pairs: for each block, four 16-byte
 * vectors [token a elements 8c..8c+7 | token b elements 8c..8c+7], c = 0..3, plus the pair's scales as
 * [da_a da_b da_a da_b]. Each pair of weight rows is unpacked into the same shape per block and meets
 * up to 4 token pairs while in registers. An odd last row or token is paired with itself and the
 * duplicate result dropped. */
#include "kernels_arm_common.h"

#if !defined(__ARM_FEATURE_MATMUL_INT8)
#error "kernels_i8mm.c must be built with +i8mm (see native/CMakeLists.txt)"
#endif

#define PAIRS 4 /* token pairs per micro-tile */

struct packed_tile {
    int8_t *qs;  /* [pair][block][4][16] */
    float *d;    /* [pair][block][4]: activation scales a b a b */
    float *s;    /* [pair][block][4]: Q8_1 sums a b a b (Q4_1 only) */
};

static void pack_tile(int kind, const uint8_t *acts, size_t act_bytes, int64_t t0, int64_t tn, int64_t nb,
                      struct packed_tile *p) {
    const int64_t pairs = (tn + 1) / 2;
    for (int64_t pi = 0; pi < pairs; pi++) {
        const int64_t ta = t0 + 2 * pi, tb = 2 * pi + 1 < tn ? ta + 1 : ta;
        const uint8_t *a = acts + (size_t)ta * act_bytes, *b = acts + (size_t)tb * act_bytes;
        for (int64_t k = 0; k < nb; k++) {
            const int8_t *qa, *qb;
            float da, db, sa = 0, sb = 0;
            if (kind == KIND_Q4_1) {
                const pi2_block_q8_1 *xa = (const pi2_block_q8_1 *)a + k, *xb = (const pi2_block_q8_1 *)b + k;
                qa = xa->qs, qb = xb->qs, da = h2f(xa->d), db = h2f(xb->d), sa = h2f(xa->s), sb = h2f(xb->s);
            } else {
                const pi2_block_q8_0 *xa = (const pi2_block_q8_0 *)a + k, *xb = (const pi2_block_q8_0 *)b + k;
                qa = xa->qs, qb = xb->qs, da = h2f(xa->d), db = h2f(xb->d);
            }
            int8_t *dst = p->qs + ((size_t)pi * nb + k) * 64;
            for (int c = 0; c < 4; c++) {
                memcpy(dst + 16 * c, qa + 8 * c, 8);
                memcpy(dst + 16 * c + 8, qb + 8 * c, 8);
            }
            float *d = p->d + ((size_t)pi * nb + k) * 4, *s = p->s + ((size_t)pi * nb + k) * 4;
            d[0] = da, d[1] = db, d[2] = da, d[3] = db;
            s[0] = sa, s[1] = sb, s[2] = sa, s[3] = sb;
        }
    }
}

/* rows r0, r1 (maybe equal) against np token pairs starting at pair p0; out[pair] = 2x2 results */
static inline __attribute__((always_inline)) void mmla_micro(int kind, int np, const void *w0row, const void *w1row,
                                                             int64_t nb, const struct packed_tile *p, int64_t p0,
                                                             float32x4_t *out) {
    float32x4_t acc[PAIRS];
    for (int k = 0; k < PAIRS; k++) acc[k] = vdupq_n_f32(0);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t a0, a1, b0, b1;
        float da, ma, db, mb;
        load_wblock(kind, w0row, b, &a0, &a1, &da, &ma);
        load_wblock(kind, w1row, b, &b0, &b1, &db, &mb);
        /* [row0 chunk c | row1 chunk c] for chunks 0..3 */
        const int8x16_t wc0 = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a0), vreinterpretq_s64_s8(b0)));
        const int8x16_t wc1 = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a0), vreinterpretq_s64_s8(b0)));
        const int8x16_t wc2 = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a1), vreinterpretq_s64_s8(b1)));
        const int8x16_t wc3 = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a1), vreinterpretq_s64_s8(b1)));
        const float dwv[4] = {da, da, db, db}, mwv[4] = {ma, ma, mb, mb};
        const float32x4_t dw = vld1q_f32(dwv), mw = vld1q_f32(mwv);
        for (int k = 0; k < np; k++) {
            const size_t at = (size_t)(p0 + k) * nb + b;
            const int8_t *q = p->qs + at * 64;
            int32x4_t s = vmmlaq_s32(vdupq_n_s32(0), wc0, vld1q_s8(q));
            s = vmmlaq_s32(s, wc1, vld1q_s8(q + 16));
            s = vmmlaq_s32(s, wc2, vld1q_s8(q + 32));
            s = vmmlaq_s32(s, wc3, vld1q_s8(q + 48));
            acc[k] = vfmaq_f32(acc[k], vcvtq_f32_s32(s), vmulq_f32(dw, vld1q_f32(p->d + at * 4)));
            if (kind == KIND_Q4_1) acc[k] = vfmaq_f32(acc[k], mw, vld1q_f32(p->s + at * 4));
        }
    }
    for (int k = 0; k < np; k++) out[k] = acc[k];
}

static void gemm_mmla(int kind, const void *w, size_t row_bytes, int64_t rows, int64_t n, const void *acts,
                      size_t act_bytes, int64_t tokens, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK;
    const int64_t tile = tile_tokens(act_bytes); /* a multiple of 4, so pairs never straddle tiles */
    const int64_t max_pairs = tile / 2;
    struct packed_tile p;
    p.qs = malloc((size_t)(max_pairs * nb) * 64 + 1);
    p.d = malloc(sizeof(float) * (size_t)(max_pairs * nb) * 8 + 1);
    if (!p.qs || !p.d) abort();
    p.s = p.d + max_pairs * nb * 4;
    const uint8_t *wb = w;
    for (int64_t t0 = 0; t0 < tokens; t0 += tile) {
        const int64_t tn = tokens - t0 < tile ? tokens - t0 : tile, pairs = (tn + 1) / 2;
        pack_tile(kind, acts, act_bytes, t0, tn, nb, &p);
        for (int64_t r = 0; r < rows; r += 2) {
            const int two = r + 1 < rows;
            const void *w0 = wb + (size_t)r * row_bytes, *w1 = two ? wb + (size_t)(r + 1) * row_bytes : w0;
            for (int64_t pp = 0; pp < pairs; pp += PAIRS) {
                const int np = pairs - pp < PAIRS ? (int)(pairs - pp) : PAIRS;
                float32x4_t out[PAIRS];
                switch (kind * 8 + np) {
#define CASE(K, NP) \
    case K * 8 + NP: mmla_micro(K, NP, w0, w1, nb, &p, pp, out); break;
                    CASE(KIND_Q4_0, 1) CASE(KIND_Q4_0, 2) CASE(KIND_Q4_0, 3) CASE(KIND_Q4_0, 4)
                    CASE(KIND_Q4_1, 1) CASE(KIND_Q4_1, 2) CASE(KIND_Q4_1, 3) CASE(KIND_Q4_1, 4)
                    CASE(KIND_Q8_0, 1) CASE(KIND_Q8_0, 2) CASE(KIND_Q8_0, 3) CASE(KIND_Q8_0, 4)
#undef CASE
                }
                for (int k = 0; k < np; k++) {
                    float v[4];
                    vst1q_f32(v, out[k]);
                    const int64_t ta = t0 + 2 * (pp + k);
                    const int tb_ok = 2 * (pp + k) + 1 < tn;
                    y[ta * ldy + r] = v[0];
                    if (tb_ok) y[(ta + 1) * ldy + r] = v[1];
                    if (two) {
                        y[ta * ldy + r + 1] = v[2];
                        if (tb_ok) y[(ta + 1) * ldy + r + 1] = v[3];
                    }
                }
            }
        }
    }
    free(p.qs);
    free(p.d);
}

PI2_GEMM_OF_KIND(gemm_mmla_q4_0, gemm_mmla, KIND_Q4_0)
PI2_GEMM_OF_KIND(gemm_mmla_q4_1, gemm_mmla, KIND_Q4_1)
PI2_GEMM_OF_KIND(gemm_mmla_q8_0, gemm_mmla, KIND_Q8_0)

void pi2_kernels_fill_i8mm(pi2_kernel_table *t) {
    arm_fill(t);
    t->gemm[PI2_Q4_0] = gemm_mmla_q4_0;
    t->gemm[PI2_Q4_1] = gemm_mmla_q4_1;
    t->gemm[PI2_Q8_0] = gemm_mmla_q8_0;
}
