#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "kernels.h"

#define FAIL(...)                                           \
    do {                                                    \
        char msg_[400];                                     \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);           \
        pi2_set_error("%s: %s", m->file.path, msg_);        \
        return -1;                                          \
    } while (0)

/* A dense 2-D weight [cols, rows] (ggml order) of any weight type; checks the shape. */
static int bind_mat(pi2_model *m, pi2_mat *out, const char *name, int64_t cols, int64_t rows) {
    const pi2_tensor *t = pi2_file_find(&m->file, name);
    if (!t) FAIL("tensor '%s' is missing", name);
    if (t->region != PI2_SEC_RESIDENT || !pi2_type_valid_weight(t->type))
        FAIL("tensor '%s' must be a resident weight (F32/F16/Q4_0/Q4_1/Q8_0)", name);
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1 ||
        !pi2_tensor_holds(t, (uint64_t)rows * pi2_row_size((pi2_type)t->type, cols)))
        FAIL("tensor '%s' is [%lld, %lld], expected [%lld, %lld]", name, (long long)t->ne[0], (long long)t->ne[1],
             (long long)cols, (long long)rows);
    out->data = t->data;
    out->type = (pi2_type)t->type;
    out->rows = rows;
    out->cols = cols;
    out->row_bytes = out->stride = pi2_row_size(out->type, cols);
    return 0;
}

static int bind_vec_f32(pi2_model *m, const float **out, const char *name, int64_t n) {
    const pi2_tensor *t = pi2_file_find(&m->file, name);
    if (!t) FAIL("tensor '%s' is missing", name);
    /* each dimension on its own: their product can overflow (UBSan caught ne[1] * ne[2] * ne[3]) */
    if (t->type != PI2_F32 || t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1 ||
        t->region != PI2_SEC_RESIDENT || !pi2_tensor_holds(t, (uint64_t)n * 4))
        FAIL("tensor '%s' must be F32 [%lld]", name, (long long)n);
    *out = (const float *)t->data;
    return 0;
}

static int bind_ffn(pi2_model *m, pi2_ffn_block *b, int layer, int expert) {
    const pi2_header *h = &m->h;
    char suffix[16] = "", name[96];
    if (h->arch == PI2_ARCH_MOE) snprintf(suffix, sizeof suffix, ".%d", expert);

    snprintf(name, sizeof name, "blk.%d.ffn_bundles%s", layer, suffix);
    const pi2_tensor *t = pi2_file_find(&m->file, name);
    if (!t) FAIL("tensor '%s' is missing", name);
    uint64_t want_off = ((uint64_t)layer * m->n_ffn_blocks + expert) * h->ffn_block_bytes;
    if (t->region != PI2_SEC_NEURONS || t->ne[1] != h->n_ff || t->offset != want_off ||
        !pi2_tensor_holds(t, (uint64_t)h->n_ff * h->bundle_stride))
        FAIL("bundles '%s' must be [n_embd, n_ff] at neuron-region offset %llu", name, (unsigned long long)want_off);
    pi2_mat rows = {.data = t->data, .type = (pi2_type)h->neuron_type, .rows = h->n_ff, .cols = h->n_embd,
                    .row_bytes = h->part_bytes, .stride = h->bundle_stride};
    b->gate = rows;
    b->up = rows;
    b->up.data += h->part_bytes;
    b->down_cols = rows;
    b->down_cols.data += 2 * h->part_bytes;

    snprintf(name, sizeof name, "blk.%d.ffn_order%s", layer, suffix);
    t = pi2_file_find(&m->file, name);
    if (!t) FAIL("tensor '%s' is missing", name);
    if (t->type != PI2_TYPE_I32 || t->ne[0] != h->n_ff || t->n_dims != 1 || !pi2_tensor_holds(t, (uint64_t)h->n_ff * 4))
        FAIL("'%s' must be I32 [n_ff]", name);
    b->order = (const int32_t *)t->data;
    /* A permutation, or the scatter in the dense path would write out of bounds. */
    uint8_t *seen = calloc(h->n_ff, 1);
    if (!seen) FAIL("out of memory");
    for (uint32_t k = 0; k < h->n_ff; k++) {
        int32_t o = b->order[k];
        if (o < 0 || (uint32_t)o >= h->n_ff || seen[o]) {
            free(seen);
            FAIL("'%s' is not a permutation of 0..n_ff-1", name);
        }
        seen[o] = 1;
    }
    free(seen);

    memset(&b->down, 0, sizeof b->down);
    if (h->flags & PI2_FLAG_DENSE_DOWN) {
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight%s", layer, suffix);
        if (bind_mat(m, &b->down, name, h->n_ff, h->n_embd) != 0) return -1;
    }
    return 0;
}

