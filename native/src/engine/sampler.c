#include "sampler.h"

#include <math.h>
#include <stdlib.h>

#include "common.h"
#include "parmat.h"

int pi2_sampler_init(pi2_sampler *s, int32_t n_vocab, float temperature, float top_p, uint64_t seed) {
    if (!(temperature >= 0) || !(top_p > 0 && top_p <= 1)) {
        pi2_set_error("temperature must be >= 0 and top-p in (0, 1]");
        return -1;
    }
    s->temperature = temperature;
    s->top_p = top_p;
    s->state = seed;
    s->n_vocab = n_vocab;
    s->pool = NULL;
    s->probs = malloc((size_t)n_vocab * sizeof(float));
    s->idx = malloc((size_t)n_vocab * sizeof(int32_t));
    s->block_sum = malloc((size_t)(n_vocab / PI2_SAMPLER_BLOCK + 1) * sizeof(double));
    if (!s->probs || !s->idx || !s->block_sum) {
        pi2_sampler_free(s);
        pi2_set_error("out of memory for the sampler");
        return -1;
    }
    return 0;
}

void pi2_sampler_free(pi2_sampler *s) {
    free(s->probs);
    free(s->idx);
    free(s->block_sum);
    s->probs = NULL;
    s->idx = NULL;
    s->block_sum = NULL;
}

/* The maximum in 16 lanes, each its own chain of compares, then the maximum's first index: one chain
 * through x[best] cost ~11 cycles a token (158 us over SmolLM2's 49152 logits, every greedy token and
 * every draw's shift). `x > m ? x : m` never takes a NaN, so NaNs are passed over as that chain passed
 * them (and a NaN first logit is its answer, 0, as it was), and -0 and +0 tie as they did. */
