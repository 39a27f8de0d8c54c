/* An FFN backend: who computes the FFN blocks of a forward pass when it is not forward.c's dense
 * FFN. forward.c calls it (pi2_ctx_set_ffn); the sparse engine is one (pi2_sparse_backend), and it
 * needs nothing of forward.c for that, so the engine sits below the forward pass. */
#ifndef PI2_FFN_BACKEND_H
#define PI2_FFN_BACKEND_H

typedef struct {
    void *impl;
    /* Before a layer's attention; x: the residual stream of the batch's `tokens` tokens (reads for
     * the layer's FFN may start here and fly while attention computes). */
    void (*layer_begin)(void *impl, int layer, const float *x, int tokens);
    /* out[t] = FFN of block (layer, expert) of in[t] (normalized inputs), t < tokens. 0, or -1 with an
     * error (a failed read). */
    int (*ffn)(void *impl, int layer, int expert, const float *in, int tokens, float *out);
    /* After the pass over every layer. */
    void (*step_end)(void *impl);
} pi2_ffn_backend;

#endif
