/* The sparse engine's FFN of one block (the forward pass's FFN backend): the predicted neurons in waves,
 * computed from the cache while the missing ones are read, then the down pass. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "neuron_cache.h"
#include "parmat.h"
#include "sparse_internal.h"
#include "sparse_predict.h"

static void add_waiter(pi2_sparse *s, int64_t hdl, int unit) {
    s->wave.wait_next[unit] = s->wave.wait_head[hdl];
    s->wave.wait_head[hdl] = unit;
}

/* ---- computing one neuron -------------------------------------------------------------------- */

/* Unit i: neuron wave_k[i] for every token whose mask asks for it. Returns 1 when the unit needs a
 * second read (two-phase: a gate came out positive and only the gate part is in memory). */
static int compute_unit(pi2_sparse *s, int i) {
    const pi2_type wt = (pi2_type)s->m->h.neuron_type;
    const uint32_t act = s->m->h.ffn_act;
    const int k = s->wave.k[i];
    const int64_t hdl = s->wave.h[i];
    const uint8_t *bundle = pi2_ncache_bundle(s->cache, hdl, k);
    const int gate_only = pi2_ncache_state(s->cache, hdl) == PI2_SLOT_GATE;
    float *gates = s->scratch.gates + (size_t)i * s->n_batch;
    if (gate_only) { /* phase one: gates, and whether any token needs the rest */
        int need = 0;
        for (int t = 0; t < s->wave.tokens; t++) {
            if (!s->scratch.mask[(size_t)t * s->F + k]) continue;
            gates[t] = pi2_vec_dot_packed(wt, s->E, bundle, s->scratch.pact + (size_t)t * s->scratch.pact_row);
            need |= gates[t] > 0.0f;
        }
        return need;
    }
    float *hv = s->scratch.hv + (size_t)i * s->n_batch;
    uint8_t live = 0;
    for (int t = 0; t < s->wave.tokens; t++) {
        hv[t] = 0.0f;
        if (!s->scratch.mask[(size_t)t * s->F + k]) continue;
        const uint8_t *a = s->scratch.pact + (size_t)t * s->scratch.pact_row;
        const float g = s->wave.phase[i] ? gates[t] : pi2_vec_dot_packed(wt, s->E, bundle, a);
        if (act == PI2_ACT_SWIGLU || g > 0.0f)
            hv[t] = pi2_neuron_output(act, g, pi2_vec_dot_packed(wt, s->E, bundle + s->part, a));
        live |= hv[t] != 0.0f;
    }
    s->scratch.live[i] = live;
    return 0;
}

/* The row unit i reads first: its up row where its gate is known (phase two), else its gate row. */
static const uint8_t *first_row(const pi2_sparse *s, int i) {
    return pi2_ncache_bundle(s->cache, s->wave.h[i], s->wave.k[i]) + (s->wave.phase[i] ? s->part : 0);
}

/* Units units[0..cnt) (cnt <= 4) for a single token, their rows through the activation together
 * (pi2_vec_dot_packed_rows: the same floats as compute_unit's one-at-a-time dots, so results do not
 * depend on how units were grouped). rest[j] = 1 where compute_unit would have returned 1. next[0..n_next):
 * the rows this thread reads after these, asked for while these compute (pi2_ahead). */
