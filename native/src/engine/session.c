/* Opening and closing a session (session.h). */
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "event_schema.h"

int pi2_model_load_for(pi2_model *m, const char *path, int verify_neurons, int no_pack, const pi2_sparse_config *cfg) {
    const int sparse = cfg->policy != PI2_POLICY_DENSE;
    if (pi2_model_load(m, path, verify_neurons && !sparse) != 0) return -1;
    /* Packing copies gate/up into anonymous memory: fast in memory, but under a budget the dense
     * policy must page from the file like llama.cpp with mmap, and sparse policies read bundles. */
    if (!sparse && !no_pack && !cfg->memory_budget && pi2_model_pack_ffn(m) != 0) {
        pi2_model_free(m);
        return -1;
    }
    if ((sparse || !cfg->memory_budget) && !cfg->no_repack && pi2_model_repack(m) != 0) {
        pi2_model_free(m);
        return -1;
    }
    return 0;
}

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
    /* the same check `info` makes (vocab_blob.h) */
    s->tok = pi2_tokenizer_from_section(o->model, s->m.file.tokenizer, s->m.file.tokenizer_len, s->m.h.n_vocab, &s->desc);
    return s->tok ? 0 : -1;
}

int pi2_session_max_batch(const pi2_options *o) { return o->sparse.memory_budget ? 64 : 256; }

int pi2_session_default_ctx(const pi2_model *m) {
    return m->h.n_ctx_train && m->h.n_ctx_train < PI2_DEFAULT_CTX ? (int)m->h.n_ctx_train : PI2_DEFAULT_CTX;
}

int pi2_session_start(pi2_session *s, const pi2_options *o, int n_ctx, int n_batch, pi2_sparse_shape *shape,
                      pi2_sparse_sizing *measure) {
    s->n_ctx = n_ctx;
    s->n_batch = n_batch;
    if (!(s->pool = pi2_pool_from_flags(o->threads, o->affinity, &s->n_threads))) return -1;
    const int dense = o->sparse.policy == PI2_POLICY_DENSE;
    if (!(s->ctx = pi2_ctx_create(&s->m, s->n_ctx, s->n_batch, dense, s->pool))) return -1;
    const uint64_t ctx_bytes = pi2_ctx_bytes(s->ctx);
    if (measure) return pi2_sparse_measure(&s->m, s->pool, s->n_batch, ctx_bytes, &o->sparse, shape, measure);
    if (!dense) {
        if (!(s->sparse = pi2_sparse_open(&s->m, s->pool, s->n_batch, ctx_bytes, &o->sparse))) return -1;
        pi2_ctx_set_ffn(s->ctx, pi2_sparse_backend(s->sparse)); /* the FFN from flash, below forward.c */
    }
    if (pi2_sampler_init(&s->sampler, (int32_t)s->m.h.n_vocab, o->temperature, o->top_p, o->seed) != 0) return -1;
    s->sampler.pool = s->pool; /* the draw's passes over the vocabulary, between tokens */
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

int pi2_session_turn(pi2_session *s, int n_new, int n_predict, int ignore_eos, int turn_index, uint64_t t0,
                     void (*emit)(const char *piece, int n), pi2_turn_record *r) {
    memset(r, 0, sizeof *r);
    r->stop = "length";
    r->turn = turn_index;
    r->t0 = pi2_seconds(t0);
    r->n_prompt = n_new;
    r->n_cached = pi2_ctx_n_past(s->ctx);
    const uint64_t cpu0 = pi2_cpu_ns();
    s->has_pending = 0;
    s->stop_turn = 0;
    pi2_sparse_stats st_prev = {0}, st_cur = {0};
    char tok_json[400], piece[256];
    pi2_sparse_snapshot(s->sparse, &st_prev);
    pi2_prof_snap pa, pb;
    pi2_prof_take(&pa, s->ctx, s->sparse, s->pool);
    for (int t = 0; t < n_new; t += s->n_batch) {
        int nb = n_new - t < s->n_batch ? n_new - t : s->n_batch;
        if (pi2_forward(s->ctx, s->ids + t, nb, NULL) != 0) return -1;
    }
    if (n_new > 0) {
        pi2_prof_take(&pb, s->ctx, s->sparse, s->pool);
        pi2_prof_add(&s->prefill_prof, &pa, &pb, (uint64_t)n_new);
    }
    pi2_sparse_snapshot(s->sparse, &st_cur);
    uint64_t t_prefill = pi2_now_ns(), t_first = 0, t_last = 0;
    int n_gen = 0, n_dec = 0;
    while (n_gen < n_predict) {
        int32_t next = pi2_sample(&s->sampler, pi2_ctx_logits(s->ctx));
        uint64_t now = pi2_now_ns();
        if (!n_gen) t_first = now;
        t_last = now;
        if (s->on_sample) s->on_sample(now, next);
        /* with the sparse engine: what the forward pass that produced this token's logits cost */
        pi2_sparse_token_json(s->sparse, &st_prev, &st_cur, tok_json, sizeof tok_json);
        /* events that cannot be written end the run now, not after hours of tokens nobody recorded */
        /* CPU time (all threads): a system call that sums them, ~15 us here: only when it is recorded */
        const pi2_token_record tr = {.t = pi2_seconds(now), .cpu_s = s->ev.f ? pi2_cpu_ns() / 1e9 : 0, .turn = turn_index,
                                     .i = n_gen, .id = next};
        if (pi2_event_token(&s->ev, PI2_CMD_GENERATE | PI2_CMD_CHAT, &tr, tok_json) != 0) return -1;
        n_gen++;
        if (!ignore_eos && pi2_token_is_eog(s->tok, next)) {
            /* Not kept in the cache: the host's chat template writes the end-of-turn text itself. */
            r->stop = "eog";
            break;
        }
        int np = pi2_token_to_piece(s->tok, next, piece, sizeof piece);
        emit(piece, np > 0 ? np : 0); /* a token without text too: a server streams its time */
        if (s->stop_turn) {
            r->stop = "stop";
            break;
        }
        if (n_gen < n_predict) {
            st_prev = st_cur;
            if (!n_dec) pi2_prof_take(&pa, s->ctx, s->sparse, s->pool);
            if (pi2_forward(s->ctx, &next, 1, NULL) != 0) return -1;
            n_dec++;
            pi2_sparse_snapshot(s->sparse, &st_cur);
        } else {
            /* The answer's last token joins the cache with the next turn's prefill. */
            s->has_pending = 1;
            s->pending = next;
        }
    }
    if (n_dec) {
        pi2_prof_take(&pb, s->ctx, s->sparse, s->pool);
        pi2_prof_add(&s->prof, &pa, &pb, (uint64_t)n_dec);
    }
    r->n_gen = n_gen;
    r->prefill_s = pi2_seconds(t_prefill - t0);
    r->ttft_s = t_first ? pi2_seconds(t_first - t0) : 0;
    r->decode_s = t_first ? pi2_seconds(t_last - t_first) : 0;
    r->decode_tps = n_gen > 1 && r->decode_s > 0 ? (n_gen - 1) / r->decode_s : 0;
    r->prefill_tps = r->prefill_s > 0 ? n_new / r->prefill_s : 0;
    r->cpu_s = pi2_seconds(pi2_cpu_ns() - cpu0);
    r->n_past = pi2_ctx_n_past(s->ctx) + s->has_pending;
    r->peak_rss_bytes = pi2_peak_rss_bytes();
    return 0;
}
