/* The sparse engine's state, shared by its files, one job each: sparse_open.c (opening, closing),
 * sparse_size.c (the budget and the cache split), sparse_io.c (reads), sparse_ffn.c (the per-block
 * waves of predicted neurons), sparse_batch.c (batches computed densely: a resident FFN, or one
 * streamed from storage in large sequential reads), sparse_stats.c (counters and reports). Not part of
 * the engine's interface (sparse.h). */
#ifndef PI2_SPARSE_INTERNAL_H
#define PI2_SPARSE_INTERNAL_H

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "norm.h"
#include "neuron_cache.h"
#include "sparse.h"
#include "sparse_predict.h"
#include "sparse_size.h"

/* Read kinds: a whole bundle, its gate part (two-phase, phase one), the rest (phase two), a cluster. */
enum { READ_FULL, READ_GATE, READ_REST, READ_CLUSTER };

/* Bytes a streamed read takes: where a storage curve has flattened (UFS ~4 GB/s from 512 KiB). */
#define PI2_STREAM_CHUNK ((size_t)4 << 20)

/* Staging buffers of a stream (a power of two): up to this many chunks in flight ahead of the one being
 * computed. With two, one 4 MiB read flew at a time, and a warm cache's block is its hot chunks (copies,
 * no reads) and then its cold ones (a read each), so the cold chunks' reads waited on their compute one
 * by one: the 7B shape at 2651 MiB waited 1.6 s of a 4.1 s prompt on reads. Four start the cold reads
 * during the hot chunks' compute (0.65 s waited), eight earlier still (0.4 s), for 32 MiB of staging
 * under a large budget (sixteen waited as long: what is left is the disk's rate, not the ring); a small
 * budget gets smaller chunks (stream_bundles). */
#define PI2_STREAM_STAGES 8

/* A batch's down pass (prefill through the waves): slice [d0, d1) of the output, taken by one thread. */
struct pi2_down_at {
    int64_t d0, d1;
};

/* The batch down pass's slices: one per compute thread, but none narrower than this many floats (every
 * live unit costs each slice a fixed amount on top of the arithmetic). */
#define PI2_DOWN_SLICE_MIN 512

/* Decode's down pass works on fixed chunks of the wave: units [c * PI2_DOWN_CHUNK, (c + 1) *
 * PI2_DOWN_CHUNK) sum their down columns into chunk c's own partial output, in unit order, done by
 * whichever thread finishes the chunk's last unit; once every unit is in, the partials are added into
 * the output in chunk order, slice by slice. The chunks do not depend on the thread count, so the sum
 * is the same bits at any thread count and whatever thread computed what. It replaced slices of the
 * output that any idle thread claimed for 16 units at a time: at 8-16 threads every claim moved a
 * slice's 2 KiB of output to another core, and only 8 threads could sum at once (16 cores, 8-layer 7B
 * shape in memory: the FFN 7.1 ms a token at 8 threads, 6.3 at 16). 64 units: a chunk's down is a few
 * microseconds of work, and the partials of a 7B-shaped wave (~3200 units) are 0.8 MiB. */
#define PI2_DOWN_CHUNK 64
#define PI2_DOWN_REDUCE 256 /* floats per slice of the final sum */

struct pi2_down_chunk {
    _Atomic int left; /* units of the chunk still to compute */
    int live;         /* its partial holds a sum (some unit had a non-zero output) */
} __attribute__((aligned(64)));

