/* neuron_io: every method reads the right bytes under concurrency (two threads submitting and reaping
 * each other's reads, queue depth full), reports reads past the end of the file, and waits for reads
 * in flight at close. A method the system refuses (io_uring under qemu-user) is skipped with the why. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "neuron_io.h"

#define FILE_SIZE (4u * 1024 * 1024 + 1000) /* an unaligned tail: O_DIRECT's short read at the end */
#define N_THREADS 2
#define READS_PER_THREAD 600
#define MAX_READ 16384
#define QD 16

static char path[512];

static uint8_t pattern(uint64_t i) { return (uint8_t)((i * 2654435761u) >> 13 ^ i >> 9); }

static int bytes_ok(const uint8_t *p, uint64_t off, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (p[i] != pattern(off + i)) return 0;
    return 1;
}

static void write_test_file(void) {
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/pi2-neuron-io-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    uint8_t *buf = malloc(FILE_SIZE);
    for (uint64_t i = 0; i < FILE_SIZE; i++) buf[i] = pattern(i);
    CHECK(write(fd, buf, FILE_SIZE) == (ssize_t)FILE_SIZE);
    free(buf);
    close(fd);
}

/* One read request of the concurrent test; any thread may reap it. */
typedef struct {
    uint64_t off;
    size_t len;
    uint8_t *dst;
    atomic_int reaped;
} request;

typedef struct {
    pi2_io *io;
    request *reqs;
    int first; /* this thread submits requests first, first + N_THREADS, ... */
    atomic_int *n_reaped, *bad_bytes, *bad_tags, *failures;
} worker_ctx;

static void reap_some(worker_ctx *w, int wait) {
    uint64_t tags[8];
    int n = pi2_io_reap(w->io, tags, 8, wait);
    if (n < 0) {
        fprintf(stderr, "unexpected read failure: %s\n", pi2_last_error());
        atomic_fetch_add(w->failures, 1);
    }
    for (int i = 0; i < n; i++) {
        uint64_t t = tags[i];
        if (t >= N_THREADS * READS_PER_THREAD || atomic_exchange(&w->reqs[t].reaped, 1)) {
            atomic_fetch_add(w->bad_tags, 1);
            continue;
        }
        request *r = &w->reqs[t];
        if (!bytes_ok(r->dst, r->off, r->len)) atomic_fetch_add(w->bad_bytes, 1);
        atomic_fetch_add(w->n_reaped, 1);
    }
}

static void *worker(void *arg) {
    worker_ctx *w = arg;
    for (int t = w->first; t < N_THREADS * READS_PER_THREAD; t += N_THREADS) {
        request *r = &w->reqs[t];
        if (pi2_io_submit(w->io, r->off, r->len, r->dst, (uint64_t)t)) {
            fprintf(stderr, "submit failed: %s\n", pi2_last_error());
            atomic_fetch_add(w->failures, 1);
            atomic_fetch_add(w->n_reaped, 1); /* never comes back */
        }
        if (t % 5 == 0) pi2_io_flush(w->io);
        if (t % 7 == 0) reap_some(w, 0);
    }
    pi2_io_flush(w->io);
    while (atomic_load(w->n_reaped) < N_THREADS * READS_PER_THREAD) {
        reap_some(w, 1); /* returns 0 at once while the other thread has nothing in flight */
        if (atomic_load(w->failures)) break;
    }
    return NULL;
}

