/* Hardware probes for the planner (pi2-probe): memory read bandwidth and random-read storage speed
 * through the same reader the engine uses (neuron_io), so the plan is built from what the engine gets. */
#ifndef PI2_PROBE_H
#define PI2_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include "neuron_io.h"

#define PI2_MEMBW_MAX_PASSES 15
#define PI2_MEMBW_MAX_STREAMS 8

typedef struct {
    int threads, passes, streams;
    size_t bytes_per_thread;
    double pass_gbps[PI2_MEMBW_MAX_PASSES]; /* all threads' bytes / wall time of the pass, 1e9 B/s */
    double median_gbps;
} pi2_membw_result;

/* Each of n_threads sums its own buffer of bytes_per_thread (touched first by that thread, so it sits
 * in that thread's memory node) passes times, all threads at once, as `streams` (1..8) equal runs read
 * side by side. 0 or -1 + pi2_set_error. */
int pi2_probe_membw(int n_threads, size_t bytes_per_thread, int passes, int streams, pi2_membw_result *out);

/* The thread pool's fixed cost (threadpool.c): every thread of a pool of n_threads runs an empty job,
 * `jobs` times back to back, then `jobs` / 10 times after the calling thread has spun gap_us alone (a
 * serial stretch of a token: past the pool's spin time the workers sleep, and the next job wakes them
 * through the kernel). Decode runs ~50 jobs a token of a 7B shape; at 16 threads a token is ~9 ms. */
typedef struct {
    int threads, jobs;
    double gap_us;
    double job_us_p50, job_us_p90;         /* back to back: one job's dispatch and barrier */
    double gap_job_us_p50, gap_job_us_p90; /* the job after each gap */
    uint64_t worker_sleeps;                /* over the gapped jobs */
} pi2_pool_result;

int pi2_probe_pool(int n_threads, int jobs, double gap_us, pi2_pool_result *out);

/* The dense decode GEMV as the engine runs it (pi2_par_matmul, one token): `bytes` of Q4_0 weights as
 * 4096 x 4096 matrices (a 7B shape's attention), on 2 MiB pages and interleaved by four where the
 * kernel level has that layout (pi2_model_repack does the same), multiplied one after another by a
 * pool of n_threads, reps times. The weights' bytes over the wall time is the rate the engine's
 * attention and output head can reach on this machine and thread count: beside membw's rate (a plain
 * summing loop), it tells whether the kernel or the memory bounds decode. rows = 1: the file's row
 * layout instead (the engine's --no-repack), to compare the two kernels on a machine. */
typedef struct {
    int threads, reps, matrices, x4, x4_prefetch, x4_streams; /* pi2_kernels_x4_* during the passes */
    size_t bytes;               /* the weights read per pass */
    double pass_gbps[PI2_MEMBW_MAX_PASSES];
    double median_gbps;
    const char *level;          /* the kernel level */
} pi2_gemv_result;

int pi2_probe_gemv(int n_threads, size_t bytes, int reps, int rows, pi2_gemv_result *out);

typedef struct {
    const char *path;
    size_t block;          /* bytes per read; a multiple of the O_DIRECT alignment when direct */
    int queue_depth;       /* reads kept in flight */
    int io_threads;        /* pread pool threads; 0 = queue_depth (so that many reads really fly) */
    pi2_io_method method;
    double seconds;
    uint64_t seed;
    /* wave > 0: reads in waves, as a decode block issues its misses (sparse_ffn.c): `wave` offsets drawn
     * within `range` bytes at a random place in the file (0: 128 MiB, about one FFN block of the 7B and
     * 47B shapes), sorted, sent at once (at most queue_depth in flight), all collected before the next
     * wave. Dense sorted waves within one span read up to ~1.3x the free-running random rate on a virtio
     * disk, sparse ones no faster (docs/PLAN.md). */
    int wave;
    uint64_t range;
} pi2_storage_probe;

typedef struct {
    pi2_io_method method; /* the one used */
    int direct;           /* 1: the page cache was bypassed */
    uint64_t file_bytes, reads, bytes;
    uint64_t range;                 /* waves: the span read within (the file where it is smaller); else 0 */
    double seconds, mb_per_s, iops; /* mb: 1e6 bytes */
    double lat_p50_us, lat_p99_us;  /* submit to reap, per read */
} pi2_storage_result;

/* Random block-aligned reads of block bytes over the whole file (or in waves, above) for about seconds. Buffered reads
 * drop the file's cached pages first (posix_fadvise DONTNEED). 0 or -1 + pi2_set_error. */
int pi2_probe_storage(const pi2_storage_probe *p, pi2_storage_result *out);

#endif
