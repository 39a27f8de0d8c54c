/* Batches computed densely over every neuron of a block: the paper's prefill (PowerInfer-2 runs it as
 * one big dense cluster, on the NPU on phones). A batch's predicted union is most of the block, so
 * predicting saves little there, and neuron-by-neuron dots read each row once per token where the GEMM
 * reads it once per tile of tokens. ReLU-family neurons that are off add nothing: this is the exact FFN.
 *
 * Two sources of rows:
 *  - resident: the cache holds every bundle in consecutive slots, so a block is one strided matrix;
 *  - streamed (powerinfer2 under a budget): the block comes in chunks of stream_n bundles through a ring
 *    of PI2_STREAM_STAGES staging buffers, each chunk computed while the next ones fill: its bundles the
 *    cache holds are copied, the others read one by one, or the whole chunk is read sequentially when
 *    that costs less (fill_chunk, from the storage curve measured at open on the neuron region itself).
 * Both add neurons in ascending order, each row's dots the same whatever the span, so a streamed batch
 * gives the resident batch's floats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"
#include "parmat.h"
#include "sparse_internal.h"

#define STREAM_TAG (1ull << 63)        /* tags of streamed reads, apart from cache slot handles */

typedef struct {
    pi2_sparse *s;
    const uint8_t *base;
    size_t stride;
    int n;
} span_job;

/* The down columns of the span, each thread owning a slice of the output: every token's live neurons
 * (compact_live's lists) through pi2_axpy_batch, which unpacks a column's slice once for all the
 * tokens that use it, where one axpy per token and neuron unpacked it for each (~13 times in a
 * 128-token batch at 10% live, and the unpack was most of an axpy). Each token's sum runs in neuron
 * order, skipping only exact zeros, which added nothing: the floats are those of one pi2_axpy per
 * non-zero output in neuron order, whatever thread did what. */
static void span_down_worker(void *p, int ith, int nth) {
    const span_job *j = p;
    pi2_sparse *s = j->s;
    const pi2_type wt = (pi2_type)s->m->h.neuron_type;
    int64_t d0, d1;
    pi2_split_aligned(s->E, PI2_QK, ith, nth, &d0, &d1);
    if (d0 >= d1) return;
    const size_t skip = 2 * s->part + pi2_row_size(wt, d0);
    enum { TILE = 256 }; /* tokens per call */
    const int32_t *idx[TILE];
    const float *a[TILE];
    int32_t count[TILE];
    for (int t0 = 0; t0 < s->wave.tokens; t0 += TILE) {
        const int t1 = s->wave.tokens - t0 < TILE ? s->wave.tokens : t0 + TILE;
        for (int t = t0; t < t1; t++) {
            const int32_t *ix = (const int32_t *)(s->batch.up_out + (size_t)t * j->n);
            int32_t c = 0;
            while (c < j->n && ix[c] < j->n) c++; /* the list ends at the end marker n or at n entries */
            idx[t - t0] = ix, a[t - t0] = s->scratch.gates + (size_t)t * j->n, count[t - t0] = c;
        }
        pi2_axpy_batch(wt, d1 - d0, j->base + skip, j->stride, t1 - t0, idx, a, count,
                       s->scratch.out + (size_t)t0 * s->E + d0, s->E);
    }
}

/* The activation over the span's gate and up dots, each token's non-zero outputs moved to the front of
 * its row of `gates` in neuron order, their neuron indices (int32, written over the up dots, which are
 * used by then) at the same places of its row of up_out, a list shorter than the span ending with the
 * index n. A row is compacted in place: entry j is written after entry k >= j was read (memcpy: the
 * int32 stores may not be moved before the float loads of the same places). Rows are split by token
 * over the pool: on the calling thread alone a 111-token batch's 111 x 14336 outputs (a 7B-shaped
 * block) took 3.8 ms a layer while every other thread waited (this VM), ~10% of prefill at 16 threads. */
typedef struct {
    pi2_sparse *s;
    int n;
} compact_job;