static void test_concurrent(pi2_io *io) {
    size_t a = pi2_io_align(io);
    size_t blocks = (FILE_SIZE / 4096) * 4096 / a; /* whole aligned blocks below the unaligned tail */
    request *reqs = calloc(N_THREADS * READS_PER_THREAD, sizeof *reqs);
    uint8_t *arena = aligned_alloc(4096, (size_t)N_THREADS * READS_PER_THREAD * (MAX_READ + 4096));
    uint64_t total = 0;
    srand(42);
    for (int t = 0; t < N_THREADS * READS_PER_THREAD; t++) {
        request *r = &reqs[t];
        size_t n_blocks = 1 + (size_t)rand() % (MAX_READ / a < 8 ? MAX_READ / a : 8);
        if (a == 1) n_blocks = 1 + (size_t)rand() % MAX_READ; /* buffered: any length, any offset */
        r->len = n_blocks * a;
        r->off = (uint64_t)((size_t)rand() % (blocks - n_blocks)) * a;
        r->dst = arena + (size_t)t * (MAX_READ + 4096) + (a == 1 ? (size_t)rand() % 4096 : 0);
        total += r->len;
    }
    atomic_int n_reaped = 0, bad_bytes = 0, bad_tags = 0, failures = 0;
    worker_ctx ctx[N_THREADS];
    pthread_t th[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        ctx[i] = (worker_ctx){io, reqs, i, &n_reaped, &bad_bytes, &bad_tags, &failures};
        pthread_create(&th[i], NULL, worker, &ctx[i]);
    }
    for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
    CHECK(failures == 0);
    CHECK(bad_tags == 0);
    CHECK(bad_bytes == 0);
    int all_reaped = 1;
    for (int t = 0; t < N_THREADS * READS_PER_THREAD; t++) all_reaped &= reqs[t].reaped;
    CHECK(all_reaped);
    CHECK(pi2_io_in_flight(io) == 0);
    uint64_t none;
    CHECK(pi2_io_reap(io, &none, 1, 1) == 0); /* nothing in flight: no wait */
    pi2_io_stats st;
    pi2_io_stats_get(io, &st);
    CHECK(st.reads == N_THREADS * READS_PER_THREAD);
    CHECK(st.bytes == total);
    free(arena);
    free(reqs);
}

/* Reads entirely past the end and across the end fail with a message naming file and offset; a good
 * read submitted with them still comes back. */
static void test_past_eof(pi2_io *io) {
    size_t a = pi2_io_align(io);
    uint8_t *buf = aligned_alloc(4096, 3 * 16384);
    uint64_t beyond = ((uint64_t)FILE_SIZE / a + 4) * a, across = (FILE_SIZE / 4096) * 4096;
    CHECK(pi2_io_submit(io, beyond, 4096, buf, 100) == 0);
    CHECK(pi2_io_submit(io, across, 8192, buf + 16384, 101) == 0);
    CHECK(pi2_io_submit(io, 4096, 4096, buf + 32768, 102) == 0);
    CHECK(pi2_io_flush(io) == 0);
    int failures = 0, good = 0;
    for (int i = 0; i < 10 && pi2_io_in_flight(io) > 0; i++) {
        uint64_t tag = 0;
        int n = pi2_io_reap(io, &tag, 1, 1);
        if (n < 0) {
            failures++;
            CHECK(strstr(pi2_last_error(), path) != NULL);
            CHECK(strstr(pi2_last_error(), "short read at end of file") != NULL);
            char beyond_s[32], across_s[32];
            snprintf(beyond_s, sizeof beyond_s, "offset %llu", (unsigned long long)beyond);
            snprintf(across_s, sizeof across_s, "offset %llu", (unsigned long long)across);
            CHECK(strstr(pi2_last_error(), beyond_s) || strstr(pi2_last_error(), across_s));
        } else if (n == 1) {
            CHECK(tag == 102);
            good += tag == 102 && bytes_ok(buf + 32768, 4096, 4096);
        }
    }
    CHECK(failures == 2);
    CHECK(good == 1);
    CHECK(pi2_io_in_flight(io) == 0);
    free(buf);
}

/* Close returns only after the reads in flight have landed. */
static void test_close_in_flight(pi2_io *io) {
    uint8_t *buf = aligned_alloc(4096, (size_t)QD * 8192);
    memset(buf, 0, (size_t)QD * 8192);
    int ok = 1;
    for (int i = 0; i < QD; i++) ok &= pi2_io_submit(io, (uint64_t)i * 65536, 8192, buf + (size_t)i * 8192, (uint64_t)i) == 0;
    CHECK(ok);
    pi2_io_close(io);
    for (int i = 0; i < QD; i++) ok &= bytes_ok(buf + (size_t)i * 8192, (uint64_t)i * 65536, 8192);
    CHECK(ok);
    free(buf);
}

/* PI2_IO_FAULT (the test hook): the chosen read fails with its reason and alone, the others arrive,
 * nothing stays in flight; a short read is resumed and gives the same bytes. */
