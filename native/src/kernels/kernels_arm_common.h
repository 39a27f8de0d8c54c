/* The arm64 kernels, compiled once per level: kernels_neon.c (ARMv8.0 NEON), kernels_dotprod.c
 * (+dotprod: vdotq_s32) and kernels_i8mm.c (+i8mm, which adds its own gemm). The only difference
 * between the first two is dot16(): SDOT where the compiler may use it, otherwise widening multiplies.
 * Each including file defines its own pi2_kernels_fill_* that calls arm_fill(). Everything here is
 * static, so the three copies never collide. */
#ifndef PI2_KERNELS_ARM_COMMON_H
#define PI2_KERNELS_ARM_COMMON_H

#include <arm_neon.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernels_impl.h"

static inline float h2f(pi2_f16 h) {
    __fp16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}

/* acc + the four 4-byte-group dot products of a and b (16 int8 each) */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    /* ARMv8.0: widening multiplies (|a*b| <= 2^14 fits int16), pairs summed into int32 */
    int16x8_t p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    int16x8_t p1 = vmull_high_s8(a, b);
    return vaddq_s32(acc, vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1)));
#endif
}

/* one block's integer dot product as 4 lanes (sum them for the total) */
static inline int32x4_t block_dot(int8x16_t w0, int8x16_t w1, const int8_t *a) {
    return dot16(dot16(vdupq_n_s32(0), w0, vld1q_s8(a)), w1, vld1q_s8(a + 16));
}

static inline void unpack_q4(const uint8_t *qs, int8x16_t *lo, int8x16_t *hi) {
    uint8x16_t v = vld1q_u8(qs);
    *lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
    *hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
}

/* NR rows (1..4) against one activation, each row with the float steps of a single dot: rows going
 * through together share the activation loads and overlap their memory streams. ahead: NULL, or the
 * rows read next (kernels.h), paced over the steps. */
static inline __attribute__((always_inline)) void dot_q4_0_rows(int NR, const uint8_t *const *rows, int64_t n,
                                                               const void *act, float *y, pi2_ahead *ahead) {
    const pi2_block_q8_0 *a = act;
    float32x4_t acc0[4], acc1[4];
    const int8x16_t eight = vdupq_n_s8(8);
    const int64_t nb = n / PI2_QK;
    for (int r = 0; r < NR; r++) acc0[r] = acc1[r] = vdupq_n_f32(0);
    pi2_ahead_pace(ahead, nb / 2);
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        pi2_ahead_step(ahead);
        const int8x16_t a0l = vld1q_s8(a[i].qs), a0h = vld1q_s8(a[i].qs + 16);
        const int8x16_t a1l = vld1q_s8(a[i + 1].qs), a1h = vld1q_s8(a[i + 1].qs + 16);
        const float da0 = h2f(a[i].d), da1 = h2f(a[i + 1].d);
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            const pi2_block_q4_0 *w = (const pi2_block_q4_0 *)rows[r];
            int8x16_t l0, h0, l1, h1;
            unpack_q4(w[i].qs, &l0, &h0);
            unpack_q4(w[i + 1].qs, &l1, &h1);
            int32x4_t p0 = dot16(dot16(vdupq_n_s32(0), vsubq_s8(l0, eight), a0l), vsubq_s8(h0, eight), a0h);
            int32x4_t p1 = dot16(dot16(vdupq_n_s32(0), vsubq_s8(l1, eight), a1l), vsubq_s8(h1, eight), a1h);
            acc0[r] = vmlaq_n_f32(acc0[r], vcvtq_f32_s32(p0), h2f(w[i].d) * da0);
            acc1[r] = vmlaq_n_f32(acc1[r], vcvtq_f32_s32(p1), h2f(w[i + 1].d) * da1);
        }
    }
    for (int r = 0; r < NR; r++) {
        const pi2_block_q4_0 *w = (const pi2_block_q4_0 *)rows[r];
        for (int64_t j = i; j < nb; j++) {
            int8x16_t l0, h0;
            unpack_q4(w[j].qs, &l0, &h0);
            int32x4_t p0 = block_dot(vsubq_s8(l0, eight), vsubq_s8(h0, eight), a[j].qs);
            acc0[r] = vmlaq_n_f32(acc0[r], vcvtq_f32_s32(p0), h2f(w[j].d) * h2f(a[j].d));
        }
        y[r] = vaddvq_f32(vaddq_f32(acc0[r], acc1[r]));
    }
}