struct pi2_sparse {
    const pi2_model *m;
    pi2_ffn_backend backend; /* what forward.c calls (pi2_sparse_backend) */
    pi2_pool *pool;
    pi2_sparse_config cfg;
    int nth, n_batch, n_blocks;
    int64_t E, F;
    int two_phase, pipeline, prefetch, keep, lookahead;
    int resident; /* the cache holds every bundle and never evicts one (preloaded; cache or powerinfer2) */
    size_t part, ra, gate_len, rest_off, rest_len, full_len;
    uint64_t *block_off; /* file offset of each block's first bundle */
    int admit_limit;     /* cold misses ranked at or beyond it go in at the cold end of the LRU (F: none) */
    float miss_logit;    /* decode: a cold miss whose predictor score is at most this is not read (INFINITY: off) */
    int cap_on;          /* --read-cap applies (powerinfer2 with a predictor) */
    struct { /* decode read cap (--read-cap; docs/SPARSE.md): per block, the misses read and the limit */
        float logit;          /* this block's: a cold miss scored at most this is not read (miss_logit or higher) */
        int per_block;        /* --read-cap N spread over a token's blocks; 0: auto or off */
        int left;             /* cold-miss reads this block may still issue */
        uint64_t last_t0, last_wait_ns; /* the previous decode block's start and the I/O wait then */
        double busy_ns;       /* moving average of a decode block's time not spent waiting on reads */
        float *scores;        /* [F] the candidates' scores */
        uint64_t capped;      /* misses left unread by the cap */
    } cap;
    pi2_io *io;
    pi2_ncache *cache;
    pi2_predictors pred;
    int64_t step;
    pi2_sparse_sizing size; /* how open sized the budget and the cache (sparse_size.h) */
    uint64_t fixed_bytes, preload_ns, preload_bytes;
    const char *budget_source; /* how the budget was set (pi2_sparse_sizing) */

    /* Dense batches (sparse_batch.c). Resident (the cache holds every bundle, preloaded block by block
     * into consecutive slots): block b's bundle k sits at block_base[b] + k * res_stride, so a batch's
     * gate and up rows go through the GEMM as one strided matrix. Streamed (powerinfer2 under a
     * budget): PI2_STREAM_STAGES staging chunks of stream_n bundles, and the storage rates measured at
     * open. */
    struct {
        const uint8_t **block_base;
        size_t res_stride;
        uint8_t *stage[PI2_STREAM_STAGES];
        int stream_n;
        double rand_reads_per_s, seq_bytes_per_s;           /* whole bundles at random, streamed chunks */
        double probe_gate_reads_per_s, probe_rest_reads_per_s; /* two-phase's two parts at random */
        uint64_t streamed_blocks, dense_blocks, warmed_bundles; /* warmed: copied into the cache from streams */
        uint64_t cached_bundles; /* copied into a stream's stage from the cache instead of read */
        float *up_out; /* a dense batch's up dots [n_batch][span] (the gate dots, then outputs: `gates`) */
    } batch;

    struct { /* scratch, sized at open (sparse_size.c counts it in the fixed region) */
        uint8_t *act; /* FFN inputs prepared for the neuron type [n_batch][act_row] */
        size_t act_row;
        uint8_t *pact; /* the same, packed for many dots (pi2_pack_act) [n_batch][pact_row], 64-aligned */
        size_t pact_row;
        uint8_t *mask, *truth; /* [n_batch][F]: compute neuron k for token t / k is truly active */
        int32_t *active;       /* union of the batch's masks, ascending (hottest first) */
        float *gates;          /* two-phase: gate outputs kept between phases [F][n_batch] */
        float *hv;             /* neuron outputs of the wave [F][n_batch], for the down pass */
        uint8_t *live;         /* [F]: unit has a non-zero output for some token */
        float *out;            /* the block's output being accumulated [n_batch][E] */
        float *look_in;        /* lookahead: the residual normalized with the coming layer's ffn_norm */
        uint8_t *look_mask;
    } scratch;

