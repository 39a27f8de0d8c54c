#include "sparse.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "forward.h"
#include "neuron_cache.h"
#include "parmat.h"
#include "sparse_internal.h"
#include "sparse_predict.h"

/* ---- configuration --------------------------------------------------------------------------- */

void pi2_sparse_config_default(pi2_sparse_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->policy = PI2_POLICY_DENSE;
    cfg->llmflash_window = 5;
    cfg->hot_fraction = 0.2f;
    cfg->hot_share = 0.5f;
    cfg->cluster = 32;
    cfg->io.queue_depth = 512;
}

static const char *policy_names[] = {"dense", "bundle", "llmflash", "cache", "powerinfer2"};

const char *pi2_policy_name(pi2_policy p) { return p <= PI2_POLICY_POWERINFER2 ? policy_names[p] : "?"; }

const char *pi2_sparse_usage(void) {
    return "  sparse engine (PowerInfer-2; docs/SPARSE.md):\n"
           "    --policy dense|bundle|llmflash|cache|powerinfer2   [dense]\n"
           "    --memory-budget SIZE     whole-process budget, e.g. 2G, 1536M (sparse policies keep peak RSS under it)\n"
           "    --predictor model|oracle  oracle = true activations (a correctness tool)   [model]\n"
           "    --check-predictor        also compute true activations: recall/precision per layer\n"
           "    --pred-threshold P       predictor threshold in (0,1) for every layer   [the model file's]\n"
           "    --llmflash-window K      llmflash: keep neurons used by the last K tokens   [5]\n"
           "    --hot-fraction F         hot set: first F of each block's bundles   [0.2]\n"
           "    --hot-share S            share of the neuron cache for hot clusters   [0.5]\n"
           "    --cluster N              bundles per hot cluster   [32]\n"
           "    --two-phase, --no-two-phase   powerinfer2: cold INT4 bundles gate part first / whole   [auto: from\n"
           "                             a storage probe at open: on where a gate-part read costs under half a whole one]\n"
           "    --prefill-stream auto|on|off   powerinfer2 batches of 8+ tokens under a budget: read each block\n"
           "                             whole in large sequential reads (auto: when the storage probe says it pays)\n"
           "    --miss-threshold P       decode: read a cold miss only if its predicted probability > P   [off]\n"
           "    --lru-only               cache, powerinfer2: plain LRU for cold misses, not insertion by rank\n"
           "    --lookahead              powerinfer2: read what the coming layer's predictor wants during attention\n"
           "    --no-repack              keep attention/output rows as stored (no interleaving by four)\n"
           "    --io auto|uring|pread|buffered   neuron reads   [auto]\n"
           "    --io-threads N, --io-affinity 0,1   pread-pool threads and their CPUs\n";
}

static int parse_fraction(const char *flag, const char *v, float *out) {
    if (pi2_parse_float_arg(flag, v, out) != 0) return -1;
    if (!(*out >= 0 && *out <= 1)) {
        pi2_set_error("%s must be between 0 and 1, got '%s'", flag, v);
        return -1;
    }
    return 0;
}

/* A threshold probability: strictly between 0 and 1 (its logit must be finite). */
static int parse_probability(const char *flag, const char *v, float *out) {
    if (parse_fraction(flag, v, out)) return -1;
    if (*out <= 0 || *out >= 1) {
        pi2_set_error("%s must be strictly between 0 and 1, got '%s'", flag, v);
        return -1;
    }
    return 0;
}

int pi2_sparse_parse_flag(const char *a, const char *v, pi2_sparse_config *cfg) {
    static const char *valued[] = {"--policy", "--memory-budget", "--predictor", "--llmflash-window", "--hot-fraction",
                                   "--hot-share", "--cluster", "--io", "--io-threads", "--io-affinity",
                                   "--pred-threshold", "--prefill-stream", "--miss-threshold"};
    if (!strcmp(a, "--check-predictor")) {
        cfg->check_predictor = 1;
        return 1;
    }
    if (!strcmp(a, "--no-two-phase") || !strcmp(a, "--two-phase")) {
        cfg->two_phase = a[2] == 'n' ? -1 : 1;
        return 1;
    }
    if (!strcmp(a, "--lru-only")) {
        cfg->lru_only = 1;
        return 1;
    }
    if (!strcmp(a, "--lookahead")) {
        cfg->lookahead = 1;
        return 1;
    }
    if (!strcmp(a, "--no-repack")) {
        cfg->no_repack = 1;
        return 1;
    }
    int known = 0;
    for (size_t i = 0; i < sizeof valued / sizeof valued[0]; i++) known |= !strcmp(a, valued[i]);
    if (!known) return 0;
    if (!v) {
        pi2_set_error("option %s needs a value", a);
        return -1;
    }
    if (!strcmp(a, "--policy")) {
        for (int p = 0; p <= PI2_POLICY_POWERINFER2; p++)
            if (!strcmp(v, policy_names[p])) {
                cfg->policy = (pi2_policy)p;
                return 2;
            }
        pi2_set_error("--policy: unknown policy '%s' (dense, bundle, llmflash, cache, powerinfer2)", v);
        return -1;
    }
    if (!strcmp(a, "--memory-budget")) return pi2_parse_size(a, v, &cfg->memory_budget) ? -1 : 2;
    if (!strcmp(a, "--predictor")) {
        if (strcmp(v, "model") && strcmp(v, "oracle")) {
            pi2_set_error("--predictor: expected model or oracle, got '%s'", v);
            return -1;
        }
        cfg->oracle = !strcmp(v, "oracle");
        return 2;
    }
    if (!strcmp(a, "--llmflash-window")) return pi2_parse_int_arg(a, v, 1, 1 << 20, &cfg->llmflash_window) ? -1 : 2;
    if (!strcmp(a, "--hot-fraction")) return parse_fraction(a, v, &cfg->hot_fraction) ? -1 : 2;
    if (!strcmp(a, "--hot-share")) return parse_fraction(a, v, &cfg->hot_share) ? -1 : 2;
    if (!strcmp(a, "--pred-threshold")) return parse_probability(a, v, &cfg->pred_threshold) ? -1 : 2;
    if (!strcmp(a, "--prefill-stream")) {
        static const char *names[] = {"off", "auto", "on"};
        for (int i = 0; i < 3; i++)
            if (!strcmp(v, names[i])) {
                cfg->prefill_stream = i - 1;
                return 2;
            }
        pi2_set_error("--prefill-stream: expected auto, on or off, got '%s'", v);
        return -1;
    }
    if (!strcmp(a, "--miss-threshold")) return parse_probability(a, v, &cfg->miss_threshold) ? -1 : 2;
    if (!strcmp(a, "--cluster")) return pi2_parse_int_arg(a, v, 1, 4096, &cfg->cluster) ? -1 : 2;
    if (!strcmp(a, "--io-threads")) return pi2_parse_int_arg(a, v, 1, 64, &cfg->io.n_threads) ? -1 : 2;
    if (!strcmp(a, "--io")) {
        static const char *names[] = {"auto", "uring", "pread", "buffered"};
        for (int i = 0; i < 4; i++)
            if (!strcmp(v, names[i])) {
                cfg->io.method = (pi2_io_method)i;
                return 2;
            }
        pi2_set_error("--io: expected auto, uring, pread or buffered, got '%s'", v);
        return -1;
    }
    /* --io-affinity */
    int32_t cpus[64];
    const int n = pi2_parse_int_list(a, v, 4095, cpus, 64);
    if (n < 0) return -1;
    for (int i = 0; i < n; i++) cfg->io_cpus[i] = cpus[i];
    cfg->io.n_cpus = n;
    return 2;
}

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

/* ---- opening: budget, cache, store ----------------------------------------------------------- */

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
static size_t round_down(size_t x, size_t a) { return x / a * a; }

static void *zalloc(size_t n, int *ok) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) *ok = 0;
    return p;
}