static float dot_q4_0(int64_t n, const void *row, const void *act) {
    const uint8_t *rows[1] = {row};
    float y;
    dot_q4_0_rows(1, rows, n, act, &y, NULL);
    return y;
}

/* the packed activation is the activation itself at the arm levels */
static void dot_packed_rows_q4_0(int64_t n, const uint8_t *const *rows, int count, const void *packed, float *y,
                                 pi2_ahead *ahead) {
    switch (count) {
    case 1: dot_q4_0_rows(1, rows, n, packed, y, ahead); break;
    case 2: dot_q4_0_rows(2, rows, n, packed, y, ahead); break;
    case 3: dot_q4_0_rows(3, rows, n, packed, y, ahead); break;
    default: dot_q4_0_rows(4, rows, n, packed, y, ahead); break;
    }
}

/* the dense GEMV: rows four at a time (the same floats as dot_q4_0 per row) */
static void rows_q4_0(const void *w, size_t rb, const int32_t *idx, int64_t count, int64_t n, const void *act,
                      float *y) {
    const uint8_t *base = w;
    int64_t i = 0;
    for (; i + 4 <= count; i += 4) {
        const uint8_t *rows[4];
        for (int r = 0; r < 4; r++) rows[r] = base + (size_t)(idx ? idx[i + r] : i + r) * rb;
        dot_q4_0_rows(4, rows, n, act, y + i, NULL);
    }
    for (; i < count; i++) {
        const uint8_t *rows[1] = {base + (size_t)(idx ? idx[i] : i) * rb};
        dot_q4_0_rows(1, rows, n, act, y + i, NULL);
    }
}

static float dot_q4_1(int64_t n, const void *row, const void *act) {
    const pi2_block_q4_1 *w = row;
    const pi2_block_q8_1 *a = act;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    float ms = 0.0f;
    const int64_t nb = n / PI2_QK;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        int8x16_t l0, h0, l1, h1;
        unpack_q4(w[i].qs, &l0, &h0);
        unpack_q4(w[i + 1].qs, &l1, &h1);
        acc0 = vmlaq_n_f32(acc0, vcvtq_f32_s32(block_dot(l0, h0, a[i].qs)), h2f(w[i].d) * h2f(a[i].d));
        acc1 = vmlaq_n_f32(acc1, vcvtq_f32_s32(block_dot(l1, h1, a[i + 1].qs)), h2f(w[i + 1].d) * h2f(a[i + 1].d));
        ms += h2f(w[i].m) * h2f(a[i].s) + h2f(w[i + 1].m) * h2f(a[i + 1].s);
    }
    for (; i < nb; i++) {
        int8x16_t l0, h0;
        unpack_q4(w[i].qs, &l0, &h0);
        acc0 = vmlaq_n_f32(acc0, vcvtq_f32_s32(block_dot(l0, h0, a[i].qs)), h2f(w[i].d) * h2f(a[i].d));
        ms += h2f(w[i].m) * h2f(a[i].s);
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1)) + ms;
}

static float dot_q8_0(int64_t n, const void *row, const void *act) {
    const pi2_block_q8_0 *w = row, *a = act;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);
    const int64_t nb = n / PI2_QK;
    int64_t i = 0;
    for (; i + 1 < nb; i += 2) {
        int32x4_t p0 = block_dot(vld1q_s8(w[i].qs), vld1q_s8(w[i].qs + 16), a[i].qs);
        int32x4_t p1 = block_dot(vld1q_s8(w[i + 1].qs), vld1q_s8(w[i + 1].qs + 16), a[i + 1].qs);
        acc0 = vmlaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[i].d) * h2f(a[i].d));
        acc1 = vmlaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(w[i + 1].d) * h2f(a[i + 1].d));
    }
    for (; i < nb; i++) {
        int32x4_t p0 = block_dot(vld1q_s8(w[i].qs), vld1q_s8(w[i].qs + 16), a[i].qs);
        acc0 = vmlaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(w[i].d) * h2f(a[i].d));
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1));
}

