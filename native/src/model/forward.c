#include "forward.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "parmat.h"

struct pi2_ctx {
    const pi2_model *m;
    pi2_pool *pool;
    int n_ctx, n_batch, n_past, nth;
    int dense_ffn;                         /* g, u, h and acc exist: this context computes FFNs itself */
    int64_t q_dim, kv_dim, n_embd, n_ff;
    pi2_f16 *k_cache, *v_cache; /* [layer][n_ctx][kv_dim] */
    float *x, *xn, *q, *k, *v, *att, *tmp; /* [n_batch][...] */
    float *rope_cs;                        /* [n_batch][head_dim]: cos, sin of each pair's angle (rope_table) */
    float *g, *u, *h;                      /* [n_batch][n_ff] */
    float *ffn_in, *ffn_out;               /* moe: gathered rows [n_batch][n_embd] */
    float *router, *expert_w;              /* [n_batch][n_expert] */
    int32_t *expert_sel;                   /* [n_batch][n_expert_used] */
    int32_t *expert_tokens;                /* [n_batch] */
    float *scores;                         /* [nth][group][n_ctx] */
    uint8_t *qf16;                         /* [nth][group][head_dim] f16 */
    float *att_out, *att_m, *att_l;        /* attention parts: [units][group] x head_dim, x 1, x 1 */
    float *acc;                            /* axpy path: [nth][n_batch][n_embd] */
    uint8_t *act;                          /* prepared activations [n_batch][act_row_max] */
    float *logits;                         /* [n_vocab] */
    size_t bytes;                          /* all of the above */
    size_t kv_bytes;                       /* of which the KV cache */
    const pi2_ffn_backend *ffn;            /* FFN computed elsewhere (the sparse engine), or NULL: dense */
    pi2_fwd_prof prof;
};

/* Every buffer of a context (count_only: only add up their bytes, so sizing can ask what a context of
 * some shape will take without a model; pi2_ctx_bytes_for). Allocation is all-or-nothing: *ok = 0. */
static void *xcalloc(size_t n, size_t size, int *ok, size_t *total, int count_only) {
    *total += (n ? n : 1) * size;
    if (count_only) return NULL;
    void *p = calloc(n ? n : 1, size);
    if (!p) *ok = 0;
    return p;
}

/* Attention's work units are (token, KV head, part of the positions). A batch has units enough for
 * the threads with one part each; decode has few (SmolLM2: 3 KV heads for 2 threads would leave a
 * thread idle a third of the time), so each head's positions are split in parts that merge exactly
 * (pi2_att_merge): about 4 units per thread, none shorter than ATT_MIN_PART positions. */
#define ATT_UNITS_PER_THREAD 4
#define ATT_MIN_PART 64
static int att_parts(const pi2_ctx *c, const pi2_header *h, int tokens, int n_pos) {
    const int64_t pairs = (int64_t)tokens * h->n_head_kv, want = (int64_t)ATT_UNITS_PER_THREAD * c->nth;
    int64_t parts = pairs >= want ? 1 : (want + pairs - 1) / pairs;
    if (parts > n_pos / ATT_MIN_PART) parts = n_pos / ATT_MIN_PART;
    return parts < 1 ? 1 : (int)parts;
}
/* the most units att_parts can give: pairs * ceil(want / pairs) < want + pairs */
static size_t att_units_max(const pi2_ctx *c, const pi2_header *h) {
    return (size_t)c->n_batch * h->n_head_kv + (size_t)ATT_UNITS_PER_THREAD * c->nth;
}

