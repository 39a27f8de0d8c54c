/* The sparse FFN's decode wave on one thread, as sparse_ffn.c runs it: per layer, the predicted neurons
 * in groups of four (their gate rows through pi2_vec_dot_packed_rows, then the up rows of the positive
 * gates), and every 64 neurons the down columns of the live ones (pi2_axpy_rows into the chunk's
 * partial). Bundles [gate | up | down] of Q4_0 fill a buffer of all layers' neurons (2 MiB pages) in
 * neuron order, and a layer's predicted neurons are a random set taken in ascending order, as the
 * resident neuron cache holds and the wave visits them (about a quarter of the bundles, so rows start
 * ~28 KB apart on average; taken in random order instead, the same rows cost ~20% more). The shape and
 * statistics are issue 31's model: 4096 wide, 14336 neurons, 24% predicted, 43% of those live (10.3%
 * of the FFN).
 * Variants, alternated rep by rep so the machine's load hits them alike:
 *   none   no pi2_ahead: each group starts by waiting for DRAM at its rows' starts
 *   ahead  the next group's gate rows and the chunk's next live columns named (what sparse_ffn.c does)
 *   hot    every neuron one of 32 bundles a layer (in L2): the kernels' arithmetic alone
 * Prints ms per token (all layers) and GB/s over the bytes the wave reads, medians. A benchmark, not a
 * test: built, not run by ctest.
 * Usage: bench_sparse_wave [reps (9)] [layers (8)] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"

enum { E = 4096, F = 14336, CHUNK = 64, HOT = 32 };

static uint32_t rnd_state = 12345;
static uint32_t rnd(void) { return rnd_state = rnd_state * 1664525u + 1013904223u; }

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    uint8_t *pool;      /* layers x F bundles */
    size_t part;        /* bytes of a row */
    int layers, named;  /* neurons predicted a layer */
    int *k;             /* [layers][named]: the neuron of each unit, in wave order */
    uint8_t *live;      /* [layers][named]: its gate comes out positive */
    void *packed;       /* the activation, packed */
    float *partial;     /* [named / CHUNK + 1][E] */
} wave;

static const uint8_t *bundle(const wave *w, int l, int i, int hot) {
    const int k = hot ? w->k[(size_t)l * w->named + i] % HOT : w->k[(size_t)l * w->named + i];
    return w->pool + ((size_t)l * F + (size_t)k) * 3 * w->part;
}

