/* Types, fp16 conversion, and row quantization with ggml's semantics.
 *
 * Two kinds of quantizer live here. pi2_quantize_row follows ggml's reference quantize_row_*_ref
 * (the rounding llama-quantize writes into GGUF files). Activation quantizers (pi2_act_quantize_*)
 * follow what llama.cpp's CPU backend does to activations at run time, which differs from the
 * reference in two ways: ties round to even instead of away from zero, and on x86 the inverse scale is
 * 127/amax instead of 1/(amax/127). Matching it byte for byte keeps our logits equal to llama.cpp's up
 * to float summation order, so greedy decoding agrees token for token. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernels_impl.h"

_Static_assert(sizeof(pi2_block_q4_0) == 18, "q4_0 block must match ggml");
_Static_assert(sizeof(pi2_block_q4_1) == 20, "q4_1 block must match ggml");
_Static_assert(sizeof(pi2_block_q8_0) == 34, "q8_0 block must match ggml");
_Static_assert(sizeof(pi2_block_q8_1) == 36, "q8_1 block must match ggml");

/* ---- fp16 ---------------------------------------------------------------------------------------
 * Portable bit-exact IEEE binary16 conversion (round to nearest even, subnormals, inf, NaN kept
 * quiet). aarch64 always has the FCVT instructions, so there the compiler's __fp16 is used. */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float pi2_f16_to_f32(pi2_f16 h) {
#if defined(__aarch64__)
    __fp16 v;
    memcpy(&v, &h, 2);
    return (float)v;
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) return bits_f32(sign | 0x7f800000 | (mant << 13)); /* inf / NaN (payload kept) */
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in float */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 127 - 15) << 23) | (mant << 13));
#endif
}

pi2_f16 pi2_f32_to_f16(float f) {
#if defined(__aarch64__)
    __fp16 v = (__fp16)f;
    pi2_f16 h;
    memcpy(&h, &v, 2);
    return h;
#else
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax >= 0x7f800000) /* inf stays inf; NaN stays NaN (quiet bit set, top payload bits kept) */
        return sign | (ax > 0x7f800000 ? (uint16_t)(0x7e00 | ((ax >> 13) & 0x3ff)) : 0x7c00);
    if (ax >= 0x477ff000) return sign | 0x7c00; /* >= 65520 rounds to inf */
    if (ax < 0x38800000) {
        /* result is subnormal or zero: adding 0.5 puts the float's last mantissa bit at 2^-24, so the
         * FPU does the round-to-nearest-even for us; the low bits are then the f16 mantissa. */
        float r = bits_f32(ax) + 0.5f;
        return sign | (uint16_t)(f32_bits(r) - 0x3f000000);
    }
    /* normal: rebias exponent, round the 13 dropped bits to nearest even */
    uint32_t odd = (ax >> 13) & 1;
    ax += ((uint32_t)(15 - 127) << 23) + 0xfff + odd;
    return sign | (uint16_t)(ax >> 13);
#endif
}

/* ---- reference quantizers (ggml quantize_row_*_ref semantics) ---------------------------------- */

