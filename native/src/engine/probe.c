/* Hardware probes: see probe.h. Both measure what the engine will see, not the hardware's peak: the
 * bandwidth of a plain summing loop over buffers far larger than the caches, and random reads through
 * neuron_io at the block size and queue depth the engine's bundle reads have. */
#include "probe.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "kernels.h"
#include "parmat.h"
#include "threadpool.h"

/* ---- memory bandwidth ---- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int go; /* 0: wait, 1: run the passes, -1: give up (a thread could not start) */
    pthread_barrier_t start, end; /* all threads + the timing one; set up once every thread runs */
} membw_shared;

typedef struct {
    uint64_t *buf;
    size_t n; /* words, a multiple of 8 */
    int passes, streams;
    membw_shared *sh;
    volatile uint64_t sink; /* keeps the sums from being optimized away */
    uint64_t t0, t1;        /* this pass, stamped by the thread itself around its sum */
} membw_thread;

/* Four independent 128-bit sums (SSE2 / NEON through GCC's vector extension, no intrinsics): no
 * loop-carried dependency limits the loads, and 16-byte loads outrun DRAM on any core. */
typedef uint64_t u64x2 __attribute__((vector_size(16)));

static uint64_t sum_words(const uint64_t *p, size_t n) {
    const u64x2 *v = (const u64x2 *)p; /* malloc's alignment is >= 16 */
    u64x2 s0 = {0, 0}, s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < n / 2; i += 4) s0 += v[i], s1 += v[i + 1], s2 += v[i + 2], s3 += v[i + 3];
    u64x2 s = s0 + s1 + s2 + s3;
    return s[0] + s[1];
}

/* words per stream: whole lines (what the passes read is streams times this) */
static size_t stream_words(size_t n, int streams) { return n / (size_t)streams / 8 * 8; }

/* The buffer as `streams` equal runs read side by side, a line of each in turn: how many sequential
 * streams one core keeps going at once changes what it gets from DRAM on some machines (the dense
 * GEMV's --streams). The runs are far apart (a buffer's share), as the GEMV keeps its own. */
static uint64_t sum_streams(const uint64_t *p, size_t n, int streams) {
    if (streams == 1) return sum_words(p, n);
    const size_t run = stream_words(n, streams);
    const u64x2 *v[PI2_MEMBW_MAX_STREAMS];
    for (int k = 0; k < streams; k++) v[k] = (const u64x2 *)(p + (size_t)k * run);
    u64x2 s0 = {0, 0}, s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i < run / 2; i += 4)
        for (int k = 0; k < streams; k++) s0 += v[k][i], s1 += v[k][i + 1], s2 += v[k][i + 2], s3 += v[k][i + 3];
    u64x2 s = s0 + s1 + s2 + s3;
    return s[0] + s[1];
}

