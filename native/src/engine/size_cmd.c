/* `pi2-engine size`: the sparse engine's own sizing of a model under a budget (size_cmd.h). */
#include "size_cmd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "events.h"
#include "forward.h"
#include "json_flat.h"
#include "kernels.h"
#include "model.h"
#include "sparse_predict.h"
#include "sparse_size.h"
#include "session.h"
#include "threadpool.h"


/* ---- the facts of a model known only by its shape ---------------------------------------------- */

typedef struct {
    pi2_header h;
    uint64_t resident_bytes, tokenizer_bytes;
    uint32_t read_align; /* the device's direct-read unit (the engine rounds reads and cold slots to it) */
    int has_predictor;
    const char *path;
} facts;

static int fact(void *user, const char *key, pi2_json_kind kind, const char *value, size_t len) {
    (void)len;
    facts *f = user;
    pi2_header *h = &f->h;
    static const char *const u32_keys[] = {"n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv", "head_dim",
                                           "n_ff", "n_expert", "n_expert_used", "n_ctx_train", "bundle_align",
                                           "read_align"};
    uint32_t *const u32_fields[] = {&h->n_vocab, &h->n_embd, &h->n_layer, &h->n_head, &h->n_head_kv, &h->head_dim,
                                    &h->n_ff, &h->n_expert, &h->n_expert_used, &h->n_ctx_train, &h->bundle_align,
                                    &f->read_align};
    for (size_t i = 0; i < sizeof u32_keys / sizeof u32_keys[0]; i++)
        if (!strcmp(key, u32_keys[i])) {
            char *end;
            const double v = strtod(value, &end);
            if (kind != PI2_JSON_NUMBER || v < 0 || v > 4294967295.0 || v != (uint32_t)v) {
                pi2_set_error("facts %s: \"%s\" must be a non-negative integer", f->path, key);
                return -1;
            }
            *u32_fields[i] = (uint32_t)v;
            return 0;
        }
    uint64_t *const u64_fields[] = {&h->file_bytes, &f->resident_bytes, &h->bundle_stride, &f->tokenizer_bytes};
    static const char *const u64_keys[] = {"file_bytes", "resident_bytes", "bundle_stride", "tokenizer_bytes"};
    for (size_t i = 0; i < sizeof u64_keys / sizeof u64_keys[0]; i++)
        if (!strcmp(key, u64_keys[i])) {
            char *end;
            const double v = strtod(value, &end);
            if (kind != PI2_JSON_NUMBER || v < 0 || v > 1e18) {
                pi2_set_error("facts %s: \"%s\" must be a non-negative integer", f->path, key);
                return -1;
            }
            *u64_fields[i] = (uint64_t)v;
            return 0;
        }
    if (!strcmp(key, "neuron_type")) {
        for (int t = 0; t < 16; t++)
            if (pi2_type_valid_weight(t) && !strcmp(value, pi2_type_name((pi2_type)t))) {
                h->neuron_type = (uint32_t)t;
                return 0;
            }
        pi2_set_error("facts %s: unknown neuron_type '%.20s'", f->path, value);
        return -1;
    }
    if (!strcmp(key, "dense_down") && kind == PI2_JSON_TRUE) h->flags |= PI2_FLAG_DENSE_DOWN;
    if (!strcmp(key, "has_predictor") && kind == PI2_JSON_TRUE) f->has_predictor = 1;
    return 0; /* other facts (path, arch, metadata...) do not change the sizing */
}

