/* Attention of the query heads that share one KV head (grouped-query attention) over a range of
 * positions of an F16 KV cache, written once over the including level's own dot_f16 and axpy_f16 (each level's file includes this after defining them), so that the
 * per-position steps inline instead of going through the kernel table twice per position.
 *
 * Two passes, as exact softmax: the scores of every position (the F16-rounded query against the F16
 * keys, in float), their maximum, exp(score - max) for all of them in one loop the compiler
 * vectorises (att_exp below), then V summed in float. A part returns its maximum m, its sum l and the
 * unnormalised sum of V, so that parts over different position ranges merge exactly (the caller's
 * pi2_att_merge): that lets decode split one head's positions over threads. llama.cpp's CPU flash attention instead runs an
 * online softmax with libm's expf per position and keeps the V accumulator in F16, rounded after
 * every step; that chain of dependent roundings and calls is most of decode's attention time at long
 * contexts, and the F16 accumulator only loses precision. So pi2's logits are not llama.cpp's to the
 * bit: they are closer to the exact softmax (pi2cli.models.numpy_llama, emulate=True, follows this). */
#ifndef PI2_KERNELS_ATT_H
#define PI2_KERNELS_ATT_H

#include <stdint.h>
#include <string.h>

/* e^x for x <= 0, within 2 ulp: x = n ln2 + r (Cody-Waite, |r| <= ln2 / 2), e^r by its Taylor
 * series to r^7 / 7!, 2^n through the exponent bits. Below -87 (e^x < 2^-125) it gives e^-87, well
 * under any weight that can matter after normalisation. Plain float and int arithmetic, so a loop of
 * it vectorises at every SIMD level. */
static inline float att_exp(float x) {
    /* clamped to [-87, 0], NaN to -87 as the SIMD max/min instructions do (a model whose scores are
     * not finite gives garbage, never a float-to-int conversion out of range) */
    x = x > -87.0f ? x : -87.0f;
    x = x < 0.0f ? x : 0.0f;
    const int32_t n = (int32_t)(x * 1.44269504088896341f - 0.5f); /* rounds x / ln2 for x <= 0 */
    const float r = (x - (float)n * 0.693145751953125f) - (float)n * 1.42860682030941723212e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = (n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

/* p[s] = exp(p[s] - m) for s < n; returns their sum, added in 8 running partial sums (a fixed order
 * the compiler may vectorise without reassociating: a single running sum would keep the loop scalar). */
__attribute__((optimize("tree-vectorize"))) static float att_softmax_exp(float *p, int64_t n, float m) {
    for (int64_t s = 0; s < n; s++) p[s] = att_exp(p[s] - m);
    float part[8] = {0};
    int64_t s = 0;
    for (; s + 8 <= n; s += 8)
        for (int j = 0; j < 8; j++) part[j] += p[s + j];
    for (; s < n; s++) part[0] += p[s];
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

static inline __attribute__((always_inline)) void att_f16_body(int64_t hd, int group, const pi2_f16 *q,
                                                              const pi2_f16 *k, const pi2_f16 *v, int64_t stride,
                                                              int64_t n_pos, float scale, float *p, float *out,
                                                              float *m, float *l) {
    for (int g = 0; g < group; g++) m[g] = -3.0e38f;
    for (int64_t s = 0; s < n_pos; s++) /* each key row once, from L1 for every head of the group */
        for (int g = 0; g < group; g++) {
            const float sc = dot_f16(hd, k + s * stride, q + g * hd) * scale;
            p[g * n_pos + s] = sc;
            m[g] = sc > m[g] ? sc : m[g];
        }
    for (int g = 0; g < group; g++) l[g] = n_pos ? att_softmax_exp(p + g * n_pos, n_pos, m[g]) : 0.0f;
    memset(out, 0, (size_t)group * (size_t)hd * sizeof *out);
    for (int64_t s = 0; s < n_pos; s++)
        for (int g = 0; g < group; g++) axpy_f16(hd, p[g * n_pos + s], v + s * stride, out + g * hd);
}

/* The common head sizes get their own copy, so the compiler unrolls the per-position steps. */
static void att_f16(int64_t hd, int group, const pi2_f16 *q, const pi2_f16 *k, const pi2_f16 *v, int64_t stride,
                    int64_t n_pos, float scale, float *p, float *out, float *m, float *l) {
    if (hd == 64) att_f16_body(64, group, q, k, v, stride, n_pos, scale, p, out, m, l);
    else if (hd == 128) att_f16_body(128, group, q, k, v, stride, n_pos, scale, p, out, m, l);
    else att_f16_body(hd, group, q, k, v, stride, n_pos, scale, p, out, m, l);
}

#endif
