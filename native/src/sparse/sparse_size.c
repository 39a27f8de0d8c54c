/* The sparse engine's sizing (sparse_size.h): budget, fixed region, cache split. */
#include "sparse_size.h"

#include <string.h>

#include "common.h"
#include "kernels.h"
#include "sparse_internal.h"

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

void pi2_sparse_act_rows(pi2_type wt, int64_t E, size_t *act_row, size_t *pact_row) {
    *act_row = pi2_row_size(pi2_act_type(wt), E);
    *pact_row = (pi2_packed_act_size(wt, E) + 63) / 64 * 64;
}

pi2_sparse_shape pi2_sparse_shape_of(const pi2_model *m, int n_batch, size_t ra, size_t pred_scratch, uint64_t rss,
                                     uint64_t ctx_bytes) {
    const pi2_header *h = &m->h;
    pi2_sparse_shape sh = {
        .E = h->n_embd, .F = h->n_ff, .n_blocks = (int)h->n_layer * m->n_ffn_blocks, .neuron_type = (int)h->neuron_type,
        .stride = h->bundle_stride, .part = h->part_bytes, .ra = ra, .n_batch = n_batch, .pred_scratch = pred_scratch,
        .rss = rss, .ctx_bytes = ctx_bytes,
    };
    sh.available = pi2_available_memory(&sh.available_source);
    return sh;
}

/* Bundles per streamed chunk: PI2_STREAM_CHUNK, or less under a small budget (the staged chunks take at
 * most 1/32 of it), in whole hot clusters (the stream warms the cache cluster by cluster). */
static int stream_bundles(const pi2_sparse_config *cfg, const pi2_sparse_shape *sh) {
    const uint64_t small = cfg->memory_budget / (32 * PI2_STREAM_STAGES);
    const uint64_t chunk = cfg->memory_budget && small < PI2_STREAM_CHUNK ? small : PI2_STREAM_CHUNK;
    int n = chunk > sh->stride ? (int)(chunk / sh->stride) : 1;
    if (n > sh->F) n = (int)sh->F;
    const int cl = cfg->cluster < sh->F ? cfg->cluster : (int)sh->F;
    if (n >= cl) n -= n % cl;
    return n;
}

size_t pi2_sparse_stream_bytes(int stream_n, size_t stride, int n_batch) {
    return PI2_STREAM_STAGES * (size_t)stream_n * stride + (size_t)n_batch * stream_n * sizeof(float);
}

/* What the engine allocates for itself at open (pi2_sparse_open's alloc_scratch and the stream). */
static uint64_t scratch_bytes(const pi2_sparse_config *cfg, const pi2_sparse_shape *sh, const pi2_sparse_sizing *z) {
    const size_t B = (size_t)sh->n_batch, F = (size_t)sh->F;
    const size_t truth = cfg->oracle || cfg->check_predictor ? B * F : 0;
    const size_t cap = cfg->read_cap && cfg->policy == PI2_POLICY_POWERINFER2 ? F * 4 : 0; /* read cap's scores */
    const size_t chunks = (F + PI2_DOWN_CHUNK - 1) / PI2_DOWN_CHUNK; /* decode's down pass: partials + counters */
    const size_t down = chunks * ((size_t)sh->E * sizeof(float) + sizeof(struct pi2_down_chunk));
    return B * (z->act_row + z->pact_row) + B * F + truth + cap + 2 * F * B * 4 + F * (4 + 8 + 1 + 1 + 4 + 8 + 8) + down +
           sh->pred_scratch + (z->may_stream ? pi2_sparse_stream_bytes(z->stream_n, sh->stride, sh->n_batch) : 0);
}

/* No --memory-budget: the model in memory when it fits, else a budget the machine can hold.
 * Fits means the fixed region, every bundle and the cache's bookkeeping take at most 90% of the memory
 * this process can still have (pi2_available_memory_bytes): then the budget is exactly that, so the
 * cache holds the whole FFN, preloads it and never reads again. Otherwise the budget is 90% of the
 * available memory (pi2_sparse_open says so in one line): a run that would be killed or thrash becomes
 * a run under a budget, reported as chosen. */