static void compute_units_1tok(pi2_sparse *s, const int *units, int cnt, uint8_t *rest, const uint8_t *const *next,
                               int n_next) {
    const pi2_type wt = (pi2_type)s->m->h.neuron_type;
    const uint32_t act = s->m->h.ffn_act;
    const uint8_t *bundle[4], *rows[4];
    float g[4], y[4];
    int gate_only[4], pick[4], n = 0;
    for (int j = 0; j < cnt; j++) {
        const int i = units[j];
        bundle[j] = pi2_ncache_bundle(s->cache, s->wave.h[i], s->wave.k[i]);
        gate_only[j] = pi2_ncache_state(s->cache, s->wave.h[i]) == PI2_SLOT_GATE;
        rest[j] = 0;
        if (s->wave.phase[i]) g[j] = s->scratch.gates[(size_t)i * s->n_batch];
        else rows[n] = bundle[j], pick[n++] = j;
    }
    pi2_ahead ahead;
    pi2_ahead_init(&ahead, next, n_next, s->part);
    if (n) pi2_vec_dot_packed_rows(wt, s->E, rows, n, s->scratch.pact, y, &ahead);
    for (int q = 0; q < n; q++) g[pick[q]] = y[q];
    n = 0;
    for (int j = 0; j < cnt; j++) {
        const int i = units[j];
        if (gate_only[j]) { /* phase one: keep the gate; the rest is read only if it is positive */
            s->scratch.gates[(size_t)i * s->n_batch] = g[j];
            rest[j] = g[j] > 0.0f;
            continue;
        }
        s->scratch.hv[(size_t)i * s->n_batch] = 0.0f;
        s->scratch.live[i] = 0;
        if (act == PI2_ACT_SWIGLU || g[j] > 0.0f) rows[n] = bundle[j] + s->part, pick[n++] = j;
    }
    if (n) pi2_vec_dot_packed_rows(wt, s->E, rows, n, s->scratch.pact, y, &ahead);
    for (int q = 0; q < n; q++) {
        const int j = pick[q], i = units[j];
        const float h = pi2_neuron_output(act, g[j], y[q]);
        s->scratch.hv[(size_t)i * s->n_batch] = h;
        s->scratch.live[i] = h != 0.0f;
    }
}

/* ---- decode's down pass (PI2_DOWN_CHUNK in sparse_internal.h) ---------------------------------- */

static int n_chunks(int len) { return (len + PI2_DOWN_CHUNK - 1) / PI2_DOWN_CHUNK; }

/* Every unit of chunk c is computed: sum its live units' down columns into the chunk's partial, in unit
 * order, four columns a kernel call, each call asking for the next four's lines as it goes (pi2_ahead:
 * the columns sit at random places, and the kernel's first pass over a column, its scales, would
 * otherwise wait for DRAM line by line. Issue 31's model on the 2-vCPU AMD VM: the FFN waves ~13.8 ->
 * ~13.0 ms a token at one thread and ~9.0 -> ~8.5 at two, over the gates' ahead alone). */
static void chunk_down(pi2_sparse *s, int c) {
    const pi2_type wt = (pi2_type)s->m->h.neuron_type;
    const size_t skip = 2 * s->part; /* the down column follows the gate and up rows */
    float *acc = s->wave.partial + (size_t)c * s->E;
    const int i1 = (c + 1) * PI2_DOWN_CHUNK < s->wave.len ? (c + 1) * PI2_DOWN_CHUNK : s->wave.len;
    const uint8_t *cols[PI2_DOWN_CHUNK];
    float a[PI2_DOWN_CHUNK];
    int n = 0;
    for (int i = c * PI2_DOWN_CHUNK; i < i1; i++) {
        if (!s->scratch.live[i]) continue;
        cols[n] = pi2_ncache_bundle(s->cache, s->wave.h[i], s->wave.k[i]) + skip;
        a[n++] = s->scratch.hv[(size_t)i * s->n_batch];
    }
    s->wave.chunk[c].live = n > 0;
    if (!n) return;
    memset(acc, 0, (size_t)s->E * sizeof(float));
    for (int j = 0; j < n; j += 4) {
        const int now = n - j < 4 ? n - j : 4, left = n - j - now; /* this call's columns, those after it */
        pi2_ahead next;
        pi2_ahead_init(&next, cols + j + now, left < 4 ? left : 4, pi2_row_size(wt, s->E));
        pi2_axpy_rows(wt, s->E, a + j, cols + j, now, acc, &next);
    }
}

/* Unit i is computed (hv and live written): the thread that finishes a chunk's last unit sums the chunk.
 * The counter's acquire-release chain makes every unit's outputs visible to that thread. */
static void unit_done(pi2_sparse *s, int i) {
    const int c = i / PI2_DOWN_CHUNK;
    if (atomic_fetch_sub_explicit(&s->wave.chunk[c].left, 1, memory_order_acq_rel) == 1) chunk_down(s, c);
}

/* o[j] += q[j], j < w. A whole slice's length is a constant, so -O2's vectorizer (which adds no run-time
 * checks) takes that loop: scalar, the final sum was ~70% of the wave worker's own time, ~0.65 ms a token
 * of issue 31's model on one thread (perf's share). */
static inline void add_slice(float *restrict o, const float *restrict q, int64_t w) {
    if (w == PI2_DOWN_REDUCE)
        for (int j = 0; j < PI2_DOWN_REDUCE; j++) o[j] += q[j];
    else
        for (int64_t j = 0; j < w; j++) o[j] += q[j];
}

