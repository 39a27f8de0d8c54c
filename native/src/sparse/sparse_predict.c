#include "sparse_predict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "parmat.h"

static int bind_pred_mat(const pi2_model *m, pi2_mat *out, const char *name, int64_t cols, int64_t rows_or_0) {
    const pi2_tensor *t = pi2_file_find(&m->file, name);
    if (!t) {
        pi2_set_error("%s: predictor tensor '%s' is missing", m->file.path, name);
        return -1;
    }
    if (t->region != PI2_SEC_RESIDENT || !pi2_type_valid_weight(t->type) || t->ne[0] != cols || t->ne[2] != 1 ||
        t->ne[3] != 1 || (rows_or_0 && t->ne[1] != rows_or_0) ||
        !pi2_tensor_holds(t, (uint64_t)t->ne[1] * pi2_row_size((pi2_type)t->type, cols))) {
        pi2_set_error("%s: predictor tensor '%s' must be a resident weight [%lld, %lld]", m->file.path, name,
                      (long long)cols, (long long)(rows_or_0 ? rows_or_0 : t->ne[1]));
        return -1;
    }
    out->data = t->data;
    out->type = (pi2_type)t->type;
    out->cols = cols;
    out->rows = t->ne[1];
    out->row_bytes = out->stride = pi2_row_size(out->type, cols);
    return 0;
}

int pi2_predictors_bind(pi2_predictors *p, const pi2_model *m, int n_batch, int skip) {
    const pi2_header *h = &m->h;
    memset(p, 0, sizeof *p);
    if (skip) return 0;
    const int nb = m->n_ffn_blocks;
    p->n_blocks = (int)h->n_layer * nb;
    p->n_batch = n_batch;
    p->E = h->n_embd;
    p->F = h->n_ff;
    p->gate = (h->flags & PI2_FLAG_GATE_PREDICTOR) != 0;
    p->fc1 = calloc((size_t)p->n_blocks, sizeof *p->fc1);
    p->fc2 = calloc((size_t)p->n_blocks, sizeof *p->fc2);
    p->thr_logit = calloc((size_t)p->n_blocks, sizeof *p->thr_logit);
    if (!p->fc1 || !p->fc2 || !p->thr_logit) goto oom;
    char name[96], sfx[16] = "";
    for (uint32_t l = 0; l < h->n_layer; l++) {
        snprintf(name, sizeof name, "blk.%u.pred_threshold", l);
        const pi2_tensor *t = pi2_file_find(&m->file, name);
        if (!t || t->type != PI2_F32 || t->ne[0] != nb || t->n_dims != 1 || t->region != PI2_SEC_RESIDENT ||
            !pi2_tensor_holds(t, (uint64_t)nb * 4)) {
            pi2_set_error("%s: predictor tensor '%s' must be F32 [%d]", m->file.path, name, nb);
            return -1;
        }
        for (int e = 0; e < nb; e++) {
            const int b = (int)l * nb + e;
            if (h->arch == PI2_ARCH_MOE) snprintf(sfx, sizeof sfx, ".%d", e);
            if (p->gate) { /* CATS: the gate rows themselves, in bundle order, and t on |silu(gate . x)| */
                snprintf(name, sizeof name, "blk.%u.pred_gate%s", l, sfx);
                if (bind_pred_mat(m, &p->fc1[b], name, p->E, p->F) != 0) return -1;
                float thr;
                memcpy(&thr, t->data + (size_t)e * 4, 4);
                if (!isfinite(thr) || thr < 0.0f) {
                    pi2_set_error("%s: blk.%u.pred_threshold must hold finite thresholds >= 0 for a gate predictor",
                                  m->file.path, l);
                    return -1;
                }
                p->thr_logit[b] = thr;
                size_t r1 = pi2_row_size(pi2_act_type(p->fc1[b].type), p->E);
                if (r1 > p->act1_row) p->act1_row = r1;
                continue;
            }
            snprintf(name, sizeof name, "blk.%u.pred_fc1%s", l, sfx);
            if (bind_pred_mat(m, &p->fc1[b], name, p->E, 0) != 0) return -1;
            snprintf(name, sizeof name, "blk.%u.pred_fc2%s", l, sfx);
            if (bind_pred_mat(m, &p->fc2[b], name, p->fc1[b].rows, p->F) != 0) return -1;
            if (p->fc1[b].rows > p->rank_max) p->rank_max = (int)p->fc1[b].rows;
            float thr;
            memcpy(&thr, t->data + (size_t)e * 4, 4);
            if (!(thr == thr)) {
                pi2_set_error("%s: 'blk.%u.pred_threshold' holds NaN", m->file.path, l); /* not `name`: fc2's */
                return -1;
            }
            /* sigmoid(score) > thr  <=>  score > logit(thr) */
            p->thr_logit[b] = thr <= 0.0f ? -INFINITY : thr >= 1.0f ? INFINITY : logf(thr / (1.0f - thr));
            size_t r1 = pi2_row_size(pi2_act_type(p->fc1[b].type), p->E);
            size_t r2 = pi2_row_size(pi2_act_type(p->fc2[b].type), p->fc1[b].rows);
            if (r1 > p->act1_row) p->act1_row = r1;
            if (r2 > p->act2_row) p->act2_row = r2;
        }
    }
    p->act1 = calloc((size_t)n_batch, p->act1_row);
    p->act2 = calloc((size_t)n_batch, p->act2_row ? p->act2_row : 1);
    p->hid = calloc((size_t)n_batch * (p->rank_max ? p->rank_max : 1), sizeof(float));
    p->scores = calloc((size_t)n_batch * p->F, sizeof(float));
    if (!p->act1 || !p->act2 || !p->hid || !p->scores) goto oom;
    return 0;
oom:
    pi2_set_error("out of memory for the predictors");
    return -1;
}