static void compact_tokens(void *p, int64_t t0, int64_t t1) {
    const compact_job *j = p;
    pi2_sparse *s = j->s;
    const int n = j->n;
    const uint32_t act = s->m->h.ffn_act;
    for (int64_t t = t0; t < t1; t++) {
        float *h = s->scratch.gates + (size_t)t * n, *u = s->batch.up_out + (size_t)t * n;
        int32_t live = 0;
        for (int32_t k = 0; k < n; k++) {
            const float g = h[k];
            const float o = act == PI2_ACT_SWIGLU || g > 0.0f ? pi2_neuron_output(act, g, u[k]) : 0.0f;
            if (o == 0.0f) continue;
            h[live] = o;
            memcpy(u + live++, &k, sizeof k);
        }
        if (live < n) memcpy(u + live, &n, sizeof n);
    }
}

static void compact_live(pi2_sparse *s, int n) {
    compact_job j = {s, n};
    pi2_pool_run_tokens(s->pool, s->wave.tokens, compact_tokens, &j);
}

/* s->scratch.out[t] += the FFN over neurons [0, n) of a span whose bundle k sits at base + k * stride. */
static void dense_span(pi2_sparse *s, const uint8_t *base, size_t stride, int n) {
    const pi2_type wt = (pi2_type)s->m->h.neuron_type;
    const pi2_mat gate = {.data = base, .type = wt, .rows = n, .cols = s->E, .row_bytes = pi2_row_size(wt, s->E),
                          .stride = stride};
    pi2_mat up = gate;
    up.data += s->part;
    /* one job for the two, as attention's Q/K/V: one packed batch and no barrier between them */
    const pi2_mat *w[2] = {&gate, &up};
    float *y[2] = {s->scratch.gates, s->batch.up_out};
    const int64_t ldy[2] = {n, n};
    pi2_par_matmul_n(s->pool, 2, w, s->scratch.act, s->wave.tokens, y, ldy);
    compact_live(s, n);
    span_job j = {s, base, stride, n};
    pi2_pool_run_or_inline(s->pool, span_down_worker, &j);
}

/* An acquired slot's bytes from src (its neuron's or cluster's streamed bundles), ready and recent. */
static void fill_slot(pi2_sparse *s, int64_t h, const uint8_t *src) {
    size_t bytes;
    int blk, first;
    uint8_t *dst = pi2_ncache_slot_data(s->cache, h, &bytes, &blk, &first);
    memcpy(dst, src, bytes);
    pi2_ncache_set_state(s->cache, h, PI2_SLOT_READY);
    pi2_ncache_touch(s->cache, h, s->step);
    pi2_ncache_unpin(s->cache, h);
}

/* Copy what the cache should hold of streamed bundles [k0, k0 + n) of block b into it: the hot clusters
 * wholly inside the chunk and the cold neurons ranked below admit_limit, where missing. The stream
 * already brought them into memory, so decode starts from the cache it would have built (a cold cache
 * after prefill made the first tokens of each turn slow), at the cost of a copy and no extra read. */
static void warm_from_stream(pi2_sparse *s, int b, int k0, int n, const uint8_t *stage) {
    const pi2_ncache_config *cc = pi2_ncache_cfg(s->cache);
    const size_t stride = s->m->h.bundle_stride;
    const int cl = cc->cluster, end = k0 + n;
    for (int k = (k0 + cl - 1) / cl * cl; k < cc->hot_neurons && k < end; k += cl) {
        const int last = k + cl < s->F ? k + cl : (int)s->F;
        if (last > end || pi2_ncache_find(s->cache, b, k) >= 0) continue;
        const int64_t h = pi2_ncache_acquire(s->cache, b, k);
        if (h < 0) continue;
        fill_slot(s, h, stage + (size_t)(k - k0) * stride);
        s->batch.warmed_bundles += (uint64_t)(last - k);
    }
    const int lo = k0 > cc->hot_neurons ? k0 : cc->hot_neurons, hi = end < s->admit_limit ? end : s->admit_limit;
    for (int k = lo; k < hi; k++) {
        if (pi2_ncache_find(s->cache, b, k) >= 0) continue;
        const int64_t h = pi2_ncache_acquire(s->cache, b, k);
        if (h < 0) continue;
        fill_slot(s, h, stage + (size_t)(k - k0) * stride);
        s->batch.warmed_bundles++;
    }
}

