/* Thread pool: every part runs exactly once per job, jobs do not overlap, the caller is part 0,
 * ranges split without gaps or overlaps, and bad arguments fail cleanly. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "common.h"
#include "parmat.h"
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

/* Dynamic jobs: chunks taken from a shared counter cover [0, n) exactly once whichever threads take
 * part; a worker that joins late never runs a job twice or after it closed; static jobs in between
 * still run on every thread. More threads than cores makes late workers common. */
struct dyn_job {
    pi2_chunks chunks;
    _Atomic long sum;
    _Atomic int calls[MAX_T];
    _Atomic int closed; /* set by the caller after pi2_pool_run_dynamic returned */
    _Atomic int ran_after_close;
};

static void dyn_work(void *ctx, int ith, int nth) {
    (void)nth;
    struct dyn_job *j = ctx;
    atomic_fetch_add(&j->calls[ith], 1);
    int64_t b, e;
    long s = 0;
    while (pi2_chunks_take(&j->chunks, &b, &e))
        for (int64_t i = b; i < e; i++) s += i;
    atomic_fetch_add(&j->sum, s);
    if (atomic_load(&j->closed)) atomic_store(&j->ran_after_close, 1);
}

static void test_dynamic(int n_threads) {
    pi2_pool *p = pi2_pool_create(n_threads, NULL);
    CHECK(p != NULL);
    int bad_sum = 0, twice = 0, late = 0, caller_missing = 0, static_bad = 0;
    static struct dyn_job jobs[400]; /* each job stays alive: a late worker must not touch it anyway */
    for (int round = 0; round < 400; round++) {
        struct dyn_job *j = &jobs[round];
        memset(j, 0, sizeof *j);
        const int64_t n = 1 + (round * 37) % 3000;
        pi2_chunks_init(&j->chunks, n, 16, n_threads);
        pi2_pool_run_dynamic(p, dyn_work, j);
        atomic_store(&j->closed, 1);
        if (atomic_load(&j->sum) != (long)(n * (n - 1) / 2)) bad_sum++;
        if (atomic_load(&j->calls[0]) != 1) caller_missing++;
        for (int t = 0; t < n_threads; t++) twice += atomic_load(&j->calls[t]) > 1;
        if (round % 3 == 0) { /* a static job in between: every thread, once */
            struct job sj;
            memset(&sj, 0, sizeof sj);
            sj.n = 1000;
            sj.caller = pthread_self();
            pi2_pool_run(p, work, &sj);
            for (int t = 0; t < n_threads; t++) static_bad += atomic_load(&sj.calls[t]) != 1;
            if (atomic_load(&sj.sum) != 1000L * 999 / 2) static_bad++;
        }
    }
    pi2_pool_free(p);
    for (int round = 0; round < 400; round++) late += atomic_load(&jobs[round].ran_after_close);
    CHECK(bad_sum == 0);
    CHECK(twice == 0);
    CHECK(late == 0);
    CHECK(caller_missing == 0);
    CHECK(static_bad == 0);
}

static void nop(void *ctx, int ith, int nth) { (void)ctx, (void)ith, (void)nth; }

/* The counters the run summary's decode_profile reads: one job per run that used the workers, and a
 * sleep for each worker left idle past its spin. */
static void test_counters(void) {
    pi2_pool_counters c;
    pi2_pool_counters_get(NULL, &c);
    CHECK(c.jobs == 0 && c.worker_sleeps == 0);
    pi2_pool *p = pi2_pool_create(3, NULL);
    CHECK(p != NULL);
    for (int i = 0; i < 10; i++) pi2_pool_run(p, nop, NULL);
    for (int i = 0; i < 5; i++) pi2_pool_run_dynamic(p, nop, NULL);
    struct timespec ts = {0, 20 * 1000 * 1000}; /* far past the spin: both workers sleep */
    nanosleep(&ts, NULL);
    pi2_pool_run(p, nop, NULL);
    pi2_pool_counters_get(p, &c);
    CHECK(c.jobs == 16);
    CHECK(c.worker_sleeps >= 2);
    pi2_pool_free(p);
    pi2_pool *one = pi2_pool_create(1, NULL); /* a pool of one runs inline: no jobs */
    pi2_pool_run(one, nop, NULL);
    pi2_pool_counters_get(one, &c);
    CHECK(c.jobs == 0);
    pi2_pool_free(one);
}

/* Q, K and V as one job give each matrix's rows byte for byte as one job each, at every thread count,
 * for one token and for a batch, and a matrix under the inline limit too. */
static void test_matmul_n(void) {
    enum { COLS = 256, T = 3 };
    static const int64_t rows[3] = {100, 48, 1};
    float *w[3], *y1[3], *yn[3], x[T][COLS];
    pi2_mat m[3];
    for (int i = 0; i < 3; i++) {
        w[i] = malloc(sizeof(float) * rows[i] * COLS);
        y1[i] = calloc((size_t)(rows[i] * T), sizeof(float));
        yn[i] = calloc((size_t)(rows[i] * T), sizeof(float));
        for (int64_t e = 0; e < rows[i] * COLS; e++) w[i][e] = (float)((e * 7919 + i * 31) % 201 - 100) / 37.0f;
        m[i] = (pi2_mat){.data = (const uint8_t *)w[i], .type = PI2_F32, .rows = rows[i], .cols = COLS,
                         .row_bytes = COLS * sizeof(float), .stride = COLS * sizeof(float)};
    }
    for (int t = 0; t < T; t++)
        for (int e = 0; e < COLS; e++) x[t][e] = (float)((t * 13 + e * 17) % 29 - 14) / 7.0f;
    const size_t act_row = pi2_row_size(pi2_act_type(PI2_F32), COLS);
    uint8_t *acts = malloc(act_row * T);
    for (int t = 0; t < T; t++) pi2_prepare_act(PI2_F32, x[t], acts + t * act_row, COLS);
    int bad = 0;
    for (int nth = 1; nth <= 5; nth++) {
        pi2_pool *p = nth > 1 ? pi2_pool_create(nth, NULL) : NULL;
        for (int tokens = 1; tokens <= T; tokens += T - 1) {
            const pi2_mat *ws[3] = {&m[0], &m[1], &m[2]};
            const int64_t ld[3] = {rows[0], rows[1], rows[2]};
            for (int i = 0; i < 3; i++) pi2_par_matmul(p, &m[i], acts, tokens, y1[i], rows[i]);
            pi2_par_matmul_n(p, 3, ws, acts, tokens, yn, ld);
            for (int i = 0; i < 3; i++) bad += memcmp(y1[i], yn[i], sizeof(float) * rows[i] * tokens) != 0;
        }
        pi2_pool_free(p);
    }
    CHECK(bad == 0);
    for (int i = 0; i < 3; i++) free(w[i]), free(y1[i]), free(yn[i]);
    free(acts);
}

int main(void) {
    test_split();
    test_counters();
    test_matmul_n();
    test_dynamic(1);
    test_dynamic(2);
    test_dynamic(6);
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