static int alloc_scratch(pi2_sparse *s) {
    const size_t B = (size_t)s->n_batch, F = (size_t)s->F;
    int ok = 1;
    s->act_row = pi2_row_size(pi2_act_type((pi2_type)s->m->h.neuron_type), s->E);
    s->act = zalloc(B * s->act_row, &ok);
    s->pact_row = (pi2_packed_act_size((pi2_type)s->m->h.neuron_type, s->E) + 63) / 64 * 64;
    if (!(s->pact = aligned_alloc(64, B * s->pact_row))) ok = 0;
    s->mask = zalloc(B * F, &ok);
    if (s->cfg.oracle || s->cfg.check_predictor) s->truth = zalloc(B * F, &ok);
    s->active = zalloc(F * sizeof(int32_t), &ok);
    s->gates = zalloc(F * B * sizeof(float), &ok);
    s->look_in = zalloc((size_t)s->E * sizeof(float), &ok);
    s->look_mask = zalloc(F, &ok);
    s->hv = zalloc(F * B * sizeof(float), &ok);
    s->live = zalloc(F, &ok);
    s->wave_k = zalloc(F * sizeof(int32_t), &ok);
    s->wave_h = zalloc(F * sizeof(int64_t), &ok);
    s->phase = zalloc(F, &ok);
    s->wait_next = zalloc(F * sizeof(int32_t), &ok);
    s->ready = zalloc(2 * F * sizeof(int32_t), &ok);
    s->to_read = zalloc(F * sizeof(int64_t), &ok);
    s->to_read_kind = zalloc(F, &ok);
    s->block_off = zalloc((size_t)s->n_blocks * sizeof(uint64_t), &ok);
    s->layer_tp = zalloc(s->m->h.n_layer * sizeof(uint64_t), &ok);
    s->layer_fp = zalloc(s->m->h.n_layer * sizeof(uint64_t), &ok);
    s->layer_fn = zalloc(s->m->h.n_layer * sizeof(uint64_t), &ok);
    s->layer_seen = zalloc(s->m->h.n_layer * sizeof(uint64_t), &ok);
    return ok ? 0 : -1;
}

/* Batches may be streamed (sparse_batch.c): powerinfer2, exact neurons not asked for. */
static int may_stream(const pi2_sparse *s) {
    return s->pipeline && s->n_batch >= PI2_DENSE_BATCH && !s->cfg.oracle && !s->cfg.check_predictor &&
           s->cfg.prefill_stream >= 0;
}

static size_t scratch_bytes(const pi2_sparse *s) {
    const size_t B = (size_t)s->n_batch, F = (size_t)s->F;
    const size_t truth = s->cfg.oracle || s->cfg.check_predictor ? B * F : 0;
    return B * (s->act_row + s->pact_row) + B * F + truth + 2 * F * B * 4 + F * (4 + 8 + 1 + 1 + 4 + 8 + 8 + 1) +
           pi2_predictors_scratch_bytes(&s->pred) + (may_stream(s) ? pi2_sparse_stream_bytes(s) : 0);
}

/* How the cache's bytes split into regions for this policy; 0 or -1 with an error. */
static int size_cache(pi2_sparse *s, uint64_t cache_bytes, pi2_ncache_config *cc) {
    const pi2_header *h = &s->m->h;
    memset(cc, 0, sizeof *cc);
    cc->n_blocks = s->n_blocks;
    cc->n_ff = (int)s->F;
    cc->stride = h->bundle_stride;
    /* A cold slot holds a bundle's data without the file's alignment padding (6912 of 8192 bytes
     * for a 7B Q4_0 model: 15% more neurons per byte); clusters keep the file's layout. */
    cc->cold_bytes = s->full_len;
    cc->cluster = s->cfg.cluster < (int)s->F ? s->cfg.cluster : (int)s->F;
    const int64_t total_bundles = (int64_t)s->n_blocks * s->F;
    int64_t slots = (int64_t)(cache_bytes / cc->cold_bytes);
    if (slots > total_bundles) slots = total_bundles; /* the whole FFN fits: no more is useful */
    const pi2_policy p = s->cfg.policy;
    if (slots == total_bundles && p != PI2_POLICY_BUNDLE && p != PI2_POLICY_LLMFLASH) {
        /* The whole FFN fits: one region, loaded up front (preload), nothing to evict or split. */
        cc->cold_slots = slots;
        return 0;
    }
    if (p == PI2_POLICY_CACHE || p == PI2_POLICY_POWERINFER2) {
        int hot = (int)round_up((size_t)(s->cfg.hot_fraction * (float)s->F + 0.5f), (size_t)cc->cluster);
        cc->hot_neurons = hot > s->F ? (int)s->F : hot;
        int64_t clusters_per_block = (cc->hot_neurons + cc->cluster - 1) / cc->cluster;
        int64_t hot_slots = (int64_t)((double)cache_bytes * s->cfg.hot_share / (double)(cc->cluster * cc->stride));
        /* Layers come round in a cycle, so an LRU region smaller than the hot set of all blocks would
         * evict every cluster just before its next use. Shrink the hot set to what fits instead. */
        int64_t fit = hot_slots / s->n_blocks;
        if (fit < clusters_per_block) {
            clusters_per_block = fit;
            cc->hot_neurons = (int)(fit * cc->cluster);
        }
        cc->hot_slots = clusters_per_block * s->n_blocks;
        cc->cold_slots = (int64_t)((cache_bytes - (uint64_t)cc->hot_slots * cc->cluster * cc->stride) / cc->cold_bytes);
        int64_t cold_neurons = (int64_t)s->n_blocks * (s->F - cc->hot_neurons);
        if (cc->cold_slots > cold_neurons) cc->cold_slots = cold_neurons;
        if (!cc->hot_slots) cc->hot_neurons = 0; /* no room for clusters: every neuron is cold */
        if (!cc->hot_neurons) cc->cold_slots = slots;
    } else if (p == PI2_POLICY_BUNDLE) {
        /* No cache, only a staging area for one block's active bundles (computed in waves if smaller). */
        cc->cold_slots = slots < s->F ? slots : s->F;
    } else {
        cc->cold_slots = slots;
    }
    if (cc->cold_slots + cc->hot_slots < 1) {
        pi2_set_error("the memory budget leaves no room for even one neuron bundle");
        return -1;
    }
    return 0;
}

static uint64_t io_bytes(const pi2_sparse *s) {
    pi2_io_stats st;
    pi2_io_stats_get(s->io, &st);
    return st.bytes;
}

/* The cache holds every bundle: read the neuron region block by block in large sequential reads and
 * hand each bundle to its slot, so decode starts with everything in memory and never reads again (the
 * model-fits-in-memory case). Slots of the file's stride are read into directly (slots come off the
 * free stack in order, so a chunk's bundles fill contiguous slots); smaller slots (a bundle without its
 * alignment padding) are filled from two staging buffers, one copied out while the next is read. */