/* Chunk [k0, k0 + n) of block b into stage: bundles the cache holds whole (READY: a hot cluster, or a
 * cold neuron read whole or in both phases) are copied from their slots, the others read one by one,
 * when those reads cost less than reading the chunk in one go (the rates the probe measured at open);
 * else the whole chunk is read. A later turn's prefill finds the hot set and the cold neurons the
 * cache kept, so it reads only what the cache lacks. Returns the reads submitted (0: the chunk is in
 * stage already), or -1. */
static int fill_chunk(pi2_sparse *s, int b, int k0, int n, uint8_t *stage, uint64_t tag) {
    const size_t stride = s->m->h.bundle_stride;
    int missing = 0;
    for (int k = k0; k < k0 + n; k++) {
        const int64_t h = pi2_ncache_find(s->cache, b, k);
        missing += h < 0 || pi2_ncache_state(s->cache, h) != PI2_SLOT_READY;
    }
    const double t_seq = (double)n * stride / s->batch.seq_bytes_per_s;
    if (missing < n && s->batch.rand_reads_per_s > 0 && missing / s->batch.rand_reads_per_s < t_seq) {
        int reads = 0;
        for (int k = k0; k < k0 + n; k++) {
            uint8_t *dst = stage + (size_t)(k - k0) * stride;
            const int64_t h = pi2_ncache_find(s->cache, b, k);
            if (h >= 0 && pi2_ncache_state(s->cache, h) == PI2_SLOT_READY) {
                memcpy(dst, pi2_ncache_bundle(s->cache, h, k), s->full_len);
                pi2_ncache_touch(s->cache, h, s->step);
                s->batch.cached_bundles++;
                continue;
            }
            if (pi2_io_submit(s->io, s->block_off[b] + (uint64_t)k * stride, s->full_len, dst, tag) != 0) return -1;
            reads++;
        }
        return pi2_io_flush(s->io) != 0 ? -1 : reads;
    }
    if (pi2_io_submit(s->io, s->block_off[b] + (uint64_t)k0 * stride, (size_t)n * stride, stage, tag) != 0 ||
        pi2_io_flush(s->io) != 0)
        return -1;
    return 1;
}

/* A stream of n_chunks chunks through the ring of PI2_STREAM_STAGES staging buffers: fill(c) starts chunk
 * c into its buffer (the reads it submitted, 0 when the chunk is there already, -1 on an error), use(d)
 * takes chunk d once its reads have arrived, while up to PI2_STREAM_STAGES - 1 later chunks fill. On an
 * error the reads still in flight are collected before returning -1 (the error names the read). */
typedef struct {
    int (*fill)(pi2_sparse *s, int c, uint8_t *stage, uint64_t tag, void *ctx);
    void (*use)(pi2_sparse *s, int d, const uint8_t *stage, void *ctx);
    void *ctx;
} stream_ops;

static int stream_ring(pi2_sparse *s, int n_chunks, const stream_ops *ops) {
    const int R = PI2_STREAM_STAGES;
    int left[PI2_STREAM_STAGES] = {0};
    for (int c = 0; c < n_chunks + R - 1; c++) {
        if (c < n_chunks && (left[c % R] = ops->fill(s, c, s->batch.stage[c % R], STREAM_TAG | (uint64_t)c, ops->ctx)) < 0) {
            snprintf(s->error, sizeof s->error, "%s", pi2_last_error());
            atomic_store(&s->failed, 1);
            goto failed;
        }
        const int d = c - (R - 1); /* the oldest chunk in the ring */
        if (d < 0) continue;
        if (pi2_sparse_wait_chunk(s, d, left, R) != 0) goto failed;
        ops->use(s, d, s->batch.stage[d % R], ops->ctx);
    }
    return 0;
failed:
    for (uint64_t tags[4]; pi2_io_in_flight(s->io) > 0;) pi2_io_reap(s->io, tags, 4, 1);
    return -1;
}

/* A dense batch's chunk c of block *(int *)ctx: from the cache, single reads or one read (fill_chunk),
 * then through the GEMM and, what the cache should keep of it, into the cache. */
static int batch_fill(pi2_sparse *s, int c, uint8_t *stage, uint64_t tag, void *ctx) {
    const int per = s->batch.stream_n, n = s->F - (int64_t)c * per < per ? (int)(s->F - (int64_t)c * per) : per;
    return fill_chunk(s, *(const int *)ctx, c * per, n, stage, tag);
}