int pi2_predictors_own(pi2_predictors *p) {
    size_t total = 0;
    for (int b = 0; b < p->n_blocks && p->fc1; b++)
        total += (size_t)p->fc1[b].rows * p->fc1[b].stride + (size_t)p->fc2[b].rows * p->fc2[b].stride;
    if (!total) return 0;
    if (!(p->owned = pi2_huge_alloc(total))) {
        pi2_set_error("out of memory for the predictors' weights (%.1f MiB)", total / 1048576.0);
        return -1;
    }
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uint8_t *at = p->owned;
    for (int b = 0; b < p->n_blocks; b++) {
        pi2_mat *mats[2] = {&p->fc1[b], &p->fc2[b]};
        for (int i = 0; i < 2; i++) {
            const size_t bytes = (size_t)mats[i]->rows * mats[i]->stride;
            if (!bytes) continue; /* a gate predictor has no fc2 */
            memcpy(at, mats[i]->data, bytes);
            /* the mapping's pages are not read again: give them back (the mapping stays valid) */
            const uintptr_t a = ((uintptr_t)mats[i]->data + page - 1) / page * page,
                            e = ((uintptr_t)mats[i]->data + bytes) / page * page;
            if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
            mats[i]->data = at;
            at += bytes;
        }
    }
    return 0;
}

void pi2_predictors_free(pi2_predictors *p) {
    free(p->owned);
    free(p->fc1);
    free(p->fc2);
    free(p->thr_logit);
    free(p->act1);
    free(p->act2);
    free(p->hid);
    free(p->scores);
    memset(p, 0, sizeof *p);
}

size_t pi2_predictors_scratch_bytes(const pi2_predictors *p) {
    return (size_t)p->n_batch * (p->act1_row + p->act2_row + (size_t)p->rank_max * 4 + (size_t)p->F * 4);
}

/* mask[i] = scores[i] > thr, from locals: through p->scores the compiler must reload the pointer after
 * every byte stored to mask (a char store may change it), and the loop ran scalar: ~9 us a block of
 * 14336 neurons on the calling thread while the pool waited. */
static void threshold(const float *restrict scores, size_t n, float thr, uint8_t *restrict mask) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) /* a fixed 16: -O2's cost model vectorises it, not the open loop */
        for (int k = 0; k < 16; k++) mask[i + k] = scores[i + k] > thr;
    for (; i < n; i++) mask[i] = scores[i] > thr;
}

void pi2_predict(pi2_predictors *p, pi2_pool *pool, int block, const float *in, int tokens, uint8_t *mask) {
    const pi2_mat *fc1 = &p->fc1[block], *fc2 = &p->fc2[block];
    const int64_t R = fc1->rows;
    for (int t = 0; t < tokens; t++) pi2_prepare_act(fc1->type, in + (size_t)t * p->E, p->act1 + (size_t)t * p->act1_row, p->E);
    if (p->gate) { /* CATS: |silu(g)| > t; at t = 0 every neuron whose output is not exactly zero */
        pi2_par_matmul(pool, fc1, p->act1, tokens, p->scores, p->F);
        const float thr = p->thr_logit[block];
        for (size_t i = 0; i < (size_t)tokens * p->F; i++) {
            const float g = p->scores[i];
            p->scores[i] = fabsf(g / (1.0f + expf(-g)));
            mask[i] = p->scores[i] > thr;
        }
        return;
    }
    pi2_par_matmul(pool, fc1, p->act1, tokens, p->hid, R);
    for (int t = 0; t < tokens; t++) {
        float *hid = p->hid + (size_t)t * R;
        for (int64_t r = 0; r < R; r++) hid[r] = hid[r] > 0.0f ? hid[r] : 0.0f;
        pi2_prepare_act(fc2->type, hid, p->act2 + (size_t)t * p->act2_row, R);
    }
    pi2_par_matmul(pool, fc2, p->act2, tokens, p->scores, p->F);
    threshold(p->scores, (size_t)tokens * p->F, p->thr_logit[block], mask);
}

void pi2_true_activations(pi2_pool *pool, const pi2_model *m, const pi2_ffn_block *blk, const uint8_t *act,
                          size_t act_row, int tokens, uint8_t *truth) {
    const int64_t F = m->h.n_ff;
    const uint32_t fn = m->h.ffn_act;
    float *g = malloc(sizeof(float) * (size_t)F * tokens), *u = malloc(sizeof(float) * (size_t)F * tokens);
    if (!g || !u) { /* cannot tell: compute every neuron (exact, only slower) */
        memset(truth, 1, (size_t)F * tokens);
        free(g);
        free(u);
        return;
    }
    pi2_par_matmul(pool, &blk->gate, act, tokens, g, F);
    if (fn == PI2_ACT_DRELU) pi2_par_matmul(pool, &blk->up, act, tokens, u, F);
    for (size_t i = 0; i < (size_t)F * tokens; i++)
        truth[i] = fn == PI2_ACT_SWIGLU ? 1 : fn == PI2_ACT_RELU ? g[i] > 0.0f : (g[i] > 0.0f && u[i] > 0.0f);
    free(g);
    free(u);
    /* The block's pages came in through the mapping: give them back so RSS does not grow. */
    madvise((void *)blk->gate.data, m->h.ffn_block_bytes, MADV_DONTNEED);
}
