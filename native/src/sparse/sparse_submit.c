/* The I/O submitter: a decode wave's reads issued from one thread of their own, the paper's I/O core.
 *
 * Before it, compute thread 0 issued the wave's misses itself (and waited for free queue slots while
 * the other threads computed: with 64 in flight and thousands of misses, most of the wave), and any
 * compute thread issued the phase-two read of a neuron whose gate came out positive: the more compute
 * threads, the more cores issued (the paper measured UFS losing up to 40% when several cores issue),
 * and the waits of the issuing compute thread were counted as I/O wait although others computed. Now
 * the compute threads only compute and harvest completions; this thread issues, phase-two reads first
 * (they finish neurons already half computed), then the wave's misses 16 at a time. It starts with the
 * first wave that reads (a model held whole in memory never starts it), sleeps between waves, and is
 * pinned to the first CPU of --io-affinity when one is given. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "sparse_internal.h"

#define SUBMIT_BATCH 16 /* misses issued between looks at the phase-two posts */

static void *submitter_main(void *arg) {
    pi2_sparse *s = arg;
    struct pi2_submitter *u = &s->sub;
    if (s->cfg.io.n_cpus > 0 && s->cfg.io.cpus) {
        const int cpu = s->cfg.io.cpus[0];
        cpu_set_t set;
        CPU_ZERO(&set);
        if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
        if (cpu < 0 || cpu >= CPU_SETSIZE || pthread_setaffinity_np(pthread_self(), sizeof set, &set))
            fprintf(stderr, "pi2: warning: I/O submitter: cannot pin to cpu %d, left unpinned\n", cpu);
    }
    pthread_mutex_lock(&u->mu);
    for (;;) {
        while (!u->stop && !u->n_post && u->next_read >= u->n_reads) pthread_cond_wait(&u->work_cv, &u->mu);
        if (u->stop) break;
        const int n_take = u->n_post, r0 = u->next_read;
        const int r1 = u->n_reads - r0 > SUBMIT_BATCH ? r0 + SUBMIT_BATCH : u->n_reads;
        memcpy(u->take, u->post, (size_t)n_take * sizeof *u->take);
        u->n_post = 0;
        u->next_read = r1;
        u->busy = 1;
        pthread_mutex_unlock(&u->mu);
        int rc = 0;
        for (int i = 0; i < n_take && rc == 0; i++) rc = pi2_sparse_submit_bg(s, u->take[i], READ_REST);
        for (int r = r0; r < r1 && rc == 0; r++) rc = pi2_sparse_submit_bg(s, s->wave.to_read[r], s->wave.to_read_kind[r]);
        if (rc == 0) pi2_io_flush(s->io);
        pthread_mutex_lock(&u->mu);
        u->reads += (uint64_t)(n_take + r1 - r0);
        if (rc != 0) u->next_read = u->n_reads; /* s->failed is set: the wave ends */
        u->busy = 0;
        pthread_cond_broadcast(&u->idle_cv);
    }
    pthread_mutex_unlock(&u->mu);
    return NULL;
}

static int start(pi2_sparse *s) {
    struct pi2_submitter *u = &s->sub;
    if (!(u->post = malloc((size_t)s->F * sizeof *u->post)) || !(u->take = malloc((size_t)s->F * sizeof *u->take))) {
        pi2_set_error("out of memory for the I/O submitter");
        return -1;
    }
    pthread_mutex_init(&u->mu, NULL);
    pthread_cond_init(&u->work_cv, NULL);
    pthread_cond_init(&u->idle_cv, NULL);
    const int err = pthread_create(&u->thread, NULL, submitter_main, s);
    if (err) {
        pthread_mutex_destroy(&u->mu);
        pthread_cond_destroy(&u->work_cv);
        pthread_cond_destroy(&u->idle_cv);
        pi2_set_error("cannot start the I/O submitter: %s", strerror(err));
        return -1;
    }
    u->started = 1;
    return 0;
}

int pi2_submitter_wave_begin(pi2_sparse *s) {
    struct pi2_submitter *u = &s->sub;
    if (!u->started) {
        if (u->off || s->wave.n_to_read == 0) return 0;
        if (start(s) != 0) {
            u->off = 1;
            return -1;
        }
    }
    atomic_store_explicit(&u->kick, s->wave.n_to_read > 0, memory_order_release);
    return 0;
}

/* The hand-over happens inside the wave's job, not before it: waking this thread made the kernel run it
 * on the calling thread's core (the waker's), and it then issued up to a queue's worth of reads there
 * while the caller, which had not yet published the job, waited, and so did every compute thread
 * spinning for that job. That was most of decode's "serial" FFN time under a budget (the 7B shape,
 * 4 layers, 446 MiB, 2 threads: ~0.7 ms a wave of the caller's wall time against ~15 us of its CPU).
 * Once the job is out, the other compute threads compute the cached neurons meanwhile. The signal
 * goes after the unlock, so the woken thread does not run only to block on the mutex still held. */
void pi2_submitter_kick(pi2_sparse *s) {
    struct pi2_submitter *u = &s->sub;
    if (!atomic_load_explicit(&u->kick, memory_order_relaxed) || !atomic_exchange(&u->kick, 0)) return;
    pthread_mutex_lock(&u->mu);
    u->next_read = 0;
    u->n_reads = s->wave.n_to_read;
    pthread_mutex_unlock(&u->mu);
    pthread_cond_signal(&u->work_cv);
}

void pi2_submitter_wave_end(pi2_sparse *s) {
    struct pi2_submitter *u = &s->sub;
    if (!u->started) return;
    atomic_store(&u->kick, 0); /* a job no thread entered (none does: the caller always runs it) */
    pthread_mutex_lock(&u->mu);
    u->next_read = u->n_reads = 0; /* after a failure some may be left: they are not wanted */
    u->n_post = 0;
    while (u->busy) pthread_cond_wait(&u->idle_cv, &u->mu);
    pthread_mutex_unlock(&u->mu);
}

void pi2_submitter_post(pi2_sparse *s, int64_t hdl) {
    struct pi2_submitter *u = &s->sub;
    pthread_mutex_lock(&u->mu);
    u->post[u->n_post++] = hdl; /* one post per slot and wave: at most F */
    pthread_cond_signal(&u->work_cv);
    pthread_mutex_unlock(&u->mu);
}

void pi2_submitter_stop(pi2_sparse *s) {
    struct pi2_submitter *u = &s->sub;
    if (u->started) {
        pthread_mutex_lock(&u->mu);
        u->stop = 1;
        pthread_cond_signal(&u->work_cv);
        pthread_mutex_unlock(&u->mu);
        pthread_join(u->thread, NULL);
        pthread_mutex_destroy(&u->mu);
        pthread_cond_destroy(&u->work_cv);
        pthread_cond_destroy(&u->idle_cv);
        u->started = 0;
    }
    free(u->post);
    free(u->take);
    u->post = u->take = NULL;
}