static float dot_f32(int64_t n, const void *row, const void *act) {
    const float *w = row, *a = act;
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++) acc[k] = vfmaq_f32(acc[k], vld1q_f32(w + i + 4 * k), vld1q_f32(a + i + 4 * k));
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], vld1q_f32(w + i), vld1q_f32(a + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; i++) s += w[i] * a[i];
    return s;
}

static inline float32x4_t load_h4(const pi2_f16 *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

static inline __attribute__((always_inline)) float dot_f16(int64_t n, const void *row, const void *act) {
    const pi2_f16 *w = row, *a = act;
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++) acc[k] = vfmaq_f32(acc[k], load_h4(w + i + 4 * k), load_h4(a + i + 4 * k));
    for (; i + 4 <= n; i += 4) acc[0] = vfmaq_f32(acc[0], load_h4(w + i), load_h4(a + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; i++) s += h2f(w[i]) * h2f(a[i]);
    return s;
}

/* ---- axpy ---- */

static inline void axpy_s8x16(int8x16_t q, float s, float m, float *y) {
    int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
    const float32x4_t vs = vdupq_n_f32(s), vm = vdupq_n_f32(m);
    float32x4_t f[4] = {vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vcvtq_f32_s32(vmovl_high_s16(lo)),
                        vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vcvtq_f32_s32(vmovl_high_s16(hi))};
    for (int k = 0; k < 4; k++) vst1q_f32(y + 4 * k, vaddq_f32(vld1q_f32(y + 4 * k), vfmaq_f32(vm, f[k], vs)));
}

static void axpy_q4_0(int64_t n, float a, const void *row, float *y) {
    const pi2_block_q4_0 *w = row;
    const int8x16_t eight = vdupq_n_s8(8);
    for (int64_t i = 0; i < n / PI2_QK; i++, y += PI2_QK) {
        int8x16_t lo, hi;
        unpack_q4(w[i].qs, &lo, &hi);
        const float s = a * h2f(w[i].d);
        axpy_s8x16(vsubq_s8(lo, eight), s, 0.0f, y);
        axpy_s8x16(vsubq_s8(hi, eight), s, 0.0f, y + 16);
    }
}

/* y += a[0] * row 0 + ... (count <= 4 rows, in order), y kept in registers per block: the same floats
 * as axpy_q4_0 one row after another (y + (q * s + 0)), with y read and written once per group. */
static void axpy_rows_q4_0(int64_t n, const float *a, const uint8_t *const *rows, int count, float *y,
                           pi2_ahead *ahead) {
    const int8x16_t eight = vdupq_n_s8(8);
    const float32x4_t zero = vdupq_n_f32(0.0f);
    pi2_ahead_pace(ahead, n / PI2_QK);
    for (int64_t i = 0; i < n / PI2_QK; i++, y += PI2_QK) {
        pi2_ahead_step(ahead);
        float32x4_t acc[8];
        for (int k = 0; k < 8; k++) acc[k] = vld1q_f32(y + 4 * k);
        for (int r = 0; r < count; r++) {
            const pi2_block_q4_0 *w = (const pi2_block_q4_0 *)rows[r] + i;
            int8x16_t lo, hi;
            unpack_q4(w->qs, &lo, &hi);
            const float32x4_t vs = vdupq_n_f32(a[r] * h2f(w->d));
            const int8x16_t q[2] = {vsubq_s8(lo, eight), vsubq_s8(hi, eight)};
            for (int h = 0; h < 2; h++) {
                const int16x8_t l = vmovl_s8(vget_low_s8(q[h])), u = vmovl_high_s8(q[h]);
                const float32x4_t f[4] = {vcvtq_f32_s32(vmovl_s16(vget_low_s16(l))), vcvtq_f32_s32(vmovl_high_s16(l)),
                                          vcvtq_f32_s32(vmovl_s16(vget_low_s16(u))), vcvtq_f32_s32(vmovl_high_s16(u))};
                for (int k = 0; k < 4; k++) acc[4 * h + k] = vaddq_f32(acc[4 * h + k], vfmaq_f32(zero, f[k], vs));
            }
        }
        for (int k = 0; k < 8; k++) vst1q_f32(y + 4 * k, acc[k]);
    }
}

/* ---- axpy over a batch: prefill's down pass (kernels_axpy_batch.h's driver around these two) ---- */

/* block w's 32 weights as floats, q - 8 (exact) */
static inline void axb_unpack(const pi2_block_q4_0 *w, float *f) {
    int8x16_t lo, hi;
    unpack_q4(w->qs, &lo, &hi);
    const int8x16_t q[2] = {vsubq_s8(lo, vdupq_n_s8(8)), vsubq_s8(hi, vdupq_n_s8(8))};
    for (int h = 0; h < 2; h++) {
        const int16x8_t l = vmovl_s8(vget_low_s8(q[h])), u = vmovl_high_s8(q[h]);
        vst1q_f32(f + 16 * h, vcvtq_f32_s32(vmovl_s16(vget_low_s16(l))));
        vst1q_f32(f + 16 * h + 4, vcvtq_f32_s32(vmovl_high_s16(l)));
        vst1q_f32(f + 16 * h + 8, vcvtq_f32_s32(vmovl_s16(vget_low_s16(u))));
        vst1q_f32(f + 16 * h + 12, vcvtq_f32_s32(vmovl_high_s16(u)));
    }
}

/* y[0..32) += a[k] * (qf[c] * d[c]) for k < count, c = ix[k] - c0, as axpy_q4_0: y + (q * (a * d) + 0) */
static inline void axb_add(float *y, const float *qf, const float *d, const int32_t *ix, int32_t c0, const float *a,
                           int32_t count) {
    const float32x4_t zero = vdupq_n_f32(0.0f);
    float32x4_t acc[8];
    for (int i = 0; i < 8; i++) acc[i] = vld1q_f32(y + 4 * i);
    for (int32_t k = 0; k < count; k++) {
        const int32_t c = ix[k] - c0;
        const float *f = qf + c * PI2_QK;
        const float32x4_t s = vdupq_n_f32(a[k] * d[c]);
        for (int i = 0; i < 8; i++) acc[i] = vaddq_f32(acc[i], vfmaq_f32(zero, vld1q_f32(f + 4 * i), s));
    }
    for (int i = 0; i < 8; i++) vst1q_f32(y + 4 * i, acc[i]);
}

#include "kernels_axpy_batch.h"

static void axpy_q4_1(int64_t n, float a, const void *row, float *y) {
    const pi2_block_q4_1 *w = row;
    for (int64_t i = 0; i < n / PI2_QK; i++, y += PI2_QK) {
        int8x16_t lo, hi;
        unpack_q4(w[i].qs, &lo, &hi);
        const float s = a * h2f(w[i].d), m = a * h2f(w[i].m);
        axpy_s8x16(lo, s, m, y);
        axpy_s8x16(hi, s, m, y + 16);
    }
}

static void axpy_q8_0(int64_t n, float a, const void *row, float *y) {
    const pi2_block_q8_0 *w = row;
    for (int64_t i = 0; i < n / PI2_QK; i++, y += PI2_QK) {
        const float s = a * h2f(w[i].d);
        axpy_s8x16(vld1q_s8(w[i].qs), s, 0.0f, y);
        axpy_s8x16(vld1q_s8(w[i].qs + 16), s, 0.0f, y + 16);
    }
}

static void axpy_f32(int64_t n, float a, const void *row, float *y) {
    const float *w = row;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_n_f32(vld1q_f32(w + i), a)));
    for (; i < n; i++) y[i] += a * w[i];
}