static void ctx_buffers(pi2_ctx *c, const pi2_header *h, int count_only, int *ok) {
    size_t B = (size_t)c->n_batch, E = (size_t)c->n_embd;
    int64_t widest = c->n_embd > c->q_dim ? c->n_embd : c->q_dim;
    if (c->n_ff > widest) widest = c->n_ff;
    size_t act_row = pi2_row_size(PI2_F32, widest); /* F32 is the widest activation type */
    size_t *n = &c->bytes;
    const int k = count_only;
    size_t cache = (size_t)h->n_layer * (size_t)c->n_ctx * (size_t)c->kv_dim;
    c->k_cache = xcalloc(cache, sizeof(pi2_f16), ok, n, k);
    c->v_cache = xcalloc(cache, sizeof(pi2_f16), ok, n, k);
    c->kv_bytes = c->bytes;
    c->x = xcalloc(B * E, sizeof(float), ok, n, k);
    c->xn = xcalloc(B * E, sizeof(float), ok, n, k);
    c->tmp = xcalloc(B * E, sizeof(float), ok, n, k);
    c->q = xcalloc(B * (size_t)c->q_dim, sizeof(float), ok, n, k);
    c->att = xcalloc(B * (size_t)c->q_dim, sizeof(float), ok, n, k);
    c->k = xcalloc(B * (size_t)c->kv_dim, sizeof(float), ok, n, k);
    c->v = xcalloc(B * (size_t)c->kv_dim, sizeof(float), ok, n, k);
    c->rope_cs = xcalloc(B * (size_t)h->head_dim, sizeof(float), ok, n, k);
    /* The dense FFN's batch buffers (3 x n_batch x n_ff floats: 11 MiB for a 7B shape at 64 tokens)
     * only where this context computes FFNs: the sparse engine keeps its own, and under a budget
     * every byte held here is taken from the neuron cache. */
    if (c->dense_ffn) {
        c->g = xcalloc(B * (size_t)c->n_ff, sizeof(float), ok, n, k);
        c->u = xcalloc(B * (size_t)c->n_ff, sizeof(float), ok, n, k);
        c->h = xcalloc(B * (size_t)c->n_ff, sizeof(float), ok, n, k);
    }
    c->ffn_in = xcalloc(B * E, sizeof(float), ok, n, k);
    c->ffn_out = xcalloc(B * E, sizeof(float), ok, n, k);
    size_t ne = h->n_expert ? h->n_expert : 1;
    c->router = xcalloc(B * ne, sizeof(float), ok, n, k);
    c->expert_w = xcalloc(B * ne, sizeof(float), ok, n, k);
    c->expert_sel = xcalloc(B * ne, sizeof(int32_t), ok, n, k);
    c->expert_tokens = xcalloc(B, sizeof(int32_t), ok, n, k);
    const size_t group = h->n_head_kv ? h->n_head / h->n_head_kv : 1, units = att_units_max(c, h);
    c->scores = xcalloc((size_t)c->nth * group * (size_t)c->n_ctx, sizeof(float), ok, n, k);
    c->qf16 = xcalloc((size_t)c->nth * group * h->head_dim, sizeof(pi2_f16), ok, n, k);
    c->att_out = xcalloc(units * group * h->head_dim, sizeof(float), ok, n, k);
    c->att_m = xcalloc(units * group, sizeof(float), ok, n, k);
    c->att_l = xcalloc(units * group, sizeof(float), ok, n, k);
    if (c->dense_ffn && !(h->flags & PI2_FLAG_DENSE_DOWN)) c->acc = xcalloc((size_t)c->nth * B * E, sizeof(float), ok, n, k);
    c->act = xcalloc(B, act_row, ok, n, k);
    c->logits = xcalloc(h->n_vocab, sizeof(float), ok, n, k);
}

static void ctx_shape(pi2_ctx *c, const pi2_header *h, int n_ctx, int n_batch, int nth, int dense_ffn) {
    c->dense_ffn = dense_ffn;
    c->n_ctx = n_ctx;
    c->n_batch = n_batch;
    c->nth = nth;
    c->n_embd = h->n_embd;
    c->n_ff = h->n_ff;
    c->q_dim = (int64_t)h->n_head * h->head_dim;
    c->kv_dim = (int64_t)h->n_head_kv * h->head_dim;
}

size_t pi2_ctx_bytes_for(const pi2_header *h, int n_ctx, int n_batch, int nth, int dense_ffn, size_t *kv_bytes) {
    pi2_ctx c;
    memset(&c, 0, sizeof c);
    ctx_shape(&c, h, n_ctx, n_batch, nth, dense_ffn);
    int ok = 1;
    ctx_buffers(&c, h, 1, &ok);
    if (kv_bytes) *kv_bytes = c.kv_bytes;
    return c.bytes;
}

pi2_ctx *pi2_ctx_create(const pi2_model *m, int n_ctx, int n_batch, int dense_ffn, pi2_pool *pool) {
    const pi2_header *h = &m->h;
    if (n_ctx < 1 || n_batch < 1) {
        pi2_set_error("context and batch sizes must be positive");
        return NULL;
    }
    pi2_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->m = m;
    c->pool = pool;
    ctx_shape(c, h, n_ctx, n_batch, pool ? pi2_pool_size(pool) : 1, dense_ffn);
    int ok = 1;
    ctx_buffers(c, h, 0, &ok);
    if (!ok) {
        pi2_ctx_free(c);
        pi2_set_error("out of memory for a context of %d positions and batches of %d", n_ctx, n_batch);
        return NULL;
    }
    return c;
}

