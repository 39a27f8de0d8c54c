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

/* ---- the batch GEMM with SMMLA (kernels.h, pi2_batch_gemm) ----
 * The batch's records hold each token pair's 8-byte chunks side by side ([a chunk c | b chunk c]: the
 * 8x2 operand of SMMLA as it stands), so a pair of weight rows, unpacked once per call into the same
 * shape per block ([row 0 chunk c | row 1 chunk c], c = 0..3), meets the tile's 4 token pairs with 4
 * SMMLA each: 32 products an instruction and no shuffle of the activations per call (gemm_mmla above
 * repacks them per tile of every call). Per row and token: sum = fma((float)isum, d_w * d_a, sum)
 * block after block, the dotprod level's order. */

/* block b of row r: its quants and scale, from plain rows or rows interleaved by four */
static inline void batch_row_block(const uint8_t *w, size_t row_bytes, int x4, int64_t nb, int64_t r, int64_t b,
                                   const uint8_t **qs, float *d) {
    pi2_f16 h;
    if (x4) { /* pi2_x4_pack: per group of 4 rows and block, the rows' 16 quant bytes, then 4 scales */
        const uint8_t *rec = w + (size_t)((r / 4) * nb + b) * 4 * sizeof(pi2_block_q4_0);
        *qs = rec + 16 * (r % 4);
        memcpy(&h, rec + 64 + 2 * (r % 4), sizeof h);
    } else {
        const pi2_block_q4_0 *x = (const pi2_block_q4_0 *)(w + (size_t)r * row_bytes) + b;
        *qs = x->qs;
        h = x->d;
    }
    *d = h2f(h);
}

/* rows r0, r0 + 1 (the second zero with scale 0 when nr = 1) -> u[b * 4 + c], dw[b * 4..] = [d0 d0 d1 d1] */
static void batch_unpack_pair(const uint8_t *w, size_t row_bytes, int x4, int64_t r0, int nr, int64_t nb,
                              int8x16_t *u, float *dw) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    const int8x16_t eight = vdupq_n_s8(8);
    for (int64_t b = 0; b < nb; b++) {
        int64x2_t lo[2], hi[2];
        float d[2] = {0.0f, 0.0f};
        for (int i = 0; i < 2; i++) {
            if (i >= nr) {
                lo[i] = hi[i] = vdupq_n_s64(0);
                continue;
            }
            const uint8_t *qs;
            batch_row_block(w, row_bytes, x4, nb, r0 + i, b, &qs, &d[i]);
            const uint8x16_t v = vld1q_u8(qs);
            lo[i] = vreinterpretq_s64_s8(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, m4)), eight)); /* elements 0..15 */
            hi[i] = vreinterpretq_s64_s8(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight)); /* 16..31 */
        }
        int8x16_t *o = u + b * 4;
        o[0] = vreinterpretq_s8_s64(vzip1q_s64(lo[0], lo[1]));
        o[1] = vreinterpretq_s8_s64(vzip2q_s64(lo[0], lo[1]));
        o[2] = vreinterpretq_s8_s64(vzip1q_s64(hi[0], hi[1]));
        o[3] = vreinterpretq_s8_s64(vzip2q_s64(hi[0], hi[1]));
        const float dv[4] = {d[0], d[0], d[1], d[1]};
        memcpy(dw + b * 4, dv, sizeof dv);
    }
}

static void batch_tile_pair(const int8x16_t *u, const float *dw, int64_t nb, const pi2_batch_block *a, float *y,
                            int64_t ldy, int nr, int nt) {
    float32x4_t acc[PI2_BATCH_TILE / 2]; /* per token pair: [r0 ta, r0 tb, r1 ta, r1 tb] */
    for (int p = 0; p < PI2_BATCH_TILE / 2; p++) acc[p] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++, a++) {
        const int8x16_t w0 = u[b * 4], w1 = u[b * 4 + 1], w2 = u[b * 4 + 2], w3 = u[b * 4 + 3];
        const float32x4_t d = vld1q_f32(dw + b * 4);
        for (int p = 0; p < PI2_BATCH_TILE / 2; p++) {
            const int8_t(*q)[2][8] = a->qs[p];
            int32x4_t s = vmmlaq_s32(vdupq_n_s32(0), w0, vld1q_s8(q[0][0]));
            s = vmmlaq_s32(s, w1, vld1q_s8(q[1][0]));
            s = vmmlaq_s32(s, w2, vld1q_s8(q[2][0]));
            s = vmmlaq_s32(s, w3, vld1q_s8(q[3][0]));
            const float32x2_t da = vld1_f32(a->d + 2 * p);
            acc[p] = vfmaq_f32(acc[p], vcvtq_f32_s32(s), vmulq_f32(d, vcombine_f32(da, da)));
        }
    }
    for (int p = 0; p < PI2_BATCH_TILE / 2; p++) {
        float o[4];
        vst1q_f32(o, acc[p]);
        for (int i = 0; i < 2 && 2 * p + i < nt; i++)
            for (int r = 0; r < nr; r++) y[(2 * p + i) * ldy + r] = o[2 * r + i];
    }
}

static void batch_gemm_mmla_q4_0(const void *w, size_t row_bytes, int x4, int64_t rows, int64_t n,
                                 const pi2_batch_block *batch, int64_t tokens, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK;
    int8x16_t *u = malloc((size_t)nb * 4 * sizeof(int8x16_t));
    float *dw = malloc((size_t)nb * 4 * sizeof(float));
    if (!u || !dw) abort();
    for (int64_t r = 0; r < rows; r += 2) {
        const int nr = rows - r < 2 ? 1 : 2;
        batch_unpack_pair(w, row_bytes, x4, r, nr, nb, u, dw);
        for (int64_t t = 0; t < tokens; t += PI2_BATCH_TILE) {
            const int nt = tokens - t < PI2_BATCH_TILE ? (int)(tokens - t) : PI2_BATCH_TILE;
            batch_tile_pair(u, dw, nb, batch + (t / PI2_BATCH_TILE) * nb, y + t * ldy + r, ldy, nr, nt);
        }
    }
    free(u);
    free(dw);
}

void pi2_kernels_fill_i8mm(pi2_kernel_table *t) {
    arm_fill(t);
    t->gemm[PI2_Q4_0] = gemm_mmla_q4_0;
    t->gemm[PI2_Q4_1] = gemm_mmla_q4_1;
    t->gemm[PI2_Q8_0] = gemm_mmla_q8_0;
    t->batch_gemm[PI2_Q4_0] = batch_gemm_mmla_q4_0;
}
