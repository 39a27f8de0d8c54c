/* Which FFN neurons to compute: the model's activation predictors (per layer, per expert: score =
 * fc2 . relu(fc1 . x), active when sigmoid(score) > threshold; or, in files with a gate predictor
 * (CATS), score = |silu(gate . x)| from a resident copy of the gate rows, active when score > the
 * layer's threshold; docs/FORMAT.md), and the truth they are judged against (the oracle: every gate
 * and up row multiplied out). */
#ifndef PI2_SPARSE_PREDICT_H
#define PI2_SPARSE_PREDICT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "threadpool.h"

typedef struct {
    int n_blocks, n_batch, rank_max;
    int gate;            /* 1: fc1 is the block's gate [E, F] (CATS), fc2 unused, thr_logit holds t itself */
    int64_t E, F;
    pi2_mat *fc1, *fc2;  /* per block; fc2 row k scores bundle k */
    float *thr_logit;    /* per block: logit(threshold), so no sigmoid per neuron */
    uint8_t *act1, *act2;
    size_t act1_row, act2_row;
    float *hid, *scores; /* [n_batch][rank_max], [n_batch][F] */
    uint8_t *owned;      /* the weights' copy after pi2_predictors_own, else NULL (mapped from the file) */
} pi2_predictors;

/* Bind every block's predictor (checking names, types and shapes). skip: bind nothing (the oracle
 * needs none). 0, or -1 with an error naming the tensor. */
int pi2_predictors_bind(pi2_predictors *p, const pi2_model *m, int n_batch, int skip);
void pi2_predictors_free(pi2_predictors *p);
/* Copy the weights out of the file's mapping into this process's own memory, whose pages the kernel
 * cannot drop: under a memory cgroup at its limit, mapped file pages are reclaimed and fault back in
 * from storage mid-decode. 0 or -1 with an error. */
int pi2_predictors_own(pi2_predictors *p);
size_t pi2_predictors_scratch_bytes(const pi2_predictors *p);

/* mask[t][k] = 1 when block's predictor calls bundle k active for in[t] (normalized FFN input). */
void pi2_predict(pi2_predictors *p, pi2_pool *pool, int block, const float *in, int tokens, uint8_t *mask);

/* truth[t][k] = 1 when neuron k's output is non-zero for token t: act holds the FFN inputs prepared
 * for the neuron type (act_row bytes each). Reads every gate (and up) row through the file mapping,
 * then hands those pages back (madvise), so RSS grows by at most one block meanwhile. */
void pi2_true_activations(pi2_pool *pool, const pi2_model *m, const pi2_ffn_block *blk, const uint8_t *act,
                          size_t act_row, int tokens, uint8_t *truth);

#endif