void pi2_ctx_free(pi2_ctx *c) {
    if (!c) return;
    void *ptrs[] = {c->k_cache, c->v_cache, c->x, c->xn, c->tmp, c->q, c->att, c->k, c->v, c->rope_cs, c->g, c->u, c->h,
                    c->ffn_in, c->ffn_out, c->router, c->expert_w, c->expert_sel, c->expert_tokens,
                    c->scores, c->qf16, c->att_out, c->att_m, c->att_l, c->acc, c->act, c->logits};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
    free(c);
}

const float *pi2_ctx_logits(const pi2_ctx *c) { return c->logits; }
size_t pi2_ctx_bytes(const pi2_ctx *c) { return c->bytes; }
size_t pi2_ctx_kv_bytes(const pi2_ctx *c) { return c->kv_bytes; }
void pi2_ctx_set_ffn(pi2_ctx *c, const pi2_ffn_backend *b) { c->ffn = b; }
int pi2_ctx_n_past(const pi2_ctx *c) { return c->n_past; }
int pi2_ctx_n_ctx(const pi2_ctx *c) { return c->n_ctx; }
int pi2_ctx_n_batch(const pi2_ctx *c) { return c->n_batch; }
void pi2_ctx_reset(pi2_ctx *c) { c->n_past = 0; }
void pi2_ctx_truncate(pi2_ctx *c, int n_past) {
    if (n_past >= 0 && n_past < c->n_past) c->n_past = n_past;
}
void pi2_ctx_prof(const pi2_ctx *c, pi2_fwd_prof *p) { *p = c->prof; }

/* ---- parallel helpers ------------------------------------------------------------------------ */

static void run(pi2_ctx *c, pi2_pool_fn fn, void *job) { pi2_pool_run_or_inline(c->pool, fn, job); }
static void run_chunks(pi2_ctx *c, pi2_pool_fn fn, void *job) { pi2_pool_run_chunks(c->pool, fn, job); }

/* Convert `tokens` rows of x (n used values, row stride ldx) into the activation type that weight
 * type wt pairs with; returns the per-token byte stride in c->act. */
static size_t prepare(pi2_ctx *c, pi2_type wt, const float *x, int64_t n, int64_t ldx, int64_t tokens) {
    const size_t out_row = pi2_row_size(pi2_act_type(wt), n);
    pi2_par_prepare(c->pool, wt, x, n, ldx, tokens, c->act, out_row);
    return out_row;
}

/* Gate and up rows of the same bundles, chunk by chunk: the up pass of a chunk finds its bundles
 * already in cache from the gate pass, instead of streaming the whole block twice with gaps. */
typedef struct {
    const pi2_mat *gate, *up;
    const uint8_t *acts, *batch; /* batch: pi2_par_batch's, or NULL */
    int64_t tokens;
    float *g, *u;
    int64_t ldy;
    pi2_chunks rows;
} gateup_job;

#define GATEUP_CHUNK 16

static void gateup_worker(void *p, int ith, int nth) {
    (void)ith, (void)nth;
    gateup_job *j = p;
    int64_t r0, r1;
    while (pi2_chunks_take(&j->rows, &r0, &r1))
    for (int64_t r = r0; r < r1; r += GATEUP_CHUNK) {
        const int64_t nr = r1 - r < GATEUP_CHUNK ? r1 - r : GATEUP_CHUNK;
        const pi2_mat *ws[2] = {j->gate, j->up};
        float *ys[2] = {j->g, j->u};
        for (int k = 0; k < 2; k++) {
            const pi2_mat *w = ws[k];
            const uint8_t *base = w->data + (size_t)r * w->stride;
            if (j->tokens == 1) pi2_gemv_strided(w->type, base, w->stride, nr, w->cols, j->acts, ys[k] + r);
            else if (j->batch) pi2_batch_gemm(w->type, base, w->stride, 0, nr, w->cols, j->batch, j->tokens, ys[k] + r, j->ldy);
            else pi2_gemm_strided(w->type, base, w->stride, nr, w->cols, j->acts, j->tokens, ys[k] + r, j->ldy);
        }
    }
}