static inline __attribute__((always_inline)) void axpy_f16(int64_t n, float a, const void *row, float *y) {
    const pi2_f16 *w = row;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_n_f32(load_h4(w + i), a)));
    for (; i < n; i++) y[i] += a * h2f(w[i]);
}

static inline void store_h4(pi2_f16 *p, float32x4_t v) { vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(v))); }

#include "kernels_att.h"

/* ---- activation quantizers: llama.cpp's arm quantize_row_q8_0/q8_1 semantics (id = 1/d, vcvtn) ---- */

static inline float block_amax(const float *x, float32x4_t v[8]) {
    float32x4_t m = vdupq_n_f32(0);
    for (int k = 0; k < 8; k++) {
        v[k] = vld1q_f32(x + 4 * k);
        m = vmaxq_f32(m, vabsq_f32(v[k]));
    }
    return vmaxvq_f32(m);
}

static inline int quantize_block(const float32x4_t v[8], float id, int8_t *out) {
    int32x4_t q[8], sum = vdupq_n_s32(0);
    for (int k = 0; k < 8; k++) {
        q[k] = vcvtnq_s32_f32(vmulq_n_f32(v[k], id));
        sum = vaddq_s32(sum, q[k]);
    }
    for (int k = 0; k < 2; k++) {
        int16x8_t a = vcombine_s16(vqmovn_s32(q[4 * k]), vqmovn_s32(q[4 * k + 1]));
        int16x8_t b = vcombine_s16(vqmovn_s32(q[4 * k + 2]), vqmovn_s32(q[4 * k + 3]));
        vst1q_s8(out + 16 * k, vcombine_s8(vqmovn_s16(a), vqmovn_s16(b)));
    }
    return vaddvq_s32(sum);
}

