/* The segmented neuron cache: memory for FFN bundles and the bookkeeping of what lives where.
 *
 * Two regions share the cache's part of the memory budget (PowerInfer-2's hot and cold regions):
 *   hot   slots of `cluster` consecutive bundles: the first hot_neurons bundles of every FFN block
 *         (the file stores bundles hottest first) are cached a cluster at a time, LRU per cluster;
 *   cold  single-bundle slots for the other neurons, LRU per neuron.
 * Entries are read-only copies of the file, so eviction just forgets them.
 *
 * No I/O happens here: the caller (sparse_ffn.c, sparse_io.c) asks where a neuron is, acquires a slot for a miss,
 * reads into it and moves the slot's state along. A handle names a slot in either region: cold
 * slots are [0, cold_slots), hot slots [cold_slots, cold_slots + hot_slots). Pinned slots (reads in
 * flight, neurons the current wave computes) are never evicted.
 *
 * Not thread-safe: the engine's main thread changes the cache; compute threads only read bundles of
 * pinned slots, and the I/O reaper moves states under the engine's lock. */
#ifndef PI2_NEURON_CACHE_H
#define PI2_NEURON_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* Slot states. Two-phase loading (INT4 cold neurons) goes EMPTY -> LOADING_GATE -> GATE ->
 * LOADING_REST -> READY; whole-bundle loads go EMPTY -> LOADING -> READY. */
enum { PI2_SLOT_EMPTY = 0, PI2_SLOT_LOADING, PI2_SLOT_LOADING_GATE, PI2_SLOT_GATE, PI2_SLOT_LOADING_REST,
       PI2_SLOT_READY };

typedef struct {
    int n_blocks;        /* FFN blocks: layers x (experts or 1) */
    int n_ff;            /* bundles per block */
    size_t stride;       /* bytes per bundle in the file (bundle_stride): hot clusters keep this layout */
    size_t cold_bytes;   /* bytes per cold slot (>= a bundle's data, <= stride); 0 = stride */
    int cluster;         /* bundles per hot slot, >= 1 */
    int hot_neurons;     /* per block; a multiple of cluster or n_ff, 0 = no hot region */
    int64_t hot_slots;   /* clusters the hot region holds */
    int64_t cold_slots;  /* bundles the cold region holds */
} pi2_ncache_config;

typedef struct pi2_ncache pi2_ncache;

/* NULL + pi2_last_error() when memory cannot be reserved. Slot memory is reserved, not touched:
 * it counts in RSS only as slots fill. */
pi2_ncache *pi2_ncache_create(const pi2_ncache_config *cfg);
void pi2_ncache_free(pi2_ncache *c);
const pi2_ncache_config *pi2_ncache_cfg(const pi2_ncache *c);

/* Bytes of slot memory (hot + cold). */
size_t pi2_ncache_bytes(const pi2_ncache *c);

int pi2_ncache_is_hot(const pi2_ncache *c, int k); /* bundle k of any block is in the hot set */

/* The slot holding neuron k of block b (its cluster's slot for hot neurons), or -1. */
int64_t pi2_ncache_find(const pi2_ncache *c, int b, int k);
/* find for ks[0..n) of block b at once (decode's resident wave: one call, not 2n); returns how many are hot */
int pi2_ncache_find_many(const pi2_ncache *c, int b, const int32_t *ks, int n, int64_t *h);

/* A slot for neuron k of block b (its cluster, when hot), taken from the region's least recently used
 * unpinned entry, whose previous content is forgotten. The slot is EMPTY, pinned once and most
 * recently used. -1 when every slot of the region is pinned (or the region is empty). */
int64_t pi2_ncache_acquire(pi2_ncache *c, int b, int k);

/* Slot h to the least recently used end of its region: taken first by the next acquire unless touched
 * before (insertion at the cold end, for content not expected back soon). A pinned slot moves there when
 * its last pin goes (pi2_ncache_unpin), unless touched first. */
void pi2_ncache_demote(pi2_ncache *c, int64_t h);

/* Bundle k's bytes inside slot h (h must hold k's neuron or cluster). */
uint8_t *pi2_ncache_bundle(const pi2_ncache *c, int64_t h, int k);
/* The whole slot: for a hot slot the cluster's first bundle, *bytes = cluster bytes; the file
 * offset of that content within its block is returned through *first_k (bundle index). */
uint8_t *pi2_ncache_slot_data(const pi2_ncache *c, int64_t h, size_t *bytes, int *block, int *first_k);

int pi2_ncache_state(const pi2_ncache *c, int64_t h);
void pi2_ncache_set_state(pi2_ncache *c, int64_t h, int state);
void pi2_ncache_pin(pi2_ncache *c, int64_t h);
void pi2_ncache_unpin(pi2_ncache *c, int64_t h);
/* Most recently used now; `token` is the step it was used at (the window policy's clock). */
void pi2_ncache_touch(pi2_ncache *c, int64_t h, int64_t token);

/* Forget every unpinned cold entry last used before `min_token` (LLM in a Flash's window).
 * Returns the number dropped. */
int64_t pi2_ncache_drop_older(pi2_ncache *c, int64_t min_token);
/* Forget every unpinned entry (a policy without a cache uses the slots as a staging area). */
void pi2_ncache_drop_all(pi2_ncache *c);

/* Entries holding data (any state but EMPTY) per region, for stats and tests. */
int64_t pi2_ncache_used(const pi2_ncache *c, int hot);

#endif