    struct { /* the wave being computed: units i < len are neurons k[i] in slots h[i] */
        int tokens, len;
        int32_t *k;
        int64_t *h;
        uint8_t *phase;       /* 1: gate computed, rest in flight */
        int32_t *wait_head;   /* per slot handle: first unit waiting for its read, -1 none */
        int32_t *acq;         /* per slot handle: the wave that acquired it (hit/miss counting) */
        int32_t serial;
        int32_t *wait_next;   /* per unit */
        int32_t *ready;       /* units whose data is in memory, in arrival order (a unit may come twice) */
        /* each on a cache line of its own: every thread takes tickets every few units, and a shared
         * line made each look at n_ready or pending a miss (at 16 threads, a line bouncing per ticket) */
        _Atomic int n_ready;
        char pad_ready[64 - sizeof(int)];
        _Atomic int next_ticket;
        char pad_ticket[64 - sizeof(int)];
        _Atomic int pending;
        char pad_pending[64 - sizeof(int)];
        struct pi2_down_chunk *chunk; /* decode: [F / PI2_DOWN_CHUNK] (sparse_ffn.c) */
        float *partial;               /* decode: chunk c's sum at [c * E] */
        _Atomic int next_reduce;      /* decode: the next slice of the final sum to take */
        char pad_reduce[64 - sizeof(int)];
        struct pi2_down_at *down_at;  /* [n_slices]: a batch's down pass's slices of the output */
        int n_slices;
        _Atomic int next_slice;       /* a batch's down pass: the next slice to take */
        int64_t *to_read;     /* slot handles to read for this wave, with their kind */
        uint8_t *to_read_kind;
        int n_to_read;
    } wave;
    struct pi2_submitter { /* the wave's reads, issued from one thread of their own (sparse_submit.c) */
        pthread_t thread;
        int started, off;     /* off: --no-io-submitter, the compute threads issue */
        pthread_mutex_t mu;
        pthread_cond_t work_cv, idle_cv;
        int stop, busy;       /* busy: the thread is issuing, reading the wave's arrays */
        int next_read, n_reads; /* wave.to_read[next_read..n_reads) are still to issue */
        _Atomic int kick;     /* wave_begin armed it: the first thread into the wave's job hands over the reads */
        int64_t *post, *take; /* phase-two reads posted by the compute threads [F], and the thread's copy */
        int n_post;
        uint64_t reads;       /* issued by the thread */
    } sub;
    pthread_mutex_t lock; /* slot states, wait lists and the ready list: publishing units, read_rest */
    _Atomic int reaping;  /* a compute thread is the wave's reaper (pi2_sparse_reap_waiting) */
    _Atomic int failed;
    char error[300];

    pi2_sparse_stats st;
    struct { /* --check-predictor per layer; misses --miss-threshold left unread (and of those, truly active) */
        uint64_t *layer_tp, *layer_fp, *layer_fn, *layer_seen;
        uint64_t skipped_misses, skipped_active;
    } check;
    struct { /* decode steps: neurons named (predicted, or the truth with the oracle) by hotness rank bin and
              * by block; not in pi2_sparse_stats, which every token copies */
        uint64_t by_rank[PI2_RANK_BINS];
        uint64_t *by_block;
        uint64_t steps; /* decode forward passes */
    } named;
};

/* powerinfer2 computes a batch of at least this many tokens over every neuron (sparse_batch.c): by 8
 * tokens the union of the tokens' predicted neurons is most of a block (1 - 0.8^8 = 83% at 20%
 * predicted per token), so predicting saves little and the exact FFN costs little more. */
#define PI2_DENSE_BATCH 8

/* A neuron's output from its gate and up dots (the up dot is only computed when this can be non-zero:
 * always for SwiGLU, for a positive gate otherwise). */
static inline float pi2_neuron_output(uint32_t act, float g, float u) {
    return act == PI2_ACT_SWIGLU ? g / (1.0f + expf(-g)) * u : act == PI2_ACT_RELU ? g * u : (u > 0.0f ? g * u : 0.0f);
}

/* sparse_io.c: read slot hdl's bundle (READ_* kind) into the cache, pinned while in flight. 0, or -1
 * with s->error set. */
int pi2_sparse_submit(pi2_sparse *s, int64_t hdl, int kind);
/* The same from the submitter thread: its waits for a free slot are not I/O wait (pi2_io_submit_bg). */
int pi2_sparse_submit_bg(pi2_sparse *s, int64_t hdl, int kind);
/* sparse_submit.c: the submitter. wave_begin (calling thread, before the wave's job) starts the thread
 * the first time and arms the hand-over; 0, or -1 with an error when the thread cannot start (the
 * compute threads then issue, as with --no-io-submitter). kick (every thread entering the wave's job;
 * the first one acts) hands it the wave's reads. wave_end (after the job) returns once the thread no
 * longer touches the wave. post: a compute thread's phase-two read (READ_REST). stop: at close. */
