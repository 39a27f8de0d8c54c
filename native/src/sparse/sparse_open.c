/* The sparse engine's opening and closing (sparse.h): configuration, scratch, the budget and the cache
 * (sized by sparse_size.c), the preload, the storage probe. The policy's model load is the session's
 * (session.c, pi2_model_load_for). */
#include "sparse.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "neuron_cache.h"
#include "parmat.h"
#include "sparse_internal.h"
#include "sparse_predict.h"
#include "sparse_size.h"

/* ---- configuration --------------------------------------------------------------------------- */

void pi2_sparse_config_default(pi2_sparse_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->policy = PI2_POLICY_DENSE;
    cfg->llmflash_window = PI2_DEFAULT_LLMFLASH_WINDOW;
    cfg->hot_fraction = PI2_DEFAULT_HOT_FRACTION;
    cfg->hot_share = PI2_DEFAULT_HOT_SHARE;
    cfg->cluster = PI2_DEFAULT_CLUSTER;
    cfg->io.queue_depth = PI2_DEFAULT_QUEUE_DEPTH;
}

static const char *policy_names[] = {"dense", "bundle", "llmflash", "cache", "powerinfer2"};

const char *pi2_policy_name(pi2_policy p) { return p <= PI2_POLICY_POWERINFER2 ? policy_names[p] : "?"; }

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
    pi2_sparse_act_rows((pi2_type)s->m->h.neuron_type, s->E, &s->scratch.act_row, &s->scratch.pact_row);
    s->scratch.act = zalloc(B * s->scratch.act_row, &ok);
    if (!(s->scratch.pact = aligned_alloc(64, B * s->scratch.pact_row))) ok = 0;
    s->scratch.mask = zalloc(B * F, &ok);
    if (s->cfg.oracle || s->cfg.check_predictor) s->scratch.truth = zalloc(B * F, &ok);
    s->scratch.active = zalloc(F * sizeof(int32_t), &ok);
    s->scratch.gates = zalloc(F * B * sizeof(float), &ok);
    s->scratch.look_in = zalloc((size_t)s->E * sizeof(float), &ok);
    s->scratch.look_mask = zalloc(F, &ok);
    s->scratch.hv = zalloc(F * B * sizeof(float), &ok);
    s->scratch.live = zalloc(F, &ok);
    if (s->cap_on) s->cap.scores = zalloc(F * sizeof(float), &ok);
    s->wave.k = zalloc(F * sizeof(int32_t), &ok);
    s->wave.h = zalloc(F * sizeof(int64_t), &ok);
    s->wave.phase = zalloc(F, &ok);
    s->wave.wait_next = zalloc(F * sizeof(int32_t), &ok);
    s->wave.ready = zalloc(2 * F * sizeof(int32_t), &ok);
    {
        const size_t chunks = (F + PI2_DOWN_CHUNK - 1) / PI2_DOWN_CHUNK, bytes = chunks * sizeof(struct pi2_down_chunk);
        if ((s->wave.chunk = aligned_alloc(64, bytes))) memset(s->wave.chunk, 0, bytes);
        else ok = 0;
        if (!(s->wave.partial = aligned_alloc(64, chunks * (size_t)s->E * sizeof(float)))) ok = 0;
    }
    {
        const int64_t most = (s->E + PI2_DOWN_SLICE_MIN - 1) / PI2_DOWN_SLICE_MIN;
        const int n = (int)(s->nth < most ? s->nth : most);
        s->wave.n_slices = n;
        /* plain bounds, read-only during the pass: no alignment (aligned_alloc wants a multiple of it) */
        if ((s->wave.down_at = zalloc((size_t)n * sizeof(struct pi2_down_at), &ok)))
            for (int i = 0; i < n; i++) pi2_split_aligned(s->E, PI2_QK, i, n, &s->wave.down_at[i].d0, &s->wave.down_at[i].d1);
    }
    s->wave.to_read = zalloc(F * sizeof(int64_t), &ok);
    s->wave.to_read_kind = zalloc(F, &ok);
    s->block_off = zalloc((size_t)s->n_blocks * sizeof(uint64_t), &ok);
    s->check.layer_tp = zalloc(s->m->h.n_layer * sizeof(uint64_t), &ok);
    s->check.layer_fp = zalloc(s->m->h.n_layer * sizeof(uint64_t), &ok);
    s->check.layer_fn = zalloc(s->m->h.n_layer * sizeof(uint64_t), &ok);
    s->check.layer_seen = zalloc(s->m->h.n_layer * sizeof(uint64_t), &ok);
    s->named.by_block = zalloc((size_t)s->n_blocks * sizeof(uint64_t), &ok);
    return ok ? 0 : -1;
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
    s->batch.block_base = malloc(sizeof(*s->batch.block_base) * (size_t)s->n_blocks);
    s->batch.up_out = malloc(sizeof(float) * (size_t)s->n_batch * (size_t)s->F);
    if (!s->batch.block_base || !s->batch.up_out) {
        pi2_set_error("out of memory for the resident FFN's tables");
        return -1;
    }
    for (int b = 0; b < s->n_blocks; b++)
        s->batch.block_base[b] = pi2_ncache_bundle(s->cache, pi2_ncache_find(s->cache, b, 0), 0);
    s->batch.res_stride = slot;
    return 0;
}