/* Y[t][0..rows) = W x[t] for t < tokens; x rows have stride ldx floats, Y rows ldy. */
static void matmul(pi2_ctx *c, const pi2_mat *w, const float *x, int64_t ldx, int64_t tokens, float *y,
                   int64_t ldy) {
    prepare(c, w->type, x, w->cols, ldx, tokens);
    pi2_par_matmul(c->pool, w, c->act, tokens, y, ldy);
}

/* Same, reusing activations already prepared for a weight of the same activation type. */
static void matmul_prepared(pi2_ctx *c, const pi2_mat *w, int64_t tokens, float *y, int64_t ldy) {
    pi2_par_matmul(c->pool, w, c->act, tokens, y, ldy);
}

/* ---- elementwise pieces, written to round like ggml's CPU ops -------------------------------- */

/* x[t] += add[t] (add may be NULL), then xn[t] = rmsnorm(x[t]) * w (w may be NULL: no norm), for every
 * token, a batch's by token on the pool (pi2_pool_run_tokens): 128 prompt tokens' adds and norms were
 * ~0.1 ms a layer on the calling thread alone, a serial stretch that grows with the batch while the
 * matrices shrink with the threads. Each element's operations are the same either way. */
typedef struct {
    pi2_ctx *c;
    const float *add, *w;
} add_norm_job;

static void add_norm_tokens(void *p, int64_t b, int64_t e) {
    const add_norm_job *j = p;
    pi2_ctx *c = j->c;
    const int64_t E = c->n_embd;
    for (int64_t t = b; t < e; t++) {
        float *x = c->x + t * E;
        if (j->add)
            for (int64_t i = 0; i < E; i++) x[i] += j->add[t * E + i];
        if (j->w) pi2_rmsnorm(c->xn + t * E, x, j->w, E, c->m->h.rms_eps);
    }
}

static void add_norm(pi2_ctx *c, const float *add, const float *w, int tokens) {
    add_norm_job j = {c, add, w};
    pi2_pool_run_tokens(c->pool, tokens, add_norm_tokens, &j);
}

/* llama.cpp's "normal" RoPE: rotate adjacent pairs; theta advances by a float product as ggml does.
 * The angles depend on the position and the pair alone, not on the head or the layer, so each pass
 * computes their cosines and sines once per token (rope_table): every head of every layer then costs
 * four multiplies a pair. Computed per head, the 2 x 2560 cosf/sinf a layer of a 7B shape took were a
 * serial stretch of the token that the other threads waited through. */
static void rope_table(float *cs, int64_t head_dim, int pos, float theta_scale) {
    float theta = (float)pos;
    for (int64_t i = 0; i < head_dim; i += 2) {
        cs[i] = cosf(theta);
        cs[i + 1] = sinf(theta);
        theta *= theta_scale;
    }
}

static void rope(float *x, int64_t head_dim, const float *cs) {
    for (int64_t i = 0; i < head_dim; i += 2) {
        const float x0 = x[i], x1 = x[i + 1];
        x[i] = x0 * cs[i] - x1 * cs[i + 1];
        x[i + 1] = x0 * cs[i + 1] + x1 * cs[i];
    }
}

/* ---- attention ------------------------------------------------------------------------------- */

typedef struct {
    pi2_ctx *c;
    int layer, tokens, parts; /* parts per (token, KV head): att_parts */
    pi2_chunks units;         /* (token, KV head, part) */
} att_job;