static void act_q8_0(const float *x, void *out, int64_t n) {
    pi2_block_q8_0 *y = out;
    float32x4_t v[8];
    for (int64_t i = 0; i < n / PI2_QK; i++, x += PI2_QK) {
        const float d = block_amax(x, v) / 127.0f;
        y[i].d = pi2_f32_to_f16(d);
        quantize_block(v, d != 0.0f ? 1.0f / d : 0.0f, y[i].qs);
    }
}

static void act_q8_1(const float *x, void *out, int64_t n) {
    pi2_block_q8_1 *y = out;
    float32x4_t v[8];
    for (int64_t i = 0; i < n / PI2_QK; i++, x += PI2_QK) {
        const float d = block_amax(x, v) / 127.0f;
        y[i].d = pi2_f32_to_f16(d);
        int sum = quantize_block(v, d != 0.0f ? 1.0f / d : 0.0f, y[i].qs);
        y[i].s = pi2_f32_to_f16(d * (float)sum);
    }
}

static void act_f16(const float *x, void *out, int64_t n) {
    pi2_f16 *h = out;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(h + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) h[i] = pi2_f32_to_f16(x[i]);
}

/* ---- gemm: the tiling driver (kernels_gemm_tiles.h) around this level's micro-kernel ---- */

#define PI2_GEMM_ACT int8_t
#include "kernels_gemm_tiles.h"

static inline __attribute__((always_inline)) void load_wblock(int kind, const void *wrow, int64_t b, int8x16_t *w0,
                                                               int8x16_t *w1, float *dw, float *mw) {
    if (kind == KIND_Q4_0) {
        const pi2_block_q4_0 *w = (const pi2_block_q4_0 *)wrow + b;
        unpack_q4(w->qs, w0, w1);
        *w0 = vsubq_s8(*w0, vdupq_n_s8(8));
        *w1 = vsubq_s8(*w1, vdupq_n_s8(8));
        *dw = h2f(w->d);
        *mw = 0.0f;
    } else if (kind == KIND_Q4_1) {
        const pi2_block_q4_1 *w = (const pi2_block_q4_1 *)wrow + b;
        unpack_q4(w->qs, w0, w1);
        *dw = h2f(w->d);
        *mw = h2f(w->m);
    } else {
        const pi2_block_q8_0 *w = (const pi2_block_q8_0 *)wrow + b;
        *w0 = vld1q_s8(w->qs);
        *w1 = vld1q_s8(w->qs + 16);
        *dw = h2f(w->d);
        *mw = 0.0f;
    }
}

/* da/sa: [block][MICRO] activation scales (and Q8_1 sums) of this micro-tile */
static inline __attribute__((always_inline)) void gemm_row_micro(int kind, int nt, const void *wrow, int64_t nb,
                                                                 const PI2_GEMM_ACT *const *acts, size_t ablock,
                                                                 const float *da, const float *sa, float *out) {
    float32x4_t acc[MICRO];
    float32x4_t corr = vdupq_n_f32(0);
    for (int t = 0; t < MICRO; t++) acc[t] = vdupq_n_f32(0);
    for (int64_t b = 0; b < nb; b++) {
        int8x16_t w0, w1;
        float dw, mw;
        load_wblock(kind, wrow, b, &w0, &w1, &dw, &mw);
        const float32x4_t scale = vmulq_n_f32(vld1q_f32(da + b * MICRO), dw);
        if (kind == KIND_Q4_1) corr = vfmaq_n_f32(corr, vld1q_f32(sa + b * MICRO), mw);
        /* the lane index must be a literal */
#define MICRO_STEP(T)                                                              \
    if (T < nt) {                                                                  \
        int32x4_t p = block_dot(w0, w1, acts[T] + b * ablock);                     \
        acc[T] = vfmaq_laneq_f32(acc[T], vcvtq_f32_s32(p), scale, T);              \
    }
        MICRO_STEP(0) MICRO_STEP(1) MICRO_STEP(2) MICRO_STEP(3)
#undef MICRO_STEP
    }
    float c[MICRO];
    vst1q_f32(c, corr);
    for (int t = 0; t < nt; t++) out[t] = vaddvq_f32(acc[t]) + c[t];
}

