#include "parmat.h"

#include <stdlib.h>

#include "kernels.h"

void pi2_pool_run_or_inline(pi2_pool *pool, pi2_pool_fn fn, void *job) {
    if (pool) pi2_pool_run(pool, fn, job);
    else fn(job, 0, 1);
}

void pi2_pool_run_chunks(pi2_pool *pool, pi2_pool_fn fn, void *job) {
    if (pool) pi2_pool_run_dynamic(pool, fn, job);
    else fn(job, 0, 1);
}

void pi2_split_aligned(int64_t n, int64_t align, int ith, int nth, int64_t *b, int64_t *e) {
    int64_t units = (n + align - 1) / align;
    pi2_split_range(units, ith, nth, b, e);
    *b *= align;
    *e *= align;
    if (*b > n) *b = n;
    if (*e > n) *e = n;
}

void pi2_chunks_init(pi2_chunks *c, int64_t n, int64_t align, int nth) {
    int64_t chunk = n / ((int64_t)nth * 4);
    chunk = (chunk + align - 1) / align * align;
    atomic_init(&c->next, 0);
    c->n = n;
    c->chunk = chunk < align ? align : chunk;
}

int pi2_chunks_take(pi2_chunks *c, int64_t *b, int64_t *e) {
    const int64_t start = atomic_fetch_add_explicit(&c->next, c->chunk, memory_order_relaxed);
    if (start >= c->n) return 0;
    *b = start;
    *e = start + c->chunk < c->n ? start + c->chunk : c->n;
    return 1;
}

typedef struct {
    pi2_type wt;
    const uint8_t *acts;
    int64_t n, tokens;
    uint8_t *batch;
} batch_job;

static void batch_worker(void *p, int ith, int nth) {
    const batch_job *j = p;
    const int64_t tiles = (j->tokens + PI2_BATCH_TILE - 1) / PI2_BATCH_TILE;
    int64_t b, e;
    pi2_split_range(tiles, ith, nth, &b, &e);
    if (b >= e) return;
    const int64_t t0 = b * PI2_BATCH_TILE, t1 = e * PI2_BATCH_TILE < j->tokens ? e * PI2_BATCH_TILE : j->tokens;
    pi2_batch_pack(j->wt, j->acts + (size_t)t0 * pi2_row_size(pi2_act_type(j->wt), j->n), j->n, t1 - t0,
                   j->batch + (size_t)b * (size_t)(j->n / PI2_QK) * sizeof(pi2_batch_block));
}

void *pi2_par_batch(pi2_pool *pool, pi2_type wt, const uint8_t *acts, int64_t n, int64_t tokens) {
    const size_t bytes = pi2_batch_size(wt, n, tokens);
    if (!bytes) return NULL;
    batch_job j = {wt, acts, n, tokens, aligned_alloc(64, (bytes + 63) / 64 * 64)};
    if (!j.batch) return NULL; /* the unpacked path needs no memory */
    pi2_pool_run_or_inline(pool, batch_worker, &j);
    return j.batch;
}

typedef struct {
    const pi2_mat *w;
    const uint8_t *acts, *batch;
    int64_t tokens;
    float *y;
    int64_t ldy;
    pi2_chunks rows;
} mm_job;

static void mm_rows(const mm_job *j, int64_t r0, int64_t r1) {
    const pi2_mat *w = j->w;
    const uint8_t *base = w->data + (size_t)r0 * w->stride;
    if (j->batch) { /* the same floats as below, from the packed batch */
        pi2_batch_gemm(w->type, base, w->stride, w->x4, r1 - r0, w->cols, j->batch, j->tokens, j->y + r0, j->ldy);
        return;
    }
    if (w->x4) { /* chunks are multiples of 16 rows: they start at a group of four */
        pi2_x4_gemm(w->type, base, r1 - r0, w->cols, j->acts, j->tokens, j->y + r0, j->ldy);
        return;
    }
    if (w->stride == w->row_bytes) {
        if (j->tokens == 1) pi2_gemv(w->type, base, r1 - r0, w->cols, j->acts, j->y + r0);
        else pi2_gemm(w->type, base, r1 - r0, w->cols, j->acts, j->tokens, j->y + r0, j->ldy);
        return;
    }
    /* Rows inside bundles (stride = bundle_stride): the kernels' strided variants. */
    if (j->tokens == 1) pi2_gemv_strided(w->type, base, w->stride, r1 - r0, w->cols, j->acts, j->y + r0);
    else pi2_gemm_strided(w->type, base, w->stride, r1 - r0, w->cols, j->acts, j->tokens, j->y + r0, j->ldy);
}

static void mm_worker(void *p, int ith, int nth) {
    (void)ith, (void)nth;
    mm_job *j = p;
    int64_t r0, r1;
    while (pi2_chunks_take(&j->rows, &r0, &r1)) mm_rows(j, r0, r1);
}

void pi2_par_matmul(pi2_pool *pool, const pi2_mat *w, const uint8_t *acts, int64_t tokens, float *y, int64_t ldy) {
    uint8_t *batch = pi2_par_batch(pool, w->type, acts, w->cols, tokens);
    mm_job j = {.w = w, .acts = acts, .batch = batch, .tokens = tokens, .y = y, .ldy = ldy};
    pi2_chunks_init(&j.rows, w->rows, 16, pool ? pi2_pool_size(pool) : 1);
    pi2_pool_run_chunks(pool, mm_worker, &j);
    free(batch);
}

typedef struct {
    pi2_type wt;
    const float *x;
    int64_t n, ldx, tokens;
    uint8_t *out;
    size_t out_row;
} prep_job;

static void prep_worker(void *p, int ith, int nth) {
    prep_job *j = p;
    int64_t b, e;
    pi2_split_range(j->tokens, ith, nth, &b, &e);
    for (int64_t t = b; t < e; t++) pi2_prepare_act(j->wt, j->x + t * j->ldx, j->out + t * j->out_row, j->n);
}

void pi2_par_prepare(pi2_pool *pool, pi2_type wt, const float *x, int64_t n, int64_t ldx, int64_t tokens, uint8_t *out,
                     size_t out_row) {
    prep_job j = {wt, x, n, ldx, tokens, out, out_row};
    /* One row (decode) is quicker here than a wake-up of the pool. */
    pi2_pool_run_or_inline(tokens > 1 ? pool : NULL, prep_worker, &j);
}