static void att_worker(void *p, int ith, int nth) {
    att_job *j = p;
    pi2_ctx *c = j->c;
    const pi2_header *h = &c->m->h;
    const int64_t hd = h->head_dim, n_kv = h->n_head_kv, group = h->n_head / h->n_head_kv;
    const float scale = 1.0f / sqrtf((float)hd);
    const pi2_f16 *K = c->k_cache + (size_t)j->layer * c->n_ctx * c->kv_dim;
    const pi2_f16 *V = c->v_cache + (size_t)j->layer * c->n_ctx * c->kv_dim;
    pi2_f16 *qh = (pi2_f16 *)c->qf16 + (size_t)ith * group * hd;
    float *sc = c->scores + (size_t)ith * group * c->n_ctx;
    (void)nth;
    int64_t b, e;
    while (pi2_chunks_take(&j->units, &b, &e))
        for (int64_t u = b; u < e; u++) {
            const int64_t t = u / (n_kv * j->parts), kvh = u / j->parts % n_kv, part = u % j->parts;
            const int64_t n = c->n_past + t + 1, len = (n + j->parts - 1) / j->parts; /* causal: positions 0..pos */
            const int64_t s0 = part * len < n ? part * len : n, s1 = s0 + len < n ? s0 + len : n;
            /* the group's queries (heads kvh * group ..) in F16, as the cache */
            pi2_prepare_act(PI2_F16, c->q + t * c->q_dim + kvh * group * hd, qh, group * hd);
            pi2_att_f16(hd, (int)group, qh, K + s0 * c->kv_dim + kvh * hd, V + s0 * c->kv_dim + kvh * hd, c->kv_dim,
                        s1 - s0, scale, sc, c->att_out + u * group * hd, c->att_m + u * group, c->att_l + u * group);
        }
}

/* Each token's Q and K heads rotated, and its K and V rows into the layer's cache as F16. */
typedef struct {
    pi2_ctx *c;
    int layer;
} rope_kv_job;

static void rope_kv_tokens(void *p, int64_t b, int64_t e) {
    const rope_kv_job *j = p;
    pi2_ctx *c = j->c;
    const pi2_header *h = &c->m->h;
    for (int64_t t = b; t < e; t++) {
        const int64_t pos = c->n_past + t;
        const float *cs = c->rope_cs + (size_t)t * h->head_dim;
        for (uint32_t hh = 0; hh < h->n_head; hh++) rope(c->q + t * c->q_dim + hh * h->head_dim, h->head_dim, cs);
        for (uint32_t hh = 0; hh < h->n_head_kv; hh++) rope(c->k + t * c->kv_dim + hh * h->head_dim, h->head_dim, cs);
        const size_t at = ((size_t)j->layer * c->n_ctx + (size_t)pos) * (size_t)c->kv_dim;
        pi2_prepare_act(PI2_F16, c->k + t * c->kv_dim, c->k_cache + at, c->kv_dim); /* the level's converter */
        pi2_prepare_act(PI2_F16, c->v + t * c->kv_dim, c->v_cache + at, c->kv_dim);
    }
}

/* Each head of each token from its parts (pi2_att_merge), split by token. */
static void merge_tokens(void *p, int64_t b, int64_t e) {
    const att_job *j = p;
    pi2_ctx *c = j->c;
    const pi2_header *h = &c->m->h;
    const int64_t hd = h->head_dim, group = h->n_head / h->n_head_kv;
    for (int64_t t = b; t < e; t++)
        for (int64_t hh = 0; hh < h->n_head; hh++) {
            const int64_t u0 = (t * h->n_head_kv + hh / group) * j->parts, g = hh % group;
            pi2_att_merge(hd, j->parts, c->att_out + (u0 * group + g) * hd, group * hd, c->att_m + u0 * group + g,
                          c->att_l + u0 * group + g, group, c->att + t * c->q_dim + hh * hd);
        }
}

static void attention(pi2_ctx *c, const pi2_layer *L, int layer, int tokens) {
    const pi2_header *h = &c->m->h;
    const int64_t E = c->n_embd;
    add_norm(c, NULL, L->attn_norm, tokens);
    prepare(c, L->wq.type, c->xn, E, E, tokens);
    if (pi2_act_type(L->wk.type) == pi2_act_type(L->wq.type) && pi2_act_type(L->wv.type) == pi2_act_type(L->wq.type)) {
        /* one job for the three: no barrier between them */
        const pi2_mat *w[3] = {&L->wq, &L->wk, &L->wv};
        float *y[3] = {c->q, c->k, c->v};
        const int64_t ld[3] = {c->q_dim, c->kv_dim, c->kv_dim};
        pi2_par_matmul_n(c->pool, 3, w, c->act, tokens, y, ld);
    } else {
        matmul_prepared(c, &L->wq, tokens, c->q, c->q_dim);
        if (pi2_act_type(L->wk.type) != pi2_act_type(L->wq.type)) prepare(c, L->wk.type, c->xn, E, E, tokens);
        matmul_prepared(c, &L->wk, tokens, c->k, c->kv_dim);
        if (pi2_act_type(L->wv.type) != pi2_act_type(L->wk.type)) prepare(c, L->wv.type, c->xn, E, E, tokens);
        matmul_prepared(c, &L->wv, tokens, c->v, c->kv_dim);
    }

    rope_kv_job rk = {c, layer};
    pi2_pool_run_tokens(c->pool, tokens, rope_kv_tokens, &rk);
    att_job j = {.c = c, .layer = layer, .tokens = tokens, .parts = att_parts(c, h, tokens, c->n_past + 1)};
    pi2_chunks_init(&j.units, (int64_t)tokens * h->n_head_kv * j.parts, 1, c->nth);
    run_chunks(c, att_worker, &j);
    pi2_pool_run_tokens(c->pool, tokens, merge_tokens, &j);
    matmul(c, &L->wo, c->att, c->q_dim, tokens, c->tmp, E); /* added to x by ffn() */
}