PI2_GEMM_VIA_DOT(f32)
PI2_GEMM_VIA_DOT(f16)
PI2_ROWS_VIA_DOT(f32)
PI2_ROWS_VIA_DOT(f16)
PI2_ROWS_VIA_DOT(q4_1)
PI2_ROWS_VIA_DOT(q8_0)

#if defined(__ARM_FEATURE_DOTPROD)
/* ---- the batch GEMM (kernels.h, pi2_batch_gemm): Q4_0 rows as lanes, four at a time ----
 * A quad of rows is unpacked once per call into, per block, 8 vectors: vector j holds the four rows'
 * weights 4j..4j+3 (nibble - 8, int8), so one SDOT by element (vdotq_lane_s32 on the batch's 8-byte
 * chunks) multiplies them with a token's 4-byte group j and adds into the quad's 4 int32 lanes: 8
 * SDOT per token, block and quad, 16 products each (SDOT's most), and no horizontal sum at the end.
 * The tile's 8 tokens come
 * through the batch's records (one pointer, fixed offsets). Per row and token the floats are
 * sum = fma((float)isum, d_w * d_a, sum) block after block: this level's order, within rounding of the
 * scalar reference (test_kernels.c). A quad's weights (128 bytes a block) stay in L1 while the
 * tokens go by. */
#define BQ 4 /* rows per quad: the int32 lanes of one vector */

/* rows r0 .. r0 + nr - 1 (nr <= 4; the rest zero, scale 0) of plain rows or of rows interleaved by four
 * -> u[b * 8 + j], dw[b * 4 + i] */
static void batch_unpack_quad(const uint8_t *w, size_t row_bytes, int x4, int nr, int64_t nb, int8x16_t *u,
                              float *dw) {
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    const int8x16_t eight = vdupq_n_s8(8);
    for (int64_t b = 0; b < nb; b++) {
        int32x4_t lo[BQ], hi[BQ];
        for (int i = 0; i < BQ; i++) {
            const uint8_t *qs, *d;
            if (x4) { /* pi2_x4_pack: per block, the quad's 4 x 16 quant bytes, then its 4 scales */
                const uint8_t *rec = w + (size_t)b * 4 * sizeof(pi2_block_q4_0);
                qs = rec + 16 * i, d = rec + 64 + 2 * i;
            } else {
                const pi2_block_q4_0 *x = (const pi2_block_q4_0 *)(w + (size_t)i * row_bytes) + b;
                qs = x->qs, d = (const uint8_t *)&x->d;
            }
            if (i >= nr) {
                lo[i] = hi[i] = vdupq_n_s32(0);
                dw[b * BQ + i] = 0.0f;
                continue;
            }
            const uint8x16_t v = vld1q_u8(qs);
            lo[i] = vreinterpretq_s32_s8(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, m4)), eight));
            hi[i] = vreinterpretq_s32_s8(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight));
            pi2_f16 h;
            memcpy(&h, d, sizeof h);
            dw[b * BQ + i] = h2f(h);
        }
        /* 4 x 4 transposes of 4-byte groups: vector j = [row 0 group j, row 1 group j, ...] */
        for (int half = 0; half < 2; half++) {
            const int32x4_t *r = half ? hi : lo;
            const int32x4_t t0 = vtrn1q_s32(r[0], r[1]), t1 = vtrn2q_s32(r[0], r[1]);
            const int32x4_t t2 = vtrn1q_s32(r[2], r[3]), t3 = vtrn2q_s32(r[2], r[3]);
            int8x16_t *o = u + b * 8 + 4 * half;
            o[0] = vreinterpretq_s8_s64(vtrn1q_s64(vreinterpretq_s64_s32(t0), vreinterpretq_s64_s32(t2)));
            o[1] = vreinterpretq_s8_s64(vtrn1q_s64(vreinterpretq_s64_s32(t1), vreinterpretq_s64_s32(t3)));
            o[2] = vreinterpretq_s8_s64(vtrn2q_s64(vreinterpretq_s64_s32(t0), vreinterpretq_s64_s32(t2)));
            o[3] = vreinterpretq_s8_s64(vtrn2q_s64(vreinterpretq_s64_s32(t1), vreinterpretq_s64_s32(t3)));
        }
    }
}