static int read_facts(const char *path, facts *f) {
    memset(f, 0, sizeof *f);
    f->path = path;
    f->h.neuron_type = PI2_Q4_0;
    FILE *in = fopen(path, "rb");
    if (!in) {
        pi2_set_error("cannot read facts %s", path);
        return -1;
    }
    char *text = malloc(1 << 20);
    const size_t n = text ? fread(text, 1, 1 << 20, in) : 0;
    fclose(in);
    int rc = text ? pi2_json_flat_parse_skipping(path, text, n, fact, f) : -1;
    free(text);
    if (rc) return -1;
    pi2_header *h = &f->h;
    if (!h->n_embd || !h->n_layer || !h->n_ff || !h->n_head || !h->head_dim || !h->n_vocab || h->n_embd % 32) {
        pi2_set_error("facts %s: need n_embd (a multiple of 32), n_layer, n_ff, n_head, head_dim and n_vocab", path);
        return -1;
    }
    if (!h->n_head_kv) h->n_head_kv = h->n_head;
    if (!h->n_ctx_train) h->n_ctx_train = 4096;
    if (!h->bundle_align) h->bundle_align = 4096;
    /* unknown: the largest unit a device asks of direct reads (sparse_open.c takes the file's own) */
    if (!f->read_align) f->read_align = h->bundle_align < 4096 ? h->bundle_align : 4096;
    if (f->read_align < 512 || f->read_align > h->bundle_align || (f->read_align & (f->read_align - 1))) {
        pi2_set_error("facts %s: \"read_align\" must be a power of two from 512 to bundle_align", path);
        return -1;
    }
    h->part_bytes = pi2_row_size((pi2_type)h->neuron_type, h->n_embd);
    if (!h->bundle_stride) h->bundle_stride = (3 * h->part_bytes + h->bundle_align - 1) / h->bundle_align * h->bundle_align;
    if (!f->resident_bytes) { /* a registry shape without it: embeddings, attention, output in the neuron type */
        const uint64_t E = h->n_embd, q = (uint64_t)h->n_head * h->head_dim, kv = (uint64_t)h->n_head_kv * h->head_dim;
        const size_t row = pi2_row_size((pi2_type)h->neuron_type, h->n_embd);
        f->resident_bytes = (2 * (uint64_t)h->n_vocab + (uint64_t)h->n_layer * (q + 2 * kv + E)) * row;
    }
    return 0;
}

/* ---- the command ------------------------------------------------------------------------------- */

/* Facts know the file, not the process: what a session holds beyond the resident section is estimated
 * as the tokenizer's tables (about three times its section, measured on SmolLM2's 49152-token vocabulary)
 * and 4 MiB of C library, thread stacks and allocator. */
static uint64_t process_allowance(const facts *f) { return 3 * f->tokenizer_bytes + (4u << 20); }

/* The predictor's scratch (pi2_predictors_scratch_bytes) for a shape whose predictor is not at hand:
 * per batch row its scores (4 bytes a neuron), the FFN input as the predictor's activation row, and a
 * rank of up to 1024 (hidden floats and their activation row). Its scores dominate: on the small 7B
 * shape at --batch 64 the file's measured 2.09 MiB, this 2.35 MiB. Without it the facts' minimum budget
 * came out 2.7 MiB below the file's; with it 0.2 MiB (68.28 against 68.47 MiB). */
static uint64_t predictor_allowance(const facts *f, const pi2_sparse_config *cfg, int n_batch) {
    if (!f->has_predictor || (cfg->oracle && !cfg->check_predictor)) return 0;
    const uint64_t E = f->h.n_embd, rank = 1024;
    return (uint64_t)n_batch * (4 * (uint64_t)f->h.n_ff + pi2_row_size(PI2_Q8_0, (int64_t)E) + 4 * rank +
                                pi2_row_size(PI2_Q8_0, (int64_t)rank));
}

typedef struct {
    const char *source;   /* "measured" (a model opened as the engine opens it) or "estimated" (facts) */
    uint64_t allowance;   /* estimated: the process_allowance in the resident part */
    uint64_t model_bytes, kv_bytes;
    int n_ctx, n_batch, threads;
} size_run;

static const char *budget_source(const pi2_sparse_sizing *z, const pi2_sparse_shape *sh) {
    if (!strcmp(z->budget_source, "given")) return "flag";
    if (!strncmp(z->budget_source, "none", 4)) return "none";
    return sh->available_source;
}

