/* Thread pool: every part runs exactly once per job, jobs do not overlap, the caller is part 0,
 * ranges split without gaps or overlaps, and bad arguments fail cleanly. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "common.h"
#include "threadpool.h"

#define MAX_T 8

struct job {
    _Atomic int calls[MAX_T];
    _Atomic int inside; /* threads inside the current job */
    _Atomic int overlap;
    int nth_seen_wrong;
    _Atomic long sum;
    int64_t n;
    pthread_t caller;
    _Atomic int caller_not_zero;
};

static void work(void *ctx, int ith, int nth) {
    struct job *j = ctx;
    atomic_fetch_add(&j->calls[ith], 1);
    if (ith == 0 && !pthread_equal(pthread_self(), j->caller)) atomic_store(&j->caller_not_zero, 1);
    int64_t b, e;
    pi2_split_range(j->n, ith, nth, &b, &e);
    long s = 0;
    for (int64_t i = b; i < e; i++) s += i;
    atomic_fetch_add(&j->sum, s);
}

/* Consecutive jobs that depend on the previous job's result: catches a job starting before all
 * threads finished the previous one. */
struct chain {
    int n;
    int values[MAX_T];
    _Atomic int errors;
    int round;
};

static void chain_step(void *ctx, int ith, int nth) {
    struct chain *c = ctx;
    /* every thread reads all values of the previous round, then writes its own next value */
    for (int i = 0; i < nth; i++)
        if (__atomic_load_n(&c->values[i], __ATOMIC_RELAXED) != c->round) atomic_fetch_add(&c->errors, 1);
}
static void chain_write(void *ctx, int ith, int nth) {
    struct chain *c = ctx;
    __atomic_store_n(&c->values[ith], c->round + 1, __ATOMIC_RELAXED);
}

static void test_split(void) {
    int bad = 0;
    for (int64_t n = 0; n < 50; n++) {
        for (int nth = 1; nth <= 9; nth++) {
            int64_t next = 0, minsz = n, maxsz = 0;
            for (int ith = 0; ith < nth; ith++) {
                int64_t b, e;
                pi2_split_range(n, ith, nth, &b, &e);
                if (b != next || e < b) bad++;
                next = e;
                if (e - b < minsz) minsz = e - b;
                if (e - b > maxsz) maxsz = e - b;
            }
            if (next != n || maxsz - minsz > 1) bad++;
        }
    }
    CHECK(bad == 0);
    int64_t b = 5, e = 5;
    pi2_split_range(10, 3, 3, &b, &e); /* ith out of range: empty */
    CHECK(b == 0 && e == 0);
}

static void run_pool(int nthreads, const int *affinity) {
    pi2_pool *pool = pi2_pool_create(nthreads, affinity);
    CHECK(pool != NULL);
    if (!pool) return;
    CHECK(pi2_pool_size(pool) == nthreads);
    static struct job j;
    memset(&j, 0, sizeof j);
    j.n = 1001;
    j.caller = pthread_self();
    const int jobs = 1000;
    for (int k = 0; k < jobs; k++) pi2_pool_run(pool, work, &j);
    int bad_calls = 0;
    for (int i = 0; i < nthreads; i++) bad_calls += atomic_load(&j.calls[i]) != jobs;
    CHECK(bad_calls == 0);
    CHECK(atomic_load(&j.sum) == (long)jobs * 1001 * 1000 / 2);
    CHECK(atomic_load(&j.caller_not_zero) == 0);

    struct chain c;
    memset(&c, 0, sizeof c);
    for (c.round = 0; c.round < 500; c.round++) {
        pi2_pool_run(pool, chain_step, &c);
        pi2_pool_run(pool, chain_write, &c);
    }
    CHECK(atomic_load(&c.errors) == 0);

    /* a pause long enough for the workers to fall asleep, then more jobs */
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    memset(&j, 0, sizeof j);
    j.n = 7;
    j.caller = pthread_self();
    for (int k = 0; k < 5; k++) {
        pi2_pool_run(pool, work, &j);
        nanosleep(&ts, NULL);
    }
    CHECK(atomic_load(&j.sum) == 5L * 21);
    pi2_pool_free(pool);
}

int main(void) {
    test_split();
    run_pool(1, NULL);
    run_pool(2, NULL);
    run_pool(4, NULL);
    /* pinning: cpu 0 always exists; an absent cpu is warned about, not fatal */
    int aff[3] = {-1, 0, 1000};
    run_pool(3, aff);
    CHECK(pi2_pool_create(0, NULL) == NULL);
    CHECK(strstr(pi2_last_error(), "thread count") != NULL);
    pi2_pool_free(NULL);
    return pi2_test_summary("test_threadpool");
}