static void batch_tile_quad(const int8x16_t *u, const float *dw, int64_t nb, const pi2_batch_block *a, float *y,
                            int64_t ldy, int nr, int nt) {
    float32x4_t acc[PI2_BATCH_TILE];
    for (int t = 0; t < PI2_BATCH_TILE; t++) acc[t] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < nb; b++, a++) {
        const int8x16_t *w = u + b * 8;
        const float32x4_t d = vld1q_f32(dw + b * BQ);
        for (int t = 0; t < PI2_BATCH_TILE; t++) {
            const int8_t(*q)[2][8] = a->qs[t / 2]; /* chunk c (groups 2c, 2c + 1) at q[c][t % 2] */
            const int8x8_t c0 = vld1_s8(q[0][t % 2]), c1 = vld1_s8(q[1][t % 2]);
            const int8x8_t c2 = vld1_s8(q[2][t % 2]), c3 = vld1_s8(q[3][t % 2]);
            int32x4_t s0 = vdotq_lane_s32(vdupq_n_s32(0), w[0], c0, 0);
            int32x4_t s1 = vdotq_lane_s32(vdupq_n_s32(0), w[4], c2, 0);
            s0 = vdotq_lane_s32(s0, w[1], c0, 1);
            s1 = vdotq_lane_s32(s1, w[5], c2, 1);
            s0 = vdotq_lane_s32(s0, w[2], c1, 0);
            s1 = vdotq_lane_s32(s1, w[6], c3, 0);
            s0 = vdotq_lane_s32(s0, w[3], c1, 1);
            s1 = vdotq_lane_s32(s1, w[7], c3, 1);
            acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(vaddq_s32(s0, s1)), vmulq_n_f32(d, a->d[t]));
        }
    }
    for (int t = 0; t < nt; t++) {
        if (nr == BQ) {
            vst1q_f32(y + t * ldy, acc[t]);
        } else {
            float o[BQ];
            vst1q_f32(o, acc[t]);
            memcpy(y + t * ldy, o, sizeof(float) * (size_t)nr);
        }
    }
}

static void batch_gemm_q4_0(const void *w, size_t row_bytes, int x4, int64_t rows, int64_t n,
                            const pi2_batch_block *batch, int64_t tokens, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK;
    int8x16_t *u = malloc((size_t)nb * 8 * sizeof(int8x16_t));
    float *dw = malloc((size_t)nb * BQ * sizeof(float));
    if (!u || !dw) abort();
    for (int64_t r = 0; r < rows; r += BQ) {
        const int nr = rows - r < BQ ? (int)(rows - r) : BQ;
        batch_unpack_quad((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, x4, nr, nb, u, dw);
        for (int64_t t = 0; t < tokens; t += PI2_BATCH_TILE) {
            const int nt = tokens - t < PI2_BATCH_TILE ? (int)(tokens - t) : PI2_BATCH_TILE;
            batch_tile_quad(u, dw, nb, batch + (t / PI2_BATCH_TILE) * nb, y + t * ldy + r, ldy, nr, nt);
        }
    }
    free(u);
    free(dw);
}
#undef BQ
#endif

static void arm_fill(pi2_kernel_table *t) {
    PI2_KERNELS_SET_COMMON(t);
    t->dot_packed_rows[PI2_Q4_0] = dot_packed_rows_q4_0;
    t->axpy_rows[PI2_Q4_0] = axpy_rows_q4_0;
    t->axpy_batch[PI2_Q4_0] = axpy_batch_q4_0;
    t->act_q8_0 = act_q8_0;
    t->act_q8_1 = act_q8_1;
    t->act_f16 = act_f16;
#if defined(__ARM_FEATURE_DOTPROD)
    t->batch_gemm[PI2_Q4_0] = batch_gemm_q4_0;
#endif
}

#endif