static int preload(pi2_sparse *s) {
    const size_t stride = s->m->h.bundle_stride, slot = pi2_ncache_cfg(s->cache)->cold_bytes;
    const int per_chunk = stride < ((size_t)4 << 20) ? (int)(((size_t)4 << 20) / stride) : 1;
    const size_t chunk = (size_t)per_chunk * stride, align = s->ra > 4096 ? s->ra : 4096;
    const int direct = slot == stride, chunks_per_block = (int)((s->F + per_chunk - 1) / per_chunk);
    const int64_t n_chunks = (int64_t)s->n_blocks * chunks_per_block;
    const uint64_t t0 = pi2_now_ns(), bytes0 = io_bytes(s);
    uint8_t *stage[2] = {NULL, NULL};
    if (!direct && (!(stage[0] = aligned_alloc(align, chunk)) || !(stage[1] = aligned_alloc(align, chunk)))) {
        free(stage[0]);
        pi2_set_error("out of memory for the preload's staging buffers");
        return -1;
    }
    int rc = 0;
    int arrived[2] = {0, 0}; /* chunk c has arrived: arrived[c & 1] (at most two are in flight) */
    for (int64_t c = 0; rc == 0 && c <= n_chunks; c++) {
        if (c < n_chunks) { /* issue chunk c */
            const int b = (int)(c / chunks_per_block), k0 = (int)(c % chunks_per_block) * per_chunk;
            const int n = s->F - k0 < per_chunk ? (int)(s->F - k0) : per_chunk;
            uint8_t *dst = stage[c & 1];
            if (direct) {
                int64_t h0 = -1;
                for (int k = 0; k < n && rc == 0; k++) {
                    const int64_t h = pi2_ncache_acquire(s->cache, b, k0 + k);
                    if (h0 < 0) h0 = h;
                    if (h != h0 + k) {
                        pi2_set_error("preload: cache slots are not contiguous");
                        rc = -1;
                    }
                }
                size_t len;
                int blk, kk;
                if (rc == 0) dst = pi2_ncache_slot_data(s->cache, h0, &len, &blk, &kk);
            }
            arrived[c & 1] = 0;
            if (rc == 0) rc = pi2_io_submit(s->io, s->block_off[b] + (uint64_t)k0 * stride, (size_t)n * stride, dst, (uint64_t)c);
            if (rc == 0) rc = pi2_io_flush(s->io);
        }
        if (rc != 0 || c == 0) continue;
        const int64_t p = c - 1; /* finish chunk p: wait for it (completions come in any order) */
        if ((rc = pi2_sparse_wait_chunk(s, p, arrived)) != 0) break;
        const int b = (int)(p / chunks_per_block), k0 = (int)(p % chunks_per_block) * per_chunk;
        const int n = s->F - k0 < per_chunk ? (int)(s->F - k0) : per_chunk;
        for (int k = 0; k < n; k++) {
            int64_t h = direct ? pi2_ncache_find(s->cache, b, k0 + k) : pi2_ncache_acquire(s->cache, b, k0 + k);
            if (!direct) {
                size_t len;
                int blk, kk;
                memcpy(pi2_ncache_slot_data(s->cache, h, &len, &blk, &kk), stage[p & 1] + (size_t)k * stride, slot);
            }
            pi2_ncache_set_state(s->cache, h, PI2_SLOT_READY);
            pi2_ncache_unpin(s->cache, h);
        }
    }
    if (rc != 0) /* a failed read: collect what is still in flight before the buffers go */
        for (uint64_t tags[4]; pi2_io_in_flight(s->io) > 0;) pi2_io_reap(s->io, tags, 4, 1); /* -1: one more failed */
    free(stage[0]);
    free(stage[1]);
    s->preload_ns = pi2_now_ns() - t0;
    s->preload_bytes = io_bytes(s) - bytes0;
    return rc;
}

/* After a preload: the block bases when every block's bundles sit in consecutive slots (the preload
 * takes slots off the free stack in order, so they do), with the batch's up-dot buffer. */
static int find_resident(pi2_sparse *s) {
    const size_t slot = pi2_ncache_cfg(s->cache)->cold_bytes;
    for (int b = 0; b < s->n_blocks; b++) {
        const uint8_t *base = pi2_ncache_bundle(s->cache, pi2_ncache_find(s->cache, b, 0), 0);
        for (int k = 1; k < s->F; k++)
            if (pi2_ncache_bundle(s->cache, pi2_ncache_find(s->cache, b, k), k) != base + (size_t)k * slot) return 0;
    }
    s->block_base = malloc(sizeof(*s->block_base) * (size_t)s->n_blocks);
    s->up_out = malloc(sizeof(float) * (size_t)s->n_batch * (size_t)s->F);
    if (!s->block_base || !s->up_out) {
        pi2_set_error("out of memory for the resident FFN's tables");
        return -1;
    }
    for (int b = 0; b < s->n_blocks; b++)
        s->block_base[b] = pi2_ncache_bundle(s->cache, pi2_ncache_find(s->cache, b, 0), 0);
    s->res_stride = slot;
    return 0;
}

/* No --memory-budget: the model in memory when it fits, else a budget the machine can hold.
 * Fits means the fixed region, every bundle and the cache's bookkeeping take at most 90% of the memory
 * this process can still have (pi2_available_memory_bytes): then the budget is exactly that, so the
 * cache holds the whole FFN, preloads it and never reads again. Otherwise the budget is 90% of the
 * available memory and the engine says so in one line: a run that would be killed or thrash becomes a
 * run under a budget, reported as chosen. */
static int budget_for(pi2_sparse *s, uint64_t fixed_now, uint64_t ffn_bytes) {
    /* the cache pays 48 bytes of bookkeeping per slot out of its bytes (pi2_sparse_open) */
    const uint64_t cache = ffn_bytes / (s->full_len - 48) * s->full_len + s->full_len;
    const uint64_t up_out = s->n_batch > 1 ? (uint64_t)s->n_batch * (uint64_t)s->F * sizeof(float) : 0;
    const uint64_t whole = fixed_now + cache + up_out, avail = pi2_available_memory_bytes();
    /* the margin is 4 MiB + 1% of the budget: solve budget = whole + 4 MiB + budget / 100 */
    const uint64_t resident = (whole + (4u << 20)) / 99 * 100 + 100;
    if (!avail || resident <= avail / 10 * 9) {
        s->cfg.memory_budget = resident;
        s->budget_source = "none: whole model resident";
        return 0;
    }
    s->cfg.memory_budget = avail / 10 * 9;
    s->budget_source = "chosen: 90% of available memory";
    fprintf(stderr,
            "pi2-engine: no --memory-budget and the model needs %.2f GiB in memory but %.2f GiB is available: "
            "running under a budget of %.2f GiB (90%% of it)\n",
            resident / 1073741824.0, avail / 1073741824.0, s->cfg.memory_budget / 1073741824.0);
    return 0;
}