static void budget_for(const pi2_sparse_shape *sh, pi2_sparse_sizing *z, uint64_t fixed_now) {
    const uint64_t ffn_bytes = (uint64_t)sh->n_blocks * sh->F * z->full_len;
    /* the cache pays 48 bytes of bookkeeping per slot out of its bytes */
    const uint64_t cache = ffn_bytes / (z->full_len - 48) * z->full_len + z->full_len;
    const uint64_t up_out = sh->n_batch > 1 ? (uint64_t)sh->n_batch * (uint64_t)sh->F * sizeof(float) : 0;
    const uint64_t whole = fixed_now + cache + up_out, avail = sh->available;
    /* the margin is 4 MiB + 1% of the budget: solve budget = whole + 4 MiB + budget / 100 */
    z->whole_bytes = (whole + (4u << 20)) / 99 * 100 + 100;
    if (!avail || z->whole_bytes <= avail / 10 * 9) {
        z->budget = z->whole_bytes;
        z->budget_source = "none: whole model resident";
    } else {
        z->budget = avail / 10 * 9;
        z->budget_source = "chosen: 90% of available memory";
    }
}

/* How the cache's bytes split into regions for this policy; 0 or -1 with an error. */
static int size_cache(const pi2_sparse_config *cfg, const pi2_sparse_shape *sh, uint64_t cache_bytes, size_t full_len,
                      pi2_ncache_config *cc) {
    const int64_t F = sh->F;
    memset(cc, 0, sizeof *cc);
    cc->n_blocks = sh->n_blocks;
    cc->n_ff = (int)F;
    cc->stride = sh->stride;
    /* A cold slot holds a bundle's data without the file's alignment padding (6912 of 8192 bytes
     * for a 7B Q4_0 model: 15% more neurons per byte); clusters keep the file's layout. */
    cc->cold_bytes = full_len;
    cc->cluster = cfg->cluster < (int)F ? cfg->cluster : (int)F;
    const int64_t total_bundles = (int64_t)sh->n_blocks * F;
    int64_t slots = (int64_t)(cache_bytes / cc->cold_bytes);
    if (slots > total_bundles) slots = total_bundles; /* the whole FFN fits: no more is useful */
    const pi2_policy p = cfg->policy;
    if (slots == total_bundles && p != PI2_POLICY_BUNDLE && p != PI2_POLICY_LLMFLASH) {
        /* The whole FFN fits: one region, loaded up front (preload), nothing to evict or split. */
        cc->cold_slots = slots;
        return 0;
    }
    if (p == PI2_POLICY_CACHE || p == PI2_POLICY_POWERINFER2) {
        int hot = (int)round_up((size_t)(cfg->hot_fraction * (float)F + 0.5f), (size_t)cc->cluster);
        cc->hot_neurons = hot > F ? (int)F : hot;
        int64_t clusters_per_block = (cc->hot_neurons + cc->cluster - 1) / cc->cluster;
        int64_t hot_slots = (int64_t)((double)cache_bytes * cfg->hot_share / (double)(cc->cluster * cc->stride));
        /* Layers come round in a cycle, so an LRU region smaller than the hot set of all blocks would
         * evict every cluster just before its next use. Shrink the hot set to what fits instead. */
        int64_t fit = hot_slots / sh->n_blocks;
        if (fit < clusters_per_block) {
            clusters_per_block = fit;
            cc->hot_neurons = (int)(fit * cc->cluster);
        }
        cc->hot_slots = clusters_per_block * sh->n_blocks;
        cc->cold_slots = (int64_t)((cache_bytes - (uint64_t)cc->hot_slots * cc->cluster * cc->stride) / cc->cold_bytes);
        int64_t cold_neurons = (int64_t)sh->n_blocks * (F - cc->hot_neurons);
        if (cc->cold_slots > cold_neurons) cc->cold_slots = cold_neurons;
        if (!cc->hot_slots) cc->hot_neurons = 0; /* no room for clusters: every neuron is cold */
        if (!cc->hot_neurons) cc->cold_slots = slots;
    } else if (p == PI2_POLICY_BUNDLE) {
        /* No cache, only a staging area for one block's active bundles (computed in waves if smaller). */
        cc->cold_slots = slots < F ? slots : F;
    } else {
        cc->cold_slots = slots;
    }
    if (cc->cold_slots + cc->hot_slots < 1) {
        pi2_set_error("the memory budget leaves no room for even one neuron bundle");
        return -1;
    }
    return 0;
}