static void quantize_q4_0_ref(const float *x, pi2_block_q4_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PI2_QK) {
        /* the value of largest magnitude, with its sign, maps to -8 */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < PI2_QK; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = pi2_f32_to_f16(d);
        for (int j = 0; j < PI2_QK / 2; j++) {
            int lo = (int8_t)(x[j] * id + 8.5f), hi = (int8_t)(x[j + PI2_QK / 2] * id + 8.5f);
            lo = lo < 15 ? lo : 15;
            hi = hi < 15 ? hi : 15;
            y[i].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void quantize_q4_1_ref(const float *x, pi2_block_q4_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PI2_QK) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < PI2_QK; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = pi2_f32_to_f16(d);
        y[i].m = pi2_f32_to_f16(min);
        for (int j = 0; j < PI2_QK / 2; j++) {
            int lo = (int8_t)((x[j] - min) * id + 0.5f), hi = (int8_t)((x[j + PI2_QK / 2] - min) * id + 0.5f);
            lo = lo < 15 ? lo : 15;
            hi = hi < 15 ? hi : 15;
            y[i].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static float block_amax(const float *x) {
    float amax = 0.0f;
    for (int j = 0; j < PI2_QK; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    return amax;
}

static void quantize_q8_0_ref(const float *x, pi2_block_q8_0 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PI2_QK) {
        const float d = block_amax(x) / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = pi2_f32_to_f16(d);
        for (int j = 0; j < PI2_QK; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void quantize_q8_1_ref(const float *x, pi2_block_q8_1 *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += PI2_QK) {
        const float d = block_amax(x) / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = pi2_f32_to_f16(d);
        int sum = 0;
        for (int j = 0; j < PI2_QK; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = pi2_f32_to_f16((float)sum * d);
    }
}

/* ---- the row converters of each type ------------------------------------------------------------ */

static void from_f32(const float *x, void *out, int64_t n) { memcpy(out, x, (size_t)n * sizeof(float)); }
static void from_f16(const float *x, void *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) ((pi2_f16 *)out)[i] = pi2_f32_to_f16(x[i]);
}
static void from_q4_0(const float *x, void *out, int64_t n) { quantize_q4_0_ref(x, out, n / PI2_QK); }
static void from_q4_1(const float *x, void *out, int64_t n) { quantize_q4_1_ref(x, out, n / PI2_QK); }
static void from_q8_0(const float *x, void *out, int64_t n) { quantize_q8_0_ref(x, out, n / PI2_QK); }
static void from_q8_1(const float *x, void *out, int64_t n) { quantize_q8_1_ref(x, out, n / PI2_QK); }

static void to_f32(const void *row, float *out, int64_t n) { memcpy(out, row, (size_t)n * sizeof(float)); }
static void to_f16(const void *row, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = pi2_f16_to_f32(((const pi2_f16 *)row)[i]);
}
static void to_q4_0(const void *row, float *out, int64_t n) {
    for (int64_t i = 0; i < n / PI2_QK; i++, out += PI2_QK) {
        const pi2_block_q4_0 *b = (const pi2_block_q4_0 *)row + i;
        const float d = pi2_f16_to_f32(b->d);
        for (int j = 0; j < PI2_QK / 2; j++) {
            out[j] = (float)((b->qs[j] & 0xf) - 8) * d;
            out[j + PI2_QK / 2] = (float)((b->qs[j] >> 4) - 8) * d;
        }
    }
}
static void to_q4_1(const void *row, float *out, int64_t n) {
    for (int64_t i = 0; i < n / PI2_QK; i++, out += PI2_QK) {
        const pi2_block_q4_1 *b = (const pi2_block_q4_1 *)row + i;
        const float d = pi2_f16_to_f32(b->d), m = pi2_f16_to_f32(b->m);
        for (int j = 0; j < PI2_QK / 2; j++) {
            out[j] = (float)(b->qs[j] & 0xf) * d + m;
            out[j + PI2_QK / 2] = (float)(b->qs[j] >> 4) * d + m;
        }
    }
}
static void to_q8_0(const void *row, float *out, int64_t n) {
    for (int64_t i = 0; i < n / PI2_QK; i++, out += PI2_QK) {
        const pi2_block_q8_0 *b = (const pi2_block_q8_0 *)row + i;
        const float d = pi2_f16_to_f32(b->d);
        for (int j = 0; j < PI2_QK; j++) out[j] = (float)b->qs[j] * d;
    }
}
static void to_q8_1(const void *row, float *out, int64_t n) {
    for (int64_t i = 0; i < n / PI2_QK; i++, out += PI2_QK) {
        const pi2_block_q8_1 *b = (const pi2_block_q8_1 *)row + i;
        const float d = pi2_f16_to_f32(b->d);
        for (int j = 0; j < PI2_QK; j++) out[j] = (float)b->qs[j] * d;
    }
}

/* ---- type traits: one row per type, as ggml's type_traits ---------------------------------------- */

typedef struct {
    const char *name;
    int64_t block;        /* elements per block (1: a plain float type) */
    size_t block_bytes;
    int weight;           /* may be a tensor's type in a .pi2 file */
    pi2_type act;         /* the activation type its dot products take */
    void (*from_float)(const float *x, void *out, int64_t n); /* ggml's reference rounding */
    void (*to_float)(const void *row, float *out, int64_t n);
} type_traits;

static const type_traits traits[] = {
    [PI2_F32] = {"F32", 1, sizeof(float), 1, PI2_F32, from_f32, to_f32},
    [PI2_F16] = {"F16", 1, sizeof(pi2_f16), 1, PI2_F16, from_f16, to_f16},
    [PI2_Q4_0] = {"Q4_0", PI2_QK, sizeof(pi2_block_q4_0), 1, PI2_Q8_0, from_q4_0, to_q4_0},
    [PI2_Q4_1] = {"Q4_1", PI2_QK, sizeof(pi2_block_q4_1), 1, PI2_Q8_1, from_q4_1, to_q4_1},
    [PI2_Q8_0] = {"Q8_0", PI2_QK, sizeof(pi2_block_q8_0), 1, PI2_Q8_0, from_q8_0, to_q8_0},
    [PI2_Q8_1] = {"Q8_1", PI2_QK, sizeof(pi2_block_q8_1), 0, PI2_F32, from_q8_1, to_q8_1}, /* activations only: no act */
};

/* The traits of t, or NULL for a number that names no type. */
static const type_traits *traits_of(int t) {
    return t >= 0 && (size_t)t < sizeof traits / sizeof traits[0] && traits[t].name ? &traits[t] : NULL;
}

const char *pi2_type_name(pi2_type t) { return traits_of((int)t) ? traits[t].name : "unknown"; }

int pi2_type_valid_weight(int t) { return traits_of(t) && traits[t].weight; }

size_t pi2_row_size(pi2_type t, int64_t n) {
    const type_traits *tt = traits_of((int)t);
    return n < 0 || !tt ? 0 : (size_t)(n / tt->block) * tt->block_bytes;
}

pi2_type pi2_act_type(pi2_type weight_type) {
    const type_traits *tt = traits_of((int)weight_type);
    return tt ? tt->act : PI2_F32;
}

static const type_traits *row_traits(pi2_type t, int64_t n, const char *what) {
    const type_traits *tt = traits_of((int)t);
    if (!tt) {
        fprintf(stderr, "pi2: %s: unknown type %d\n", what, (int)t);
        abort();
    }
    if (n < 0 || n % tt->block != 0) {
        fprintf(stderr, "pi2: %s: bad row length %lld for %s\n", what, (long long)n, tt->name);
        abort();
    }
    return tt;
}

void pi2_quantize_row(pi2_type t, const float *x, void *out, int64_t n) {
    row_traits(t, n, "quantize_row")->from_float(x, out, n);
}

void pi2_dequantize_row(pi2_type t, const void *row, float *out, int64_t n) {
    row_traits(t, n, "dequantize_row")->to_float(row, out, n);
}

/* ---- activation quantizers (llama.cpp run-time semantics) --------------------------------------- */

/* Inverse scale as llama.cpp computes it on this architecture. */
static inline float act_inverse_scale(float amax, float d) {
#if defined(__x86_64__) || defined(__i386__)
    (void)d;
    return amax != 0.0f ? 127.0f / amax : 0.0f; /* ggml-cpu/arch/x86 */
#else
    (void)amax;
    return d != 0.0f ? 1.0f / d : 0.0f; /* ggml-cpu/arch/arm */
#endif
}

/* Round half to even, independent of the current rounding mode (values are within +-128). */
static inline int round_even(float v) {
    float r = roundf(v); /* half away from zero */
    if (fabsf(v - truncf(v)) == 0.5f) r = 2.0f * roundf(v * 0.5f);
    return (int)r;
}

/* x * id rounded to float, then to the nearest integer with ties to even, independent of the current
 * rounding mode (values are within +-128). The product goes through a volatile so the compiler cannot
 * fuse it into the tie test (gcc contracts a*b-c into an FMA on arm64 by default), which would round
 * differently from the SIMD levels' separate multiply. */
static inline int round_even_product(float x, float id) {
    volatile float product = x * id;
    return round_even(product);
}

void pi2_act_quantize_q8_0_scalar(const float *x, void *out, int64_t n) {
    pi2_block_q8_0 *y = out;
    for (int64_t i = 0; i < n / PI2_QK; i++, x += PI2_QK) {
        const float amax = block_amax(x), d = amax / 127.0f, id = act_inverse_scale(amax, d);
        y[i].d = pi2_f32_to_f16(d);
        for (int j = 0; j < PI2_QK; j++) y[i].qs[j] = (int8_t)round_even_product(x[j], id);
    }
}

void pi2_act_quantize_q8_1_scalar(const float *x, void *out, int64_t n) {
    pi2_block_q8_1 *y = out;
    for (int64_t i = 0; i < n / PI2_QK; i++, x += PI2_QK) {
        const float amax = block_amax(x), d = amax / 127.0f, id = act_inverse_scale(amax, d);
        y[i].d = pi2_f32_to_f16(d);
        int sum = 0;
        for (int j = 0; j < PI2_QK; j++) {
            y[i].qs[j] = (int8_t)round_even_product(x[j], id);
            sum += y[i].qs[j];
        }
        y[i].s = pi2_f32_to_f16(d * (float)sum);
    }
}

void pi2_act_convert_f16_scalar(const float *x, void *out, int64_t n) {
    pi2_f16 *h = out;
    for (int64_t i = 0; i < n; i++) h[i] = pi2_f32_to_f16(x[i]);
}