/* pi2_sparse_open up to its sizing: the engine with its predictors, scratch and store, the budget and the
 * cache's split decided (s->size) but no cache yet. NULL + error. */
static pi2_sparse *open_sized(const pi2_model *m, pi2_pool *pool, int n_batch, uint64_t ctx_bytes,
                              const pi2_sparse_config *cfg, pi2_sparse_shape *shape_out) {
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
    s->pool = pool;
    s->cfg = *cfg;
    s->cfg.io.cpus = s->cfg.io.n_cpus ? s->cfg.io_cpus : NULL;
    s->nth = pool ? pi2_pool_size(pool) : 1;
    s->n_batch = n_batch;
    s->n_blocks = (int)h->n_layer * m->n_ffn_blocks;
    s->E = h->n_embd;
    s->F = h->n_ff;
    s->part = h->part_bytes;
    const pi2_policy p = cfg->policy;
    s->keep = p != PI2_POLICY_BUNDLE;
    s->pipeline = p == PI2_POLICY_POWERINFER2;
    /* The submitter is the paper's I/O core: one the compute threads leave free, or the one --io-affinity
     * names. With every usable core computing it only takes CPU from them: 2 cores, 2 threads, 60% of
     * the 8-layer 7B shape, teacher-forced tokens: 13% slower a token than the compute threads issuing
     * (3 pairs alternated; f039ad2, which had no submitter, 5.06 s against 5.90 and 5.17 without it). */
    s->sub.off = cfg->no_io_submitter || (!cfg->io.n_cpus && s->nth >= pi2_usable_cpus());
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
    /* --read-cap: powerinfer2's decode, ranked by the predictor's scores (docs/SPARSE.md) */
    s->cap_on = p == PI2_POLICY_POWERINFER2 && cfg->read_cap != 0 && !cfg->oracle && (s->pred.fc1 || s->pred.gate);
    if (s->cap_on && cfg->read_cap > 0) {
        const int per_token = (int)h->n_layer * (h->n_expert ? (int)h->n_expert_used : 1);
        s->cap.per_block = (cfg->read_cap + per_token - 1) / per_token;
    }
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
    s->ra = align < PI2_MIN_READ_ALIGN ? PI2_MIN_READ_ALIGN : align;
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
    const pi2_sparse_shape shape = pi2_sparse_shape_of(m, s->n_batch, s->ra, pi2_predictors_scratch_bytes(&s->pred),
                                                       pi2_rss_bytes(), ctx_bytes);
    *shape_out = shape;
    if (pi2_sparse_size(cfg, &shape, &s->size) != 0) goto fail;
    const pi2_sparse_sizing *z = &s->size;
    if (!strcmp(z->budget_source, "chosen: 90% of available memory"))
        fprintf(stderr,
                "pi2-engine: no --memory-budget and the model needs %.2f GiB in memory but %.2f GiB is available: "
                "running under a budget of %.2f GiB (90%% of it)\n",
                z->whole_bytes / 1073741824.0, shape.available / 1073741824.0, z->budget / 1073741824.0);
    s->cfg.memory_budget = z->budget;
    s->budget_source = z->budget_source;
    s->fixed_bytes = z->fixed;
    s->batch.stream_n = z->stream_n;
    return s;
fail:
    pi2_sparse_close(s);
    return NULL;
}

