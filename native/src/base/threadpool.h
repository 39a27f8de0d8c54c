/* A persistent pool of worker threads for the kernels: decode runs hundreds of parallel matrix
 * operations per token, so a job must start and finish in microseconds. Workers spin briefly after a
 * job (the next one usually follows at once), then sleep on a condition variable.
 *
 * One thread at a time may call pi2_pool_run on a pool (the engine's main thread). */
#ifndef PI2_THREADPOOL_H
#define PI2_THREADPOOL_H

#include <stdint.h>

typedef struct pi2_pool pi2_pool;

/* ith in [0, nth); the calling thread of pi2_pool_run is ith 0. */
typedef void (*pi2_pool_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 counts the caller. cpu_affinity, if not NULL, has n_threads entries: the CPU each
 * thread is pinned to (entry 0 pins the calling thread), or -1 to leave that thread unpinned. A CPU
 * the system refuses (phones forbid some cores: EINVAL) is warned about on stderr and skipped.
 * Returns NULL and sets pi2_last_error() on failure. */
pi2_pool *pi2_pool_create(int n_threads, const int *cpu_affinity);

/* Runs fn(ctx, ith, nth) on every thread, nth = pool size; returns when all have returned. */
void pi2_pool_run(pi2_pool *pool, pi2_pool_fn fn, void *ctx);

/* For jobs whose threads take work from a shared counter until none is left (pi2_chunks), so any
 * subset of threads finishes the job: fn runs on the caller (ith 0) and on the workers that start it
 * before the caller's call returns; a worker that has not started by then skips it. Returns when
 * every thread that started has returned. ith values are distinct, but not all of [1, nth) run. */
void pi2_pool_run_dynamic(pi2_pool *pool, pi2_pool_fn fn, void *ctx);

int pi2_pool_size(const pi2_pool *pool);

/* What the pool did since it was created, for the run summary: decode runs hundreds of jobs a token,
 * and each is a barrier every thread must reach; a worker that slept (it spun SPIN_NS without a job)
 * needs a wake-up through the kernel before it can take part in the next. */
typedef struct {
    uint64_t jobs;          /* pi2_pool_run / pi2_pool_run_dynamic calls that used the workers */
    uint64_t worker_sleeps; /* times a worker gave up spinning and slept on the condition variable */
    uint64_t caller_sleeps; /* times the caller slept waiting for the workers to finish a job */
    uint64_t skipped;       /* dynamic jobs a worker joined too late for (the caller had done the work) */
} pi2_pool_counters;

/* Sums the counters (NULL pool: zeros). Exact when no job runs; a close estimate while one does. */
void pi2_pool_counters_get(const pi2_pool *pool, pi2_pool_counters *c);

/* The pool the --threads/--affinity flags ask for: `threads` (0: one per CPU in `affinity`, else one
 * per online CPU), pinned to the CPUs listed in `affinity` (NULL: unpinned; one CPU per thread).
 * *n_threads gets the count. NULL with an error on a bad list or count. */
pi2_pool *pi2_pool_from_flags(int threads, const char *affinity, int *n_threads);

/* Stops and joins the workers; NULL is accepted. */
void pi2_pool_free(pi2_pool *pool);

/* Splits [0, n) into nth contiguous parts as equal as possible; part ith is [*begin, *end). */
void pi2_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end);

#endif
