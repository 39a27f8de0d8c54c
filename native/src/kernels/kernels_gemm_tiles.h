/* The quantized GEMM's tiling driver, shared by the x86 and arm kernel headers (included by
 * kernels_x86_common.h and kernels_arm_common.h, once per kernel level).
 *
 * Tokens are processed in tiles whose activations fit in L2 (~256 KiB); within a tile every weight row
 * is read once and each unpacked weight block meets up to MICRO tokens while in registers. Per tile,
 * the per-block activation scales (and each level's correction terms) are gathered into small float
 * arrays laid out [group of MICRO tokens][block][token in group], so one vector load gives a block's
 * values for the whole micro-tile.
 *
 * The including header defines h2f() and, before including this one, PI2_GEMM_ACT (the element type its
 * micro-kernel reads activation quants as) and optionally PI2_GEMM_Q4_0_OFFSET(q8_0 block) (Q4_0's
 * per-token correction term, for a micro-kernel that unpacks nibbles without the -8), and after it:
 *   gemm_row_micro(kind, nt, wrow, nb, acts, ablock, da, ca, out)   one weight row against nt tokens */
#ifndef PI2_KERNELS_GEMM_TILES_H
#define PI2_KERNELS_GEMM_TILES_H

enum { KIND_Q4_0, KIND_Q4_1, KIND_Q8_0 };
#define MICRO 4

static inline __attribute__((always_inline)) void gemm_row_micro(int kind, int nt, const void *wrow, int64_t nb,
                                                                 const PI2_GEMM_ACT *const *acts, size_t ablock,
                                                                 const float *da, const float *ca, float *out);

/* A tile's block scales sd, and the correction terms sc: Q4_1's activation sums (the micro-kernel
 * multiplies them by the weight block's m) and, where the level asks (PI2_GEMM_Q4_0_OFFSET), Q4_0's. */
static void fill_tile_scales(int kind, const uint8_t *acts, size_t act_bytes, int64_t t0, int64_t tn, int64_t nb,
                             float *sd, float *sc) {
    for (int64_t t = 0; t < tn; t++) {
        const uint8_t *a = acts + (size_t)(t0 + t) * act_bytes;
        float *dg = sd + (t / MICRO) * nb * MICRO + t % MICRO, *cg = sc + (t / MICRO) * nb * MICRO + t % MICRO;
        for (int64_t b = 0; b < nb; b++) {
            if (kind == KIND_Q4_1) {
                const pi2_block_q8_1 *q = (const pi2_block_q8_1 *)a + b;
                dg[b * MICRO] = h2f(q->d);
                cg[b * MICRO] = h2f(q->s);
            } else {
                const pi2_block_q8_0 *q = (const pi2_block_q8_0 *)a + b;
                dg[b * MICRO] = h2f(q->d);
#ifdef PI2_GEMM_Q4_0_OFFSET
                if (kind == KIND_Q4_0) cg[b * MICRO] = PI2_GEMM_Q4_0_OFFSET(q);
#endif
            }
        }
    }
}

static int64_t tile_tokens(size_t act_bytes) {
    int64_t tile = act_bytes ? (int64_t)((256u << 10) / act_bytes) : 64;
    return tile < MICRO ? MICRO : tile > 64 ? 64 : tile / MICRO * MICRO;
}

static void gemm_quant(int kind, const void *w, size_t row_bytes, int64_t rows, int64_t n, const void *acts,
                       size_t act_bytes, int64_t tokens, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK;
    const size_t ablock = kind == KIND_Q4_1 ? sizeof(pi2_block_q8_1) : sizeof(pi2_block_q8_0);
    const size_t qs_off = kind == KIND_Q4_1 ? offsetof(pi2_block_q8_1, qs) : offsetof(pi2_block_q8_0, qs);
    const int64_t tile = tile_tokens(act_bytes);
    float *sd = calloc((size_t)(tile * nb) * 2 + MICRO, sizeof(float));
    if (!sd) abort();
    float *sc = sd + tile * nb;
    const uint8_t *ab = acts;
    for (int64_t t0 = 0; t0 < tokens; t0 += tile) {
        const int64_t tn = tokens - t0 < tile ? tokens - t0 : tile;
        fill_tile_scales(kind, ab, act_bytes, t0, tn, nb, sd, sc);
        for (int64_t r = 0; r < rows; r++) {
            const void *wrow = (const uint8_t *)w + (size_t)r * row_bytes;
            for (int64_t t = 0; t < tn; t += MICRO) {
                const int nt = tn - t < MICRO ? (int)(tn - t) : MICRO;
                const PI2_GEMM_ACT *ap[MICRO];
                float out[MICRO];
                for (int k = 0; k < nt; k++) ap[k] = (const PI2_GEMM_ACT *)(ab + (size_t)(t0 + t + k) * act_bytes + qs_off);
                const float *dp = sd + (t / MICRO) * nb * MICRO, *cp = sc + (t / MICRO) * nb * MICRO;
                switch (kind * 8 + nt) { /* constant kind and nt let the compiler keep acc[] in registers */
#define CASE(K, NT) \
    case K * 8 + NT: gemm_row_micro(K, NT, wrow, nb, ap, ablock, dp, cp, out); break;
                    CASE(KIND_Q4_0, 1) CASE(KIND_Q4_0, 2) CASE(KIND_Q4_0, 3) CASE(KIND_Q4_0, 4)
                    CASE(KIND_Q4_1, 1) CASE(KIND_Q4_1, 2) CASE(KIND_Q4_1, 3) CASE(KIND_Q4_1, 4)
                    CASE(KIND_Q8_0, 1) CASE(KIND_Q8_0, 2) CASE(KIND_Q8_0, 3) CASE(KIND_Q8_0, 4)
#undef CASE
                }
                for (int k = 0; k < nt; k++) y[(t0 + t + k) * ldy + r] = out[k];
            }
        }
    }
    free(sd);
}

PI2_GEMM_OF_KIND(gemm_q4_0, gemm_quant, KIND_Q4_0)
PI2_GEMM_OF_KIND(gemm_q4_1, gemm_quant, KIND_Q4_1)
PI2_GEMM_OF_KIND(gemm_q8_0, gemm_quant, KIND_Q8_0)

#endif
