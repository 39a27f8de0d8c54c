/* RMSNorm, rounded as ggml's CPU op: the forward pass's and the sparse engine's lookahead's. */
#ifndef PI2_NORM_H
#define PI2_NORM_H

#include <stdint.h>

/* out = x / rms(x) * w over n values. */
void pi2_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);

#endif
