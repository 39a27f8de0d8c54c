/* The sparse engine's reads (sparse_internal.h): submitting bundle reads into cache slots, reaping them
 * and releasing the units that wait, the preload of a resident FFN, and the reads started before a
 * layer's attention (hot-cluster prefetch, lookahead). */
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

uint64_t pi2_sparse_io_bytes(const pi2_sparse *s) {
    pi2_io_stats st;
    pi2_io_stats_get(s->io, &st);
    return st.bytes;
}

/* The cache holds every bundle: read the neuron region block by block in large sequential reads and
 * hand each bundle to its slot, so decode starts with everything in memory and never reads again (the
 * model-fits-in-memory case). Slots of the file's stride are read into directly (slots come off the
 * free stack in order, so a chunk's bundles fill contiguous slots); smaller slots (a bundle without its
 * alignment padding) are filled from two staging buffers, one copied out while the next is read. */
int pi2_sparse_preload(pi2_sparse *s) {
    const size_t stride = s->m->h.bundle_stride, slot = pi2_ncache_cfg(s->cache)->cold_bytes;
    const int per_chunk = stride < ((size_t)4 << 20) ? (int)(((size_t)4 << 20) / stride) : 1;
    const size_t chunk = (size_t)per_chunk * stride, align = s->ra > 4096 ? s->ra : 4096;
    const int direct = slot == stride, chunks_per_block = (int)((s->F + per_chunk - 1) / per_chunk);
    const int64_t n_chunks = (int64_t)s->n_blocks * chunks_per_block;
    const uint64_t t0 = pi2_now_ns(), bytes0 = pi2_sparse_io_bytes(s);
    uint8_t *stage[2] = {NULL, NULL};
    if (!direct && (!(stage[0] = aligned_alloc(align, chunk)) || !(stage[1] = aligned_alloc(align, chunk)))) {
        free(stage[0]);
        pi2_set_error("out of memory for the preload's staging buffers");
        return -1;
    }
    int rc = 0;
    int left[2] = {0, 0}; /* chunk c's reads still in flight: left[c & 1] (at most two chunks are) */
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
            if (rc == 0) rc = pi2_io_submit(s->io, s->block_off[b] + (uint64_t)k0 * stride, (size_t)n * stride, dst, (uint64_t)c);
            if (rc == 0) left[c & 1] = 1;
            if (rc == 0) rc = pi2_io_flush(s->io);
        }
        if (rc != 0 || c == 0) continue;
        const int64_t p = c - 1; /* finish chunk p: wait for it (completions come in any order) */
        if ((rc = pi2_sparse_wait_chunk(s, p, left, 2)) != 0) break;
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
    s->preload_bytes = pi2_sparse_io_bytes(s) - bytes0;
    return rc;
}

/* ---- reading ---------------------------------------------------------------------------------- */

static int submit(pi2_sparse *s, int64_t hdl, int kind, int bg) {
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
    if ((bg ? pi2_io_submit_bg : pi2_io_submit)(s->io, off, len, dst, (uint64_t)hdl) != 0) {
        snprintf(s->error, sizeof s->error, "%s", pi2_last_error());
        atomic_store(&s->failed, 1);
        return -1;
    }
    return 0;
}

int pi2_sparse_submit(pi2_sparse *s, int64_t hdl, int kind) { return submit(s, hdl, kind, 0); }
int pi2_sparse_submit_bg(pi2_sparse *s, int64_t hdl, int kind) { return submit(s, hdl, kind, 1); }

/* Called with s->lock held: a read finished; move the slot on and release the units waiting for it. */
static void complete(pi2_sparse *s, int64_t hdl) {
    int st = pi2_ncache_state(s->cache, hdl);
    pi2_ncache_set_state(s->cache, hdl, st == PI2_SLOT_LOADING_GATE ? PI2_SLOT_GATE : PI2_SLOT_READY);
    pi2_ncache_unpin(s->cache, hdl);
    int n = atomic_load_explicit(&s->wave.n_ready, memory_order_relaxed);
    for (int32_t i = s->wave.wait_head[hdl]; i >= 0; i = s->wave.wait_next[i]) s->wave.ready[n++] = i;
    s->wave.wait_head[hdl] = -1;
    atomic_store_explicit(&s->wave.n_ready, n, memory_order_release);
}

