/* Prefill's down pass over a batch (kernels.h, pi2_axpy_batch) for Q4_0 columns: the driver, shared
 * by the x86 and arm kernel headers (included once per kernel level, like kernels_gemm_tiles.h).
 *
 * One axpy per token and column unpacks the column's nibbles into floats for every token that uses it
 * (~13 times a column in a 128-token batch at 10% live): some 15 vector operations per 32 products
 * where the products and sums take 4, so the unpack was most of the pass. Here the columns go in groups
 * of up to AXB_COLS and each group block by block: block b of each column some token uses is unpacked
 * once into floats beside its scale (16 KiB, in L1), and every token then adds its columns of the group
 * from there, its 32 outputs of the block in registers meanwhile. The outputs are held block-major for
 * the call ([block][token][32]), so a block's outputs of all the tokens are one run of memory: rows ldy
 * apart (multiples of 4 KiB) fell into the same few cache sets, and loading them cost more than the
 * arithmetic. Each element gets axpy_q4_0's y + (q * (a * d) + 0), in the token's column order: the
 * same floats.
 *
 * The including header defines, before including this one:
 *   axb_unpack(w, f)                      block w's 32 weights as floats q - 8 into f (64-byte aligned)
 *   axb_add(y, qf, d, ix, c0, a, count)   y[0..32) += a[k] * qf[c] * d[c], c = ix[k] - c0, for k < count
 *                                         in order, with axpy_q4_0's roundings (y 64-byte aligned) */
#ifndef PI2_KERNELS_AXPY_BATCH_H
#define PI2_KERNELS_AXPY_BATCH_H

#define AXB_COLS 128

static void axpy_batch_q4_0(int64_t n, const uint8_t *cols, size_t stride, int64_t tokens, const int32_t *const *idx,
                            const float *const *a, const int32_t *count, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK;
    if (tokens < 1 || nb < 1) return;
    float *qf = aligned_alloc(64, AXB_COLS * PI2_QK * sizeof(float)), dc[AXB_COLS];
    float *yp = aligned_alloc(64, (size_t)(nb * tokens) * PI2_QK * sizeof(float));
    int32_t *pos = calloc((size_t)(2 * tokens), sizeof(int32_t)), *end = pos + tokens;
    uint8_t used[AXB_COLS];
    if (!qf || !yp || !pos) abort();
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t b = 0; b < nb; b++) memcpy(yp + (b * tokens + t) * PI2_QK, y + t * ldy + b * PI2_QK, PI2_QK * sizeof(float));
    for (;;) {
        int32_t c0 = INT32_MAX; /* the group starts at the lowest column a token has left */
        for (int64_t t = 0; t < tokens; t++)
            if (pos[t] < count[t] && idx[t][pos[t]] < c0) c0 = idx[t][pos[t]];
        if (c0 == INT32_MAX) break;
        memset(used, 0, sizeof used);
        for (int64_t t = 0; t < tokens; t++) {
            int32_t e = pos[t];
            for (; e < count[t] && idx[t][e] - c0 < AXB_COLS; e++) used[idx[t][e] - c0] = 1;
            end[t] = e;
        }
        for (int64_t b = 0; b < nb; b++) {
            for (int c = 0; c < AXB_COLS; c++) {
                if (!used[c]) continue;
                const pi2_block_q4_0 *w = (const pi2_block_q4_0 *)(cols + (size_t)(c0 + c) * stride) + b;
                axb_unpack(w, qf + c * PI2_QK);
                dc[c] = h2f(w->d);
            }
            for (int64_t t = 0; t < tokens; t++) {
                if (end[t] > pos[t])
                    axb_add(yp + (b * tokens + t) * PI2_QK, qf, dc, idx[t] + pos[t], c0, a[t] + pos[t], end[t] - pos[t]);
            }
        }
        memcpy(pos, end, (size_t)tokens * sizeof(int32_t));
    }
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t b = 0; b < nb; b++) memcpy(y + t * ldy + b * PI2_QK, yp + (b * tokens + t) * PI2_QK, PI2_QK * sizeof(float));
    free(qf);
    free(yp);
    free(pos);
}

#endif