static void test_fault(pi2_io_method m, const char *fault, const char *why) {
    setenv("PI2_IO_FAULT", fault, 1);
    pi2_io_config cfg = {.method = m, .queue_depth = 4, .n_threads = 2};
    pi2_io *io = pi2_io_open(path, &cfg);
    unsetenv("PI2_IO_FAULT");
    if (!io) { /* io_uring where the kernel refuses it */
        CHECK(m == PI2_IO_URING);
        return;
    }
    enum { N = 12 };
    uint8_t *buf = aligned_alloc(4096, N * 8192);
    for (int i = 0; i < N; i++) CHECK(pi2_io_submit(io, (uint64_t)i * 12288, 8192, buf + i * 8192, (uint64_t)i) == 0);
    CHECK(pi2_io_flush(io) == 0);
    int failures = 0, good = 0;
    for (int k = 0; k < 4 * N && pi2_io_in_flight(io) > 0; k++) {
        uint64_t tags[N];
        int n = pi2_io_reap(io, tags, N, 1);
        if (n < 0) {
            failures++;
            CHECK(strstr(pi2_last_error(), path) == pi2_last_error());
            CHECK(why && strstr(pi2_last_error(), why) != NULL);
            CHECK(strchr(pi2_last_error(), '\n') == NULL);
        }
        for (int i = 0; i < n; i++) good += bytes_ok(buf + tags[i] * 8192, tags[i] * 12288, 8192);
    }
    CHECK(pi2_io_in_flight(io) == 0);
    CHECK(failures == (why ? 1 : 0));
    CHECK(good == N - failures);
    pi2_io_close(io);
    free(buf);
}

static void test_method(pi2_io_method m, int no_direct) {
    pi2_io_config cfg = {.method = m, .queue_depth = QD, .n_threads = 2, .no_direct = no_direct};
    pi2_io *io = pi2_io_open(path, &cfg);
    if (!io) {
        printf("skip %s: %s\n", pi2_io_method_name(m), pi2_last_error());
        CHECK(m == PI2_IO_URING); /* every other method must always work */
        CHECK(strstr(pi2_last_error(), "io_uring") != NULL);
        return;
    }
    pi2_io_method used = pi2_io_method_used(io);
    printf("%s%s: uses %s, direct %d, align %zu\n", pi2_io_method_name(m), no_direct ? " (no_direct)" : "",
           pi2_io_method_name(used), pi2_io_is_direct(io), pi2_io_align(io));
    if (m == PI2_IO_URING) CHECK(used == PI2_IO_URING);
    if (m == PI2_IO_PREAD) CHECK(used == (pi2_io_is_direct(io) ? PI2_IO_PREAD : PI2_IO_BUFFERED));
    if (m == PI2_IO_BUFFERED || no_direct) CHECK(!pi2_io_is_direct(io));
    size_t a = pi2_io_align(io);
    CHECK(a == 1 ? !pi2_io_is_direct(io) : a >= 512 && (a & (a - 1)) == 0);
    if (a > 1) {
        uint8_t *buf = aligned_alloc(4096, 8192);
        CHECK(pi2_io_submit(io, 1, a, buf, 0) == -1); /* unaligned offset */
        CHECK(pi2_io_submit(io, 0, a, buf + 1, 0) == -1);
        CHECK(strstr(pi2_last_error(), "multiples of") != NULL);
        free(buf);
    }
    CHECK(pi2_io_submit(io, 0, 0, (void *)path, 0) == -1);
    test_concurrent(io);
    test_past_eof(io);
    test_close_in_flight(io);
}

int main(void) {
    write_test_file();
    CHECK(pi2_io_open("/nonexistent/pi2-store", NULL) == NULL);
    CHECK(strstr(pi2_last_error(), "/nonexistent/pi2-store: ") == pi2_last_error());
    pi2_io_config bad = {.queue_depth = -1};
    CHECK(pi2_io_open(path, &bad) == NULL);
    CHECK(strcmp(pi2_io_method_name(PI2_IO_URING), "io_uring") == 0);
    pi2_io_close(NULL);
    test_method(PI2_IO_AUTO, 0);
    test_method(PI2_IO_URING, 0);
    test_method(PI2_IO_URING, 1);
    test_method(PI2_IO_PREAD, 0);
    test_method(PI2_IO_BUFFERED, 0);
    const pi2_io_method fault_methods[] = {PI2_IO_URING, PI2_IO_PREAD, PI2_IO_BUFFERED};
    for (int i = 0; i < 3; i++) {
        test_fault(fault_methods[i], "eio:3", "Input/output error");
        test_fault(fault_methods[i], "eof:5", "short read at end of file");
        test_fault(fault_methods[i], "short:2", NULL);
        test_fault(fault_methods[i], "short:1", NULL);
    }
    unlink(path);
    return pi2_test_summary("test_neuron_io");
}
