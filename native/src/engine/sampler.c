#include "sampler.h"

#include <math.h>
#include <stdlib.h>

#include "common.h"

int pi2_sampler_init(pi2_sampler *s, int32_t n_vocab, float temperature, float top_p, uint64_t seed) {
    if (!(temperature >= 0) || !(top_p > 0 && top_p <= 1)) {
        pi2_set_error("temperature must be >= 0 and top-p in (0, 1]");
        return -1;
    }
    s->temperature = temperature;
    s->top_p = top_p;
    s->state = seed;
    s->n_vocab = n_vocab;
    s->probs = malloc((size_t)n_vocab * sizeof(float));
    s->idx = malloc((size_t)n_vocab * sizeof(int32_t));
    if (!s->probs || !s->idx) {
        pi2_sampler_free(s);
        pi2_set_error("out of memory for the sampler");
        return -1;
    }
    return 0;
}

void pi2_sampler_free(pi2_sampler *s) {
    free(s->probs);
    free(s->idx);
    s->probs = NULL;
    s->idx = NULL;
}

int32_t pi2_argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
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

int32_t pi2_sample(pi2_sampler *s, const float *logits) {
    test_delay();
    const int32_t n = s->n_vocab;
    if (s->temperature == 0.0f) return pi2_argmax(logits, n);
    const float mx = logits[pi2_argmax(logits, n)];
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += (s->probs[i] = expf((logits[i] - mx) / s->temperature));
    for (int32_t i = 0; i < n; i++) s->probs[i] = (float)(s->probs[i] / sum);
    /* Nucleus: the smallest set of most likely tokens whose mass reaches top_p. */
    int32_t keep = n;
    if (s->top_p < 1.0f) {
        for (int32_t i = 0; i < n; i++) s->idx[i] = i;
        sort_probs = s->probs;
        qsort(s->idx, (size_t)n, sizeof(int32_t), by_prob_desc);
        double cum = 0;
        for (keep = 0; keep < n;) {
            cum += s->probs[s->idx[keep++]];
            if (cum >= s->top_p) break;
        }
    } else {
        for (int32_t i = 0; i < n; i++) s->idx[i] = i;
    }
    double mass = 0;
    for (int32_t i = 0; i < keep; i++) mass += s->probs[s->idx[i]];
    double r = (double)(splitmix64(&s->state) >> 11) * (1.0 / 9007199254740992.0) * mass;
    for (int32_t i = 0; i < keep; i++) {
        r -= s->probs[s->idx[i]];
        if (r < 0) return s->idx[i];
    }
    return s->idx[keep - 1];
}
