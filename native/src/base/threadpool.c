/* Persistent pthread pool: a generation counter announces each job; workers spin on it for a short
 * while, then sleep on a futex on the generation (Linux and Android: the engine's platforms). The
 * caller runs part 0 itself, then waits (spin, then sleep on a condition variable) for the
 * remaining-workers count to reach zero. A dynamic job is closed when the caller finishes its part: a
 * worker that had not started it by then (its core busy elsewhere) skips it, so the caller never waits
 * for a thread that was not running.
 *
 * Why a futex and not a condition variable for the workers: a broadcast wakes every sleeper, and each
 * must then take the mutex back before it returns, one after another, every hand-over a wake-up
 * through the kernel of its own; with 15 sleepers the last one joined the job ~15 wake-ups late. One
 * FUTEX_WAKE releases them all at once, with no lock to pass around. */
#include "threadpool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"

/* How long a thread spins for the next event before sleeping. Long enough to bridge the gaps of a
 * decode: between two tokens the calling thread alone samples, writes the token's event and starts the
 * next pass, 75-100 us with events on (this VM, 2 threads; ~200 us with the sampler's two pool jobs in
 * between), and at 100 us every worker slept once or twice a token (16 threads: 32 sleeps a token), each
 * sleep a wake-up through the kernel of 25-110 us before the next job (pi2-probe pool). Short enough
 * not to burn a core for long while the engine waits on input or I/O. */
#define SPIN_NS 250000ull

#define JOB_DYNAMIC (1ull << 31)
#define JOB_SLOTS 0x7fffffffull
static inline unsigned job_gen(uint64_t w) { return (unsigned)(w >> 32); }

/* One cache line each (aligned_alloc): a worker's counters are written by that worker alone. */
struct worker {
    pi2_pool *pool;
    pthread_t thread;
    int ith;
    int cpu;
    _Atomic uint64_t sleeps, skipped;
} __attribute__((aligned(64)));

struct pi2_pool {
    int n;
    struct worker *workers; /* n - 1 workers; index i has ith = i + 1 */
    pthread_mutex_t mu;
    pthread_cond_t done_cv; /* the caller's sleep until the workers finish */
    /* The job's generation again, alone in a 32-bit word for the futex the workers sleep on, and how
     * many sleep there (the caller makes the wake-up call only when one does). */
    _Atomic uint32_t gen;
    _Atomic int sleepers;
    /* The current job: generation (bumped once per job) << 32 | JOB_DYNAMIC | open worker slots. One
     * word, so a worker takes a slot of exactly the job it saw. */
    _Atomic uint64_t job;
    _Atomic int remaining; /* workers that must still finish the current job */
    _Atomic int stop;
    pi2_pool_fn fn;
    void *ctx;
    _Atomic uint64_t jobs, caller_sleeps; /* written by the caller only */
};

static inline void bump(_Atomic uint64_t *c) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1, memory_order_relaxed);
}

/* One turn of a spin-wait: pause, and every 64th turn give the core away (a busy thread may need it when
 * threads outnumber cores). 1 once the wait has spun SPIN_NS: time to sleep on a condition variable. */
static int spun_out(int i, uint64_t *t0) {
    if ((i & 63) == 63) {
        uint64_t now = pi2_now_ns();
        sched_yield();
        if (!*t0) *t0 = now;
        else if (now - *t0 > SPIN_NS) return 1;
    }
    pi2_cpu_relax();
    return 0;
}

static void futex_wait(_Atomic uint32_t *w, uint32_t expect) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, expect, NULL, NULL, 0);
}
static void futex_wake_all(_Atomic uint32_t *w) { syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0); }

/* Sleep until the generation moves past `seen` or the pool stops. The sleeper count goes up before the
 * generation is read again, and the caller publishes the generation before it reads the count (both
 * sequentially consistent): either this thread sees the new generation, or the caller sees it asleep. */
static void sleep_until_job(pi2_pool *p, unsigned seen) {
    atomic_fetch_add(&p->sleepers, 1);
    while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop)) futex_wait(&p->gen, seen);
    atomic_fetch_sub(&p->sleepers, 1);
}

