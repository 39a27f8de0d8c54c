/* Matrix products split across the thread pool: the one place that decides how rows are divided
 * between threads, for the forward pass and the sparse engine's predictors alike.
 *
 * Rows go out in chunks that threads take from a shared counter, not in fixed halves: a thread whose
 * core is busy elsewhere (a phone's little core, another process, a VM's stolen time) then does less
 * of the work instead of making every other thread wait for it. Each row's result is computed the
 * same way whichever thread takes it, so outputs do not depend on the split. */
#ifndef PI2_PARMAT_H
#define PI2_PARMAT_H

#include <stdatomic.h>
#include <stdint.h>

#include "kernels.h"
#include "threadpool.h"

/* Run fn on every thread of pool, or once on this thread when pool is NULL. */
void pi2_pool_run_or_inline(pi2_pool *pool, pi2_pool_fn fn, void *job);

/* Per-token work of a batch (norms, rotations, cache rows, activations): fn(job, t0, t1) for a share
 * of tokens [0, tokens) on each thread of the pool; a single token's runs on this thread, where a
 * wake-up of the pool costs more than the work. */
typedef void (*pi2_tokens_fn)(void *job, int64_t t0, int64_t t1);
void pi2_pool_run_tokens(pi2_pool *pool, int64_t tokens, pi2_tokens_fn fn, void *job);

/* The same for a job whose threads take pi2_chunks until none is left: workers that have not started
 * when this thread is done are not waited for (pi2_pool_run_dynamic). */
void pi2_pool_run_chunks(pi2_pool *pool, pi2_pool_fn fn, void *job);

/* Split [0, n) into nth parts whose boundaries are multiples of `align`. */
void pi2_split_aligned(int64_t n, int64_t align, int ith, int nth, int64_t *b, int64_t *e);

/* A shared counter handing out [b, e) chunks of [0, n), each a multiple of `align` rows; about 4
 * chunks per thread, so a slow thread is caught up with at a small cost per chunk. */
typedef struct {
    _Atomic int64_t next;
    int64_t n, chunk;
} pi2_chunks;

void pi2_chunks_init(pi2_chunks *c, int64_t n, int64_t align, int nth);
int pi2_chunks_take(pi2_chunks *c, int64_t *b, int64_t *e); /* 0 when none are left */

/* Convert `tokens` rows of x (n values each, rows ldx floats apart) into the activation type that
 * weight type wt pairs with (pi2_prepare_act), out_row bytes apart in out. */
void pi2_par_prepare(pi2_pool *pool, pi2_type wt, const float *x, int64_t n, int64_t ldx, int64_t tokens, uint8_t *out,
                     size_t out_row);

/* Prefill's packed batch of `tokens` prepared activations (kernels.h, pi2_batch_pack), packed by the
 * pool's threads tile by tile; NULL where the kernel level has no batch GEMM for wt or the tokens are
 * too few (callers keep pi2_gemm). The caller frees it. pi2_par_matmul makes its own. */
void *pi2_par_batch(pi2_pool *pool, pi2_type wt, const uint8_t *acts, int64_t n, int64_t tokens);

/* y[t][r] = dot(W[r], acts[t]) for t < tokens: acts prepared with pi2_prepare_act for w->type, one
 * per token (pi2_row_size(pi2_act_type(w->type), w->cols) bytes each); y rows ldy floats apart. */
void pi2_par_matmul(pi2_pool *pool, const pi2_mat *w, const uint8_t *acts, int64_t tokens, float *y, int64_t ldy);

/* The same for n (<= PI2_PAR_MULTI) matrices that take the same activations (attention's Q, K and V),
 * as one pool job: their rows are one queue of chunks, so threads move from one matrix to the next with
 * no barrier between them. y[i] gets w[i]'s rows, ldy[i] floats apart; the floats are pi2_par_matmul's. */
#define PI2_PAR_MULTI 4
void pi2_par_matmul_n(pi2_pool *pool, int n, const pi2_mat *const *w, const uint8_t *acts, int64_t tokens,
                      float *const *y, const int64_t *ldy);

#endif