int32_t pi2_argmax(const float *x, int32_t n) {
    enum { LANES = 16 };
    if (n <= 1 || x[0] != x[0]) return 0;
    float m[LANES];
    for (int k = 0; k < LANES; k++) m[k] = x[0];
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) m[k] = x[i + k] > m[k] ? x[i + k] : m[k];
    float mx = m[0];
    for (int k = 1; k < LANES; k++) mx = m[k] > mx ? m[k] : mx;
    for (; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (i = 0; i < n; i++)
        if (x[i] == mx) break;
    return i;
}

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static const float *sort_probs;
static int by_prob_desc(const void *a, const void *b) {
    float pa = sort_probs[*(const int32_t *)a], pb = sort_probs[*(const int32_t *)b];
    if (pa != pb) return pa < pb ? 1 : -1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* Test-only: PI2_TEST_DELAY_US=N makes every sampled token N microseconds slower, spun on the monotonic
 * clock so the delay is exact (sleep would round it up). The farm's regression tests inject a known
 * slowdown with it; unset (always, outside tests) it costs one getenv per process. */
static void test_delay(void) {
    static long delay_ns = -1;
    if (delay_ns < 0) {
        const char *v = getenv("PI2_TEST_DELAY_US");
        delay_ns = v && *v ? strtol(v, NULL, 10) * 1000 : 0;
        if (delay_ns < 0) delay_ns = 0;
    }
    if (!delay_ns) return;
    uint64_t until = pi2_now_ns() + (uint64_t)delay_ns;
    while (pi2_now_ns() < until) {
    }
}

/* The vocabulary's passes (exp, then division by the sum) go to the pool's threads while they would
 * otherwise wait for the next token, block by block of PI2_SAMPLER_BLOCK tokens: each value is computed
 * alone, and each block's sum in token order, so the floats depend on neither the split nor the thread
 * count. The calling thread adds the blocks' sums in block order. Summed over the whole vocabulary on
 * the calling thread, in one chain of dependent double adds, the two sums and draw's scan took ~150 us
 * a token of SmolLM2's 49152 (at 16 threads, where a token is ~9 ms): long enough for the pool's
 * workers to fall asleep before the next token's first job. */
typedef struct vocab_job vocab_job;
struct vocab_job {
    const float *logits;
    float *probs;
    double *block_sum;
    int32_t n;
    float mx, temperature;
    double sum; /* the normalisation's divisor (its pass only) */
    /* the pass: tokens [i0, i1) of one block computed, their sum returned */
    double (*block)(const vocab_job *j, int64_t i0, int64_t i1);
    pi2_chunks blocks;
};

static double exp_block(const vocab_job *j, int64_t i0, int64_t i1) {
    double sum = 0;
    for (int64_t i = i0; i < i1; i++) sum += j->probs[i] = expf((j->logits[i] - j->mx) / j->temperature);
    return sum;
}

static double normalize_block(const vocab_job *j, int64_t i0, int64_t i1) {
    double sum = 0;
    for (int64_t i = i0; i < i1; i++) sum += j->probs[i] = (float)(j->probs[i] / j->sum);
    return sum;
}

static void blocks_worker(void *p, int ith, int nth) {
    (void)ith, (void)nth;
    vocab_job *j = p;
    int64_t b, e;
    while (pi2_chunks_take(&j->blocks, &b, &e))
        for (int64_t k = b; k < e; k++) {
            const int64_t i0 = k * PI2_SAMPLER_BLOCK, i1 = i0 + PI2_SAMPLER_BLOCK < j->n ? i0 + PI2_SAMPLER_BLOCK : j->n;
            j->block_sum[k] = j->block(j, i0, i1);
        }
}

static int32_t n_blocks(const pi2_sampler *s) { return (s->n_vocab + PI2_SAMPLER_BLOCK - 1) / PI2_SAMPLER_BLOCK; }

/* The blocks' sums, in block order. */
static double blocks_total(const pi2_sampler *s) {
    double t = 0;
    for (int32_t k = 0; k < n_blocks(s); k++) t += s->block_sum[k];
    return t;
}

static double uniform(pi2_sampler *s) { return (double)(splitmix64(&s->state) >> 11) * (1.0 / 9007199254740992.0); }

/* One of the first `keep` tokens of idx, each as likely as its share of their mass, summed in list order. */
static int32_t draw_listed(pi2_sampler *s, const int32_t *idx, int32_t keep) {
    double mass = 0;
    for (int32_t i = 0; i < keep; i++) mass += s->probs[idx[i]];
    double r = uniform(s) * mass;
    for (int32_t i = 0; i < keep; i++) {
        r -= s->probs[idx[i]];
        if (r < 0) return idx[i];
    }
    return idx[keep - 1];
}

/* One token of the whole vocabulary, each as likely as its probability: the block holding the draw is
 * found from the blocks' sums (normalize_block's), then the token within it. */
static int32_t draw_all(pi2_sampler *s) {
    double r = uniform(s) * blocks_total(s);
    int32_t k = 0;
    while (k + 1 < n_blocks(s) && r - s->block_sum[k] >= 0) r -= s->block_sum[k++];
    const int32_t i0 = k * PI2_SAMPLER_BLOCK, i1 = i0 + PI2_SAMPLER_BLOCK < s->n_vocab ? i0 + PI2_SAMPLER_BLOCK : s->n_vocab;
    for (int32_t i = i0; i < i1; i++) {
        r -= s->probs[i];
        if (r < 0) return i;
    }
    return i1 - 1;
}

/* One pass over the vocabulary's blocks, split over the pool's threads (or run here without one). */
static void over_vocab(pi2_sampler *s, vocab_job *j, double (*block)(const vocab_job *, int64_t, int64_t)) {
    j->block = block;
    pi2_chunks_init(&j->blocks, n_blocks(s), 1, s->pool ? pi2_pool_size(s->pool) : 1);
    pi2_pool_run_chunks(s->pool, blocks_worker, j);
}

int32_t pi2_sample(pi2_sampler *s, const float *logits) {
    test_delay();
    const int32_t n = s->n_vocab;
    if (s->temperature == 0.0f) return pi2_argmax(logits, n);
    vocab_job j = {.logits = logits, .probs = s->probs, .block_sum = s->block_sum, .n = n,
                   .mx = logits[pi2_argmax(logits, n)], .temperature = s->temperature};
    over_vocab(s, &j, exp_block);
    j.sum = blocks_total(s);
    over_vocab(s, &j, normalize_block);
    if (s->top_p >= 1.0f) return draw_all(s); /* every token, in token order: no index list */
    /* Nucleus: the smallest set of most likely tokens whose mass reaches top_p. */
    for (int32_t i = 0; i < n; i++) s->idx[i] = i;
    sort_probs = s->probs;
    qsort(s->idx, (size_t)n, sizeof(int32_t), by_prob_desc);
    double cum = 0;
    int32_t keep = 0;
    while (keep < n) {
        cum += s->probs[s->idx[keep++]];
        if (cum >= s->top_p) break;
    }
    return draw_listed(s, s->idx, keep);
}