static void *membw_main(void *arg) {
    membw_thread *t = arg;
    for (size_t i = 0; i < t->n; i++) t->buf[i] = i; /* first touch: the pages land near this thread */
    pthread_mutex_lock(&t->sh->mu);
    while (t->sh->go == 0) pthread_cond_wait(&t->sh->cv, &t->sh->mu);
    int run = t->sh->go > 0;
    pthread_mutex_unlock(&t->sh->mu);
    for (int p = 0; run && p < t->passes; p++) {
        pthread_barrier_wait(&t->sh->start);
        t->t0 = pi2_now_ns();
        t->sink += sum_streams(t->buf, t->n, t->streams);
        t->t1 = pi2_now_ns();
        pthread_barrier_wait(&t->sh->end);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of a probe's n (<= PI2_MEMBW_MAX_PASSES) passes; the passes keep their order. */
static double median_of_passes(const double *pass, int n) {
    double v[PI2_MEMBW_MAX_PASSES];
    memcpy(v, pass, sizeof(double) * (size_t)n);
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int pi2_probe_membw(int n_threads, size_t bytes_per_thread, int passes, int streams, pi2_membw_result *out) {
    size_t n = bytes_per_thread / 64 * 8;
    if (n_threads < 1 || n_threads > 1024 || n == 0 || passes < 1 || passes > PI2_MEMBW_MAX_PASSES || streams < 1 ||
        streams > PI2_MEMBW_MAX_STREAMS || stream_words(n, streams) == 0) {
        pi2_set_error("membw: bad arguments (threads %d, %zu bytes per thread, %d passes, %d streams)", n_threads,
                      bytes_per_thread, passes, streams);
        return -1;
    }
    memset(out, 0, sizeof *out);
    membw_thread *ts = calloc((size_t)n_threads, sizeof *ts);
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    membw_shared sh = {.go = 0};
    pthread_mutex_init(&sh.mu, NULL);
    pthread_cond_init(&sh.cv, NULL);
    pthread_barrier_init(&sh.start, NULL, (unsigned)n_threads + 1);
    pthread_barrier_init(&sh.end, NULL, (unsigned)n_threads + 1);
    int rc = -1, started = 0;
    if (!ts || !th) goto done;
    for (int i = 0; i < n_threads; i++) /* allocated here, touched by the threads */
        if (!(ts[i].buf = malloc(n * sizeof(uint64_t)))) goto done;
    for (; started < n_threads; started++) {
        ts[started] = (membw_thread){.buf = ts[started].buf, .n = n, .passes = passes, .streams = streams, .sh = &sh};
        if (pthread_create(&th[started], NULL, membw_main, &ts[started])) break;
    }
    pthread_mutex_lock(&sh.mu);
    sh.go = started == n_threads ? 1 : -1; /* the barriers need every thread */
    pthread_cond_broadcast(&sh.cv);
    pthread_mutex_unlock(&sh.mu);
    for (int p = 0; sh.go > 0 && p < passes; p++) {
        pthread_barrier_wait(&sh.start);
        pthread_barrier_wait(&sh.end);
        /* From the first thread's start to the last one's end, as the threads stamped them: a timing
         * thread that stamped after the start barrier could be descheduled while the sums ran (on a
         * loaded 2-core VM one pass in five read 746 GB/s), and no pass may read faster than it did. */
        uint64_t t0 = ts[0].t0, t1 = ts[0].t1;
        for (int i = 1; i < n_threads; i++) {
            if (ts[i].t0 < t0) t0 = ts[i].t0;
            if (ts[i].t1 > t1) t1 = ts[i].t1;
        }
        double s = (double)(t1 - t0) * 1e-9;
        out->pass_gbps[p] = (double)n * sizeof(uint64_t) * n_threads / s / 1e9;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (sh.go < 0) {
        pi2_set_error("membw: cannot start thread %d of %d", started + 1, n_threads);
        goto done;
    }
    out->median_gbps = median_of_passes(out->pass_gbps, passes);
    out->threads = n_threads, out->passes = passes, out->streams = streams;
    out->bytes_per_thread = stream_words(n, streams) * (size_t)streams * sizeof(uint64_t); /* what was read */
    rc = 0;
done:
    if (rc && sh.go == 0) pi2_set_error("membw: cannot allocate %d x %zu bytes", n_threads, n * sizeof(uint64_t));
    pthread_barrier_destroy(&sh.start);
    pthread_barrier_destroy(&sh.end);
    pthread_mutex_destroy(&sh.mu);
    pthread_cond_destroy(&sh.cv);
    for (int i = 0; ts && i < n_threads; i++) free(ts[i].buf);
    free(ts), free(th);
    return rc;
}

/* ---- storage ---- */

/* ---- the pool's fixed cost ---- */

static void empty_job(void *ctx, int ith, int nth) { (void)ctx, (void)ith, (void)nth; }

static double pctl(double *v, int n, double q) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[(int)(q * (n - 1) + 0.5)];
}

int pi2_probe_pool(int n_threads, int jobs, double gap_us, pi2_pool_result *out) {
    if (n_threads < 1 || jobs < 10 || !(gap_us >= 0)) {
        pi2_set_error("pool: bad arguments (threads %d, jobs %d, gap %.0f us)", n_threads, jobs, gap_us);
        return -1;
    }
    pi2_pool *pool = pi2_pool_create(n_threads, NULL);
    double *t = malloc(sizeof(double) * (size_t)jobs);
    if (!pool || !t) {
        pi2_pool_free(pool);
        free(t);
        if (!pool) return -1;
        pi2_set_error("pool: out of memory");
        return -1;
    }
    memset(out, 0, sizeof *out);
    out->threads = n_threads, out->jobs = jobs, out->gap_us = gap_us;
    for (int i = 0; i < 100; i++) pi2_pool_run(pool, empty_job, NULL); /* every worker started and spinning */
    for (int i = 0; i < jobs; i++) {
        const uint64_t t0 = pi2_now_ns();
        pi2_pool_run(pool, empty_job, NULL);
        t[i] = (pi2_now_ns() - t0) / 1e3;
    }
    out->job_us_p90 = pctl(t, jobs, 0.9), out->job_us_p50 = pctl(t, jobs, 0.5);
    pi2_pool_counters c0, c1;
    pi2_pool_counters_get(pool, &c0);
    const int n_gap = jobs / 10;
    for (int i = 0; i < n_gap; i++) {
        const uint64_t until = pi2_now_ns() + (uint64_t)(gap_us * 1e3);
        while (pi2_now_ns() < until) { /* the calling thread's serial work */
        }
        const uint64_t t0 = pi2_now_ns();
        pi2_pool_run(pool, empty_job, NULL);
        t[i] = (pi2_now_ns() - t0) / 1e3;
    }
    pi2_pool_counters_get(pool, &c1);
    out->gap_job_us_p90 = pctl(t, n_gap, 0.9), out->gap_job_us_p50 = pctl(t, n_gap, 0.5);
    out->worker_sleeps = c1.worker_sleeps - c0.worker_sleeps;
    pi2_pool_free(pool);
    free(t);
    return 0;
}

static uint64_t next_random(uint64_t *state) { /* xorshift64*: plenty for picking offsets */
    uint64_t x = *state;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

#define MAX_LATENCIES (1 << 20) /* the first million reads are plenty for percentiles */
#define WAVE_RANGE (128ull << 20)

/* pi2_storage_probe.wave: waves of sorted offsets within one span, each collected whole. 0 or -1. */
static int probe_waves(const pi2_storage_probe *p, pi2_io *io, char *bufs, uint64_t n_blocks, uint64_t *rng,
                       uint64_t *lat, uint64_t *n_lat, pi2_storage_result *out, uint64_t *now, uint64_t deadline) {
    const uint64_t range = p->range ? p->range : WAVE_RANGE;
    const uint64_t span = range / p->block < n_blocks ? (range / p->block ? range / p->block : 1) : n_blocks;
    out->range = span * p->block;
    uint64_t *offs = malloc(sizeof(uint64_t) * (size_t)p->wave), *sent = malloc(sizeof(uint64_t) * (size_t)p->wave);
    int *buf_of = malloc(sizeof(int) * (size_t)p->wave), *free_bufs = malloc(sizeof(int) * (size_t)p->queue_depth);
    uint64_t tags[64];
    int rc = -1, n_free = p->queue_depth;
    if (!offs || !sent || !buf_of || !free_bufs) {
        pi2_set_error("storage: out of memory");
        goto done;
    }
    for (int i = 0; i < n_free; i++) free_bufs[i] = i; /* a read lands in a buffer no other read in flight uses */
    while (*now < deadline) {
        const uint64_t base = next_random(rng) % (n_blocks - span + 1);
        for (int i = 0; i < p->wave; i++) offs[i] = (base + next_random(rng) % span) * p->block;
        qsort(offs, (size_t)p->wave, sizeof *offs, cmp_u64);
        int next = 0;
        while (next < p->wave || pi2_io_in_flight(io) > 0) {
            for (; next < p->wave && n_free > 0; next++) {
                buf_of[next] = free_bufs[--n_free];
                if (pi2_io_submit(io, offs[next], p->block, bufs + (size_t)buf_of[next] * p->block, (uint64_t)next))
                    goto done;
                sent[next] = pi2_now_ns();
            }
            if (pi2_io_flush(io)) goto done;
            const int n = pi2_io_reap(io, tags, 64, 1);
            if (n < 0) goto done;
            *now = pi2_now_ns();
            for (int k = 0; k < n; k++) {
                if (*n_lat < MAX_LATENCIES) lat[(*n_lat)++] = *now - sent[tags[k]];
                free_bufs[n_free++] = buf_of[tags[k]];
                out->reads++, out->bytes += p->block;
            }
        }
    }
    rc = 0;
done:
    free(offs), free(sent), free(buf_of), free(free_bufs);
    return rc;
}

int pi2_probe_storage(const pi2_storage_probe *p, pi2_storage_result *out) {
    memset(out, 0, sizeof *out);
    struct stat sb;
    if (stat(p->path, &sb)) return pi2_set_error("%s: %s", p->path, strerror(errno)), -1;
    if (p->block == 0 || p->block > (64u << 20) || p->queue_depth < 1 || p->queue_depth > 1024 ||
        p->io_threads < 0 || !(p->seconds > 0) || p->wave < 0 || p->wave > (1 << 20)) {
        pi2_set_error("storage: bad arguments (block %zu, queue depth %d, %d I/O threads, %g s)", p->block,
                      p->queue_depth, p->io_threads, p->seconds);
        return -1;
    }
    uint64_t n_blocks = (uint64_t)sb.st_size / p->block;
    if (n_blocks == 0)
        return pi2_set_error("%s: %lld bytes, smaller than one block of %zu", p->path, (long long)sb.st_size,
                             p->block), -1;
    int threads = p->io_threads ? p->io_threads : (p->queue_depth < 64 ? p->queue_depth : 64);
    pi2_io_config cfg = {.method = p->method, .queue_depth = p->queue_depth, .n_threads = threads};
    pi2_io *io = pi2_io_open(p->path, &cfg);
    if (!io) return -1;
    out->method = pi2_io_method_used(io), out->direct = pi2_io_is_direct(io);
    out->file_bytes = (uint64_t)sb.st_size;
    char *bufs = NULL;
    uint64_t *lat = malloc(MAX_LATENCIES * sizeof *lat), *sent = calloc((size_t)p->queue_depth, sizeof *sent);
    uint64_t tags[64], rng = p->seed | 1, n_lat = 0;
    int rc = -1;
    if (p->block % pi2_io_align(io)) {
        pi2_set_error("%s: block %zu is not a multiple of the O_DIRECT alignment %zu", p->path, p->block,
                      pi2_io_align(io));
        goto done;
    }
    if (!lat || !sent || posix_memalign((void **)&bufs, 4096, p->block * (size_t)p->queue_depth)) {
        pi2_set_error("storage: out of memory");
        goto done;
    }
    memset(bufs, 0, p->block * (size_t)p->queue_depth);
    if (!out->direct) { /* reads through the page cache: start from a cold cache at least */
        int fd = open(p->path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), close(fd);
    }
    uint64_t t_start = pi2_now_ns(), deadline = t_start + (uint64_t)(p->seconds * 1e9), now = t_start;
    if (p->wave > 0) {
        if (probe_waves(p, io, bufs, n_blocks, &rng, lat, &n_lat, out, &now, deadline)) goto done;
        goto summary;
    }
    for (int i = 0; i < p->queue_depth; i++) { /* tag = buffer index; each buffer always has one read */
        uint64_t off = next_random(&rng) % n_blocks * p->block;
        if (pi2_io_submit(io, off, p->block, bufs + (size_t)i * p->block, (uint64_t)i)) goto done;
        sent[i] = pi2_now_ns();
    }
    if (pi2_io_flush(io)) goto done;
    while (pi2_io_in_flight(io) > 0) {
        int n = pi2_io_reap(io, tags, 64, 1);
        if (n < 0) goto done;
        now = pi2_now_ns();
        for (int k = 0; k < n; k++) {
            uint64_t i = tags[k];
            if (n_lat < MAX_LATENCIES) lat[n_lat++] = now - sent[i];
            out->reads++, out->bytes += p->block;
            if (now >= deadline) continue; /* drain */
            uint64_t off = next_random(&rng) % n_blocks * p->block;
            if (pi2_io_submit(io, off, p->block, bufs + i * p->block, i)) goto done;
            sent[i] = now;
        }
        if (pi2_io_flush(io)) goto done;
    }
summary:
    out->seconds = (double)(now - t_start) * 1e-9;
    out->mb_per_s = (double)out->bytes / out->seconds / 1e6;
    out->iops = (double)out->reads / out->seconds;
    qsort(lat, n_lat, sizeof *lat, cmp_u64);
    out->lat_p50_us = (double)lat[n_lat / 2] / 1e3;
    out->lat_p99_us = (double)lat[n_lat * 99 / 100] / 1e3;
    rc = 0;
done:
    pi2_io_close(io);
    free(bufs), free(lat), free(sent);
    return rc;
}

/* ---- the dense decode GEMV ---- */

int pi2_probe_gemv(int n_threads, size_t bytes, int reps, int rows_layout, pi2_gemv_result *out) {
    enum { N = 4096 };
    const size_t mat_bytes = pi2_row_size(PI2_Q4_0, N) * N;
    const int n_mat = (int)(bytes / mat_bytes);
    if (n_threads < 1 || n_threads > 1024 || n_mat < 1 || reps < 1 || reps > PI2_MEMBW_MAX_PASSES) {
        pi2_set_error("gemv: bad arguments (threads %d, %zu bytes: at least one 4096 x 4096 Q4_0 matrix of %zu, "
                      "%d reps)", n_threads, bytes, mat_bytes, reps);
        return -1;
    }
    memset(out, 0, sizeof *out);
    out->threads = n_threads, out->reps = reps, out->matrices = n_mat, out->bytes = mat_bytes * (size_t)n_mat;
    out->x4 = !rows_layout && pi2_x4_supported(PI2_Q4_0);
    out->x4_prefetch = pi2_kernels_x4_prefetch();
    out->x4_streams = pi2_kernels_x4_streams();
    out->level = pi2_kernel_level_name(pi2_kernels_current());
    uint8_t *rows = malloc(mat_bytes), *w = pi2_huge_alloc(out->bytes);
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    uint8_t *act = malloc(pi2_row_size(pi2_act_type(PI2_Q4_0), N));
    pi2_mat *m = calloc((size_t)n_mat, sizeof *m);
    pi2_pool *pool = pi2_pool_create(n_threads, NULL);
    int rc = -1;
    if (!rows || !w || !x || !y || !act || !m || !pool) {
        if (pool) pi2_set_error("gemv: out of memory (%zu MiB of weights)", out->bytes >> 20);
        goto done;
    }
    uint32_t r = 1;
    for (size_t b = 0; b < mat_bytes / sizeof(pi2_block_q4_0); b++) { /* random nibbles, small scales */
        pi2_block_q4_0 *blk = (pi2_block_q4_0 *)rows + b;
        blk->d = pi2_f32_to_f16(0.01f);
        for (int j = 0; j < PI2_QK / 2; j++) blk->qs[j] = (uint8_t)((r = r * 1664525u + 1013904223u) >> 24);
    }
    for (int i = 0; i < n_mat; i++) { /* every matrix its own copy: the pass reads DRAM, not a cache */
        uint8_t *mi = w + mat_bytes * (size_t)i;
        if (out->x4) pi2_x4_pack(PI2_Q4_0, rows, N, N, mi);
        else memcpy(mi, rows, mat_bytes);
        m[i] = (pi2_mat){.data = mi, .type = PI2_Q4_0, .rows = N, .cols = N, .row_bytes = mat_bytes / N,
                         .stride = mat_bytes / N, .x4 = out->x4};
    }
    for (int i = 0; i < N; i++) x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    pi2_prepare_act(PI2_Q4_0, x, act, N);
    for (int i = 0; i < n_mat; i++) pi2_par_matmul(pool, &m[i], act, 1, y, N); /* warm: pages, pool */
    for (int p = 0; p < reps; p++) {
        const uint64_t t0 = pi2_now_ns();
        for (int i = 0; i < n_mat; i++) pi2_par_matmul(pool, &m[i], act, 1, y, N);
        out->pass_gbps[p] = (double)out->bytes / ((double)(pi2_now_ns() - t0) * 1e-9) / 1e9;
    }
    out->median_gbps = median_of_passes(out->pass_gbps, reps);
    rc = 0;
done:
    pi2_pool_free(pool);
    free(m), free(act), free(y), free(x), free(w), free(rows);
    return rc;
}