/* Harvest finished reads (blocking when wait and reads are in flight). Caller holds s->lock. */
int pi2_sparse_reap(pi2_sparse *s, int wait) {
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

int pi2_sparse_reap_waiting(pi2_sparse *s) {
    uint64_t tags[64];
    const int n = pi2_io_reap(s->io, tags, 64, 1); /* asleep in the kernel without s->lock */
    if (n == 0) return 0; /* nothing in flight */
    pthread_mutex_lock(&s->lock);
    if (n < 0) {
        snprintf(s->error, sizeof s->error, "%s", pi2_last_error());
        atomic_store(&s->failed, 1);
    }
    for (int i = 0; i < n; i++) complete(s, (int64_t)tags[i]);
    pthread_mutex_unlock(&s->lock);
    return n;
}

void pi2_sparse_drain(pi2_sparse *s) {
    pthread_mutex_lock(&s->lock);
    while (pi2_io_in_flight(s->io) > 0 && pi2_sparse_reap(s, 1) >= 0) {}
    pthread_mutex_unlock(&s->lock);
}

/* Hot clusters of the coming layer that are not cached yet: read them while attention runs. */
/* Lookahead (our extension of the hot prefetch): the residual stream before a layer's attention is
 * close to its FFN input after it, so the layer's predictor run on it names most of the neurons the
 * FFN will want. Their missing bundles are read while attention computes; the FFN then finds them in
 * flight or arrived. A wrong guess costs a read and a cold slot. Decode only (one token). */
static void lookahead(pi2_sparse *s, int layer, const float *x) {
    const int b = layer; /* dense models only */
    pi2_rmsnorm(s->scratch.look_in, x, s->m->layers[layer].ffn_norm, s->E, s->m->h.rms_eps);
    pi2_predict(&s->pred, s->pool, b, s->scratch.look_in, 1, s->scratch.look_mask);
    for (int k = 0; k < s->F; k++) {
        if (!s->scratch.look_mask[k] || pi2_ncache_is_hot(s->cache, k) || pi2_ncache_find(s->cache, b, k) >= 0) continue;
        /* Never wait here: a full queue would stall attention, the very time these reads should use. */
        if (pi2_io_in_flight(s->io) >= s->cfg.io.queue_depth - 8) return;
        int64_t hdl = pi2_ncache_acquire(s->cache, b, k);
        if (hdl < 0) return;
        const int kind = s->two_phase ? READ_GATE : READ_FULL;
        pi2_ncache_set_state(s->cache, hdl, kind == READ_GATE ? PI2_SLOT_LOADING_GATE : PI2_SLOT_LOADING);
        pi2_ncache_touch(s->cache, hdl, s->step);
        if (pi2_sparse_submit(s, hdl, kind) != 0) return;
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
            if (pi2_sparse_submit(s, hdl, READ_CLUSTER) != 0) return;
            pi2_ncache_unpin(s->cache, hdl); /* acquire's pin: only the in-flight pin stays */
        }
    }
    pi2_io_flush(s->io);
}


int pi2_sparse_wait_chunk(pi2_sparse *s, int64_t c, int *left, int ring) {
    while (left[c & (ring - 1)] > 0) {
        uint64_t tags[64];
        const int got = pi2_io_reap(s->io, tags, 64, 1);
        if (got < 0) {
            snprintf(s->error, sizeof s->error, "%s", pi2_last_error());
            atomic_store(&s->failed, 1);
            return -1;
        }
        for (int i = 0; i < got; i++) left[tags[i] & (uint64_t)(ring - 1)]--;
    }
    return 0;
}