/* Every chunk is summed (pending reached 0 after each chunk's last unit): out += the partials in chunk
 * order, slice by slice, each slice taken by one thread. An element gets the same additions in the same
 * order whichever slice holds it. Any subset of the threads finishes it: the wave's job returns only
 * when every thread that joined it has. */
static void reduce_some(pi2_sparse *s) {
    const int nc = n_chunks(s->wave.len);
    for (;;) {
        const int64_t d0 = (int64_t)atomic_fetch_add(&s->wave.next_reduce, 1) * PI2_DOWN_REDUCE;
        if (d0 >= s->E) return;
        const int64_t w = s->E - d0 < PI2_DOWN_REDUCE ? s->E - d0 : PI2_DOWN_REDUCE;
        for (int c = 0; c < nc; c++)
            if (s->wave.chunk[c].live) add_slice(s->scratch.out + d0, s->wave.partial + (size_t)c * s->E + d0, w);
    }
}

/* A batch's down pass: out[t] += h[i][t] * down_i over the wave's units in their fixed order (hottest
 * first), slice by slice of the output, each slice taken by one thread. So the sum is the same whatever
 * thread computed which neuron and whenever its read arrived: runs repeat bit for bit (the predictor's
 * thresholds would otherwise turn last-bit noise into different neurons, and different text). Any subset
 * of the threads finishes it (pi2_pool_run_chunks). */
static void down_batch_worker(void *p, int ith, int nth) {
    (void)ith, (void)nth;
    pi2_sparse *s = p;
    const pi2_type wt = (pi2_type)s->m->h.neuron_type;
    for (;;) {
        const int q = atomic_fetch_add(&s->wave.next_slice, 1);
        if (q >= s->wave.n_slices) return;
        const int64_t d0 = s->wave.down_at[q].d0, d1 = s->wave.down_at[q].d1;
        if (d0 >= d1) continue;
        const size_t skip = 2 * s->part + pi2_row_size(wt, d0);
        /* four live columns at a time, each token's slice of the output read and written once per group
         * while the four columns stay in L1 across tokens. A token whose four outputs are all zero is
         * skipped; a zero output within a group adds q * 0 = 0, which leaves the sum as it was. */
        const uint8_t *cols[4];
        const float *hv[4];
        int n = 0;
        for (int i = 0; i <= s->wave.len; i++) {
            if (i < s->wave.len) {
                if (!s->scratch.live[i]) continue;
                cols[n] = pi2_ncache_bundle(s->cache, s->wave.h[i], s->wave.k[i]) + skip;
                hv[n++] = s->scratch.hv + (size_t)i * s->n_batch;
                if (n < 4) continue;
            }
            if (!n) break;
            for (int t = 0; t < s->wave.tokens; t++) {
                float a[4];
                int any = 0;
                for (int r = 0; r < n; r++) any |= (a[r] = hv[r][t]) != 0.0f;
                if (any) pi2_axpy_rows(wt, d1 - d0, a, cols, n, s->scratch.out + (size_t)t * s->E + d0, NULL);
            }
            n = 0;
        }
    }
}

/* Bring the first lines of a unit's rows towards this core while the current unit computes: bundles
 * sit at random places in the cache, and each row start would otherwise wait for DRAM. */
static void prefetch_unit(const pi2_sparse *s, int i) {
    const uint8_t *b = pi2_ncache_bundle(s->cache, s->wave.h[i], s->wave.k[i]);
    for (int l = 0; l < 4; l++) {
        __builtin_prefetch(b + 64 * l, 0, 3);
        __builtin_prefetch(b + s->part + 64 * l, 0, 3);
    }
}

/* Phase two of a two-phase neuron: register as waiting, then read the up row and down column. */
static void read_rest(pi2_sparse *s, int i) {
    const int64_t hdl = s->wave.h[i];
    pthread_mutex_lock(&s->lock);
    s->wave.phase[i] = 1;
    const int first = pi2_ncache_state(s->cache, hdl) == PI2_SLOT_GATE;
    if (first) pi2_ncache_set_state(s->cache, hdl, PI2_SLOT_LOADING_REST);
    add_waiter(s, hdl, i);
    pthread_mutex_unlock(&s->lock);
    if (!first) return;
    if (s->sub.started) pi2_submitter_post(s, hdl); /* issued from the submitter's core */
    else if (pi2_sparse_submit(s, hdl, READ_REST) == 0) pi2_io_flush(s->io);
}