static void print_json(const pi2_options *o, const size_run *r, const pi2_sparse_shape *sh, const pi2_sparse_sizing *z,
                       int ok, uint64_t min_budget) {
    char path[1100], err[700];
    pi2_json_string(path, sizeof path, o->model ? o->model : o->facts);
    const pi2_ncache_config *cc = &z->cc;
    printf("{\"schema\": 1, \"%s\": %s, \"policy\": \"%s\", \"fixed_source\": \"%s\", \"model_bytes\": %llu, "
           "\"n_ctx\": %d, \"n_batch\": %d, \"threads\": %d, \"min_budget_bytes\": %llu",
           o->model ? "model" : "facts", path, pi2_policy_name(o->sparse.policy), r->source,
           (unsigned long long)r->model_bytes, r->n_ctx, r->n_batch, r->threads, (unsigned long long)min_budget);
    if (!ok) {
        pi2_json_string(err, sizeof err, pi2_last_error());
        printf(", \"budget_bytes\": %llu, \"error\": %s}\n", (unsigned long long)o->sparse.memory_budget, err);
        return;
    }
    const uint64_t hot = (uint64_t)cc->hot_slots * cc->cluster * cc->stride, cold = (uint64_t)cc->cold_slots * cc->cold_bytes;
    printf(", \"budget_bytes\": %llu, \"budget_source\": \"%s\", \"budget_rule\": \"%s\", \"available_bytes\": %llu, "
           "\"whole_model_resident\": %s, "
           "\"fixed\": {\"bytes\": %llu, \"resident_bytes\": %llu, \"context_bytes\": %llu, \"kv_cache_bytes\": %llu, "
           "\"scratch_bytes\": %llu, \"predictor_scratch_bytes\": %llu, \"margin_bytes\": %llu, "
           "\"estimated_process_bytes\": %llu}, "
           "\"cache\": {\"bytes\": %llu, \"hot_bytes\": %llu, \"cold_bytes\": %llu, \"hot_neurons_per_block\": %d, "
           "\"cluster\": %d, \"hot_slots\": %lld, \"cold_slots\": %lld, \"cold_slot_bytes\": %llu, "
           "\"bundle_stride\": %llu, \"n_blocks\": %d, \"n_ff\": %d}}\n",
           (unsigned long long)z->budget, budget_source(z, sh), z->budget_source, (unsigned long long)sh->available,
           z->whole_resident ? "true" : "false", (unsigned long long)z->fixed, (unsigned long long)z->rss,
           (unsigned long long)z->ctx_bytes, (unsigned long long)r->kv_bytes, (unsigned long long)z->scratch,
           (unsigned long long)sh->pred_scratch, (unsigned long long)z->margin, (unsigned long long)r->allowance,
           (unsigned long long)(hot + cold),
           (unsigned long long)hot, (unsigned long long)cold, cc->hot_neurons, cc->cluster, (long long)cc->hot_slots,
           (long long)cc->cold_slots, (unsigned long long)cc->cold_bytes, (unsigned long long)cc->stride, cc->n_blocks,
           cc->n_ff);
}

static void print_text(const pi2_options *o, const size_run *r, const pi2_sparse_sizing *z) {
    const pi2_ncache_config *cc = &z->cc;
    printf("%s: policy %s, budget %.1f MiB (%s)%s\n", o->model ? o->model : o->facts, pi2_policy_name(o->sparse.policy),
           z->budget / 1048576.0, z->budget_source, z->whole_resident ? ", whole model resident" : "");
    printf("  fixed %.1f MiB (%s): resident %.1f, context %.1f (KV cache %.1f), scratch %.1f, margin %.1f\n",
           z->fixed / 1048576.0, r->source, z->rss / 1048576.0, z->ctx_bytes / 1048576.0, r->kv_bytes / 1048576.0,
           z->scratch / 1048576.0, z->margin / 1048576.0);
    printf("  cache %.1f MiB: %d hot neurons per block in %lld clusters of %d, %lld cold slots of %zu B\n",
           ((double)cc->hot_slots * cc->cluster * cc->stride + (double)cc->cold_slots * cc->cold_bytes) / 1048576.0,
           cc->hot_neurons, (long long)cc->hot_slots, cc->cluster, (long long)cc->cold_slots, cc->cold_bytes);
}

/* Neither -m nor --facts: the flags alone (with a plan's settings, which --plan put in their place), as
 * every command checks them; the host judges plan files with this (pi2cli/plan/plan.py: load_plan). */
