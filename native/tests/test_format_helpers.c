/* CRC-32 against zlib's known values, and the sampler: greedy is argmax, sampling is reproducible
 * from its seed, top-p keeps only the nucleus, and a thread pool draws the same tokens as one thread. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "crc32.h"
#include "sampler.h"
#include "threadpool.h"

/* pi2_argmax against the one-chain loop it replaced (best moves on a strictly larger value only), on
 * lengths around its 16 lanes, ties, signed zeros and NaNs (passed over; a NaN first value wins). */
static int32_t argmax_reference(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void check_argmax_is_the_first_strict_maximum(void) {
    enum { MAX = 100 };
    float x[MAX];
    uint32_t st = 3;
    int bad = 0;
    for (int n = 1; n <= MAX; n++)
        for (int trial = 0; trial < 40; trial++) {
            for (int i = 0; i < n; i++) { /* few distinct values: ties everywhere */
                st = st * 1664525u + 1013904223u;
                const uint32_t r = st >> 24;
                x[i] = r < 8 ? NAN : r < 16 ? -0.0f : r < 24 ? 0.0f : (float)(r % 5) - 2.0f;
            }
            if (trial % 4 == 0) x[0] = NAN;
            bad += pi2_argmax(x, n) != argmax_reference(x, n);
        }
    CHECK(bad == 0);
}

/* A vocabulary of SmolLM2's size and 3 threads: the draws with the pool are the draws without it,
 * with and without top-p (the pool only splits passes whose values do not depend on the split). */
static void check_pool_draws_alike(void) {
    enum { N = 49152, DRAWS = 300 };
    float *logits = malloc(sizeof(float) * N);
    uint32_t st = 7;
    for (int i = 0; i < N; i++) st = st * 1664525u + 1013904223u, logits[i] = (float)(st >> 8) / (1 << 24) * 12.0f;
    pi2_pool *pool = pi2_pool_create(3, NULL);
    CHECK(logits && pool);
    const float top_ps[2] = {1.0f, 0.9f};
    for (int k = 0; k < 2; k++) {
        pi2_sampler a, b;
        CHECK(pi2_sampler_init(&a, N, 0.8f, top_ps[k], 11) == 0 && pi2_sampler_init(&b, N, 0.8f, top_ps[k], 11) == 0);
        b.pool = pool;
        int differ = 0, distinct = 0, prev = -1;
        for (int i = 0; i < DRAWS; i++) {
            const int32_t x = pi2_sample(&a, logits), y = pi2_sample(&b, logits);
            differ += x != y || memcmp(a.probs, b.probs, sizeof(float) * N) != 0; /* every probability too */
            distinct += x != prev, prev = x;
        }
        CHECK(differ == 0);
        CHECK(distinct > DRAWS / 2); /* a real draw over many tokens, not one token again and again */
        pi2_sampler_free(&a);
        pi2_sampler_free(&b);
    }
    pi2_pool_free(pool);
    free(logits);
}

int main(void) {
    CHECK(pi2_crc32(0, "", 0) == 0);
    CHECK(pi2_crc32(0, "123456789", 9) == 0xCBF43926u); /* the standard check value */
    const char *text = "The quick brown fox jumps over the lazy dog";
    uint32_t whole = pi2_crc32(0, text, strlen(text));
    CHECK(whole == 0x414FA339u);
    CHECK(pi2_crc32(pi2_crc32(0, text, 10), text + 10, strlen(text) - 10) == whole); /* streaming */

    float logits[6] = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f, 2.0f};
    CHECK(pi2_argmax(logits, 6) == 1); /* first of the tied maxima */
    check_argmax_is_the_first_strict_maximum();
    pi2_sampler s, s2;
    CHECK(pi2_sampler_init(&s, 6, 0.0f, 1.0f, 1) == 0);
    CHECK(pi2_sample(&s, logits) == 1);
    pi2_sampler_free(&s);
    CHECK(pi2_sampler_init(&s, 6, 1.0f, 1.0f, 42) == 0 && pi2_sampler_init(&s2, 6, 1.0f, 1.0f, 42) == 0);
    int same = 1, counts[6] = {0};
    for (int i = 0; i < 2000; i++) {
        int32_t a = pi2_sample(&s, logits), b = pi2_sample(&s2, logits);
        same &= a == b;
        counts[a]++;
    }
    CHECK(same);
    CHECK(counts[2] > 0 && counts[1] > counts[2]); /* everything possible, likelier tokens more often */
    pi2_sampler_free(&s);
    pi2_sampler_free(&s2);
    /* top-p 0.5: tokens 1, 5 (p ~0.31 each) form the nucleus; nothing else is ever drawn */
    CHECK(pi2_sampler_init(&s, 6, 1.0f, 0.5f, 3) == 0);
    int outside = 0;
    for (int i = 0; i < 2000; i++) {
        int32_t a = pi2_sample(&s, logits);
        outside += a != 1 && a != 5;
    }
    CHECK(outside == 0);
    pi2_sampler_free(&s);
    CHECK(pi2_sampler_init(&s, 6, -1.0f, 1.0f, 3) == -1);
    check_pool_draws_alike();
    return pi2_test_summary("test_format_helpers");
}