static void pin_self(int cpu, int ith) {
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (cpu >= CPU_SETSIZE) {
        fprintf(stderr, "pi2: warning: thread %d: cpu %d out of range, not pinned\n", ith, cpu);
        return;
    }
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        fprintf(stderr, "pi2: warning: thread %d: cannot pin to cpu %d (%s), left unpinned\n", ith, cpu,
                strerror(errno));
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    pi2_pool *p = w->pool;
    pin_self(w->cpu, w->ith);
    unsigned seen = 0; /* generation at creation; a job may be posted before this thread runs */
    for (;;) {
        /* spin for a new generation, then sleep */
        uint64_t t0 = 0;
        for (int i = 0;; i++) {
            if (job_gen(atomic_load_explicit(&p->job, memory_order_acquire)) != seen) break;
            if (atomic_load(&p->stop)) return NULL;
            if (spun_out(i, &t0)) {
                bump(&w->sleeps);
                sleep_until_job(p, seen);
                break;
            }
        }
        if (atomic_load(&p->stop)) return NULL;
        uint64_t job = atomic_load_explicit(&p->job, memory_order_acquire);
        seen = job_gen(job);
        if (job & JOB_DYNAMIC) {
            /* Take a slot unless the caller already closed this job (it did the work itself). */
            int joined = 0;
            while (job_gen(job) == seen && (job & JOB_SLOTS) && !joined)
                joined = atomic_compare_exchange_weak_explicit(&p->job, &job, job - 1, memory_order_acq_rel,
                                                               memory_order_acquire);
            if (!joined) {
                bump(&w->skipped);
                continue;
            }
        }
        p->fn(p->ctx, w->ith, p->n);
        if (atomic_fetch_sub_explicit(&p->remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

pi2_pool *pi2_pool_create(int n_threads, const int *cpu_affinity) {
    if (n_threads < 1 || n_threads > 1024) {
        pi2_set_error("thread count %d out of range 1..1024", n_threads);
        return NULL;
    }
    pi2_pool *p = calloc(1, sizeof *p);
    if (!p) {
        pi2_set_error("out of memory creating a thread pool");
        return NULL;
    }
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    if (cpu_affinity) pin_self(cpu_affinity[0], 0);
    const size_t wbytes = (size_t)n_threads * sizeof *p->workers;
    p->workers = aligned_alloc(64, wbytes);
    if (p->workers) memset(p->workers, 0, wbytes);
    if (!p->workers) {
        free(p);
        pi2_set_error("out of memory creating a thread pool");
        return NULL;
    }
    for (int i = 0; i < n_threads - 1; i++) {
        struct worker *w = &p->workers[i];
        w->pool = p;
        w->ith = i + 1;
        w->cpu = cpu_affinity ? cpu_affinity[i + 1] : -1;
        int err = pthread_create(&w->thread, NULL, worker_main, w);
        if (err) {
            p->n = i + 1; /* free() joins the workers started so far */
            pi2_pool_free(p);
            pi2_set_error("cannot start thread %d of %d: %s", i + 1, n_threads, strerror(err));
            return NULL;
        }
    }
    return p;
}

int pi2_pool_size(const pi2_pool *pool) { return pool->n; }

void pi2_pool_counters_get(const pi2_pool *p, pi2_pool_counters *c) {
    memset(c, 0, sizeof *c);
    if (!p) return;
    c->jobs = atomic_load_explicit(&((pi2_pool *)p)->jobs, memory_order_relaxed);
    c->caller_sleeps = atomic_load_explicit(&((pi2_pool *)p)->caller_sleeps, memory_order_relaxed);
    for (int i = 0; i < p->n - 1; i++) {
        c->worker_sleeps += atomic_load_explicit(&p->workers[i].sleeps, memory_order_relaxed);
        c->skipped += atomic_load_explicit(&p->workers[i].skipped, memory_order_relaxed);
    }
}

pi2_pool *pi2_pool_from_flags(int threads, const char *affinity, int *n_threads) {
    int32_t listed[1024];
    int cpus[1024], n_aff = 0;
    if (affinity && (n_aff = pi2_parse_int_list("--affinity", affinity, 1 << 20, listed, 1024)) < 0) return NULL;
    for (int i = 0; i < n_aff; i++) cpus[i] = listed[i];
    int n = threads ? threads : (n_aff ? n_aff : (int)sysconf(_SC_NPROCESSORS_ONLN));
    if (n < 1) n = 1;
    if (n_aff && n_aff != n) {
        pi2_set_error("--affinity lists %d cpus for %d threads (give one per thread)", n_aff, n);
        return NULL;
    }
    *n_threads = n;
    return pi2_pool_create(n, n_aff ? cpus : NULL);
}

static void pool_run(pi2_pool *p, pi2_pool_fn fn, void *ctx, int dynamic) {
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    bump(&p->jobs);
    atomic_store(&p->remaining, p->n - 1);
    const unsigned g = job_gen(atomic_load(&p->job)) + 1u;
    const uint64_t gen = (uint64_t)g << 32;
    atomic_store_explicit(&p->job, gen | (dynamic ? JOB_DYNAMIC : 0) | (uint64_t)(p->n - 1), memory_order_release);
    atomic_store(&p->gen, g); /* then the sleepers: see sleep_until_job */
    if (atomic_load(&p->sleepers)) futex_wake_all(&p->gen);

    fn(ctx, 0, p->n);

    if (dynamic) { /* close the job: workers that have not joined yet skip it */
        const uint64_t left = atomic_exchange(&p->job, gen | JOB_DYNAMIC) & JOB_SLOTS;
        atomic_fetch_sub(&p->remaining, (int)left);
    }
    uint64_t t0 = 0;
    for (int i = 0; atomic_load_explicit(&p->remaining, memory_order_acquire) != 0; i++) {
        if (spun_out(i, &t0)) {
            bump(&p->caller_sleeps);
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->remaining) != 0) pthread_cond_wait(&p->done_cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
            break;
        }
    }
}

void pi2_pool_run(pi2_pool *p, pi2_pool_fn fn, void *ctx) { pool_run(p, fn, ctx, 0); }
void pi2_pool_run_dynamic(pi2_pool *p, pi2_pool_fn fn, void *ctx) { pool_run(p, fn, ctx, 1); }

void pi2_pool_free(pi2_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1); /* a sleeper woken by this sees stop */
    futex_wake_all(&p->gen);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->workers[i].thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->done_cv);
    free(p->workers);
    free(p);
}

void pi2_split_range(int64_t n, int ith, int nth, int64_t *begin, int64_t *end) {
    if (n <= 0 || nth <= 0 || ith < 0 || ith >= nth) {
        *begin = *end = 0;
        return;
    }
    int64_t base = n / nth, extra = n % nth;
    /* the first `extra` parts get one more element */
    *begin = ith * base + (ith < extra ? ith : extra);
    *end = *begin + base + (ith < extra ? 1 : 0);
}