/* one token's waves over all layers; returns the bytes read */
static double run(wave *w, int use_ahead, int hot) {
    double bytes = 0;
    for (int l = 0; l < w->layers; l++) {
        const uint8_t *live = w->live + (size_t)l * w->named;
        for (int c0 = 0; c0 < w->named; c0 += CHUNK) {
            const int c1 = c0 + CHUNK < w->named ? c0 + CHUNK : w->named;
            for (int i = c0; i < c1; i += 4) {
                const int cnt = c1 - i < 4 ? c1 - i : 4;
                const uint8_t *rows[4], *ups[4], *next[4];
                float g[4], y[4];
                int n_up = 0, n_next = 0;
                for (int j = 0; j < cnt; j++) {
                    rows[j] = bundle(w, l, i + j, hot);
                    if (live[i + j]) ups[n_up++] = rows[j] + w->part;
                }
                for (int j = i + 4; j < i + 8 && j < w->named; j++) next[n_next++] = bundle(w, l, j, hot);
                pi2_ahead ahead;
                pi2_ahead_init(&ahead, next, n_next, w->part);
                pi2_vec_dot_packed_rows(PI2_Q4_0, E, rows, cnt, w->packed, g, use_ahead ? &ahead : NULL);
                if (n_up) pi2_vec_dot_packed_rows(PI2_Q4_0, E, ups, n_up, w->packed, y, NULL);
                bytes += (double)(cnt + n_up) * (double)w->part;
            }
            /* the chunk is computed: its live columns into its partial, four a call */
            const uint8_t *cols[CHUNK];
            float a[CHUNK];
            int n = 0;
            for (int i = c0; i < c1; i++)
                if (live[i]) cols[n] = bundle(w, l, i, hot) + 2 * w->part, a[n++] = 0.5f;
            float *acc = w->partial + (size_t)(c0 / CHUNK) * E;
            memset(acc, 0, sizeof(float) * E);
            for (int j = 0; j < n; j += 4) { /* chunk_down's calls */
                const int now = n - j < 4 ? n - j : 4, left = n - j - now;
                pi2_ahead ahead;
                pi2_ahead_init(&ahead, cols + j + now, left < 4 ? left : 4, w->part);
                pi2_axpy_rows(PI2_Q4_0, E, a + j, cols + j, now, acc, use_ahead ? &ahead : NULL);
            }
            bytes += (double)n * (double)w->part;
        }
    }
    return bytes;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 9, layers = argc > 2 ? atoi(argv[2]) : 8;
    if (reps < 1 || layers < 1) {
        fprintf(stderr, "usage: bench_sparse_wave [reps (9)] [layers (8)]\n");
        return 2;
    }
    pi2_kernels_init();
    wave w = {.part = pi2_row_size(PI2_Q4_0, E), .layers = layers, .named = F * 24 / 100};
    const size_t total = (size_t)layers * F * 3 * w.part;
    w.pool = pi2_huge_alloc(total);
    w.k = malloc(sizeof(int) * (size_t)layers * (size_t)w.named);
    w.live = malloc((size_t)layers * (size_t)w.named);
    w.partial = aligned_alloc(64, sizeof(float) * E * (size_t)(w.named / CHUNK + 1));
    const size_t psz = pi2_packed_act_size(PI2_Q4_0, E);
    w.packed = aligned_alloc(64, (psz + 63) / 64 * 64);
    uint8_t *seen = malloc(F);
    if (!w.pool || !w.k || !w.live || !w.partial || !w.packed || !seen) {
        fprintf(stderr, "bench_sparse_wave: out of memory (%zu MiB of bundles)\n", total >> 20);
        return 1;
    }
    for (size_t b = 0; b < total / sizeof(pi2_block_q4_0); b++) { /* random nibbles, small scales */
        pi2_block_q4_0 *blk = (pi2_block_q4_0 *)w.pool + b;
        blk->d = pi2_f32_to_f16(0.01f);
        for (int j = 0; j < PI2_QK / 2; j++) blk->qs[j] = (uint8_t)(rnd() >> 24);
    }
    for (int l = 0; l < layers; l++) { /* distinct neurons, ascending; 43% of them live */
        memset(seen, 0, F);
        for (int i = 0; i < w.named;) {
            const int k = (int)(rnd() >> 8) % F;
            if (seen[k]) continue;
            seen[k] = 1;
            w.k[(size_t)l * w.named + i] = k;
            w.live[(size_t)l * w.named + i++] = (rnd() >> 8) % 100 < 43;
        }
        qsort(w.k + (size_t)l * w.named, (size_t)w.named, sizeof(int), cmp_int);
    }
    float x[E];
    uint8_t act[E / PI2_QK * sizeof(pi2_block_q8_0)];
    for (int i = 0; i < E; i++) x[i] = sinf(0.1f * (float)i);
    pi2_prepare_act(PI2_Q4_0, x, act, E);
    pi2_pack_act(PI2_Q4_0, act, E, w.packed);

    static const char *names[3] = {"none", "ahead", "hot"};
    double *ms[3], bytes = 0;
    for (int v = 0; v < 3; v++) ms[v] = malloc(sizeof(double) * (size_t)reps);
    for (int v = 0; v < 3; v++) run(&w, v == 1, v == 2); /* warm up */
    for (int r = 0; r < reps; r++)
        for (int v = 0; v < 3; v++) {
            const uint64_t t0 = pi2_now_ns();
            const double b = run(&w, v == 1, v == 2);
            ms[v][r] = (double)(pi2_now_ns() - t0) / 1e6;
            if (v == 0) bytes = b;
        }
    printf("sparse FFN decode wave, one thread, kernel level %s: %d layers x %d of %d neurons (%.1f MB a token)\n",
           pi2_kernel_level_name(pi2_kernels_current()), layers, w.named, F, bytes / 1e6);
    double med[3];
    for (int v = 0; v < 3; v++) {
        qsort(ms[v], (size_t)reps, sizeof(double), cmp_double);
        med[v] = ms[v][reps / 2];
        printf("  %-6s %7.2f ms a token  %5.1f GB/s\n", names[v], med[v], bytes / med[v] / 1e6);
    }
    printf("  ahead / none: %.3fx the speed (median of %d reps)\n", med[0] / med[1], reps);
    return 0;
}
