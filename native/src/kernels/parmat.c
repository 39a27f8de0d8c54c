#include "parmat.h"

#include <stdlib.h>

#include "kernels.h"

void pi2_pool_run_or_inline(pi2_pool *pool, pi2_pool_fn fn, void *job) {
    if (pool) pi2_pool_run(pool, fn, job);
    else fn(job, 0, 1);
}

typedef struct {
    pi2_tokens_fn fn;
    void *job;
    int64_t tokens;
} tokens_job;

static void tokens_worker(void *p, int ith, int nth) {
    const tokens_job *j = p;
    int64_t b, e;
    pi2_split_range(j->tokens, ith, nth, &b, &e);
    if (b < e) j->fn(j->job, b, e);
}

void pi2_pool_run_tokens(pi2_pool *pool, int64_t tokens, pi2_tokens_fn fn, void *job) {
    tokens_job j = {fn, job, tokens};
    pi2_pool_run_or_inline(tokens > 1 ? pool : NULL, tokens_worker, &j);
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

/* One job over up to PI2_PAR_MULTI matrices, their rows laid end to end in one range of "slots": part
 * m's rows are slots [first[m], first[m] + rows), and each part starts on a multiple of the job's
 * alignment (x4 groups, and the kernels' row blocks, then never straddle a chunk). Threads take chunks
 * of slots that shrink as the range drains (guided self-scheduling): a chunk is MM_SHARE-th of what is
 * left per thread, never under MM_MIN_BYTES of weights. Fixed chunks of a quarter of a thread's share
 * left every thread but the last idle for half a chunk on average at the end of each matrix: at 16
 * threads, 15-30 us of a 120-180 us attention matrix, and ~0.2 ms of the output head's 1.5 ms. Here the
 * last chunks are 16 rows (37 KiB of a 4096-wide Q4_0 matrix), so the threads finish within a few
 * microseconds of each other.
 * Quantized rows go in multiples of MM_ALIGN (16); F16 rows (the predictors) in multiples of 4, the
 * group rows_f16 computes, whose floats are the single row's: a predictor's fc1 (64 x 4096 F16, 512 KiB)
 * was four 16-row chunks, so at most 4 of 16 threads shared it. */
#define MM_ALIGN 16
#define MM_ALIGN_F16 4
#define MM_MIN_BYTES 16384
#define MM_SHARE 2

typedef struct {
    const pi2_mat *w;
    float *y;
    int64_t ldy, first;
} mm_part;

typedef struct {
    int n;
    mm_part part[PI2_PAR_MULTI];
    const uint8_t *acts, *batch; /* batch: prefill's packed activations, shared by every part, or NULL */
    int64_t tokens, slots, per, min, align; /* per: MM_SHARE x the threads; min: the smallest chunk */
    _Atomic int64_t next;
} mm_job;

static void mm_rows(const mm_job *j, const mm_part *p, int64_t r0, int64_t r1) {
    const pi2_mat *w = p->w;
    const uint8_t *base = w->data + (size_t)r0 * w->stride;
    if (j->batch) { /* the same floats as below, from the packed batch */
        pi2_batch_gemm(w->type, base, w->stride, w->x4, r1 - r0, w->cols, j->batch, j->tokens, p->y + r0, p->ldy);
        return;
    }
    if (w->x4) { /* chunks are multiples of 16 rows: they start at a group of four */
        pi2_x4_gemm(w->type, base, r1 - r0, w->cols, j->acts, j->tokens, p->y + r0, p->ldy);
        return;
    }
    if (w->stride == w->row_bytes) {
        if (j->tokens == 1) pi2_gemv(w->type, base, r1 - r0, w->cols, j->acts, p->y + r0);
        else pi2_gemm(w->type, base, r1 - r0, w->cols, j->acts, j->tokens, p->y + r0, p->ldy);
        return;
    }
    /* Rows inside bundles (stride = bundle_stride): the kernels' strided variants. */
    if (j->tokens == 1) pi2_gemv_strided(w->type, base, w->stride, r1 - r0, w->cols, j->acts, p->y + r0);
    else pi2_gemm_strided(w->type, base, w->stride, r1 - r0, w->cols, j->acts, j->tokens, p->y + r0, p->ldy);
}

/* The next chunk of slots [*b, *e); 0 when none is left. */
static int mm_take(mm_job *j, int64_t *b, int64_t *e) {
    int64_t at = atomic_load_explicit(&j->next, memory_order_relaxed);
    for (;;) {
        const int64_t left = j->slots - at;
        if (left <= 0) return 0;
        int64_t size = (left / j->per + j->align - 1) / j->align * j->align;
        if (size < j->min) size = j->min;
        if (size > left) size = left;
        if (atomic_compare_exchange_weak_explicit(&j->next, &at, at + size, memory_order_relaxed, memory_order_relaxed)) {
            *b = at, *e = at + size;
            return 1;
        }
    }
}

static void mm_worker(void *arg, int ith, int nth) {
    (void)ith, (void)nth;
    mm_job *j = arg;
    int64_t b, e;
    while (mm_take(j, &b, &e))
        for (int m = 0; m < j->n; m++) { /* the parts the chunk covers */
            const mm_part *p = &j->part[m];
            const int64_t r0 = b > p->first ? b - p->first : 0, r1 = e - p->first < p->w->rows ? e - p->first : p->w->rows;
            if (r0 < r1) mm_rows(j, p, r0, r1);
        }
}

/* Below this many multiply-adds a matrix is computed on the calling thread: waking the pool costs more
 * than it saves (a predictor's fc1, rank x n_embd: 32 x 4096, is two 16-row chunks, so two threads at
 * most would share it while every other thread woke for nothing). */
#define PAR_MIN_MACS ((int64_t)1 << 17)

void pi2_par_matmul_n(pi2_pool *pool, int n, const pi2_mat *const *w, const uint8_t *acts, int64_t tokens,
                      float *const *y, const int64_t *ldy) {
    mm_job j = {.n = n, .acts = acts, .tokens = tokens, .align = MM_ALIGN_F16};
    int64_t macs = 0;
    size_t row_bytes = 0; /* the widest part's */
    for (int i = 0; i < n; i++) {
        if (w[i]->type != PI2_F16 || w[i]->x4) j.align = MM_ALIGN;
        if (w[i]->row_bytes > row_bytes) row_bytes = w[i]->row_bytes;
    }
    for (int i = 0; i < n; i++) {
        macs += w[i]->rows * w[i]->cols * tokens;
        j.part[i] = (mm_part){.w = w[i], .y = y[i], .ldy = ldy[i], .first = j.slots};
        j.slots += (w[i]->rows + j.align - 1) / j.align * j.align;
    }
    pi2_pool *run = macs <= PAR_MIN_MACS ? NULL : pool;
    const int nth = run ? pi2_pool_size(run) : 1;
    j.per = (int64_t)MM_SHARE * nth;
    /* A batch (prefill) re-reads its packed activations for every chunk and is bound by arithmetic, not
     * by memory: its chunks stay at least a quarter of a thread's share, as before the guided split. */
    j.min = (int64_t)((MM_MIN_BYTES + row_bytes - 1) / (row_bytes ? row_bytes : 1));
    if (tokens > 1 && j.min < j.slots / (4 * nth)) j.min = j.slots / (4 * nth);
    j.min = (j.min + j.align - 1) / j.align * j.align;
    atomic_init(&j.next, 0);
    /* One packed batch serves every part when they share the input's type and width (Q, K and V do). */
    int same = 1;
    for (int i = 1; i < n; i++) same &= w[i]->type == w[0]->type && w[i]->cols == w[0]->cols;
    uint8_t *batch = same ? pi2_par_batch(run, w[0]->type, acts, w[0]->cols, tokens) : NULL;
    j.batch = batch;
    pi2_pool_run_chunks(run, mm_worker, &j);
    free(batch);
}

void pi2_par_matmul(pi2_pool *pool, const pi2_mat *w, const uint8_t *acts, int64_t tokens, float *y, int64_t ldy) {
    pi2_par_matmul_n(pool, 1, &w, acts, tokens, &y, &ldy);
}

typedef struct {
    pi2_type wt;
    const float *x;
    int64_t n, ldx;
    uint8_t *out;
    size_t out_row;
} prep_job;

static void prep_tokens(void *p, int64_t b, int64_t e) {
    const prep_job *j = p;
    for (int64_t t = b; t < e; t++) pi2_prepare_act(j->wt, j->x + t * j->ldx, j->out + t * j->out_row, j->n);
}

void pi2_par_prepare(pi2_pool *pool, pi2_type wt, const float *x, int64_t n, int64_t ldx, int64_t tokens, uint8_t *out,
                     size_t out_row) {
    prep_job j = {wt, x, n, ldx, out, out_row};
    pi2_pool_run_tokens(pool, tokens, prep_tokens, &j);
}