pi2_sparse *pi2_sparse_open(const pi2_model *m, pi2_ctx *ctx, pi2_pool *pool, const pi2_sparse_config *cfg) {
    const pi2_header *h = &m->h;
    if (cfg->policy == PI2_POLICY_DENSE) {
        pi2_set_error("the dense policy does not use the sparse engine");
        return NULL;
    }
    if (!(h->flags & PI2_FLAG_PREDICTOR) && !cfg->oracle) {
        pi2_set_error("%s has no activation predictors: use --predictor oracle or --policy dense", m->file.path);
        return NULL;
    }
    if (cfg->check_predictor && !(h->flags & PI2_FLAG_PREDICTOR)) {
        pi2_set_error("%s has no activation predictors to check", m->file.path);
        return NULL;
    }
    pi2_sparse *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->m = m;
    s->ctx = ctx;
    s->pool = pool;
    s->cfg = *cfg;
    s->cfg.io.cpus = s->cfg.io.n_cpus ? s->cfg.io_cpus : NULL;
    s->nth = pool ? pi2_pool_size(pool) : 1;
    s->n_batch = pi2_ctx_n_batch(ctx);
    s->n_blocks = (int)h->n_layer * m->n_ffn_blocks;
    s->E = h->n_embd;
    s->F = h->n_ff;
    s->part = h->part_bytes;
    /* a streamed chunk: PI2_STREAM_CHUNK, or 1/64 of a small budget (two are staged) */
    const uint64_t chunk = cfg->memory_budget && cfg->memory_budget / 64 < PI2_STREAM_CHUNK ? cfg->memory_budget / 64
                                                                                           : PI2_STREAM_CHUNK;
    s->stream_n = chunk > h->bundle_stride ? (int)(chunk / h->bundle_stride) : 1;
    if (s->stream_n > s->F) s->stream_n = (int)s->F;
    const int cl = cfg->cluster < s->F ? cfg->cluster : (int)s->F; /* whole clusters per chunk (warm_from_stream) */
    if (s->stream_n >= cl) s->stream_n -= s->stream_n % cl;
    const pi2_policy p = cfg->policy;
    s->keep = p != PI2_POLICY_BUNDLE;
    s->pipeline = p == PI2_POLICY_POWERINFER2;
    s->prefetch = p == PI2_POLICY_POWERINFER2 && h->arch != PI2_ARCH_MOE;
    s->lookahead = s->prefetch && cfg->lookahead && !cfg->oracle;
    /* Two-phase pays only when a zero gate makes the neuron's output zero (ReLU-family FFNs). */
    s->two_phase = p == PI2_POLICY_POWERINFER2 && cfg->two_phase >= 0 && h->ffn_act != PI2_ACT_SWIGLU &&
                   (h->neuron_type == PI2_Q4_0 || h->neuron_type == PI2_Q4_1);
    pthread_mutex_init(&s->lock, NULL);
    if (pi2_predictors_bind(&s->pred, m, s->n_batch, cfg->oracle && !cfg->check_predictor) != 0) goto fail;
    if (s->pred.gate && (cfg->miss_threshold > 0 || cfg->pred_threshold > 0)) { /* those are probabilities */
        pi2_set_error("%s: --pred-threshold and --miss-threshold are probabilities of an fc1/fc2 predictor; this "
                      "file's gate predictor (CATS) has a threshold per layer instead (pi2 convert --sparsity)",
                      m->file.path);
        goto fail;
    }
    s->miss_logit = INFINITY;
    if (cfg->miss_threshold > 0 && s->pred.fc1 && !cfg->oracle)
        s->miss_logit = logf(cfg->miss_threshold / (1.0f - cfg->miss_threshold));
    if (cfg->pred_threshold > 0 && s->pred.thr_logit) /* the plan's threshold for every layer */
        for (int b = 0; b < s->pred.n_blocks; b++)
            s->pred.thr_logit[b] = logf(cfg->pred_threshold / (1.0f - cfg->pred_threshold));
    if (alloc_scratch(s) != 0) {
        pi2_set_error("out of memory for the sparse engine's scratch");
        goto fail;
    }
    for (uint32_t l = 0; l < h->n_layer; l++)
        for (int e = 0; e < m->n_ffn_blocks; e++)
            s->block_off[l * m->n_ffn_blocks + e] = (uint64_t)(m->layers[l].ffn[e].gate.data - m->file.map);

    if (!(s->io = pi2_io_open(m->file.path, &s->cfg.io))) goto fail;
    size_t align = pi2_io_align(s->io);
    s->ra = align < 512 ? 512 : align;
    if (s->ra > h->bundle_align) {
        pi2_set_error("%s: bundles are %u-byte aligned but direct reads need %zu (use --io buffered)", m->file.path,
                      h->bundle_align, s->ra);
        goto fail;
    }
    s->full_len = round_up(3 * s->part, s->ra);
    s->gate_len = round_up(s->part, s->ra);
    s->rest_off = round_down(s->part, s->ra);
    s->rest_len = s->full_len - s->rest_off;

    /* The predictors' weights would stay mapped from the file, come into memory only as decode first
     * used them (75 MiB on the 7B shape, past the budget), and be reclaimed and read back mid-decode
     * whenever a budget's cgroup sat at its limit: copy them into our own memory now, which the RSS
     * below then counts. */
    if (pi2_predictors_own(&s->pred) != 0) goto fail;
    /* The fixed region: everything this process holds now, what the context reserved but has not
     * touched yet (KV cache), our scratch, and a margin for the allocator, stacks and I/O rings. */
    const uint64_t rss = pi2_rss_bytes(), ctx_bytes = pi2_ctx_bytes(ctx), scratch = scratch_bytes(s);
    const uint64_t ffn_bytes = (uint64_t)s->n_blocks * s->F * s->full_len;
    s->budget_source = "given";
    if (!cfg->memory_budget && budget_for(s, rss + ctx_bytes + scratch, ffn_bytes) != 0) goto fail;
    const uint64_t budget = s->cfg.memory_budget;
    const uint64_t margin = (4u << 20) + (budget / 100);
    s->fixed_bytes = rss + ctx_bytes + scratch + margin;
    if (budget <= s->fixed_bytes) {
        pi2_set_error("--memory-budget %.1f MiB is too small: the fixed region needs %.1f MiB before any neuron is "
                      "cached (resident now %.1f, context and KV cache %.1f, scratch %.1f, margin %.1f MiB)",
                      budget / 1048576.0, s->fixed_bytes / 1048576.0, rss / 1048576.0, ctx_bytes / 1048576.0,
                      scratch / 1048576.0, margin / 1048576.0);
        goto fail;
    }
    uint64_t cache_bytes = budget - s->fixed_bytes;
    /* Each region's slots come with bookkeeping (~40 bytes a slot): pay it out of the same budget. */
    cache_bytes -= cache_bytes / s->full_len * 48;
    pi2_ncache_config cc;
    if (size_cache(s, cache_bytes, &cc) != 0) goto fail;
    if (!(s->cache = pi2_ncache_create(&cc))) goto fail;
    /* Bundles are stored hottest first, so a neuron's rank in its block stands for how often it fires.
     * The cold region holds cold_slots / n_blocks neurons per block: those ranked just after the hot
     * set are the ones worth keeping; a miss ranked beyond them goes in at the cold end of the LRU list,
     * taken first by the next miss unless it is used again before (then it moves up like any hit).
     * Plain LRU let one-off misses push out neurons that come back every few tokens. */
    s->admit_limit = (int)s->F;
    if ((p == PI2_POLICY_CACHE || p == PI2_POLICY_POWERINFER2) && !cfg->lru_only) {
        const int64_t per_block = cc.cold_slots / s->n_blocks;
        s->admit_limit = cc.hot_neurons + per_block < s->F ? (int)(cc.hot_neurons + per_block) : (int)s->F;
    }
    int64_t handles = cc.cold_slots + cc.hot_slots;
    s->wait_head = malloc(sizeof(int32_t) * (size_t)handles);
    s->acq_wave = calloc((size_t)handles, sizeof(int32_t));
    if (!s->wait_head || !s->acq_wave) {
        pi2_set_error("out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < handles; i++) s->wait_head[i] = -1;
    if (cc.cold_slots == (int64_t)s->n_blocks * s->F && s->keep && cfg->policy != PI2_POLICY_LLMFLASH) {
        if (preload(s) != 0) goto fail;
        /* the batched path's up dots: within the budget when none was given (it was sized for them) or
         * when what the cache left over holds them */
        const size_t up_bytes = (size_t)s->n_batch * s->F * sizeof(float);
        const uint64_t left = cache_bytes - (uint64_t)cc.cold_slots * cc.cold_bytes;
        if (s->n_batch > 1 && (strcmp(s->budget_source, "given") || left >= up_bytes) && find_resident(s) != 0)
            goto fail;
    }
    if (!s->block_base && s->pipeline) { /* reads will happen: measure what they cost here */
        const uint64_t bytes0 = io_bytes(s);
        if (pi2_sparse_probe_storage(s) != 0 || (may_stream(s) && pi2_sparse_stream_open(s) != 0)) goto fail;
        s->preload_bytes += io_bytes(s) - bytes0;
        /* Two-phase costs a gate-part read, then the rest for about half the neurons (those whose gate
         * comes out positive): it pays where that is cheaper than one whole read (storage bound by
         * bandwidth, the paper's UFS), not where every request costs the same (IOPS-bound disks). */
        if (s->two_phase && cfg->two_phase == 0)
            s->two_phase = 1.0 / s->probe_gate_reads_per_s + 0.5 / s->probe_rest_reads_per_s < 1.0 / s->rand_reads_per_s;
    }
    pi2_ctx_set_sparse(ctx, s);
    return s;
fail:
    pi2_sparse_close(s);
    return NULL;
}

void pi2_sparse_close(pi2_sparse *s) {
    if (!s) return;
    if (s->ctx) pi2_ctx_set_sparse(s->ctx, NULL);
    pi2_io_close(s->io);
    pi2_ncache_free(s->cache);
    free(s->block_base);
    free(s->up_out);
    pi2_sparse_stream_close(s);
    pi2_predictors_free(&s->pred);
    void *ptrs[] = {s->look_in, s->look_mask, s->act, s->pact, s->mask, s->truth, s->active, s->hv, s->live, s->gates, s->wave_k, s->wave_h, s->phase,
                    s->wait_next, s->ready, s->to_read, s->to_read_kind, s->block_off, s->layer_tp, s->layer_fp,
                    s->layer_fn, s->layer_seen, s->wait_head, s->acq_wave};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* ---- reading ---------------------------------------------------------------------------------- */

static int submit(pi2_sparse *s, int64_t hdl, int kind) {
    size_t bytes;
    int block, k;
    uint8_t *dst = pi2_ncache_slot_data(s->cache, hdl, &bytes, &block, &k);
    uint64_t off = s->block_off[block] + (uint64_t)k * s->m->h.bundle_stride;
    size_t len = s->full_len;
    if (kind == READ_CLUSTER) {
        len = bytes - s->m->h.bundle_stride + s->full_len; /* the last bundle's padding is not needed */
    } else if (kind == READ_GATE) {
        len = s->gate_len;
    } else if (kind == READ_REST) {
        off += s->rest_off;
        dst += s->rest_off;
        len = s->rest_len;
    }
    pi2_ncache_pin(s->cache, hdl); /* in flight: never evicted */
    if (pi2_io_submit(s->io, off, len, dst, (uint64_t)hdl) != 0) {
        snprintf(s->error, sizeof s->error, "%s", pi2_last_error());
        atomic_store(&s->failed, 1);
        return -1;
    }
    return 0;
}

/* Called with s->lock held: a read finished; move the slot on and release the units waiting for it. */
static void complete(pi2_sparse *s, int64_t hdl) {
    int st = pi2_ncache_state(s->cache, hdl);
    pi2_ncache_set_state(s->cache, hdl, st == PI2_SLOT_LOADING_GATE ? PI2_SLOT_GATE : PI2_SLOT_READY);
    pi2_ncache_unpin(s->cache, hdl);
    int n = atomic_load_explicit(&s->n_ready, memory_order_relaxed);
    for (int32_t i = s->wait_head[hdl]; i >= 0; i = s->wait_next[i]) s->ready[n++] = i;
    s->wait_head[hdl] = -1;
    atomic_store_explicit(&s->n_ready, n, memory_order_release);
}

/* Harvest finished reads (blocking when wait and reads are in flight). Caller holds s->lock. */
static int reap(pi2_sparse *s, int wait) {
    uint64_t tags[64];
    int n = pi2_io_reap(s->io, tags, 64, wait);
    if (n < 0) {
        snprintf(s->error, sizeof s->error, "%s", pi2_last_error());
        atomic_store(&s->failed, 1);
        return -1;
    }
    for (int i = 0; i < n; i++) complete(s, (int64_t)tags[i]);
    return n;
}

void pi2_sparse_drain(pi2_sparse *s) {
    pthread_mutex_lock(&s->lock);
    while (pi2_io_in_flight(s->io) > 0 && reap(s, 1) >= 0) {}
    pthread_mutex_unlock(&s->lock);
}

static void add_waiter(pi2_sparse *s, int64_t hdl, int unit) {
    s->wait_next[unit] = s->wait_head[hdl];
    s->wait_head[hdl] = unit;
}

/* Hot clusters of the coming layer that are not cached yet: read them while attention runs. */
/* Lookahead (our extension of the hot prefetch): the residual stream before a layer's attention is
 * close to its FFN input after it, so the layer's predictor run on it names most of the neurons the
 * FFN will want. Their missing bundles are read while attention computes; the FFN then finds them in
 * flight or arrived. A wrong guess costs a read and a cold slot. Decode only (one token). */
static void lookahead(pi2_sparse *s, int layer, const float *x) {
    const int b = layer; /* dense models only */
    pi2_rmsnorm(s->look_in, x, s->m->layers[layer].ffn_norm, s->E, s->m->h.rms_eps);
    pi2_predict(&s->pred, s->pool, b, s->look_in, 1, s->look_mask);
    for (int k = 0; k < s->F; k++) {
        if (!s->look_mask[k] || pi2_ncache_is_hot(s->cache, k) || pi2_ncache_find(s->cache, b, k) >= 0) continue;
        /* Never wait here: a full queue would stall attention, the very time these reads should use. */
        if (pi2_io_in_flight(s->io) >= s->cfg.io.queue_depth - 8) return;
        int64_t hdl = pi2_ncache_acquire(s->cache, b, k);
        if (hdl < 0) return;
        const int kind = s->two_phase ? READ_GATE : READ_FULL;
        pi2_ncache_set_state(s->cache, hdl, kind == READ_GATE ? PI2_SLOT_LOADING_GATE : PI2_SLOT_LOADING);
        pi2_ncache_touch(s->cache, hdl, s->step);
        if (submit(s, hdl, kind) != 0) return;
        pi2_ncache_unpin(s->cache, hdl);
        s->st.lookahead_reads++;
    }
}

void pi2_sparse_layer_begin(pi2_sparse *s, int layer, const float *x, int tokens) {
    if (!s->prefetch || atomic_load(&s->failed)) return;
    if (s->lookahead && tokens == 1 && s->pred.fc1) lookahead(s, layer, x);
    const int hot = pi2_ncache_cfg(s->cache)->hot_neurons, cl = pi2_ncache_cfg(s->cache)->cluster;
    if (!pi2_ncache_cfg(s->cache)->hot_slots) {
        pi2_io_flush(s->io);
        return;
    }
    for (int e = 0; e < s->m->n_ffn_blocks; e++) {
        const int b = layer * s->m->n_ffn_blocks + e;
        for (int k = 0; k < hot; k += cl) {
            if (pi2_ncache_find(s->cache, b, k) >= 0) continue;
            int64_t hdl = pi2_ncache_acquire(s->cache, b, k);
            if (hdl < 0) return;
            pi2_ncache_set_state(s->cache, hdl, PI2_SLOT_LOADING);
            pi2_ncache_touch(s->cache, hdl, s->step);
            if (submit(s, hdl, READ_CLUSTER) != 0) return;
            pi2_ncache_unpin(s->cache, hdl); /* acquire's pin: only the in-flight pin stays */
        }
    }
    pi2_io_flush(s->io);
}

/* ---- computing one neuron -------------------------------------------------------------------- */

/* Unit i: neuron wave_k[i] for every token whose mask asks for it. Returns 1 when the unit needs a
 * second read (two-phase: a gate came out positive and only the gate part is in memory). */
static int compute_unit(pi2_sparse *s, int i) {
    const pi2_type wt = (pi2_type)s->m->h.neuron_type;
    const uint32_t act = s->m->h.ffn_act;
    const int k = s->wave_k[i];
    const int64_t hdl = s->wave_h[i];
    const uint8_t *bundle = pi2_ncache_bundle(s->cache, hdl, k);
    const int gate_only = pi2_ncache_state(s->cache, hdl) == PI2_SLOT_GATE;
    float *gates = s->gates + (size_t)i * s->n_batch;
    if (gate_only) { /* phase one: gates, and whether any token needs the rest */
        int need = 0;
        for (int t = 0; t < s->tokens; t++) {
            if (!s->mask[(size_t)t * s->F + k]) continue;
            gates[t] = pi2_vec_dot_packed(wt, s->E, bundle, s->pact + (size_t)t * s->pact_row);
            need |= gates[t] > 0.0f;
        }
        return need;
    }
    float *hv = s->hv + (size_t)i * s->n_batch;
    uint8_t live = 0;
    for (int t = 0; t < s->tokens; t++) {
        hv[t] = 0.0f;
        if (!s->mask[(size_t)t * s->F + k]) continue;
        const uint8_t *a = s->pact + (size_t)t * s->pact_row;
        const float g = s->phase[i] ? gates[t] : pi2_vec_dot_packed(wt, s->E, bundle, a);
        if (act == PI2_ACT_SWIGLU || g > 0.0f)
            hv[t] = pi2_neuron_output(act, g, pi2_vec_dot_packed(wt, s->E, bundle + s->part, a));
        live |= hv[t] != 0.0f;
    }
    s->live[i] = live;
    return 0;
}

/* Units units[0..cnt) (cnt <= 4) for a single token, their rows through the activation together
 * (pi2_vec_dot_packed_rows: the same floats as compute_unit's one-at-a-time dots, so results do not
 * depend on how units were grouped). rest[j] = 1 where compute_unit would have returned 1. */
static void compute_units_1tok(pi2_sparse *s, const int *units, int cnt, uint8_t *rest) {
    const pi2_type wt = (pi2_type)s->m->h.neuron_type;
    const uint32_t act = s->m->h.ffn_act;
    const uint8_t *bundle[4], *rows[4];
    float g[4], y[4];
    int gate_only[4], pick[4], n = 0;
    for (int j = 0; j < cnt; j++) {
        const int i = units[j];
        bundle[j] = pi2_ncache_bundle(s->cache, s->wave_h[i], s->wave_k[i]);
        gate_only[j] = pi2_ncache_state(s->cache, s->wave_h[i]) == PI2_SLOT_GATE;
        rest[j] = 0;
        if (s->phase[i]) g[j] = s->gates[(size_t)i * s->n_batch];
        else rows[n] = bundle[j], pick[n++] = j;
    }
    if (n) pi2_vec_dot_packed_rows(wt, s->E, rows, n, s->pact, y);
    for (int q = 0; q < n; q++) g[pick[q]] = y[q];
    n = 0;
    for (int j = 0; j < cnt; j++) {
        const int i = units[j];
        if (gate_only[j]) { /* phase one: keep the gate; the rest is read only if it is positive */
            s->gates[(size_t)i * s->n_batch] = g[j];
            rest[j] = g[j] > 0.0f;
            continue;
        }
        s->hv[(size_t)i * s->n_batch] = 0.0f;
        s->live[i] = 0;
        if (act == PI2_ACT_SWIGLU || g[j] > 0.0f) rows[n] = bundle[j] + s->part, pick[n++] = j;
    }
    if (n) pi2_vec_dot_packed_rows(wt, s->E, rows, n, s->pact, y);
    for (int q = 0; q < n; q++) {
        const int j = pick[q], i = units[j];
        const float h = pi2_neuron_output(act, g[j], y[q]);
        s->hv[(size_t)i * s->n_batch] = h;
        s->live[i] = h != 0.0f;
    }
}

/* The down projection of a wave: out[t] += h[i][t] * down_i over the wave's units in their fixed order
 * (hottest first), each thread owning a slice of the output. So the sum is the same whatever thread
 * computed which neuron and whenever its read arrived: runs repeat bit for bit (the predictor's
 * thresholds would otherwise turn last-bit noise into different neurons, and different text). */
static void down_worker(void *p, int ith, int nth) {
    pi2_sparse *s = p;
    const pi2_type wt = (pi2_type)s->m->h.neuron_type;
    int64_t d0, d1;
    pi2_split_aligned(s->E, PI2_QK, ith, nth, &d0, &d1);
    if (d0 >= d1) return;
    const size_t skip = 2 * s->part + pi2_row_size(wt, d0);
    if (s->tokens == 1) { /* decode: live columns four at a time through one pass over the output slice */
        const uint8_t *cols[4];
        float a[4];
        int n = 0;
        for (int i = 0; i < s->wave_len; i++) {
            if (!s->live[i]) continue;
            cols[n] = pi2_ncache_bundle(s->cache, s->wave_h[i], s->wave_k[i]) + skip;
            __builtin_prefetch(cols[n], 0, 3);
            a[n++] = s->hv[(size_t)i * s->n_batch];
            if (n == 4) pi2_axpy_rows(wt, d1 - d0, a, cols, n, s->out + d0), n = 0;
        }
        if (n) pi2_axpy_rows(wt, d1 - d0, a, cols, n, s->out + d0);
        return;
    }
    /* a batch: four live columns at a time, each token's slice of the output read and written once per
     * group while the four columns stay in L1 across tokens. A token whose four outputs are all zero
     * is skipped; a zero output within a group adds q * 0 = 0, which leaves the sum as it was. */
    const uint8_t *cols[4];
    const float *hv[4];
    int n = 0;
    for (int i = 0; i <= s->wave_len; i++) {
        if (i < s->wave_len) {
            if (!s->live[i]) continue;
            cols[n] = pi2_ncache_bundle(s->cache, s->wave_h[i], s->wave_k[i]) + skip;
            hv[n++] = s->hv + (size_t)i * s->n_batch;
            if (n < 4) continue;
        }
        if (!n) break;
        for (int t = 0; t < s->tokens; t++) {
            float a[4];
            int any = 0;
            for (int r = 0; r < n; r++) any |= (a[r] = hv[r][t]) != 0.0f;
            if (any) pi2_axpy_rows(wt, d1 - d0, a, cols, n, s->out + (size_t)t * s->E + d0);
        }
        n = 0;
    }
}

/* Bring the first lines of a unit's rows towards this core while the current unit computes: bundles
 * sit at random places in the cache, and each row start would otherwise wait for DRAM. */
static void prefetch_unit(const pi2_sparse *s, int i) {
    const uint8_t *b = pi2_ncache_bundle(s->cache, s->wave_h[i], s->wave_k[i]);
    for (int l = 0; l < 4; l++) {
        __builtin_prefetch(b + 64 * l, 0, 3);
        __builtin_prefetch(b + s->part + 64 * l, 0, 3);
    }
}

/* Phase two of a two-phase neuron: register as waiting, then read the up row and down column. */
static void read_rest(pi2_sparse *s, int i) {
    const int64_t hdl = s->wave_h[i];
    pthread_mutex_lock(&s->lock);
    s->phase[i] = 1;
    const int first = pi2_ncache_state(s->cache, hdl) == PI2_SLOT_GATE;
    if (first) pi2_ncache_set_state(s->cache, hdl, PI2_SLOT_LOADING_REST);
    add_waiter(s, hdl, i);
    pthread_mutex_unlock(&s->lock);
    if (first && submit(s, hdl, READ_REST) == 0) pi2_io_flush(s->io);
}

#define TICKETS 4 /* claimed at once: fewer atomics bouncing between cores; compute_units_1tok takes up to 4 */

/* Every thread: claim tickets; a ticket is a position in the ready list; wait for it to be filled by
 * becoming the reaper (one thread at a time) while nothing else is ready. Thread 0 first issues the
 * wave's reads when the pipeline is on, so the other threads compute cached neurons meanwhile.
 * Finished units are subtracted from `pending` in batches, always before waiting. */
static void wave_worker(void *p, int ith, int nth) {
    pi2_sparse *s = p;
    if (ith == 0 && s->pipeline) {
        for (int r = 0; r < s->n_to_read; r++)
            if (submit(s, s->to_read[r], s->to_read_kind[r]) != 0) break;
        pi2_io_flush(s->io);
    }
    int finished = 0;
    for (;;) {
        const int t0 = atomic_fetch_add(&s->next_ticket, TICKETS);
        int t = t0;
        if (s->tokens == 1) { /* decode: the tickets already filled go through the kernel together */
            const int n_ready = atomic_load_explicit(&s->n_ready, memory_order_acquire);
            const int cnt = n_ready - t0 < TICKETS ? n_ready - t0 : TICKETS;
            if (cnt > 1) {
                uint8_t rest[TICKETS];
                compute_units_1tok(s, s->ready + t0, cnt, rest);
                for (int j = 0; j < cnt; j++) {
                    if (rest[j]) read_rest(s, s->ready[t0 + j]);
                    else finished++;
                }
                t += cnt;
            }
        }
        for (; t < t0 + TICKETS; t++) {
            for (;;) {
                if (atomic_load_explicit(&s->failed, memory_order_relaxed)) return;
                const int n_ready = atomic_load_explicit(&s->n_ready, memory_order_acquire);
                if (t < n_ready) {
                    if (t + 1 < n_ready) prefetch_unit(s, s->ready[t + 1]);
                    const int i = s->ready[t];
                    if (compute_unit(s, i)) read_rest(s, i);
                    else finished++;
                    break;
                }
                if (finished) {
                    atomic_fetch_sub(&s->pending, finished);
                    finished = 0;
                }
                if (atomic_load(&s->pending) == 0) return;
                if (pthread_mutex_trylock(&s->lock) == 0) {
                    reap(s, 1);
                    pthread_mutex_unlock(&s->lock);
                } else {
                    sched_yield();
                }
            }
        }
    }
}

/* ---- one FFN block ---------------------------------------------------------------------------- */

static void count_check(pi2_sparse *s, int layer, int tokens) {
    uint64_t tp = 0, fp = 0, fn = 0;
    for (size_t i = 0; i < (size_t)tokens * s->F; i++) {
        tp += s->mask[i] && s->truth[i];
        fp += s->mask[i] && !s->truth[i];
        fn += !s->mask[i] && s->truth[i];
    }
    s->layer_tp[layer] += tp;
    s->layer_fp[layer] += fp;
    s->layer_fn[layer] += fn;
    s->layer_seen[layer] += (uint64_t)tokens * s->F;
    s->st.pred_tp += tp;
    s->st.pred_fp += fp;
    s->st.pred_fn += fn;
}

/* Take units from active[*pos..) until the cache cannot pin another slot; returns the wave size. */
static int build_wave(pi2_sparse *s, int b, int n_active, int *pos) {
    int n = 0;
    s->n_to_read = 0;
    s->wave_serial++;
    atomic_store(&s->n_ready, 0);
    while (*pos < n_active) {
        const int k = s->active[*pos];
        const int hot = pi2_ncache_is_hot(s->cache, k);
        int64_t hdl = pi2_ncache_find(s->cache, b, k);
        int hit = hdl >= 0;
        if (!hit && !hot && s->tokens == 1 && s->miss_logit < INFINITY && s->pred.scores[k] <= s->miss_logit) {
            s->skipped_misses++; /* predicted, but too unlikely to pay for its read (--miss-threshold) */
            if (s->cfg.check_predictor && s->truth[k]) s->skipped_active++;
            (*pos)++;
            continue;
        }
        if (hit) {
            pi2_ncache_pin(s->cache, hdl);
        } else {
            if ((hdl = pi2_ncache_acquire(s->cache, b, k)) < 0) break; /* everything pinned: compute first */
            int kind = hot ? READ_CLUSTER : s->two_phase ? READ_GATE : READ_FULL;
            pi2_ncache_set_state(s->cache, hdl, kind == READ_GATE ? PI2_SLOT_LOADING_GATE : PI2_SLOT_LOADING);
            s->to_read[s->n_to_read] = hdl;
            s->to_read_kind[s->n_to_read++] = (uint8_t)kind;
        }
        if (!hit && !hot && k >= s->admit_limit) pi2_ncache_demote(s->cache, hdl); /* see admit_limit */
        else pi2_ncache_touch(s->cache, hdl, s->step);
        /* A neuron of a cluster this wave is reading is a miss too, like the neuron that asked for it;
         * one of a cluster a prefetch is reading is a hit (that read was not on demand). */
        if (!hit) s->acq_wave[hdl] = s->wave_serial;
        else hit = s->acq_wave[hdl] != s->wave_serial;
        const int st = pi2_ncache_state(s->cache, hdl);
        const int loaded = st == PI2_SLOT_READY || st == PI2_SLOT_GATE;
        if (hot) hit ? s->st.hits_hot++ : s->st.misses_hot++;
        else hit ? s->st.hits_cold++ : s->st.misses_cold++;
        s->wave_k[n] = k;
        s->wave_h[n] = hdl;
        s->phase[n] = 0;
        s->live[n] = 0; /* a neuron whose gate part alone shows it inactive never gets to set it */
        if (loaded) s->ready[atomic_fetch_add(&s->n_ready, 1)] = n;
        else add_waiter(s, hdl, n);
        n++;
        (*pos)++;
    }
    return n;
}

int pi2_sparse_ffn(pi2_sparse *s, int layer, int expert, const float *in, int tokens, float *out) {
    if (atomic_load(&s->failed)) goto failed;
    const uint64_t t0 = pi2_now_ns();
    const int b = layer * s->m->n_ffn_blocks + expert;
    const int64_t F = s->F, E = s->E;
    const pi2_ffn_block *blk = &s->m->layers[layer].ffn[expert];
    s->tokens = tokens;
    pi2_par_prepare(s->pool, (pi2_type)s->m->h.neuron_type, in, E, E, tokens, s->act, s->act_row);
    for (int t = 0; t < tokens; t++) /* every neuron's dots reuse it */
        pi2_pack_act((pi2_type)s->m->h.neuron_type, s->act + (size_t)t * s->act_row, E, s->pact + (size_t)t * s->pact_row);

    /* Which neurons: the predictor's choice, or the truth; for powerinfer2's batches of at least
     * PI2_DENSE_BATCH tokens, every neuron (the paper's prefill is dense). Those come from the resident
     * FFN or a stream of the block when that costs less than reading the missing bundles one by one
     * (sparse_batch.c), else through the waves below: the same floats either way, so the text never
     * depends on the budget or on what the storage probe measured. */
    const int exact = s->cfg.oracle || s->cfg.check_predictor;
    const int dense = s->pipeline && tokens >= PI2_DENSE_BATCH && !exact;
    if (exact) pi2_true_activations(s->pool, s->m, blk, s->act, s->act_row, tokens, s->truth);
    if (s->cfg.oracle) memcpy(s->mask, s->truth, (size_t)tokens * F);
    else if (dense) memset(s->mask, 1, (size_t)tokens * F);
    else pi2_predict(&s->pred, s->pool, b, in, tokens, s->mask);
    if (s->cfg.check_predictor) count_check(s, layer, tokens);
    int n_active = 0;
    for (int64_t k = 0; k < F; k++) {
        uint8_t any = 0;
        for (int t = 0; t < tokens && !any; t++) any |= s->mask[(size_t)t * F + k];
        if (any) s->active[n_active++] = (int32_t)k;
    }
    s->st.neurons_visited += (uint64_t)F * tokens;
    int missing = 0;
    if (dense && !s->block_base)
        for (int64_t k = 0; k < F; k++) missing += pi2_ncache_find(s->cache, b, (int)k) < 0;
    const int stream = s->cfg.prefill_stream > 0 || (s->cfg.prefill_stream == 0 && pi2_sparse_stream_pays(s, missing));
    if (dense && (s->block_base || (s->stage[0] && stream))) {
        s->st.neurons_computed += (uint64_t)F * tokens;
        memset(out, 0, (size_t)tokens * E * sizeof(float));
        s->out = out;
        if (pi2_sparse_dense_batch(s, b) != 0) goto failed;
        s->st.ffn_ns += pi2_now_ns() - t0;
        return 0;
    }
    for (size_t i = 0; i < (size_t)tokens * F; i++) s->st.neurons_computed += s->mask[i];

    memset(out, 0, (size_t)tokens * E * sizeof(float));
    s->out = out;
    for (int pos = 0; pos < n_active;) {
        const int start = pos;
        s->wave_len = build_wave(s, b, n_active, &pos);
        if (s->wave_len == 0) {
            pi2_set_error("neuron cache too small: no slot free for neuron %d of block %d", s->active[start], b);
            return -1;
        }
        atomic_store(&s->pending, s->wave_len);
        atomic_store(&s->next_ticket, 0);
        if (!s->pipeline) {
            /* Read everything first, then compute (bundle, llmflash, cache). */
            for (int r = 0; r < s->n_to_read; r++)
                if (submit(s, s->to_read[r], s->to_read_kind[r]) != 0) goto failed;
            pi2_io_flush(s->io);
            pthread_mutex_lock(&s->lock);
            while (atomic_load(&s->n_ready) < s->wave_len && !atomic_load(&s->failed))
                if (reap(s, 1) == 0 && pi2_io_in_flight(s->io) == 0) break;
            pthread_mutex_unlock(&s->lock);
        }
        pi2_pool_run_or_inline(s->pool, wave_worker, s);
        if (atomic_load(&s->failed)) goto failed;
        pi2_pool_run_or_inline(s->pool, down_worker, s);
        for (int i = 0; i < s->wave_len; i++) pi2_ncache_unpin(s->cache, s->wave_h[i]);
    }
    if (!s->keep) pi2_ncache_drop_all(s->cache);

    s->st.ffn_ns += pi2_now_ns() - t0;
    return 0;
failed:
    pi2_set_error("%s", s->error[0] ? s->error : "neuron read failed");
    return -1;
}

void pi2_sparse_step_end(pi2_sparse *s) {
    s->step++;
    if (s->cfg.policy == PI2_POLICY_LLMFLASH) pi2_ncache_drop_older(s->cache, s->step - s->cfg.llmflash_window);
}

/* ---- stats ------------------------------------------------------------------------------------ */

void pi2_sparse_get_stats(const pi2_sparse *s, pi2_sparse_stats *st) {
    *st = s->st;
    pi2_io_stats io;
    pi2_io_stats_get(s->io, &io);
    st->bytes_read = io.bytes;
    st->reads = io.reads;
    st->io_wait_ns = io.wait_ns;
}

void pi2_sparse_snapshot(const pi2_sparse *s, pi2_sparse_stats *st) {
    if (s) pi2_sparse_get_stats(s, st);
}

void pi2_sparse_summary_json(const pi2_sparse *s, const pi2_sparse_config *cfg, char *buf, size_t n) {
    size_t o = 0;
#define OUT(...) o += (size_t)snprintf(buf + o, o < n ? n - o : 0, __VA_ARGS__)
    OUT(", \"policy\": \"%s\", \"predictor\": \"%s\", \"memory_budget_bytes\": %llu, \"memory_budget_source\": \"%s\"",
        pi2_policy_name(cfg->policy), cfg->oracle ? "oracle" : "model",
        (unsigned long long)(s ? s->cfg.memory_budget : cfg->memory_budget),
        s ? s->budget_source : cfg->memory_budget ? "given" : "none: mmap, the page cache decides");
    if (!s) {
        OUT(", \"io_method\": \"mmap\", \"o_direct\": false");
        return;
    }
    pi2_sparse_stats st;
    pi2_sparse_get_stats(s, &st);
    const pi2_ncache_config *cc = pi2_ncache_cfg(s->cache);
    const uint64_t lookups = st.hits_hot + st.hits_cold + st.misses_hot + st.misses_cold;
    const double io_s = st.io_wait_ns / 1e9, ffn_s = st.ffn_ns / 1e9;
    const double compute_s = ffn_s > io_s ? ffn_s - io_s : 0;
    OUT(", \"io_method\": \"%s\", \"o_direct\": %s, \"storage_bytes_read\": %llu, \"storage_reads\": %llu, "
        "\"cache_bytes\": %llu, \"hot_bytes\": %llu, \"cold_bytes\": %llu, \"fixed_bytes\": %llu, "
        "\"hot_neurons_per_block\": %d, \"cluster\": %d, \"two_phase\": %s, \"pipeline\": %s, \"lookahead\": %s, "
        "\"lookahead_reads\": %llu, "
        "\"hits_hot\": %llu, \"hits_cold\": %llu, \"misses_hot\": %llu, \"misses_cold\": %llu, \"hit_rate\": %.6f, "
        "\"io_wait_s\": %.6f, \"ffn_s\": %.6f, \"compute_s\": %.6f, \"io_share\": %.6f, \"active_fraction\": %.6f, "
        "\"preload_s\": %.6f, \"preload_bytes\": %llu, \"bytes_read_after_load\": %llu, "
        "\"dense_batch_blocks\": %llu, \"streamed_blocks\": %llu, \"probe_rand_reads_per_s\": %.0f, "
        "\"probe_gate_reads_per_s\": %.0f, \"probe_rest_reads_per_s\": %.0f, \"probe_seq_bytes_per_s\": %.0f, "
        "\"two_phase_source\": \"%s\", \"admit_rank\": %d, \"warmed_bundles\": %llu, \"skipped_misses\": %llu",
        pi2_io_method_name(pi2_io_method_used(s->io)), pi2_io_is_direct(s->io) ? "true" : "false",
        (unsigned long long)st.bytes_read, (unsigned long long)st.reads, (unsigned long long)pi2_ncache_bytes(s->cache),
        (unsigned long long)(cc->hot_slots * cc->cluster * cc->stride), (unsigned long long)(cc->cold_slots * cc->stride),
        (unsigned long long)s->fixed_bytes, cc->hot_neurons, cc->cluster, s->two_phase ? "true" : "false",
        s->pipeline ? "true" : "false", s->lookahead ? "true" : "false", (unsigned long long)st.lookahead_reads,
        (unsigned long long)st.hits_hot, (unsigned long long)st.hits_cold,
        (unsigned long long)st.misses_hot, (unsigned long long)st.misses_cold,
        lookups ? (double)(st.hits_hot + st.hits_cold) / lookups : 0.0, io_s, ffn_s, compute_s,
        io_s + compute_s > 0 ? io_s / (io_s + compute_s) : 0.0,
        st.neurons_visited ? (double)st.neurons_computed / st.neurons_visited : 0.0, s->preload_ns / 1e9,
        (unsigned long long)s->preload_bytes, (unsigned long long)(st.bytes_read - s->preload_bytes),
        (unsigned long long)s->dense_blocks, (unsigned long long)s->streamed_blocks, s->rand_reads_per_s,
        s->probe_gate_reads_per_s, s->probe_rest_reads_per_s, s->seq_bytes_per_s,
        cfg->two_phase ? "flag" : s->rand_reads_per_s > 0 ? "storage probe" : "default", s->admit_limit,
        (unsigned long long)s->warmed_bundles, (unsigned long long)s->skipped_misses);
    if (cfg->pred_threshold > 0) OUT(", \"pred_threshold\": %.6f", cfg->pred_threshold);
    if (cfg->check_predictor) {
        const uint64_t tp = st.pred_tp, fp = st.pred_fp, fn = st.pred_fn;
        /* sparsity: the share of (token, neuron) pairs whose output is truly zero */
        OUT(", \"sparsity\": %.6f, \"predictor_recall\": %.6f, \"predictor_precision\": %.6f, \"predictor_layers\": [",
            st.neurons_visited ? 1.0 - (double)(tp + fn) / st.neurons_visited : 0.0,
            tp + fn ? (double)tp / (tp + fn) : 1.0, tp + fp ? (double)tp / (tp + fp) : 1.0);
        for (uint32_t l = 0; l < s->m->h.n_layer; l++) {
            uint64_t a = s->layer_tp[l], f = s->layer_fp[l], m = s->layer_fn[l], seen = s->layer_seen[l];
            OUT("%s{\"layer\": %u, \"sparsity\": %.6f, \"recall\": %.6f, \"precision\": %.6f}", l ? ", " : "", l,
                seen ? 1.0 - (double)(a + m) / seen : 0.0, a + m ? (double)a / (a + m) : 1.0,
                a + f ? (double)a / (a + f) : 1.0);
        }
        OUT("]");
        /* what was computed, not only predicted: truly active neurons --miss-threshold left unread */
        OUT(", \"skipped_active\": %llu, \"effective_recall\": %.6f", (unsigned long long)s->skipped_active,
            tp + fn ? (double)(tp - s->skipped_active) / (tp + fn) : 1.0);
    }
#undef OUT
}

void pi2_sparse_token_json(const pi2_sparse *s, const pi2_sparse_stats *a, const pi2_sparse_stats *b, char *buf,
                           size_t n) {
    if (!s) {
        if (n) buf[0] = 0;
        return;
    }
    const double io = (b->io_wait_ns - a->io_wait_ns) / 1e9, ffn = (b->ffn_ns - a->ffn_ns) / 1e9;
    snprintf(buf, n,
             ", \"bytes_read\": %llu, \"reads\": %llu, \"hits\": %llu, \"misses\": %llu, \"io_wait_s\": %.6f, "
             "\"ffn_s\": %.6f, \"compute_s\": %.6f",
             (unsigned long long)(b->bytes_read - a->bytes_read), (unsigned long long)(b->reads - a->reads),
             (unsigned long long)(b->hits_hot + b->hits_cold - a->hits_hot - a->hits_cold),
             (unsigned long long)(b->misses_hot + b->misses_cold - a->misses_hot - a->misses_cold), io, ffn,
             ffn > io ? ffn - io : 0.0);
}

void pi2_sparse_summary_line(const pi2_sparse *s, const pi2_sparse_config *cfg, char *buf, size_t n) {
    char budget[96] = "no budget";
    if (s && strcmp(s->budget_source, "given"))
        snprintf(budget, sizeof budget, "budget %.0f MiB (%s)", s->cfg.memory_budget / 1048576.0, s->budget_source);
    else if (cfg->memory_budget)
        snprintf(budget, sizeof budget, "budget %.0f MiB", cfg->memory_budget / 1048576.0);
    if (!s) {
        snprintf(buf, n, "policy %s, %s (mmap)", pi2_policy_name(cfg->policy), budget);
        return;
    }
    pi2_sparse_stats st;
    pi2_sparse_get_stats(s, &st);
    const uint64_t hits = st.hits_hot + st.hits_cold, lookups = hits + st.misses_hot + st.misses_cold;
    int o = snprintf(buf, n, "policy %s, %s, cache %.0f MiB, read %.1f MiB from storage (%s%s), hit rate %.1f%%",
                     pi2_policy_name(cfg->policy), budget, pi2_ncache_bytes(s->cache) / 1048576.0, st.bytes_read / 1048576.0,
                     pi2_io_method_name(pi2_io_method_used(s->io)), pi2_io_is_direct(s->io) ? ", O_DIRECT" : ", buffered",
                     lookups ? 100.0 * hits / lookups : 0.0);
    if (cfg->check_predictor && o > 0 && (size_t)o < n) {
        const uint64_t tp = st.pred_tp, fp = st.pred_fp, fn = st.pred_fn;
        snprintf(buf + o, n - (size_t)o, ", predictor recall %.3f precision %.3f", tp + fn ? (double)tp / (tp + fn) : 1.0,
                 tp + fp ? (double)tp / (tp + fp) : 1.0);
    }
}