#define TICKETS 4 /* claimed at once: fewer atomics bouncing between cores; compute_units_1tok takes up to 4 */

/* The next TICKETS tickets, if all of them are filled already; else -1 (nothing claimed). Decode claims
 * its next group this way before computing the current one, so that group's rows come from DRAM while
 * the current ones compute; a group whose reads are still out is left to fetch_add, as before. */
static int claim_filled(pi2_sparse *s) {
    int t = atomic_load_explicit(&s->wave.next_ticket, memory_order_relaxed);
    const int n_ready = atomic_load_explicit(&s->wave.n_ready, memory_order_acquire);
    while (t + TICKETS <= n_ready)
        if (atomic_compare_exchange_weak(&s->wave.next_ticket, &t, t + TICKETS)) return t;
    return -1;
}

/* Every thread: claim tickets; a ticket is a position in the ready list; wait for it to be filled by
 * becoming the reaper (one thread at a time) while nothing else is ready. Thread 0 first issues the
 * wave's reads when the pipeline is on, so the other threads compute cached neurons meanwhile.
 * Finished units are subtracted from `pending` in batches, always before waiting. */
static void wave_worker(void *p, int ith, int nth) {
    pi2_sparse *s = p;
    if (s->pipeline) pi2_submitter_kick(s); /* the first thread in hands the reads over (sparse_submit.c) */
    if (ith == 0 && s->pipeline && !s->sub.started) { /* --no-io-submitter: this thread issues */
        for (int r = 0; r < s->wave.n_to_read; r++)
            if (pi2_sparse_submit(s, s->wave.to_read[r], s->wave.to_read_kind[r]) != 0) break;
        pi2_io_flush(s->io);
    }
    int finished = 0, held = -1; /* held: tickets claimed ahead (claim_filled), this thread's next */
    unsigned spins = 0;
    for (;;) {
        const int t0 = held >= 0 ? held : atomic_fetch_add(&s->wave.next_ticket, TICKETS);
        int t = t0;
        held = -1;
        if (s->wave.tokens == 1) { /* decode: the tickets already filled go through the kernel together */
            const int n_ready = atomic_load_explicit(&s->wave.n_ready, memory_order_acquire);
            const int cnt = n_ready - t0 < TICKETS ? n_ready - t0 : TICKETS;
            if (cnt > 1) {
                uint8_t rest[TICKETS];
                const uint8_t *next[TICKETS];
                int n_next = 0;
                if ((held = claim_filled(s)) >= 0)
                    for (; n_next < TICKETS; n_next++) next[n_next] = first_row(s, s->wave.ready[held + n_next]);
                compute_units_1tok(s, s->wave.ready + t0, cnt, rest, next, n_next);
                for (int j = 0; j < cnt; j++) {
                    if (rest[j]) read_rest(s, s->wave.ready[t0 + j]);
                    else unit_done(s, s->wave.ready[t0 + j]), finished++;
                }
                t += cnt;
            }
        }
        for (; t < t0 + TICKETS; t++) {
            for (;;) {
                if (atomic_load_explicit(&s->failed, memory_order_relaxed)) return;
                const int n_ready = atomic_load_explicit(&s->wave.n_ready, memory_order_acquire);
                if (t < n_ready) {
                    if (t + 1 < n_ready) prefetch_unit(s, s->wave.ready[t + 1]);
                    const int i = s->wave.ready[t];
                    if (compute_unit(s, i)) {
                        read_rest(s, i);
                    } else {
                        if (s->wave.tokens == 1) unit_done(s, i); /* a batch sums after the wave */
                        finished++;
                    }
                    break;
                }
                if (finished) {
                    atomic_fetch_sub(&s->wave.pending, finished);
                    finished = 0;
                }
                if (atomic_load(&s->wave.pending) == 0) {
                    if (s->wave.tokens == 1) reduce_some(s); /* decode: no barrier before the final sum */
                    return;
                }
                if (s->resident) { /* no reads: another thread is computing the wave's last units */
                    if ((++spins & 15) == 0) sched_yield(); /* its core may be this one */
                    else pi2_cpu_relax();
                    continue;
                }
                if (!atomic_exchange(&s->reaping, 1)) { /* become the reaper: wait for a read */
                    pi2_sparse_reap_waiting(s);
                    atomic_store(&s->reaping, 0);
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
        tp += s->scratch.mask[i] && s->scratch.truth[i];
        fp += s->scratch.mask[i] && !s->scratch.truth[i];
        fn += !s->scratch.mask[i] && s->scratch.truth[i];
    }
    s->check.layer_tp[layer] += tp;
    s->check.layer_fp[layer] += fp;
    s->check.layer_fn[layer] += fn;
    s->check.layer_seen[layer] += (uint64_t)tokens * s->F;
    s->st.pred_tp += tp;
    s->st.pred_fp += fp;
    s->st.pred_fn += fn;
}

/* ---- the decode read cap (--read-cap) --------------------------------------------------------- */

/* Reads per decode block the cap allows: --read-cap N spread over the token's blocks, or (auto) what
 * the storage serves while the block computes: the measured miss rate (whole bundles, or a gate read
 * plus, for about half, a rest read) times the moving average of a block's time not spent waiting.
 * A token whose predicted set is far larger than usual (on the synthetic 7B shape under 2651 MiB:
 * 500 to 67k misses a token, the slowest 1.5 s against a median of 0.14) then costs about what a
 * usual one does. 0: no cap. */
static int cap_per_block(pi2_sparse *s, uint64_t t0) {
    if (s->cfg.read_cap > 0) return s->cap.per_block;
    pi2_io_stats io;
    pi2_io_stats_get(s->io, &io);
    if (s->cap.last_t0 && t0 - s->cap.last_t0 < 2000000000ull) { /* the previous block was decode too */
        const double waited = (double)(io.wait_ns - s->cap.last_wait_ns), busy = (double)(t0 - s->cap.last_t0) - waited;
        const double b = busy > 0 ? busy : 0;
        s->cap.busy_ns = s->cap.busy_ns > 0 ? 0.9 * s->cap.busy_ns + 0.1 * b : b;
    }
    s->cap.last_t0 = t0;
    s->cap.last_wait_ns = io.wait_ns;
    const double per_miss = pi2_sparse_miss_seconds(s, s->two_phase);
    if (s->cap.busy_ns <= 0 || per_miss <= 0) return 0;
    const double n = s->cap.busy_ns / 1e9 / per_miss;
    return n < 1 ? 1 : n > 1e9 ? 1000000000 : (int)n;
}

/* The score at or below which a cold miss is never read: --miss-threshold's, or -INFINITY (none). */
static float floor_logit(const pi2_sparse *s) { return s->miss_logit < INFINITY ? s->miss_logit : -INFINITY; }

/* The block's miss limit: floor_logit, raised when more cold misses pass it than `cap`, to about the
 * cap-th highest score among them (a histogram of their scores: no sort in the decode path). Which
 * neurons are misses is the cache's state now; one cached now may be evicted by the block's own reads
 * before its wave, so build_wave also counts the reads against cap.left. */
static float cap_logit(pi2_sparse *s, int b, int n_active, int cap) {
    const float floor = floor_logit(s);
    s->cap.left = cap > 0 ? cap : INT_MAX;
    if (cap <= 0) return floor;
    int n = 0;
    float lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n_active; i++) {
        const int k = s->scratch.active[i];
        const float sc = s->pred.scores[k];
        if (sc <= floor || pi2_ncache_is_hot(s->cache, k) || pi2_ncache_find(s->cache, b, k) >= 0) continue;
        s->cap.scores[n++] = sc;
        lo = sc < lo ? sc : lo;
        hi = sc > hi ? sc : hi;
    }
    if (n <= cap || !(hi > lo)) return floor;
    enum { BINS = 256 };
    int count[BINS] = {0};
    const float w = (hi - lo) / BINS;
    for (int i = 0; i < n; i++) { /* the float compare also keeps w = 0 (denormal spread) and NaN in range */
        const float f = (s->cap.scores[i] - lo) / w;
        count[f < (float)BINS ? (int)f : BINS - 1]++;
    }
    int above = 0, j = BINS - 1;
    while (j > 0 && above + count[j] <= cap) above += count[j--];
    const float limit = lo + (float)(j + 1) * w; /* bins above j fit under the cap; bin j does not */
    return limit > floor ? limit : floor;
}

/* A resident FFN's wave: every active neuron, all in memory. Nothing is evicted or read, so no pins
 * and no LRU order are kept: the general path's per-neuron bookkeeping (pin, touch: several random
 * writes each) took ~150 us a block on the calling thread alone, the serial part that stopped decode's
 * FFN from scaling with threads, and long enough for the waiting workers to fall asleep. */
static int build_wave_resident(pi2_sparse *s, int b, int n_active, int *pos) {
    const int n = n_active - *pos;
    const int32_t *ks = s->scratch.active + *pos;
    s->wave.n_to_read = 0;
    const int hot = pi2_ncache_find_many(s->cache, b, ks, n, s->wave.h);
    memcpy(s->wave.k, ks, (size_t)n * sizeof *ks);
    memset(s->wave.phase, 0, (size_t)n);
    memset(s->scratch.live, 0, (size_t)n);
    for (int i = 0; i < n; i++) s->wave.ready[i] = i;
    *pos = n_active;
    s->st.hits_hot += (uint64_t)hot;
    s->st.hits_cold += (uint64_t)(n - hot);
    atomic_store(&s->wave.n_ready, n);
    return n;
}

/* Take units from active[*pos..) until the cache cannot pin another slot; returns the wave size. */
static int build_wave(pi2_sparse *s, int b, int n_active, int *pos) {
    if (s->resident) return build_wave_resident(s, b, n_active, pos);
    int n = 0;
    s->wave.n_to_read = 0;
    s->wave.serial++;
    atomic_store(&s->wave.n_ready, 0);
    while (*pos < n_active) {
        const int k = s->scratch.active[*pos];
        const int hot = pi2_ncache_is_hot(s->cache, k);
        int64_t hdl = pi2_ncache_find(s->cache, b, k);
        int hit = hdl >= 0;
        if (!hit && !hot && s->wave.tokens == 1 &&
            ((s->cap.logit > -INFINITY && s->pred.scores[k] <= s->cap.logit) || s->cap.left <= 0)) {
            /* predicted, but too unlikely to pay for its read (--miss-threshold), or past the cap */
            s->check.skipped_misses++;
            s->cap.capped += s->pred.scores[k] > floor_logit(s);
            if (s->cfg.check_predictor && s->scratch.truth[k]) s->check.skipped_active++;
            (*pos)++;
            continue;
        }
        if (hit) {
            pi2_ncache_pin(s->cache, hdl);
        } else {
            if ((hdl = pi2_ncache_acquire(s->cache, b, k)) < 0) break; /* everything pinned: compute first */
            s->cap.left -= !hot; /* a neuron that was cached when the limit was set may be a miss now */
            int kind = hot ? READ_CLUSTER : s->two_phase ? READ_GATE : READ_FULL;
            pi2_ncache_set_state(s->cache, hdl, kind == READ_GATE ? PI2_SLOT_LOADING_GATE : PI2_SLOT_LOADING);
            s->wave.to_read[s->wave.n_to_read] = hdl;
            s->wave.to_read_kind[s->wave.n_to_read++] = (uint8_t)kind;
        }
        if (!hit && !hot && k >= s->admit_limit) pi2_ncache_demote(s->cache, hdl); /* see admit_limit */
        else pi2_ncache_touch(s->cache, hdl, s->step);
        /* A neuron of a cluster this wave is reading is a miss too, like the neuron that asked for it;
         * one of a cluster a prefetch is reading is a hit (that read was not on demand). */
        if (!hit) s->wave.acq[hdl] = s->wave.serial;
        else hit = s->wave.acq[hdl] != s->wave.serial;
        const int st = pi2_ncache_state(s->cache, hdl);
        const int loaded = st == PI2_SLOT_READY || st == PI2_SLOT_GATE;
        if (hot) hit ? s->st.hits_hot++ : s->st.misses_hot++;
        else hit ? s->st.hits_cold++ : s->st.misses_cold++;
        s->wave.k[n] = k;
        s->wave.h[n] = hdl;
        s->wave.phase[n] = 0;
        s->scratch.live[n] = 0; /* a neuron whose gate part alone shows it inactive never gets to set it */
        if (loaded) s->wave.ready[atomic_fetch_add(&s->wave.n_ready, 1)] = n;
        else add_waiter(s, hdl, n);
        n++;
        (*pos)++;
    }
    return n;
}

static int sparse_ffn(pi2_sparse *s, int layer, int expert, const float *in, int tokens, float *out) {
    if (atomic_load(&s->failed)) goto failed;
    const uint64_t t0 = pi2_now_ns();
    const int b = layer * s->m->n_ffn_blocks + expert;
    const int64_t F = s->F, E = s->E;
    const pi2_ffn_block *blk = &s->m->layers[layer].ffn[expert];
    s->wave.tokens = tokens;
    pi2_par_prepare(s->pool, (pi2_type)s->m->h.neuron_type, in, E, E, tokens, s->scratch.act, s->scratch.act_row);
    for (int t = 0; t < tokens; t++) /* every neuron's dots reuse it */
        pi2_pack_act((pi2_type)s->m->h.neuron_type, s->scratch.act + (size_t)t * s->scratch.act_row, E, s->scratch.pact + (size_t)t * s->scratch.pact_row);

    /* Which neurons: the predictor's choice, or the truth; for powerinfer2's batches of at least
     * PI2_DENSE_BATCH tokens, every neuron (the paper's prefill is dense). Those go through the GEMM, from
     * the resident FFN or the block's stream (sparse_batch.c: chunk by chunk, each from the cache, from
     * reads of its missing bundles, or from one sequential read, as the storage probe says costs least:
     * the same bytes whichever). Only --prefill-stream off sends them through the waves below, whose
     * per-neuron dots sum in another order: so whether a block streams must never follow a measurement,
     * or the text would follow the disk's mood. */
    const int exact = s->cfg.oracle || s->cfg.check_predictor;
    const int dense = s->pipeline && tokens >= PI2_DENSE_BATCH && !exact;
    if (exact) pi2_true_activations(s->pool, s->m, blk, s->scratch.act, s->scratch.act_row, tokens, s->scratch.truth);
    if (s->cfg.oracle) memcpy(s->scratch.mask, s->scratch.truth, (size_t)tokens * F);
    else if (dense) memset(s->scratch.mask, 1, (size_t)tokens * F);
    else {
        const uint64_t tp = pi2_now_ns();
        pi2_predict(&s->pred, s->pool, b, in, tokens, s->scratch.mask);
        s->st.predict_ns += pi2_now_ns() - tp;
    }
    if (s->cfg.check_predictor) count_check(s, layer, tokens);
    /* The active list and decode's counts run on the calling thread alone, between pool jobs: at 16
     * threads any time here is time every other thread waits (and long gaps put them to sleep), so
     * these loops are branch-free and carry no dependency from one neuron to the next. */
    int n_active = 0;
    if (tokens == 1) {
        for (int64_t k = 0; k < F; k++) s->scratch.active[n_active] = (int32_t)k, n_active += s->scratch.mask[k] != 0;
    } else {
        for (int64_t k = 0; k < F; k++) {
            uint8_t any = 0;
            for (int t = 0; t < tokens && !any; t++) any |= s->scratch.mask[(size_t)t * F + k];
            if (any) s->scratch.active[n_active++] = (int32_t)k;
        }
    }
    s->st.neurons_visited += (uint64_t)F * tokens;
    if (tokens == 1) { /* decode's named set, for the planner's hit-rate curve (pi2_sparse_named_json) */
        s->named.by_block[b] += (uint64_t)n_active;
        for (int bin = 0, i = 0; bin < PI2_RANK_BINS; bin++) { /* active is ascending: count each bin's run */
            const int start = i;
            const int64_t end = (F * (bin + 1) + PI2_RANK_BINS - 1) / PI2_RANK_BINS; /* first k of the next bin */
            while (i < n_active && s->scratch.active[i] < end) i++;
            s->named.by_rank[bin] += (uint64_t)(i - start);
        }
    }
    if (dense && (s->batch.block_base || s->batch.stage[0])) {
        s->st.neurons_computed += (uint64_t)F * tokens;
        memset(out, 0, (size_t)tokens * E * sizeof(float));
        s->scratch.out = out;
        if (pi2_sparse_dense_batch(s, b) != 0) goto failed;
        s->st.ffn_ns += pi2_now_ns() - t0;
        return 0;
    }
    if (tokens == 1) s->st.neurons_computed += (uint64_t)n_active; /* the same count, no pass over F */
    else
        for (size_t i = 0; i < (size_t)tokens * F; i++) s->st.neurons_computed += s->scratch.mask[i];

    s->cap.logit = floor_logit(s);
    s->cap.left = INT_MAX;
    if (tokens == 1 && s->cap_on) s->cap.logit = cap_logit(s, b, n_active, cap_per_block(s, t0));
    else s->cap.last_t0 = 0; /* a batch between: the next decode block starts the interval afresh */

    memset(out, 0, (size_t)tokens * E * sizeof(float));
    s->scratch.out = out;
    for (int pos = 0; pos < n_active;) {
        const int start = pos;
        s->wave.len = build_wave(s, b, n_active, &pos);
        if (s->wave.len == 0) {
            pi2_set_error("neuron cache too small: no slot free for neuron %d of block %d", s->scratch.active[start], b);
            return -1;
        }
        atomic_store(&s->wave.pending, s->wave.len);
        atomic_store(&s->wave.next_ticket, 0);
        for (int c = 0, nc = tokens == 1 ? n_chunks(s->wave.len) : 0; c < nc; c++) { /* decode's down pass */
            const int left = s->wave.len - c * PI2_DOWN_CHUNK;
            atomic_store_explicit(&s->wave.chunk[c].left, left < PI2_DOWN_CHUNK ? left : PI2_DOWN_CHUNK, memory_order_relaxed);
            s->wave.chunk[c].live = 0;
        }
        atomic_store(&s->wave.next_reduce, 0);
        atomic_store(&s->wave.next_slice, 0);
        if (!s->pipeline) {
            /* Read everything first, then compute (bundle, llmflash, cache). */
            for (int r = 0; r < s->wave.n_to_read; r++)
                if (pi2_sparse_submit(s, s->wave.to_read[r], s->wave.to_read_kind[r]) != 0) goto failed;
            pi2_io_flush(s->io);
            pthread_mutex_lock(&s->lock);
            while (atomic_load(&s->wave.n_ready) < s->wave.len && !atomic_load(&s->failed))
                if (pi2_sparse_reap(s, 1) == 0 && pi2_io_in_flight(s->io) == 0) break;
            pthread_mutex_unlock(&s->lock);
        }
        /* Any subset of the threads finishes a wave (tickets and down slices are claimed, not owned):
         * a thread whose core is busy elsewhere when it starts is not waited for. */
        if (s->pipeline && pi2_submitter_wave_begin(s) != 0) /* the compute threads issue instead */
            fprintf(stderr, "pi2: warning: %s; the compute threads issue the reads\n", pi2_last_error());
        const uint64_t tw = pi2_now_ns();
        pi2_pool_run_chunks(s->pool, wave_worker, s);
        const uint64_t td = pi2_now_ns();
        if (s->pipeline) pi2_submitter_wave_end(s);
        s->st.wave_ns += td - tw;
        s->st.waves++;
        if (atomic_load(&s->failed)) goto failed;
        if (tokens > 1) pi2_pool_run_chunks(s->pool, down_batch_worker, s);
        s->st.down_ns += pi2_now_ns() - td;
        if (!s->resident)
            for (int i = 0; i < s->wave.len; i++) pi2_ncache_unpin(s->cache, s->wave.h[i]);
    }
    if (!s->keep) pi2_ncache_drop_all(s->cache);

    s->st.ffn_ns += pi2_now_ns() - t0;
    return 0;
failed:
    pi2_set_error("%s", s->error[0] ? s->error : "neuron read failed");
    return -1;
}

static void step_end(pi2_sparse *s) {
    s->step++;
    if (s->cfg.policy == PI2_POLICY_LLMFLASH) pi2_ncache_drop_older(s->cache, s->step - s->cfg.llmflash_window);
}

/* ---- the forward pass's FFN backend ---------------------------------------------------------- */

static void backend_layer_begin(void *s, int layer, const float *x, int tokens) {
    if (layer == 0 && tokens == 1) ((pi2_sparse *)s)->named.steps++;
    pi2_sparse_layer_begin(s, layer, x, tokens);
}
static int backend_ffn(void *s, int layer, int expert, const float *in, int tokens, float *out) {
    return sparse_ffn(s, layer, expert, in, tokens, out);
}
static void backend_step_end(void *s) { step_end(s); }

const pi2_ffn_backend *pi2_sparse_backend(pi2_sparse *s) {
    s->backend = (pi2_ffn_backend){s, backend_layer_begin, backend_ffn, backend_step_end};
    return &s->backend;
}