static int check_flags_only(const pi2_options *o) {
    if (o->json)
        printf("{\"checked\": \"flags\", \"policy\": \"%s\", \"memory_budget_bytes\": %llu, \"threads\": %d}\n",
               pi2_policy_name(o->sparse.policy), (unsigned long long)o->sparse.memory_budget, o->threads);
    else
        printf("flags ok: policy %s, budget %llu bytes\n", pi2_policy_name(o->sparse.policy),
               (unsigned long long)o->sparse.memory_budget);
    return 0;
}

int pi2_size_main(const pi2_options *o) {
    if (!o->model && !o->facts) return check_flags_only(o);
    pi2_options opt = *o;
    if (opt.sparse.policy == PI2_POLICY_DENSE) opt.sparse.policy = PI2_POLICY_POWERINFER2; /* sizing is the sparse engine's */
    size_run r = {.source = o->model ? "measured" : "estimated"};
    r.n_batch = o->n_batch ? o->n_batch : pi2_session_max_batch(o); /* as chat's */
    pi2_sparse_shape sh;
    pi2_sparse_sizing z;
    memset(&sh, 0, sizeof sh);
    memset(&z, 0, sizeof z);
    int ok = 0, rc = 1, n_threads = 1;
    uint64_t min_budget = 0;
    pi2_session ss;
    memset(&ss, 0, sizeof ss);
    if (o->model) { /* open the session as generate and chat do, and let the engine measure itself */
        if (pi2_session_load(&ss, &opt, PI2_TOKENIZER_IF_ANY) != 0) goto done;
        r.model_bytes = ss.m.file.size;
        r.n_ctx = o->n_ctx ? o->n_ctx : pi2_session_default_ctx(&ss.m);
        if (r.n_batch > r.n_ctx) r.n_batch = r.n_ctx;
        ok = pi2_session_start(&ss, &opt, r.n_ctx, r.n_batch, &sh, &z) == 0;
        n_threads = ss.n_threads;
        if (ss.ctx) r.kv_bytes = pi2_ctx_kv_bytes(ss.ctx);
    } else {
        facts f;
        if (read_facts(o->facts, &f) != 0) goto done;
        r.model_bytes = f.h.file_bytes;
        pi2_model shape_only = {.h = f.h}; /* the header is all the default context reads */
        r.n_ctx = o->n_ctx ? o->n_ctx : pi2_session_default_ctx(&shape_only);
        if (r.n_batch > r.n_ctx) r.n_batch = r.n_ctx;
        n_threads = o->threads ? o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN); /* as pi2_pool_from_flags */
        size_t kv = 0;
        const size_t ctx_bytes = pi2_ctx_bytes_for(&f.h, r.n_ctx, r.n_batch, n_threads, 0, &kv);
        r.kv_bytes = kv;
        r.allowance = process_allowance(&f);
        sh = (pi2_sparse_shape){
            .E = f.h.n_embd, .F = f.h.n_ff, .n_blocks = (int)(f.h.n_layer * (f.h.n_expert ? f.h.n_expert : 1)),
            .neuron_type = (int)f.h.neuron_type, .stride = f.h.bundle_stride, .part = f.h.part_bytes,
            .ra = f.read_align, .n_batch = r.n_batch, .pred_scratch = predictor_allowance(&f, &opt.sparse, r.n_batch),
            .rss = f.resident_bytes + process_allowance(&f), .ctx_bytes = ctx_bytes,
        };
        sh.available = pi2_available_memory(&sh.available_source);
        ok = pi2_sparse_size(&opt.sparse, &sh, &z) == 0;
    }
    r.threads = n_threads;
    {
        char err[600];
        snprintf(err, sizeof err, "%s", pi2_last_error());
        if (sh.n_blocks && sh.ra) min_budget = pi2_sparse_min_budget(&opt.sparse, &sh); /* the shape was read */
        if (!ok && min_budget) pi2_set_error("%s; the smallest budget for these settings is %.1f MiB", err, min_budget / 1048576.0);
        else pi2_set_error("%s", err);
    }
    if (o->json) print_json(&opt, &r, &sh, &z, ok, min_budget);
    if (!ok) goto done;
    if (!o->json) print_text(&opt, &r, &z);
    rc = 0;
done:
    if (rc) fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
    pi2_session_close(&ss);
    return rc;
}
