/* Fuzz target "pi2file": a whole .pi2 model through everything that reads it (docs/FORMAT.md).
 *
 * run: the bytes become a file (a memfd, no disk), then pi2_model_load_for as a sparse run loads it,
 * the predictors are bound (as `info` and sparse runs do), the vocabulary is parsed and a text
 * tokenized and turned back into pieces, and when all that is accepted, a dense forward pass and a
 * powerinfer2 one (its neuron store reading the same file) run a few tokens.
 *
 * mutate: edits that know the layout: header fields, section offsets/sizes, table entries' types,
 * shapes (including shapes whose byte counts wrap 64 bits, with nbytes set to the wrapped value),
 * offsets, names (a repeated name, missing NUL, control characters), the vocabulary blob's header,
 * special floats in weights, geometry changes with the derived fields recomputed, truncation, byte
 * flips. finish repairs file_bytes and every checksum most of the time, so inputs get past the CRCs
 * to the checks behind them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "crc32.h"
#include "forward.h"
#include "fuzz.h"
#include "model.h"
#include "session.h"
#include "sparse.h"
#include "sparse_predict.h"
#include "threadpool.h"
#include "tokenizer.h"
#include "vocab_blob.h"

#define HDR 4096
#define SECTIONS_AT 128
#define N_SEC 5
#define ENTRY 128

static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* ---- run ---- */

static int memfd = -1;
static char memfd_path[64];
static pi2_pool *pool;

static int refused(void) {
    fuzz_check_error_line("pi2file");
    return 0;
}

static void tokenize_some(const pi2_model *m) {
    if (!m->file.tokenizer_len) return;
    pi2_vocab_desc desc;
    memset(&desc, 0, sizeof desc);
    if (pi2_vocab_blob_parse(m->file.tokenizer, m->file.tokenizer_len, &desc) != 0) {
        refused();
        return;
    }
    pi2_tokenizer *tok = pi2_tokenizer_create(&desc);
    if (!tok) refused();
    else {
        static const char text[] = "Hello world <s></s> \xc3\xa9\xe4\xb8\x96 \xff\xfe tab\there  a\n";
        int32_t ids[256];
        int n = pi2_tokenize(tok, text, sizeof text - 1, desc.add_bos, 1, ids, 256);
        char piece[256];
        for (int i = 0; i < n; i++) pi2_token_to_piece(tok, ids[i], piece, sizeof piece);
        const int32_t V = pi2_tokenizer_n_vocab(tok);
        for (int32_t id = -1; id < V + 1 && id < 300; id++) pi2_token_to_piece(tok, id, piece, sizeof piece);
        pi2_token_is_eog(tok, pi2_tokenizer_eos(tok));
        pi2_tokenizer_free(tok);
    }
    pi2_vocab_desc_release(&desc);
}

/* A few tokens through forward.c, densely or with the sparse engine attached. */
static int forward_some(const pi2_model *m, const pi2_sparse_config *cfg) {
    pi2_ctx *c = pi2_ctx_create(m, 8, 4, cfg == NULL, pool);
    if (!c) return refused();
    pi2_sparse *s = NULL;
    int ok = 0;
    if (cfg && !(s = pi2_sparse_open(m, pool, 4, pi2_ctx_bytes(c), cfg))) goto done;
    if (s) pi2_ctx_set_ffn(c, pi2_sparse_backend(s));
    const int32_t V = (int32_t)m->h.n_vocab, ids[4] = {1 % V, 2 % V, 3 % V, (V - 1)};
    if (pi2_forward(c, ids, 3, NULL) != 0 || pi2_forward(c, ids + 3, 1, NULL) != 0) goto done;
    ok = 1;
done:
    if (!ok) refused();
    pi2_ctx_free(c);
    pi2_sparse_close(s);
    return ok;
}

static int run(const uint8_t *data, size_t len) {
    if (memfd < 0) {
        if ((memfd = memfd_create("pi2-fuzz", MFD_CLOEXEC)) < 0) abort();
        snprintf(memfd_path, sizeof memfd_path, "/proc/self/fd/%d", memfd);
        if (!(pool = pi2_pool_create(2, NULL))) abort();
    }
    if (ftruncate(memfd, 0) || ftruncate(memfd, (off_t)len) || pwrite(memfd, data, len, 0) != (ssize_t)len) abort();
    pi2_sparse_config cfg;
    pi2_sparse_config_default(&cfg);
    cfg.policy = PI2_POLICY_POWERINFER2;
    pi2_model m;
    if (pi2_model_load_for(&m, memfd_path, 1, 0, &cfg) != 0) return refused();
    int ok = 1;
    if (m.h.flags & PI2_FLAG_PREDICTOR) {
        pi2_predictors p;
        if (pi2_predictors_bind(&p, &m, 2, 0) != 0) ok = refused();
        pi2_predictors_free(&p);
    }
    tokenize_some(&m);
    if (ok) {
        cfg.oracle = !(m.h.flags & PI2_FLAG_PREDICTOR);
        ok = forward_some(&m, NULL) && forward_some(&m, &cfg);
    }
    pi2_model_free(&m);
    return ok;
}