/* ---- FFN --------------------------------------------------------------------------------------- */

typedef struct {
    pi2_ctx *c;
    const pi2_ffn_block *b;
    int tokens;
} axpy_job;

/* Neurons per chunk of a batch's down pass: their columns (n_embd wide) stay in L2 while every token
 * of the batch goes through them. */
#define AXPY_CHUNK 32

/* y[t] += sum_k h[t][k] * down_col[k]: each thread takes a range of neurons into its own
 * accumulator; zero activations (ReLU models) cost nothing. */
static void axpy_worker(void *p, int ith, int nth) {
    axpy_job *j = p;
    pi2_ctx *c = j->c;
    const int64_t E = c->n_embd, F = c->n_ff;
    float *acc = c->acc + (size_t)ith * c->n_batch * E;
    memset(acc, 0, (size_t)j->tokens * E * sizeof(float));
    int64_t b, e;
    pi2_split_range(F, ith, nth, &b, &e);
    const pi2_mat *d = &j->b->down_cols;
    if (j->tokens == 1) { /* decode: four columns per pass over the accumulator, the same sums */
        const uint8_t *cols[4];
        float a[4];
        int n = 0;
        for (int64_t k = b; k < e; k++) {
            if (c->h[k] == 0.0f) continue;
            cols[n] = d->data + (size_t)k * d->stride;
            a[n++] = c->h[k];
            if (n == 4) pi2_axpy_rows(d->type, E, a, cols, n, acc, NULL), n = 0;
        }
        if (n) pi2_axpy_rows(d->type, E, a, cols, n, acc, NULL);
        return;
    }
    /* a batch: chunk by chunk of neurons (their columns stay in cache while the tokens go by), each
     * token's own non-zero outputs four at a time, in neuron order: the sums of one pi2_axpy per
     * non-zero output, with the accumulator read and written once per four */
    for (int64_t k0 = b; k0 < e; k0 += AXPY_CHUNK) {
        const int64_t k1 = e - k0 < AXPY_CHUNK ? e : k0 + AXPY_CHUNK;
        for (int t = 0; t < j->tokens; t++) {
            const float *h = c->h + (size_t)t * F;
            const uint8_t *cols[4];
            float a[4];
            int n = 0;
            for (int64_t k = k0; k < k1; k++) {
                if (h[k] == 0.0f) continue;
                cols[n] = d->data + (size_t)k * d->stride;
                a[n++] = h[k];
                if (n == 4) pi2_axpy_rows(d->type, E, a, cols, n, acc + t * E, NULL), n = 0;
            }
            if (n) pi2_axpy_rows(d->type, E, a, cols, n, acc + t * E, NULL);
        }
    }
}

/* Under the sparse engine's budget, each token reads one embedding row through the file's mapping,
 * and the kernel maps it in with its neighbours (fault-around, 2 MiB folios of the page cache): over a
 * run that grew the RSS past the budget (2726 MiB under 2651 on the 7B shape). The row is read once:
 * give back the mapping's pages around it (within the table; they fault in again if needed). */
static void release_row(const pi2_mat *w, int64_t row) {
    const uintptr_t span = (uintptr_t)2 << 20, lo = (uintptr_t)w->data, hi = lo + (uintptr_t)w->rows * w->stride;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), at = lo + (uintptr_t)row * w->stride;
    uintptr_t a = at / span * span, e = (at + w->stride + span - 1) / span * span;
    if (a < lo) a = (lo + page - 1) / page * page;
    if (e > hi) e = hi / page * page;
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* out[t] = FFN of block (layer, expert) of in[t] for t < tokens (in: normalized inputs, n_embd each).
 * -1 only when the sparse engine fails to read neurons. */
