/* Where a decoded token's time goes, for the run summary's "decode_profile": the forward pass's phases,
 * the sparse FFN's parts and the thread pool's barriers and sleeps, per decoded token. How decode scales
 * with threads is read off these (docs/ENGINE.md): each pool job is a barrier, each worker sleep a
 * wake-up through the kernel before the next job, and the serial parts do not shrink with threads. */
#ifndef PI2_SESSION_PROFILE_H
#define PI2_SESSION_PROFILE_H

#include <stddef.h>
#include <stdint.h>

#include "forward.h"
#include "sparse.h"
#include "threadpool.h"

typedef struct {
    pi2_fwd_prof fwd;
    pi2_sparse_stats sp;
    pi2_pool_counters pool;
} pi2_prof_snap;

typedef struct {
    uint64_t tokens; /* decode forward passes counted */
    pi2_prof_snap sum; /* differences summed over the counted spans */
} pi2_decode_profile;

/* The counters now (sparse may be NULL, pool may be NULL). */
void pi2_prof_take(pi2_prof_snap *s, const pi2_ctx *ctx, const pi2_sparse *sparse, const pi2_pool *pool);
/* Adds what happened between a and b, a span of `tokens` decode passes. */
void pi2_prof_add(pi2_decode_profile *p, const pi2_prof_snap *a, const pi2_prof_snap *b, uint64_t tokens);
/* The summary's "decode_profile" object "{...}" (per decoded token) into buf; "" when no token was decoded. */
void pi2_prof_json(const pi2_decode_profile *p, int sparse, char *buf, size_t n);

#endif
