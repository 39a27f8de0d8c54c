/* CRC-32 against zlib's known values, and the sampler: greedy is argmax, sampling is reproducible
 * from its seed and top-p keeps only the nucleus. */
#include <string.h>

#include "check.h"
#include "crc32.h"
#include "sampler.h"

int main(void) {
    CHECK(pi2_crc32(0, "", 0) == 0);
    CHECK(pi2_crc32(0, "123456789", 9) == 0xCBF43926u); /* the standard check value */
    const char *text = "The quick brown fox jumps over the lazy dog";
    uint32_t whole = pi2_crc32(0, text, strlen(text));
    CHECK(whole == 0x414FA339u);
    CHECK(pi2_crc32(pi2_crc32(0, text, 10), text + 10, strlen(text) - 10) == whole); /* streaming */

    float logits[6] = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f, 2.0f};
    CHECK(pi2_argmax(logits, 6) == 1); /* first of the tied maxima */
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
    return pi2_test_summary("test_format_helpers");
}
