/* The sparse engine's sizing: from the memory budget (given, or chosen from what the machine has) and
 * the model's shape, the fixed region, the neuron cache's bytes and their split into hot clusters and
 * cold slots. pi2_sparse_open sizes itself with it, and `pi2-engine size` prints it, so a planner
 * asks the engine instead of copying the arithmetic (docs/SPARSE.md, "The budget"). */
#ifndef PI2_SPARSE_SIZE_H
#define PI2_SPARSE_SIZE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "neuron_cache.h"
#include "threadpool.h"
#include "sparse.h"

/* What sizing reads: the model's shape, and the process as it is when the engine opens. */
typedef struct {
    int64_t E, F;         /* n_embd, n_ff */
    int n_blocks;         /* FFN blocks: layers x (experts or 1) */
    int neuron_type;      /* pi2_type of the bundles */
    uint64_t stride;      /* bundle_stride */
    size_t part;          /* part_bytes: one row of a bundle */
    size_t ra;            /* direct-read alignment (pi2_io_align, at least 512) */
    int n_batch;          /* the context's batch */
    size_t pred_scratch;  /* pi2_predictors_scratch_bytes */
    uint64_t rss;         /* what the process holds now (weights, predictors, tokenizer, ...) */
    uint64_t ctx_bytes;   /* what the context reserved (KV cache and scratch: pi2_ctx_bytes) */
    uint64_t available;   /* pi2_available_memory(): only read when no budget is given */
    const char *available_source; /* "MemAvailable" or "cgroup": which one limits it */
} pi2_sparse_shape;

typedef struct {
    uint64_t budget;
    const char *budget_source; /* "given", "none: whole model resident", "chosen: 90% of available memory" */
    uint64_t rss, ctx_bytes, scratch, margin, fixed; /* fixed = rss + ctx_bytes + scratch + margin */
    uint64_t cache_bytes;      /* budget - fixed - the slots' bookkeeping */
    uint64_t whole_bytes;      /* no budget given: what the whole model in memory takes */
    pi2_ncache_config cc;      /* the split */
    size_t full_len;           /* a bundle's bytes as read (3 parts, rounded up to ra) */
    size_t act_row, pact_row;  /* the engine's activation rows (scratch) */
    int stream_n;              /* bundles per streamed chunk */
    int may_stream;            /* batches may be streamed (powerinfer2): staging counted in scratch */
    int whole_resident;        /* the cache holds every bundle: preloaded at open, never read again */
} pi2_sparse_sizing;

/* The shape of a loaded model (rss, ctx_bytes: measured by the caller; available: read now). */
pi2_sparse_shape pi2_sparse_shape_of(const pi2_model *m, int n_batch, size_t ra, size_t pred_scratch, uint64_t rss,
                                     uint64_t ctx_bytes);
/* 0, or -1 with the engine's one-line error (the budget cannot hold the fixed region, or no bundle). */
int pi2_sparse_size(const pi2_sparse_config *cfg, const pi2_sparse_shape *sh, pi2_sparse_sizing *z);
/* The smallest budget pi2_sparse_size accepts for this shape (cfg's budget ignored). */
uint64_t pi2_sparse_min_budget(const pi2_sparse_config *cfg, const pi2_sparse_shape *sh);

/* sparse_open.c: what pi2_sparse_open would decide for this model, context and config, by the same steps
 * up to the cache (predictors owned, scratch allocated, the process's RSS then): the shape it measured
 * (zeros if it failed before) and the sizing; 0, or -1 with the error open would give. */
int pi2_sparse_measure(const pi2_model *m, pi2_pool *pool, int n_batch, uint64_t ctx_bytes,
                       const pi2_sparse_config *cfg, pi2_sparse_shape *sh, pi2_sparse_sizing *z);

#endif
