/* PowerInfer-2's online half: the FFN computed from flash within one memory budget.
 *
 * Per FFN block (layer, expert) and batch: the predictor (or the oracle) names the neurons to compute;
 * those in the neuron cache are computed at once while the missing ones are read from the neuron
 * region (bundles: gate row | up row | down column) into cache slots and computed as they arrive.
 * Policies switch the techniques on one by one, so the same binary runs the ablation ladder and the
 * LLM-in-a-Flash baseline:
 *
 *   dense        no sparse engine: mmap the file, compute everything (forward.c alone)
 *   bundle       predictor + one read per active bundle, nothing kept between blocks
 *   llmflash     predictor + bundles + a window cache: neurons used by the last k tokens stay
 *   cache        bundle + the segmented cache (hot clusters, cold neurons, LRU each)
 *   powerinfer2  cache + two-phase reads of cold INT4 bundles + the neuron pipeline (compute cached
 *                neurons while reads fly, no barrier between gate/up and down) + hot-cluster
 *                prefetch of the next layer during attention
 *
 * The budget: fixed region (what the process already holds after loading, the context's KV cache
 * and scratch, this engine's scratch, a margin) + the neuron cache = the budget. */
#ifndef PI2_SPARSE_H
#define PI2_SPARSE_H

#include <stdint.h>
#include <stdio.h>

#include "ffn_backend.h"
#include "model.h"
#include "neuron_io.h"
#include "threadpool.h"

/* The sparse engine's defaults, each stated once: pi2_sparse_config_default (and the open) use them,
 * `capabilities --json` publishes them (session_options.c: pi2_defaults), and the host's planner reads
 * them there instead of restating them. */
#define PI2_DEFAULT_HOT_FRACTION 0.2f
#define PI2_DEFAULT_HOT_SHARE 0.5f
#define PI2_DEFAULT_CLUSTER 32
#define PI2_DEFAULT_LLMFLASH_WINDOW 5
#define PI2_DEFAULT_QUEUE_DEPTH 512 /* reads in flight */
#define PI2_MIN_READ_ALIGN 512      /* direct reads, and cold slots, are rounded to at least this */

typedef enum { PI2_POLICY_DENSE = 0, PI2_POLICY_BUNDLE, PI2_POLICY_LLMFLASH, PI2_POLICY_CACHE,
               PI2_POLICY_POWERINFER2 } pi2_policy;

typedef struct {
    pi2_policy policy;
    uint64_t memory_budget; /* bytes; 0 = none: the whole model resident when it fits (docs/SPARSE.md) */
    int oracle;             /* --predictor oracle: compute the true activations instead of predicting */
    int check_predictor;    /* also compute the true activations and count recall/precision */
    int llmflash_window;    /* tokens */
    float hot_fraction;     /* of each block's bundles (hottest first) */
    float hot_share;        /* of the cache, for the hot region */
    int cluster;            /* bundles per hot cluster */
    int two_phase;          /* powerinfer2: 0 auto (from the storage probe at open), 1 on, -1 off (whole bundles) */
    int prefill_stream;     /* powerinfer2 batches of 8+ tokens: 0 auto = 1 (GEMM over the block's stream), -1 off (the waves) */
    int lru_only;           /* cache, powerinfer2: cold misses always at the MRU end (no insertion by rank) */
    int lookahead;          /* powerinfer2: early reads from the coming layer's predictor (docs/SPARSE.md) */
    int no_warm;            /* powerinfer2 under a budget: no fill of the cache at open (docs/SPARSE.md) */
    int no_io_submitter;    /* powerinfer2: the compute threads issue decode's reads, no thread of their own */
    float pred_threshold;   /* in (0, 1): replaces the model file's per-layer thresholds; 0 = the file's */
    float miss_threshold;   /* decode: cold misses predicted below this probability are not read; 0 = off */
    int read_cap;           /* decode: most cold-miss reads per token; 0 = off, -1 = auto (what compute hides) */
    int no_repack;          /* keep attention and output rows as the file has them (pi2_model_repack) */
    pi2_io_config io;
    int io_cpus[64];
} pi2_sparse_config;

void pi2_sparse_config_default(pi2_sparse_config *cfg);
const char *pi2_policy_name(pi2_policy p);

/* Counters since the engine started (per token: take differences). */
typedef struct {
    uint64_t hits_hot, hits_cold, misses_hot, misses_cold;
    uint64_t bytes_read, reads, io_wait_ns, ffn_ns;
    uint64_t neurons_computed, neurons_visited, lookahead_reads;
    uint64_t pred_tp, pred_fp, pred_fn; /* --check-predictor */
    /* where ffn_ns went (sparse_ffn.c): the predictor, the waves' parallel compute (gate/up dots, and the
     * down pass it overlaps), the down pass left after a wave; the rest of ffn_ns is serial bookkeeping
     * on the calling thread (inputs, the active list, building waves) */
    uint64_t predict_ns, wave_ns, down_ns, waves;
} pi2_sparse_stats;

typedef struct pi2_sparse pi2_sparse;

/* Size the cache from the budget (the process's RSS now plus ctx_bytes, what the forward pass's
 * context has reserved: pi2_ctx_bytes) and open the neuron store, for batches of up to n_batch tokens.
 * NULL + error when the model lacks predictors (unless oracle), the budget cannot hold the fixed
 * region, or the file cannot be read. Attach it to a context with pi2_ctx_set_ffn(ctx,
 * pi2_sparse_backend(s)), and detach before closing. */
pi2_sparse *pi2_sparse_open(const pi2_model *m, pi2_pool *pool, int n_batch, uint64_t ctx_bytes,
                            const pi2_sparse_config *cfg);
void pi2_sparse_close(pi2_sparse *s);

/* The engine as the forward pass's FFN backend (ffn_backend.h): its layer_begin, ffn and step_end. */
const pi2_ffn_backend *pi2_sparse_backend(pi2_sparse *s);

void pi2_sparse_get_stats(const pi2_sparse *s, pi2_sparse_stats *st);

/* ", \"policy\": ..." fields for the summary event (see docs/SPARSE.md); s may be NULL (dense). */
void pi2_sparse_summary_json(const pi2_sparse *s, const pi2_sparse_config *cfg, char *buf, size_t n);
/* ", \"bytes_read\": ..." fields of a token event: what happened between snapshots a and b; "" when
 * s is NULL (dense). */
void pi2_sparse_token_json(const pi2_sparse *s, const pi2_sparse_stats *a, const pi2_sparse_stats *b, char *buf,
                           size_t n);
/* Take a snapshot (no-op when s is NULL). */
void pi2_sparse_snapshot(const pi2_sparse *s, pi2_sparse_stats *st);
/* The `named` event: the decode steps, and the neurons they named, in PI2_RANK_BINS bins of hotness rank (the
 * file keeps each block's neurons hottest first; bin = rank * PI2_RANK_BINS / n_ff) and per block
 * (layer * n_ffn_blocks + expert). The cache holds each block's top ranks and the cold slots go where
 * the traffic is, so these two, not the activations' curve, are what its hit rate follows (the
 * planner reads them: docs/PLAN.md). Written straight to f: a block count has no fixed bound. */
#define PI2_RANK_BINS 64
void pi2_sparse_named_json(const pi2_sparse *s, FILE *f);
/* One human line for stderr ("policy powerinfer2, budget ..."). */
void pi2_sparse_summary_line(const pi2_sparse *s, const pi2_sparse_config *cfg, char *buf, size_t n);

#endif
