/* A loaded model: the validated file plus typed views of every weight the forward pass uses.
 * pi2_model_load checks that each tensor the architecture needs is present with the right shape. */
#ifndef PI2_MODEL_H
#define PI2_MODEL_H

#include <stdint.h>

#include "kernels.h"
#include "pi2file.h"

typedef struct {
    pi2_mat gate, up;      /* rows in bundle order (views into the neuron region) */
    pi2_mat down_cols;     /* bundle down parts: row k = column order[k] of down, for axpy */
    pi2_mat down;          /* dense down copy [n_embd rows x n_ff cols], original order; data NULL if absent */
    const int32_t *order;  /* bundle k = original neuron order[k] */
} pi2_ffn_block;

typedef struct {
    const float *attn_norm, *ffn_norm;
    pi2_mat wq, wk, wv, wo;
    pi2_mat router;        /* moe: n_expert rows */
    pi2_ffn_block *ffn;    /* 1 (dense) or n_expert blocks */
} pi2_layer;

typedef struct {
    pi2_file file;
    pi2_header h;          /* copy of file.h for brevity */
    int n_ffn_blocks;
    pi2_mat tok_embd, output;
    const float *output_norm;
    pi2_layer *layers;
    int packed;            /* gate/up data are malloc'ed copies (pi2_model_pack_ffn) */
    uint8_t *small;        /* the norms and routers, copied out of the mapping at load (model.c: own_small) */
} pi2_model;

int pi2_model_load(pi2_model *m, const char *path, int verify_neurons);

/* The dense path: copy every block's gate and up rows out of the bundles into contiguous memory
 * (bundle order kept), so decode streams only the rows it multiplies instead of whole bundles
 * (stride gaps cost ~2x memory traffic for those rows). When the file has the dense down copy the
 * neuron region is then dropped from this process's memory (madvise), so RSS grows by nothing.
 * -1 with an error when memory runs out. */
int pi2_model_pack_ffn(pi2_model *m);
/* Decode's dense products (attention and output weights) into rows interleaved by four, where the
 * kernel level has a kernel for that layout (kernels.h, pi2_x4_supported): each matrix is copied into
 * anonymous memory and its pages in the mapping are dropped, so RSS stays the same. Matrices of other
 * types, with a row count not a multiple of 4, or shared with the token embedding stay as they are.
 * -1 with an error when memory runs out (the model stays usable, partly repacked). */
int pi2_model_repack(pi2_model *m);
void pi2_model_free(pi2_model *m);

#endif