static void batch_use(pi2_sparse *s, int d, const uint8_t *stage, void *ctx) {
    const int per = s->batch.stream_n, n = s->F - (int64_t)d * per < per ? (int)(s->F - (int64_t)d * per) : per;
    dense_span(s, stage, s->m->h.bundle_stride, n);
    warm_from_stream(s, *(const int *)ctx, d * per, n, stage);
}

int pi2_sparse_dense_batch(pi2_sparse *s, int b) {
    if (s->batch.block_base) {
        dense_span(s, s->batch.block_base[b], s->batch.res_stride, (int)s->F);
        s->batch.dense_blocks++;
        return 0;
    }
    pi2_sparse_drain(s); /* prefetched clusters land in the cache; then only streamed reads fly */
    if (atomic_load(&s->failed)) return -1;
    const stream_ops ops = {batch_fill, batch_use, &b};
    if (stream_ring(s, (int)((s->F + s->batch.stream_n - 1) / s->batch.stream_n), &ops) != 0) return -1;
    s->batch.streamed_blocks++;
    return 0;
}

/* The open's fill: chunk c of every block's first admit_limit bundles, read in one go, into the cache. */
static int warm_chunk(const pi2_sparse *s, int c, int *b, int *k0) {
    const int per = s->batch.stream_n, per_block = (s->admit_limit + per - 1) / per;
    *b = c / per_block;
    *k0 = c % per_block * per;
    return s->admit_limit - *k0 < per ? s->admit_limit - *k0 : per;
}

static int warm_fill(pi2_sparse *s, int c, uint8_t *stage, uint64_t tag, void *ctx) {
    (void)ctx;
    int b, k0;
    const int n = warm_chunk(s, c, &b, &k0);
    const size_t stride = s->m->h.bundle_stride;
    if (pi2_io_submit(s->io, s->block_off[b] + (uint64_t)k0 * stride, (size_t)n * stride, stage, tag) != 0 ||
        pi2_io_flush(s->io) != 0)
        return -1;
    return 1;
}

static void warm_use(pi2_sparse *s, int d, const uint8_t *stage, void *ctx) {
    (void)ctx;
    int b, k0;
    const int n = warm_chunk(s, d, &b, &k0);
    warm_from_stream(s, b, k0, n, stage);
}

/* The cache at open as the steady state keeps it: every block's hot clusters and its cold neurons ranked
 * below admit_limit, read in the stream's large sequential chunks and handed to their slots. PowerInfer-2
 * keeps its hot neurons in memory from the start; an empty cache instead fills through a decode's random
 * misses (on the 47B shape at 19 GiB the hit rate took ~32 tokens to climb from 0.87 to 0.98) and the
 * first prefill streams whole blocks. */
int pi2_sparse_warm(pi2_sparse *s) {
    const int per = s->batch.stream_n, per_block = (s->admit_limit + per - 1) / per;
    const stream_ops ops = {warm_fill, warm_use, NULL};
    return stream_ring(s, s->n_blocks * per_block, &ops);
}

/* Seconds to read n extents of len bytes at offs[] into dst (one after another in memory), all at once. */
static double timed_reads(pi2_sparse *s, const uint64_t *offs, int n, size_t len, uint8_t *dst) {
    const uint64_t t0 = pi2_now_ns();
    for (int i = 0; i < n; i++)
        if (pi2_io_submit(s->io, offs[i], len, dst + (size_t)i * len, STREAM_TAG | (uint64_t)i) != 0) return -1;
    if (pi2_io_flush(s->io) != 0) return -1;
    int done = 0;
    while (done < n) {
        uint64_t tags[64];
        const int got = pi2_io_reap(s->io, tags, 64, 1);
        if (got < 0) return -1;
        done += got;
    }
    return (pi2_now_ns() - t0) / 1e9;
}

int pi2_sparse_stream_open(pi2_sparse *s) {
    const size_t chunk = (size_t)s->batch.stream_n * s->m->h.bundle_stride, align = s->ra > 4096 ? s->ra : 4096;
    const size_t bytes = (chunk + align - 1) / align * align;
    for (int i = 0; i < PI2_STREAM_STAGES; i++)
        if (!(s->batch.stage[i] = aligned_alloc(align, bytes))) goto oom;
    if ((s->batch.up_out = malloc((size_t)s->n_batch * s->batch.stream_n * sizeof(float)))) return 0;
oom:
    pi2_set_error("out of memory for the streamed prefill's staging buffers");
    return -1;
}