/* The norms and the MoE router, read at every token, into one anonymous buffer. Left in the mapping they
 * are file pages that the kernel may drop under memory pressure: in a memory cgroup that the neuron cache
 * fills to its limit it did, and each token then waited on major faults in pi2_rmsnorm (7B shape at
 * 2.68 GiB: 31-230 major faults in 32 tokens, tokens with 240-310 ms outside the FFN against ~35). A few MiB
 * of anonymous memory cannot be dropped (no swap), and the fixed region counts them. */
static int own_small(pi2_model *m) {
    const pi2_header *h = &m->h;
    const size_t vec = (size_t)h->n_embd * sizeof(float);
    size_t bytes = (2 * (size_t)h->n_layer + 1) * vec;
    for (uint32_t l = 0; l < h->n_layer; l++) bytes += (size_t)m->layers[l].router.rows * m->layers[l].router.stride;
    uint8_t *at = m->small = malloc(bytes);
    if (!at) return -1;
#define OWN_VEC(p) (memcpy(at, (p), vec), (p) = (const float *)at, at += vec)
    OWN_VEC(m->output_norm);
    for (uint32_t l = 0; l < h->n_layer; l++) {
        pi2_layer *L = &m->layers[l];
        OWN_VEC(L->attn_norm);
        OWN_VEC(L->ffn_norm);
        const size_t rb = (size_t)L->router.rows * L->router.stride;
        if (rb) memcpy(at, L->router.data, rb), L->router.data = at, at += rb;
    }
#undef OWN_VEC
    return 0;
}

int pi2_model_load(pi2_model *m, const char *path, int verify_neurons) {
    memset(m, 0, sizeof *m);
    if (pi2_file_open(&m->file, path, verify_neurons) != 0) return -1;
    m->h = m->file.h;
    const pi2_header *h = &m->h;
    m->n_ffn_blocks = h->arch == PI2_ARCH_MOE ? (int)h->n_expert : 1;
    int64_t q_dim = (int64_t)h->n_head * h->head_dim, kv_dim = (int64_t)h->n_head_kv * h->head_dim;
    char name[96];
    if (bind_mat(m, &m->tok_embd, "token_embd.weight", h->n_embd, h->n_vocab) != 0) goto fail;
    if (bind_vec_f32(m, &m->output_norm, "output_norm.weight", h->n_embd) != 0) goto fail;
    if (h->flags & PI2_FLAG_TIED) {
        if (pi2_file_find(&m->file, "output.weight")) {
            pi2_set_error("%s: tied embeddings but an output.weight is present", path);
            goto fail;
        }
        m->output = m->tok_embd;
    } else if (bind_mat(m, &m->output, "output.weight", h->n_embd, h->n_vocab) != 0) {
        goto fail;
    }
    m->layers = calloc(h->n_layer, sizeof *m->layers);
    if (!m->layers) goto oom;
    for (uint32_t l = 0; l < h->n_layer; l++) {
        pi2_layer *L = &m->layers[l];
#define NAME(fmt) (snprintf(name, sizeof name, fmt, l), name)
        if (bind_vec_f32(m, &L->attn_norm, NAME("blk.%u.attn_norm.weight"), h->n_embd) != 0) goto fail;
        if (bind_vec_f32(m, &L->ffn_norm, NAME("blk.%u.ffn_norm.weight"), h->n_embd) != 0) goto fail;
        if (bind_mat(m, &L->wq, NAME("blk.%u.attn_q.weight"), h->n_embd, q_dim) != 0) goto fail;
        if (bind_mat(m, &L->wk, NAME("blk.%u.attn_k.weight"), h->n_embd, kv_dim) != 0) goto fail;
        if (bind_mat(m, &L->wv, NAME("blk.%u.attn_v.weight"), h->n_embd, kv_dim) != 0) goto fail;
        if (bind_mat(m, &L->wo, NAME("blk.%u.attn_output.weight"), q_dim, h->n_embd) != 0) goto fail;
        if (h->arch == PI2_ARCH_MOE &&
            bind_mat(m, &L->router, NAME("blk.%u.ffn_gate_inp.weight"), h->n_embd, h->n_expert) != 0)
            goto fail;
#undef NAME
        L->ffn = calloc((size_t)m->n_ffn_blocks, sizeof *L->ffn);
        if (!L->ffn) goto oom;
        for (int e = 0; e < m->n_ffn_blocks; e++)
            if (bind_ffn(m, &L->ffn[e], (int)l, e) != 0) goto fail;
    }
    if (own_small(m) != 0) goto oom;
    return 0;
oom:
    pi2_set_error("%s: out of memory", path);
fail:
    pi2_model_free(m);
    return -1;
}

