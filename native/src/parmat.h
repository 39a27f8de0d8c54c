/* Matrix products split across the thread pool: the one place that decides how rows are divided
 * between threads (tiles of 16 rows, the kernels' row tile), for the forward pass and the sparse
 * engine's predictors alike. */
#ifndef PI2_PARMAT_H
#define PI2_PARMAT_H

#include <stdint.h>

#include "model.h"
#include "threadpool.h"

/* Run fn on every thread of pool, or once on this thread when pool is NULL. */
void pi2_pool_run_or_inline(pi2_pool *pool, pi2_pool_fn fn, void *job);

/* Split [0, n) into nth parts whose boundaries are multiples of `align`. */
void pi2_split_aligned(int64_t n, int64_t align, int ith, int nth, int64_t *b, int64_t *e);

/* Convert `tokens` rows of x (n values each, rows ldx floats apart) into the activation type that
 * weight type wt pairs with (pi2_prepare_act), out_row bytes apart in out. */
void pi2_par_prepare(pi2_pool *pool, pi2_type wt, const float *x, int64_t n, int64_t ldx, int64_t tokens, uint8_t *out,
                     size_t out_row);

/* y[t][r] = dot(W[r], acts[t]) for t < tokens: acts prepared with pi2_prepare_act for w->type, one
 * per token (pi2_row_size(pi2_act_type(w->type), w->cols) bytes each); y rows ldy floats apart. */
void pi2_par_matmul(pi2_pool *pool, const pi2_mat *w, const uint8_t *acts, int64_t tokens, float *y, int64_t ldy);

#endif