/* Reads per second of `n` random extents of `len` bytes (at offset `skip` into bundles spread over the
 * whole neuron region, as a wave's misses are; `seed` picks them), all in flight at once; -1 on a
 * failed read. */
static double random_rate(pi2_sparse *s, int n, size_t skip, size_t len, uint8_t *buf, uint64_t seed) {
    const int64_t bundles = (int64_t)s->n_blocks * s->F;
    uint64_t offs[128], x = 0x9e3779b97f4a7c15ull ^ (seed * 0xbf58476d1ce4e5b9ull);
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t k = (int64_t)((x >> 17) % (uint64_t)bundles);
        offs[i] = s->block_off[k / s->F] + (uint64_t)(k % s->F) * s->m->h.bundle_stride + skip;
    }
    const double t = timed_reads(s, offs, n, len, buf);
    return t < 0 ? -1 : n / (t > 1e-6 ? t : 1e-6);
}

double pi2_sparse_miss_seconds(const pi2_sparse *s, int two_phase) {
    const double whole = s->batch.rand_reads_per_s, g = s->batch.probe_gate_reads_per_s,
                 r = s->batch.probe_rest_reads_per_s;
    if (two_phase && g > 0 && r > 0) return 1.0 / g + 0.5 / r;
    return whole > 0 ? 1.0 / whole : 0;
}

int pi2_sparse_probe_storage(pi2_sparse *s) {
    const size_t stride = s->m->h.bundle_stride, chunk = (size_t)s->batch.stream_n * stride;
    const size_t align = s->ra > 4096 ? s->ra : 4096, bytes = (128 * s->full_len > chunk ? 128 * s->full_len : chunk);
    uint8_t *buf = aligned_alloc(align, (bytes + align - 1) / align * align);
    if (!buf) {
        pi2_set_error("out of memory for the storage probe");
        return -1;
    }
    /* whole bundles, two-phase's gate part and rest at random, each twice in the order full, gate, rest,
     * rest, gate, full (fresh extents each time), keeping each one's faster rate: the first requests
     * after open run slower, and measured once in a fixed order they made whole bundles look dearer
     * than they are and chose two-phase against the device's own curve. Then whole chunks one after
     * another, as a stream reads them (the last block's first two). */
    const size_t off[3] = {0, 0, s->rest_off}, len3[3] = {s->full_len, s->gate_len, s->rest_len};
    double rate[3] = {0, 0, 0};
    for (int r = 0; r < 6; r++) {
        const int k = r < 3 ? r : 5 - r;
        const double v = random_rate(s, 128, off[k], len3[k], buf, (uint64_t)r + 1);
        rate[k] = v < 0 || rate[k] < 0 ? -1 : v > rate[k] ? v : rate[k];
    }
    s->batch.rand_reads_per_s = rate[0];
    s->batch.probe_gate_reads_per_s = rate[1];
    s->batch.probe_rest_reads_per_s = rate[2];
    const uint64_t b = (uint64_t)s->n_blocks - 1;
    const size_t len = s->F > s->batch.stream_n ? chunk : (size_t)s->F * stride;
    const uint64_t offs[2] = {s->block_off[b], s->block_off[b] + chunk};
    const double t = timed_reads(s, offs, 1, len, buf) + (s->F > s->batch.stream_n ? timed_reads(s, offs + 1, 1, len, buf) : 0);
    free(buf);
    if (s->batch.rand_reads_per_s < 0 || s->batch.probe_gate_reads_per_s < 0 || s->batch.probe_rest_reads_per_s < 0 || t < 0)
        return -1; /* the failed read's error names the file, offset and why */
    s->batch.seq_bytes_per_s = (double)(s->F > s->batch.stream_n ? 2 : 1) * len / (t > 1e-6 ? t : 1e-6);
    return 0;
}

void pi2_sparse_stream_close(pi2_sparse *s) {
    for (int i = 0; i < PI2_STREAM_STAGES; i++) {
        free(s->batch.stage[i]);
        s->batch.stage[i] = NULL;
    }
}