/* Read a block of bundles with pread (not through the mapping, whose pages would count in RSS). */
static const uint8_t *read_block(pi2_model *m, const pi2_ffn_block *b, uint8_t *buf, size_t bytes, int fd) {
    if (fd < 0) return b->gate.data;
    const size_t off = (size_t)(b->gate.data - m->file.map);
    size_t done = 0;
    while (done < bytes) {
        ssize_t got = pread(fd, buf + done, bytes - done, (off_t)(off + done));
        if (got <= 0) return b->gate.data; /* fall back to the mapping */
        done += (size_t)got;
    }
    return buf;
}

int pi2_model_pack_ffn(pi2_model *m) {
    if (m->packed) return 0;
    const size_t part = m->h.part_bytes, n_ff = m->h.n_ff, stride = m->h.bundle_stride;
    const size_t block_bytes = n_ff * stride;
    uint8_t *tmp = malloc(block_bytes);
    int fd = tmp ? open(m->file.path, O_RDONLY | O_CLOEXEC) : -1;
    m->packed = 1; /* free() tells packed rows by their stride, so a partial pack frees cleanly */
    for (uint32_t l = 0; l < m->h.n_layer; l++)
        for (int e = 0; e < m->n_ffn_blocks; e++) {
            pi2_ffn_block *b = &m->layers[l].ffn[e];
            const uint8_t *src = read_block(m, b, tmp, block_bytes, fd);
            pi2_mat *mats[2] = {&b->gate, &b->up};
            for (int k = 0; k < 2; k++) {
                uint8_t *buf = pi2_huge_alloc(n_ff * part);
                if (!buf) {
                    free(tmp);
                    if (fd >= 0) close(fd);
                    pi2_set_error("%s: out of memory packing the FFN rows (run with --no-pack-ffn)", m->file.path);
                    return -1;
                }
                for (size_t r = 0; r < n_ff; r++) memcpy(buf + r * part, src + r * stride + (size_t)k * part, part);
                mats[k]->data = buf;
                mats[k]->stride = part;
            }
        }
    free(tmp);
    if (fd >= 0) close(fd);
    if (m->h.flags & PI2_FLAG_DENSE_DOWN) {
        /* Nothing reads the bundles any more: give back any of their pages (the mapping stays valid). */
        const pi2_section *sec = &m->h.sections[PI2_SEC_NEURONS];
        madvise((void *)(m->file.map + sec->offset), sec->size, MADV_DONTNEED);
    }
    return 0;
}

static int repack_mat(pi2_model *m, pi2_mat *w) {
    if (w->x4 || w->rows % 4 || w->stride != w->row_bytes || !pi2_x4_supported(w->type)) return 0;
    const size_t bytes = (size_t)w->rows * w->row_bytes;
    void *buf = pi2_huge_alloc(bytes);
    if (!buf) {
        pi2_set_error("%s: out of memory repacking the attention weights (run with --no-repack)", m->file.path);
        return -1;
    }
    pi2_x4_pack(w->type, w->data, w->rows, w->cols, buf);
    /* the rows are read from here on: give the mapping's pages back (it stays valid) */
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)w->data + page - 1) / page * page,
                    e = ((uintptr_t)w->data + bytes) / page * page;
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
    w->data = buf;
    w->x4 = 1;
    return 0;
}

int pi2_model_repack(pi2_model *m) {
    if (!(m->h.flags & PI2_FLAG_TIED) && repack_mat(m, &m->output) != 0) return -1;
    for (uint32_t l = 0; l < m->h.n_layer; l++) {
        pi2_layer *L = &m->layers[l];
        pi2_mat *mats[4] = {&L->wq, &L->wk, &L->wv, &L->wo};
        for (int k = 0; k < 4; k++)
            if (repack_mat(m, mats[k]) != 0) return -1;
    }
    return 0;
}

void pi2_model_free(pi2_model *m) {
    if (m->layers)
        for (uint32_t l = 0; l < m->h.n_layer; l++) {
            if (m->packed && m->layers[l].ffn)
                for (int e = 0; e < m->n_ffn_blocks; e++) {
                    pi2_ffn_block *b = &m->layers[l].ffn[e];
                    if (b->gate.stride == b->gate.row_bytes) free((void *)b->gate.data);
                    if (b->up.stride == b->up.row_bytes) free((void *)b->up.data);
                }
            pi2_layer *L = &m->layers[l];
            const pi2_mat *mats[4] = {&L->wq, &L->wk, &L->wv, &L->wo};
            for (int k = 0; k < 4; k++)
                if (mats[k]->x4) free((void *)mats[k]->data);
            free(L->ffn);
        }
    if (m->output.x4) free((void *)m->output.data);
    free(m->small);
    free(m->layers);
    m->layers = NULL;
    pi2_file_close(&m->file);
}