int pi2_submitter_wave_begin(pi2_sparse *s);
void pi2_submitter_kick(pi2_sparse *s);
void pi2_submitter_wave_end(pi2_sparse *s);
void pi2_submitter_post(pi2_sparse *s, int64_t hdl);
void pi2_submitter_stop(pi2_sparse *s);
/* sparse_io.c: harvest finished reads, blocking when wait and reads fly; the caller holds s->lock. The
 * count, or -1 with s->error set. */
int pi2_sparse_reap(pi2_sparse *s, int wait);
/* sparse_io.c: the same for a wave's reaper (one thread at a time: s->reaping), blocking until a read
 * completes without holding s->lock, which it takes only to publish: a compute thread registering a
 * phase-two read (read_rest) is never held up by a reaper asleep in the kernel. */
int pi2_sparse_reap_waiting(pi2_sparse *s);
/* sparse_io.c: collect every read in flight into the cache (blocking). */
void pi2_sparse_drain(pi2_sparse *s);
/* sparse_io.c: bytes read from the neuron region so far. */
uint64_t pi2_sparse_io_bytes(const pi2_sparse *s);
/* sparse_io.c: the cache holds every bundle: read them all in, block by block. 0 or -1 with an error. */
int pi2_sparse_preload(pi2_sparse *s);
/* sparse_io.c: before a layer's attention: start the reads its FFN will want (hot clusters, lookahead). */
void pi2_sparse_layer_begin(pi2_sparse *s, int layer, const float *x, int tokens);
/* sparse_io.c: wait until every read of chunk c of a stream through `ring` staging buffers (a power of
 * two) has arrived: left[c % ring] counts them (each read's tag holds its chunk's number in the low bits;
 * at most `ring` chunks fly, completions come in any order). The preload, the cache's fill at open and
 * the streamed batches all read blocks this way. 0, or -1 with s->error set and the engine marked failed. */
int pi2_sparse_wait_chunk(pi2_sparse *s, int64_t c, int *left, int ring);

/* sparse_batch.c: a batch (tokens > 1) computed densely over every neuron of block b, the paper's
 * prefill. From the resident FFN when there is one (s->block_base), else streamed from storage in
 * chunks while the previous chunk computes. Adds into s->out; 0 or -1 with s->error set. */
int pi2_sparse_dense_batch(pi2_sparse *s, int b);
/* At open, for powerinfer2 under a budget: the staging buffers. 0 or -1 with an error. */
int pi2_sparse_stream_open(pi2_sparse *s);
/* The cache filled with its steady-state content (hot clusters, cold neurons below admit_limit), read
 * through the stream's staging buffers. */
int pi2_sparse_warm(pi2_sparse *s);
/* The rates above, measured on the neuron region (~10 ms of reads). 0 or -1 with an error. */
int pi2_sparse_probe_storage(pi2_sparse *s);
/* Seconds of storage one cold miss costs at the probed rates: a whole-bundle read, or (two_phase) a
 * gate-part read plus, for about half the neurons (those whose gate comes out positive), the rest
 * (a whole read where the probe did not measure the parts). 0 when nothing was measured. */
double pi2_sparse_miss_seconds(const pi2_sparse *s, int two_phase);
/* sparse_size.c: the staging memory a stream of stream_n-bundle chunks takes. */
size_t pi2_sparse_stream_bytes(int stream_n, size_t stride, int n_batch);
/* sparse_size.c: the engine's activation rows for bundles of type wt: prepared, packed (64-aligned). */
void pi2_sparse_act_rows(pi2_type wt, int64_t E, size_t *act_row, size_t *pact_row);
void pi2_sparse_stream_close(pi2_sparse *s);

#endif
