/* Opening and closing a session (session.h). */
#include "session.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"

#define DEFAULT_CTX 4096

int pi2_session_load(pi2_session *s, const pi2_options *o, pi2_tokenizer_use use) {
    memset(s, 0, sizeof *s);
    s->t_load0 = pi2_now_ns();
    if (pi2_model_load_for(&s->m, o->model, o->verify_neurons, o->no_pack, &o->sparse) != 0) return -1;
    s->model_loaded = 1;
    if (use == PI2_TOKENIZER_NONE || (use == PI2_TOKENIZER_IF_ANY && !s->m.file.tokenizer_len)) return 0;
    if (!s->m.file.tokenizer_len) {
        pi2_set_error("%s: the model has no tokenizer section (use eval with token ids)", o->model);
        return -1;
    }
    if (pi2_vocab_blob_parse(s->m.file.tokenizer, s->m.file.tokenizer_len, &s->desc) != 0) {
        pi2_set_error("%s: tokenizer section: %s", o->model, pi2_last_error());
        return -1;
    }
    if (!(s->tok = pi2_tokenizer_create(&s->desc))) return -1;
    if (pi2_tokenizer_n_vocab(s->tok) > (int32_t)s->m.h.n_vocab) {
        pi2_set_error("%s: tokenizer has %d tokens, the model %u", o->model, pi2_tokenizer_n_vocab(s->tok), s->m.h.n_vocab);
        return -1;
    }
    return 0;
}

int pi2_session_max_batch(const pi2_options *o) { return o->sparse.memory_budget ? 64 : 256; }

int pi2_session_default_ctx(const pi2_model *m) {
    return m->h.n_ctx_train && m->h.n_ctx_train < DEFAULT_CTX ? (int)m->h.n_ctx_train : DEFAULT_CTX;
}

int pi2_session_start(pi2_session *s, const pi2_options *o, int n_ctx, int n_batch, pi2_sparse_shape *shape,
                      pi2_sparse_sizing *measure) {
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    if (!(s->pool = pi2_pool_from_flags(o->threads, o->affinity, &s->n_threads))) return -1;
    if (!(s->ctx = pi2_ctx_create(&s->m, s->n_ctx, s->n_batch, s->pool))) return -1;
    const uint64_t ctx_bytes = pi2_ctx_bytes(s->ctx);
    if (measure) return pi2_sparse_measure(&s->m, s->pool, s->n_batch, ctx_bytes, &o->sparse, shape, measure);
    if (o->sparse.policy != PI2_POLICY_DENSE) {
        if (!(s->sparse = pi2_sparse_open(&s->m, s->pool, s->n_batch, ctx_bytes, &o->sparse))) return -1;
        pi2_ctx_set_ffn(s->ctx, pi2_sparse_backend(s->sparse)); /* the FFN from flash, below forward.c */
    }
    if (pi2_sampler_init(&s->sampler, (int32_t)s->m.h.n_vocab, o->temperature, o->top_p, o->seed) != 0) return -1;
    if (pi2_events_open(&s->ev, o->events) != 0) return -1;
    return 0;
}

void pi2_session_close(pi2_session *s) {
    pi2_events_close(&s->ev);
    pi2_sampler_free(&s->sampler);
    if (s->ctx) pi2_ctx_set_ffn(s->ctx, NULL);
    pi2_sparse_close(s->sparse);
    pi2_ctx_free(s->ctx);
    pi2_pool_free(s->pool);
    free(s->ids);
    pi2_tokenizer_free(s->tok);
    pi2_vocab_desc_release(&s->desc);
    if (s->model_loaded) pi2_model_free(&s->m);
    memset(s, 0, sizeof *s);
}

int pi2_session_reserve(pi2_session *s, int n) {
    if (n <= s->ids_cap) return 0;
    int32_t *more = realloc(s->ids, sizeof(int32_t) * (size_t)n);
    if (!more) {
        pi2_set_error("out of memory for %d token ids", n);
        return -1;
    }
    s->ids = more;
    s->ids_cap = n;
    return 0;
}

int pi2_session_tokenize(pi2_session *s, const char *text, size_t len, int add_bos, int off) {
    int cap = (int)len + 8;
    if (pi2_session_reserve(s, off + cap)) return -1;
    /* special tokens in the text are parsed (as llama.cpp) */
    int n = pi2_tokenize(s->tok, text, len, add_bos, 1, s->ids + off, cap);
    if (n < 0) {
        if (n == -1 || pi2_session_reserve(s, off - n)) return -1;
        n = pi2_tokenize(s->tok, text, len, add_bos, 1, s->ids + off, -n);
        if (n < -1) pi2_set_error("the tokenizer asked for room twice");
    }
    return n < 0 ? -1 : n;
}