static int ffn_block(pi2_ctx *c, int layer, int expert, const float *in, int tokens, float *out) {
    if (c->ffn) return c->ffn->ffn(c->ffn->impl, layer, expert, in, tokens, out);
    if (!c->dense_ffn) {
        pi2_set_error("this context was created for a sparse FFN and none is attached");
        return -1;
    }
    const pi2_ffn_block *b = &c->m->layers[layer].ffn[expert];
    const int64_t E = c->n_embd, F = c->n_ff;
    const uint32_t act = c->m->h.ffn_act;
    prepare(c, b->gate.type, in, E, E, tokens);
    gateup_job gu = {.gate = &b->gate, .up = &b->up, .acts = c->act, .tokens = tokens, .g = c->g, .u = c->u, .ldy = F};
    /* one batch for both matrices (their types agree in every model written so far) */
    uint8_t *batch = b->gate.type == b->up.type ? pi2_par_batch(c->pool, b->gate.type, c->act, b->gate.cols, tokens) : NULL;
    gu.batch = batch;
    pi2_chunks_init(&gu.rows, F, GATEUP_CHUNK, c->nth);
    run_chunks(c, gateup_worker, &gu);
    free(batch);
    for (int64_t i = 0; i < tokens * F; i++) {
        float g = c->g[i], u = c->u[i], v;
        if (act == PI2_ACT_SWIGLU) v = silu(g) * u;
        else if (act == PI2_ACT_RELU) v = (g > 0.0f ? g : 0.0f) * u;
        else v = (g > 0.0f ? g : 0.0f) * (u > 0.0f ? u : 0.0f);
        c->g[i] = v;
    }
    if (b->down.data) {
        /* Bundle order -> original neuron order, which the dense down copy's columns use. */
        for (int t = 0; t < tokens; t++)
            for (int64_t k = 0; k < F; k++) c->h[t * F + b->order[k]] = c->g[t * F + k];
        matmul(c, &b->down, c->h, F, tokens, out, E);
        return 0;
    }
    memcpy(c->h, c->g, (size_t)tokens * F * sizeof(float));
    axpy_job j = {c, b, tokens};
    run(c, axpy_worker, &j);
    memset(out, 0, (size_t)tokens * E * sizeof(float));
    for (int th = 0; th < c->nth; th++) {
        const float *acc = c->acc + (size_t)th * c->n_batch * E;
        for (int64_t i = 0; i < tokens * E; i++) out[i] += acc[i];
    }
    return 0;
}

/* Mixtral-style routing: softmax over the router logits, top-k experts, weights renormalized. */
static int moe(pi2_ctx *c, int layer, int tokens) {
    const pi2_layer *L = &c->m->layers[layer];
    const pi2_header *h = &c->m->h;
    const int64_t E = c->n_embd, NE = h->n_expert, K = h->n_expert_used;
    matmul(c, &L->router, c->xn, E, tokens, c->router, NE);
    for (int t = 0; t < tokens; t++) {
        float *r = c->router + t * NE, mx = -FLT_MAX;
        for (int64_t e = 0; e < NE; e++) mx = r[e] > mx ? r[e] : mx;
        double sum = 0;
        for (int64_t e = 0; e < NE; e++) sum += (r[e] = expf(r[e] - mx));
        for (int64_t e = 0; e < NE; e++) r[e] = (float)(r[e] / sum);
        int32_t *sel = c->expert_sel + t * K;
        float wsum = 0;
        for (int64_t k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t e = 0; e < NE; e++) {
                int taken = 0;
                for (int64_t q = 0; q < k; q++) taken |= sel[q] == e;
                if (!taken && (best < 0 || r[e] > r[best])) best = e;
            }
            sel[k] = (int32_t)best;
            wsum += r[best];
        }
        for (int64_t k = 0; k < K; k++) c->expert_w[t * K + k] = r[sel[k]] / wsum;
    }
    memset(c->tmp, 0, (size_t)tokens * E * sizeof(float));
    for (int64_t e = 0; e < NE; e++) {
        int n = 0;
        for (int t = 0; t < tokens; t++)
            for (int64_t k = 0; k < K; k++)
                if (c->expert_sel[t * K + k] == e) {
                    c->expert_tokens[n] = t;
                    memcpy(c->ffn_in + (size_t)n * E, c->xn + (size_t)t * E, (size_t)E * sizeof(float));
                    n++;
                }
        if (!n) continue;
        if (ffn_block(c, layer, (int)e, c->ffn_in, n, c->ffn_out) != 0) return -1;
        for (int i = 0; i < n; i++) {
            int t = c->expert_tokens[i];
            float w = 0;
            for (int64_t k = 0; k < K; k++)
                if (c->expert_sel[t * K + k] == e) w = c->expert_w[t * K + k];
            for (int64_t d = 0; d < E; d++) c->tmp[(size_t)t * E + d] += w * c->ffn_out[(size_t)i * E + d];
        }
    }
    return 0;
}