int pi2_sparse_size(const pi2_sparse_config *cfg, const pi2_sparse_shape *sh, pi2_sparse_sizing *z) {
    memset(z, 0, sizeof *z);
    const pi2_type wt = (pi2_type)sh->neuron_type;
    pi2_sparse_act_rows(wt, sh->E, &z->act_row, &z->pact_row);
    z->full_len = round_up(3 * sh->part, sh->ra);
    z->stream_n = stream_bundles(cfg, sh);
    /* batches may be streamed (sparse_batch.c): powerinfer2, exact neurons not asked for */
    z->may_stream = cfg->policy == PI2_POLICY_POWERINFER2 && sh->n_batch >= PI2_DENSE_BATCH && !cfg->oracle &&
                    !cfg->check_predictor && cfg->prefill_stream >= 0;
    /* The fixed region: everything the process holds now, what the context reserved but has not
     * touched yet (KV cache), the engine's scratch, and a margin for the allocator, stacks and I/O rings. */
    z->rss = sh->rss;
    z->ctx_bytes = sh->ctx_bytes;
    z->scratch = scratch_bytes(cfg, sh, z);
    z->budget = cfg->memory_budget;
    z->budget_source = "given";
    if (!cfg->memory_budget) budget_for(sh, z, z->rss + z->ctx_bytes + z->scratch);
    z->margin = (4u << 20) + (z->budget / 100);
    z->fixed = z->rss + z->ctx_bytes + z->scratch + z->margin;
    if (z->budget <= z->fixed) {
        pi2_set_error("--memory-budget %.1f MiB is too small: the fixed region needs %.1f MiB before any neuron is "
                      "cached (resident now %.1f, context and KV cache %.1f, scratch %.1f, margin %.1f MiB)",
                      z->budget / 1048576.0, z->fixed / 1048576.0, z->rss / 1048576.0, z->ctx_bytes / 1048576.0,
                      z->scratch / 1048576.0, z->margin / 1048576.0);
        return -1;
    }
    z->cache_bytes = z->budget - z->fixed;
    /* Each region's slots come with bookkeeping (~40 bytes a slot): pay it out of the same budget. */
    z->cache_bytes -= z->cache_bytes / z->full_len * 48;
    if (size_cache(cfg, sh, z->cache_bytes, z->full_len, &z->cc) != 0) return -1;
    z->whole_resident = z->cc.cold_slots == (int64_t)sh->n_blocks * sh->F && cfg->policy != PI2_POLICY_BUNDLE &&
                        cfg->policy != PI2_POLICY_LLMFLASH;
    return 0;
}

uint64_t pi2_sparse_min_budget(const pi2_sparse_config *cfg, const pi2_sparse_shape *sh) {
    pi2_sparse_config c = *cfg;
    pi2_sparse_sizing z;
    uint64_t lo = 0, hi = 1u << 20; /* lo fails, hi succeeds */
    for (c.memory_budget = hi; pi2_sparse_size(&c, sh, &z) != 0; c.memory_budget = hi) {
        lo = hi;
        if (hi >= PI2_SIZE_MAX) return 0;
        hi *= 2;
    }
    while (hi - lo > 1) {
        c.memory_budget = lo + (hi - lo) / 2;
        if (pi2_sparse_size(&c, sh, &z) == 0) hi = c.memory_budget;
        else lo = c.memory_budget;
    }
    return hi;
}
