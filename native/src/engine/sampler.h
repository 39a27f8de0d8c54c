/* Choosing the next token from logits: greedy (temperature 0) or temperature + top-p (nucleus)
 * sampling with a seeded generator, so a run is reproducible from its seed. */
#ifndef PI2_SAMPLER_H
#define PI2_SAMPLER_H

#include <stdint.h>

#include "threadpool.h"

typedef struct {
    float temperature; /* 0: greedy */
    float top_p;       /* (0, 1]; 1 keeps every token */
    uint64_t state;    /* generator state (splitmix64) */
    float *probs;      /* scratch [n_vocab] */
    int32_t *idx;      /* scratch [n_vocab] */
    double *block_sum; /* scratch [blocks of PI2_SAMPLER_BLOCK tokens]: each block's probabilities' sum */
    int32_t n_vocab;
    pi2_pool *pool;    /* NULL (pi2_sampler_init's): the vocabulary's elementwise passes on the caller alone */
} pi2_sampler;

int pi2_sampler_init(pi2_sampler *s, int32_t n_vocab, float temperature, float top_p, uint64_t seed);
void pi2_sampler_free(pi2_sampler *s);
int32_t pi2_sample(pi2_sampler *s, const float *logits);
/* Tokens per block of the sums (sampler.c): fixed, so a draw does not depend on the thread count. */
#define PI2_SAMPLER_BLOCK 1024
/* Index of the largest value (the first one on ties). */
int32_t pi2_argmax(const float *x, int32_t n);

#endif