static int ffn(pi2_ctx *c, int layer, int tokens) {
    const pi2_layer *L = &c->m->layers[layer];
    add_norm(c, c->tmp, L->ffn_norm, tokens); /* attention's output */
    int rc = c->m->h.arch == PI2_ARCH_MOE ? moe(c, layer, tokens) : ffn_block(c, layer, 0, c->xn, tokens, c->tmp);
    if (rc != 0) return -1;
    add_norm(c, c->tmp, NULL, tokens); /* x is whole again before the next layer's layer_begin sees it */
    return 0;
}

/* ---- the whole pass ---------------------------------------------------------------------------- */

int pi2_forward(pi2_ctx *c, const int32_t *tokens, int n, float *logits_all) {
    const pi2_model *m = c->m;
    const int64_t E = c->n_embd, V = m->h.n_vocab;
    if (n < 1 || n > c->n_batch) {
        pi2_set_error("batch of %d tokens (1..%d allowed)", n, c->n_batch);
        return -1;
    }
    if (c->n_past + n > c->n_ctx) {
        pi2_set_error("context full: %d positions, %d more asked (raise --ctx)", c->n_ctx, n);
        return -1;
    }
    const uint64_t t_start = pi2_now_ns();
    for (int t = 0; t < n; t++) {
        if (tokens[t] < 0 || (int64_t)tokens[t] >= V) {
            pi2_set_error("token id %d out of range [0, %lld)", tokens[t], (long long)V);
            return -1;
        }
        const pi2_mat *emb = &m->tok_embd;
        pi2_dequantize_row(emb->type, emb->data + (size_t)tokens[t] * emb->stride, c->x + t * E, E);
        if (c->ffn && emb->data != m->output.data) release_row(emb, tokens[t]);
    }
    const float theta_scale = powf(m->h.rope_theta, -2.0f / (float)m->h.head_dim);
    for (int t = 0; t < n; t++) rope_table(c->rope_cs + (size_t)t * m->h.head_dim, m->h.head_dim, c->n_past + t, theta_scale);
    const uint64_t t_emb = pi2_now_ns();
    uint64_t t = t_emb, t1; /* the embedding rows are counted with the head, below */
    for (uint32_t l = 0; l < m->h.n_layer; l++) {
        if (c->ffn) c->ffn->layer_begin(c->ffn->impl, (int)l, c->x, n); /* reads fly during attention */
        t1 = pi2_now_ns(), c->prof.prefetch_ns += t1 - t, t = t1;
        attention(c, &m->layers[l], (int)l, n);
        t1 = pi2_now_ns(), c->prof.attention_ns += t1 - t, t = t1;
        if (ffn(c, (int)l, n) != 0) return -1;
        t1 = pi2_now_ns(), c->prof.ffn_ns += t1 - t, t = t1;
    }
    /* Only the rows whose logits are wanted go through the output matrix. */
    int first = logits_all ? 0 : n - 1, rows = n - first;
    for (int t = first; t < n; t++) pi2_rmsnorm(c->xn + (t - first) * E, c->x + t * E, m->output_norm, E, m->h.rms_eps);
    /* rows <= n <= n_batch: one call, as the activations' scratch holds n_batch rows */
    matmul(c, &m->output, c->xn, E, rows, logits_all ? logits_all : c->logits, V);
    if (logits_all) memcpy(c->logits, logits_all + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
    c->prof.output_ns += pi2_now_ns() - t + (t_emb - t_start);
    c->prof.passes++;
    c->n_past += n;
    if (c->ffn) c->ffn->step_end(c->ffn->impl);
    return 0;
}