int pi2_sparse_measure(const pi2_model *m, pi2_pool *pool, int n_batch, uint64_t ctx_bytes,
                       const pi2_sparse_config *cfg, pi2_sparse_shape *sh, pi2_sparse_sizing *z) {
    memset(sh, 0, sizeof *sh);
    pi2_sparse *s = open_sized(m, pool, n_batch, ctx_bytes, cfg, sh);
    if (s) *z = s->size;
    pi2_sparse_close(s);
    return s ? 0 : -1;
}

pi2_sparse *pi2_sparse_open(const pi2_model *m, pi2_pool *pool, int n_batch, uint64_t ctx_bytes,
                            const pi2_sparse_config *cfg) {
    pi2_sparse_shape shape;
    pi2_sparse *s = open_sized(m, pool, n_batch, ctx_bytes, cfg, &shape);
    if (!s) return NULL;
    const pi2_sparse_sizing *z = &s->size;
    const pi2_policy p = cfg->policy;
    const uint64_t cache_bytes = z->cache_bytes;
    const pi2_ncache_config cc = z->cc;
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
    s->wave.wait_head = malloc(sizeof(int32_t) * (size_t)handles);
    s->wave.acq = calloc((size_t)handles, sizeof(int32_t));
    if (!s->wave.wait_head || !s->wave.acq) {
        pi2_set_error("out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < handles; i++) s->wave.wait_head[i] = -1;
    if (z->whole_resident) {
        if (pi2_sparse_preload(s) != 0) goto fail;
        /* nothing is ever evicted or read again, so decode's waves keep no LRU order and no pins
         * (sparse_ffn.c); llmflash drops by age and bundle after every block, so they do keep them */
        s->resident = p == PI2_POLICY_CACHE || p == PI2_POLICY_POWERINFER2;
        /* the batched path's up dots: within the budget when none was given (it was sized for them) or
         * when what the cache left over holds them */
        const size_t up_bytes = (size_t)s->n_batch * s->F * sizeof(float);
        const uint64_t left = cache_bytes - (uint64_t)cc.cold_slots * cc.cold_bytes;
        if (s->n_batch > 1 && (strcmp(s->budget_source, "given") || left >= up_bytes) && find_resident(s) != 0)
            goto fail;
    }
    if (!s->batch.block_base && s->pipeline) { /* reads will happen: measure what they cost here */
        const uint64_t bytes0 = pi2_sparse_io_bytes(s);
        if (pi2_sparse_probe_storage(s) != 0 || (z->may_stream && pi2_sparse_stream_open(s) != 0)) goto fail;
        /* the paper keeps the hot neurons in memory from the start: decode's first tokens and the first
         * prefill would otherwise read the steady-state cache in random requests, the cold start */
        const uint64_t t0 = pi2_now_ns();
        if (s->batch.stage[0] && !cfg->no_warm && pi2_sparse_warm(s) != 0) goto fail;
        s->preload_ns += pi2_now_ns() - t0;
        s->preload_bytes += pi2_sparse_io_bytes(s) - bytes0;
        /* Two-phase pays where its reads cost less than one whole read (storage bound by bandwidth,
         * the paper's UFS), not where every request costs the same (IOPS-bound disks). */
        if (s->two_phase && cfg->two_phase == 0)
            s->two_phase = pi2_sparse_miss_seconds(s, 1) < pi2_sparse_miss_seconds(s, 0);
    }
    return s;
fail:
    pi2_sparse_close(s);
    return NULL;
}

void pi2_sparse_close(pi2_sparse *s) {
    if (!s) return;
    pi2_submitter_stop(s);
    pi2_io_close(s->io);
    pi2_ncache_free(s->cache);
    free(s->batch.block_base);
    free(s->batch.up_out);
    pi2_sparse_stream_close(s);
    pi2_predictors_free(&s->pred);
    void *ptrs[] = {s->scratch.look_in, s->scratch.look_mask, s->scratch.act, s->scratch.pact, s->scratch.mask, s->scratch.truth, s->scratch.active, s->scratch.hv, s->scratch.live, s->scratch.gates, s->cap.scores, s->wave.k, s->wave.h, s->wave.phase,
                    s->wave.wait_next, s->wave.ready, s->wave.chunk, s->wave.partial, s->wave.down_at, s->wave.to_read, s->wave.to_read_kind, s->block_off, s->check.layer_tp, s->check.layer_fp,
                    s->check.layer_fn, s->check.layer_seen, s->wave.wait_head, s->wave.acq, s->named.by_block};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) free(ptrs[i]);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