/* ---- mutate ---- */

/* Header fields: offsets of the u32 fields after the magic, then the u64 ones. */
static const int hdr32[] = {8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72, 76, 80, 84, 112};
static const int hdr64[] = {88, 96, 104, 120};

static uint64_t sec_off(const uint8_t *b, int s) { return rd64(b + SECTIONS_AT + 24 * s); }
static uint64_t sec_size(const uint8_t *b, int s) { return rd64(b + SECTIONS_AT + 24 * s + 8); }

/* The table entry i (NULL when the table is not inside the buffer). */
static uint8_t *entry(uint8_t *b, size_t len, uint64_t i) {
    const uint64_t off = sec_off(b, 2), size = sec_size(b, 2);
    if (off > len || size > len - off || size < ENTRY) return NULL;
    return b + off + ENTRY * (i % (size / ENTRY));
}

static uint64_t type_bytes(uint32_t type, uint64_t n) { /* row bytes as the writer computes them */
    switch (type) {
    case 0: case 26: return n * 4;
    case 1: return n * 2;
    case 2: return n / 32 * 18;
    case 3: return n / 32 * 20;
    case 8: return n / 32 * 34;
    default: return n;
    }
}

/* After a change to n_embd, n_ff, n_layer, neuron_type or bundle_align: recompute part, stride,
 * block and the neuron region's size as the engine does, so the change reaches the table checks. */
static void fix_geometry(uint8_t *b) {
    const uint64_t part = type_bytes(rd32(b + 80), rd32(b + 28)), a = rd32(b + 84) ? rd32(b + 84) : 512;
    const uint64_t stride = (3 * part + a - 1) / a * a, block = (rd32(b + 48) * stride + 4095) / 4096 * 4096;
    wr64(b + 88, part), wr64(b + 96, stride), wr64(b + 104, block);
    const uint64_t blocks = rd32(b + 16) == 2 ? rd32(b + 52) : 1; /* moe: n_expert blocks a layer */
    wr64(b + SECTIONS_AT + 8, rd32(b + 32) * blocks * block);
}

