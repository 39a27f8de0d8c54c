/* Prefill's Q4_0 batch GEMM timed at every runnable kernel level that has one: a 4096 x 4096 matrix by
 * 128 tokens (a 7B model's attention matrix over a prompt), on 1 and 2 threads. Timings per level:
 * "kernel", pi2_batch_gemm alone over a batch packed beforehand (at that level: amx's layout differs),
 * its rows split in equal parts of 16s between the threads; "kernel16", the same in calls of 16 rows
 * on one thread (each thread's chunk at high thread counts, so a call's fixed costs show); "matmul",
 * pi2_par_matmul as the engine calls it (the batch packed on every call, rows in chunks that threads
 * take). Levels alternate rep by rep so a change in the machine's load hits
 * them alike; each line is the median of the reps in GMAC/s, and amx/avx512 their ratio. A benchmark,
 * not a test: built, not run by ctest.
 * Usage: bench_batch_gemm [reps (7)] [max threads (2)] [rows cols tokens (4096 4096 128)] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"
#include "parmat.h"

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint32_t rnd_state = 12345;
static float rnd_unit(void) { /* [-1, 1) */
    rnd_state = rnd_state * 1664525u + 1013904223u;
    return (float)(rnd_state >> 8) / (float)(1u << 23) - 1.0f;
}

typedef struct {
    const uint8_t *w;
    size_t rs;
    int64_t rows, n, tokens;
    const void *batch;
    float *y;
} kernel_job;

static void kernel_worker(void *p, int ith, int nth) {
    const kernel_job *j = p;
    int64_t b, e;
    pi2_split_aligned(j->rows, 16, ith, nth, &b, &e);
    if (e > b) pi2_batch_gemm(PI2_Q4_0, j->w + (size_t)b * j->rs, j->rs, 0, e - b, j->n, j->batch, j->tokens, j->y + b, j->rows);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 7, max_threads = argc > 2 ? atoi(argv[2]) : 2;
    const int64_t rows = argc > 5 ? atoll(argv[3]) : 4096, n = argc > 5 ? atoll(argv[4]) : 4096,
                  tokens = argc > 5 ? atoll(argv[5]) : 128;
    const size_t rs = pi2_row_size(PI2_Q4_0, n), as = pi2_row_size(PI2_Q8_0, n);
    uint8_t *w = malloc(rs * (size_t)rows), *acts = malloc(as * (size_t)tokens);
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)(rows * tokens));
    if (!w || !acts || !x || !y || reps < 1 || max_threads < 1) return 2;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < n; i++) x[i] = rnd_unit();
        pi2_quantize_row(PI2_Q4_0, x, w + (size_t)r * rs, n);
    }
    for (int64_t t = 0; t < tokens; t++) {
        for (int64_t i = 0; i < n; i++) x[i] = rnd_unit();
        pi2_prepare_act(PI2_Q4_0, x, acts + (size_t)t * as, n);
    }
    const pi2_mat m = {.data = w, .type = PI2_Q4_0, .rows = rows, .cols = n, .row_bytes = rs, .stride = rs};
    int levels[PI2_KERNEL_LEVELS], nl = 0;
    for (int l = 0; l < PI2_KERNEL_LEVELS; l++) /* the reference is too slow to time at this size */
        if (l != PI2_KERNELS_SCALAR && pi2_kernels_force((pi2_kernel_level)l) == 0 &&
            pi2_batch_size(PI2_Q4_0, n, tokens) > 0)
            levels[nl++] = l;
    const double macs = (double)rows * (double)n * (double)tokens;
    printf("batch GEMM Q4_0 %lld x %lld x %lld tokens, median of %d reps\n", (long long)rows, (long long)n,
           (long long)tokens, reps);
    void *batch[PI2_KERNEL_LEVELS]; /* each level's own (amx's quants go token by token) */
    for (int k = 0; k < nl; k++) {
        pi2_kernels_force((pi2_kernel_level)levels[k]);
        batch[k] = aligned_alloc(64, pi2_batch_size(PI2_Q4_0, n, tokens));
        pi2_batch_pack(PI2_Q4_0, acts, n, tokens, batch[k]);
    }
    for (int th = 1; th <= max_threads; th++) {
        pi2_pool *pool = th > 1 ? pi2_pool_create(th, NULL) : NULL;
        for (int how = 0; how < 3; how++) {
            if (how == 1 && th > 1) continue; /* kernel16: one thread */
            double *sec = malloc(sizeof(double) * (size_t)(reps * nl)), med[PI2_KERNEL_LEVELS] = {0};
            for (int rep = -1; rep < reps; rep++) /* rep -1: a warm-up */
                for (int k = 0; k < nl; k++) {
                    pi2_kernels_force((pi2_kernel_level)levels[k]);
                    kernel_job kj = {w, rs, rows, n, tokens, batch[k], y};
                    const uint64_t t0 = pi2_now_ns();
                    if (how == 0) pi2_pool_run_or_inline(pool, kernel_worker, &kj);
                    else if (how == 1)
                        for (int64_t r = 0; r < rows; r += 16)
                            pi2_batch_gemm(PI2_Q4_0, w + (size_t)r * rs, rs, 0, rows - r < 16 ? rows - r : 16, n,
                                           batch[k], tokens, y + r, rows);
                    else pi2_par_matmul(pool, &m, acts, tokens, y, rows);
                    if (rep >= 0) sec[k * reps + rep] = (double)(pi2_now_ns() - t0) * 1e-9;
                }
            const char *what = how == 0 ? "kernel" : how == 1 ? "kernel16" : "matmul";
            for (int k = 0; k < nl; k++) {
                qsort(sec + k * reps, (size_t)reps, sizeof(double), cmp_double);
                med[levels[k]] = sec[k * reps + reps / 2];
                printf("threads %d  %-8s  %-7s %8.1f GMAC/s  (%.2f ms)\n", th, what,
                       pi2_kernel_level_name((pi2_kernel_level)levels[k]), macs / med[levels[k]] * 1e-9,
                       med[levels[k]] * 1e3);
            }
            if (med[PI2_KERNELS_AMX] > 0 && med[PI2_KERNELS_AVX512] > 0)
                printf("threads %d  %-8s  amx/avx512 %.2fx\n", th, what, med[PI2_KERNELS_AVX512] / med[PI2_KERNELS_AMX]);
            free(sec);
        }
        if (pool) pi2_pool_free(pool);
    }
    for (int k = 0; k < nl; k++) free(batch[k]);
    free(w), free(acts), free(x), free(y);
    return 0;
}