static size_t mutate(fuzz_rng *r, uint8_t *b, size_t len, size_t cap) {
    if (len < HDR) return fuzz_below(r, 2) ? fuzz_insert_bytes(r, b, len, cap) : (fuzz_flip_bytes(r, b, len), len);
    uint8_t *e = entry(b, len, fuzz_next(r));
    switch (fuzz_below(r, 14)) {
    case 0: { /* a header u32 */
        uint8_t *p = b + hdr32[fuzz_below(r, sizeof hdr32 / sizeof hdr32[0])];
        wr32(p, (uint32_t)fuzz_interesting(r, rd32(p)));
        break;
    }
    case 1: { /* a header u64 */
        uint8_t *p = b + hdr64[fuzz_below(r, sizeof hdr64 / sizeof hdr64[0])];
        wr64(p, fuzz_interesting(r, rd64(p)));
        break;
    }
    case 2: { /* a section's offset or size; or two sections swapped */
        const int s = (int)fuzz_below(r, N_SEC), t = (int)fuzz_below(r, N_SEC);
        uint8_t *p = b + SECTIONS_AT + 24 * s + 8 * fuzz_below(r, 2);
        if (fuzz_below(r, 4)) wr64(p, fuzz_interesting(r, rd64(p)));
        else {
            uint8_t tmp[24];
            memcpy(tmp, b + SECTIONS_AT + 24 * s, 24);
            memcpy(b + SECTIONS_AT + 24 * s, b + SECTIONS_AT + 24 * t, 24);
            memcpy(b + SECTIONS_AT + 24 * t, tmp, 24);
        }
        break;
    }
    case 3: case 4: { /* one field of a table entry */
        if (!e) break;
        static const int at[] = {64, 68, 72, 80, 88, 96, 104, 108, 112, 120};
        const int f = at[fuzz_below(r, sizeof at / sizeof at[0])];
        if (f == 64 || f == 68 || f == 104 || f == 108) wr32(e + f, (uint32_t)fuzz_interesting(r, rd32(e + f)));
        else wr64(e + f, fuzz_interesting(r, rd64(e + f)));
        break;
    }
    case 5: { /* a new shape whose nbytes agrees with it in wrapping 64-bit arithmetic */
        if (!e) break;
        uint32_t nd = 1 + (uint32_t)fuzz_below(r, 4);
        wr32(e + 68, nd);
        uint64_t rows = 1;
        for (uint32_t d = 0; d < 4; d++) {
            uint64_t ne = d >= nd ? 1 : fuzz_below(r, 3) ? rd64(e + 72 + 8 * d) : fuzz_interesting(r, rd64(e + 72 + 8 * d));
            if (fuzz_below(r, 4) == 0 && d < nd) ne = 1ull << 32;
            wr64(e + 72 + 8 * d, ne);
            if (d) rows *= ne;
        }
        wr64(e + 120, type_bytes(rd32(e + 64), rd64(e + 72)) * rows);
        if (fuzz_below(r, 2)) wr64(e + 112, sec_size(b, (int)(rd32(e + 104) % N_SEC)) / 4096 * 4096);
        break;
    }
    case 6: { /* names: a duplicate, no NUL, empty, a control character */
        if (!e) break;
        uint8_t *o = entry(b, len, fuzz_next(r));
        switch (fuzz_below(r, 4)) {
        case 0: memcpy(e, o, 64); break;
        case 1: memset(e, 'A' + (int)fuzz_below(r, 26), 64); break;
        case 2: e[0] = 0; break;
        default: e[fuzz_below(r, 8)] = (uint8_t)fuzz_below(r, 32);
        }
        break;
    }
    case 7: { /* an entry copied over another */
        uint8_t *o = entry(b, len, fuzz_next(r));
        if (e && o && e != o) memcpy(e, o, ENTRY);
        break;
    }
    case 8: /* truncated (at a page boundary or anywhere) */
        len = fuzz_below(r, 2) ? fuzz_below(r, len) / 4096 * 4096 : fuzz_below(r, len);
        break;
    case 9: { /* the vocabulary blob's header fields, or bytes inside it */
        const uint64_t off = sec_off(b, 3), size = sec_size(b, 3);
        if (off > len || size > len - off || size < 64) break;
        if (fuzz_below(r, 2)) {
            uint8_t *p = b + off + 8 + 4 * fuzz_below(r, 14);
            wr32(p, (uint32_t)fuzz_interesting(r, rd32(p)));
        } else fuzz_flip_bytes(r, b + off, size);
        break;
    }
    case 10: { /* special values inside the resident region (norms, thresholds, the neuron order) */
        const uint64_t off = sec_off(b, 1), size = sec_size(b, 1);
        if (off > len || size > len - off || size < 4) break;
        static const uint32_t special[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0x00000001u,
                                           0x80000000u, 0xffffffffu, 0x3f800000u};
        const uint64_t at = off + fuzz_below(r, size / 4) * 4;
        wr32(b + at, fuzz_below(r, 2) ? special[fuzz_below(r, 8)] : (uint32_t)fuzz_interesting(r, rd32(b + at)));
        break;
    }
    case 11: { /* dimensions changed consistently (header geometry recomputed) */
        static const int dims[] = {16, 20, 24, 28, 32, 36, 48, 80, 84};
        uint8_t *p = b + dims[fuzz_below(r, sizeof dims / sizeof dims[0])];
        wr32(p, (uint32_t)fuzz_interesting(r, rd32(p)));
        fix_geometry(b);
        break;
    }
    case 12: /* metadata or anything else: raw bytes */
        fuzz_flip_bytes(r, b + (fuzz_below(r, 2) ? 0 : HDR), fuzz_below(r, 2) ? HDR : len - HDR);
        break;
    default: /* a page of zeros appended */
        if (len + 4096 <= cap) memset(b + len, 0, 4096), len += 4096;
    }
    return len;
}

/* Most of the time: file_bytes = the length and every checksum right, so only the edits are wrong. */
static size_t finish(fuzz_rng *r, uint8_t *b, size_t len, size_t cap) {
    if (len < HDR || fuzz_below(r, 16) == 0) return len;
    if (fuzz_below(r, 8)) wr64(b + 120, len);
    for (int s = 0; s < N_SEC; s++) {
        const uint64_t off = sec_off(b, s), size = sec_size(b, s);
        if (off <= len && size <= len - off) wr32(b + SECTIONS_AT + 24 * s + 16, pi2_crc32(0, b + off, size));
    }
    wr32(b + HDR - 4, pi2_crc32(0, b, HDR - 4));
    return len;
}

const fuzz_target fuzz_target_pi2file = {"pi2file", ".pi2 model files: load, predictors, vocabulary, dense and sparse forward",
                                         run, mutate, finish};
