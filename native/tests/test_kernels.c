/* Kernel tests: fp16 conversion, ggml-compatible quantization (golden bytes from the Python gguf
 * package's gguf.quants.quantize, which mirrors ggml's reference quantizers), llama.cpp's activation
 * rounding, quantization error bounds, the scalar kernels against plain float math, and every SIMD
 * level this CPU supports against the scalar level. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels.h"
#include "parmat.h"

/* Golden data: a 64-element vector (two blocks) and its quantized bytes, produced by
 *   x = [((i*37) % 29 - 14) * 0.173 + (0.5 if i % 7 == 0 else 0) for i in range(64)] as float32,
 *   x[5] = 2.4375; x[40] = -3.0
 *   gguf.quants.quantize(x.reshape(1, -1), GGMLQuantizationType.Q4_0 / Q4_1 / Q8_0).tobytes()
 * with gguf 0.19.0 (numpy port of ggml-quants.c's quantize_row_*_ref). */
static const float golden_x[64] = {
    -0x1.ec08320000000p+0f, -0x1.09ba5e0000000p+0f, 0x1.624dd20000000p-2f, 0x1.bae1480000000p+0f, -0x1.e72b020000000p+0f, 0x1.3800000000000p+1f,
    0x1.bae1480000000p-1f, 0x1.5fdf3c0000000p+1f, -0x1.624dd20000000p+0f, 0x0.0p+0f, 0x1.624dd20000000p+0f, -0x1.1fdf3c0000000p+1f,
    -0x1.bae1480000000p-1f, 0x1.09ba5e0000000p-1f, 0x1.3395820000000p+1f, -0x1.bae1480000000p+0f, -0x1.624dd20000000p-2f, 0x1.09ba5e0000000p+0f,
    0x1.3604180000000p+1f, -0x1.3604180000000p+0f, 0x1.624dd20000000p-3f, 0x1.074bc60000000p+1f, -0x1.09ba5e0000000p+1f, -0x1.624dd20000000p-1f,
    0x1.624dd20000000p-1f, 0x1.09ba5e0000000p+1f, -0x1.8e978e0000000p+0f, -0x1.624dd20000000p-3f, 0x1.b604180000000p+0f, -0x1.3604180000000p+1f,
    -0x1.09ba5e0000000p+0f, 0x1.624dd20000000p-2f, 0x1.bae1480000000p+0f, -0x1.e72b020000000p+0f, -0x1.09ba5e0000000p-1f, 0x1.5d70a40000000p+0f,
    0x1.1fdf3c0000000p+1f, -0x1.624dd20000000p+0f, 0x0.0p+0f, 0x1.624dd20000000p+0f, -0x1.8000000000000p+1f, -0x1.bae1480000000p-1f,
    0x1.04dd300000000p+0f, 0x1.e72b020000000p+0f, -0x1.bae1480000000p+0f, -0x1.624dd20000000p-2f, 0x1.09ba5e0000000p+0f, 0x1.3604180000000p+1f,
    -0x1.3604180000000p+0f, 0x1.5893740000000p-1f, 0x1.8e978e0000000p+0f, -0x1.09ba5e0000000p+1f, -0x1.624dd20000000p-1f, 0x1.624dd20000000p-1f,
    0x1.09ba5e0000000p+1f, -0x1.8e978e0000000p+0f, 0x1.4ed9160000000p-2f, 0x1.3604180000000p+0f, -0x1.3604180000000p+1f, -0x1.09ba5e0000000p+0f,
    0x1.624dd20000000p-2f, 0x1.bae1480000000p+0f, -0x1.e72b020000000p+0f, -0x1.374bc60000000p-6f,
};
static const uint8_t golden_q4_0[36] = {
    0x7f, 0xb5, 0x9e, 0x5b, 0x17, 0xc3, 0x7e, 0x21, 0xe5, 0xa0, 0x6c, 0x28,
    0xd4, 0x9f, 0x3b, 0xf6, 0xb1, 0x7d, 0x00, 0x36, 0x5d, 0xa3, 0xc7, 0x2c,
    0x6e, 0xa4, 0xe8, 0x4c, 0x90, 0xb6, 0x2b, 0x5d, 0x93, 0xd7, 0x3b, 0x8e,
};
static const uint8_t golden_q4_1[40] = {
    0x84, 0x35, 0xd8, 0xc0, 0x61, 0xa4, 0xe8, 0x4c, 0x82, 0xde, 0x1a, 0x5f,
    0x93, 0xd7, 0x3b, 0x71, 0xc5, 0x09, 0x4e, 0x82, 0xc9, 0x35, 0x00, 0xc2,
    0x5d, 0xa3, 0xd7, 0x3c, 0x6f, 0xa4, 0xe8, 0x4c, 0x90, 0xc6, 0x2b, 0x5e,
    0x94, 0xd7, 0x3b, 0x8f,
};
static const uint8_t golden_q8_0[68] = {
    0x8b, 0x25, 0xa7, 0xd0, 0x10, 0x50, 0xa8, 0x71, 0x28, 0x7f, 0xc0, 0x00,
    0x40, 0x98, 0xd8, 0x18, 0x6f, 0xb0, 0xf0, 0x30, 0x70, 0xc8, 0x08, 0x5f,
    0xa0, 0xe0, 0x20, 0x60, 0xb8, 0xf8, 0x4f, 0x90, 0xd0, 0x10, 0x0c, 0x26,
    0x49, 0xaf, 0xea, 0x3a, 0x5f, 0xc5, 0x00, 0x3b, 0x81, 0xdb, 0x2b, 0x51,
    0xb7, 0xf1, 0x2c, 0x67, 0xcd, 0x1c, 0x42, 0xa8, 0xe3, 0x1d, 0x58, 0xbe,
    0x0e, 0x33, 0x99, 0xd4, 0x0f, 0x49, 0xaf, 0xff,
};

/* ---- random data ---- */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd_u32(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rnd_unit(void) { return (float)((rnd_u32() >> 8) + 0.5) / 16777216.0f; } /* (0,1) */
static float rnd_gauss(void) {
    return sqrtf(-2.0f * logf(rnd_unit())) * cosf(6.2831853f * rnd_unit());
}
static void fill_gauss(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * rnd_gauss();
}

static const pi2_type weight_types[] = {PI2_F32, PI2_F16, PI2_Q4_0, PI2_Q4_1, PI2_Q8_0};
#define N_WEIGHT_TYPES (int)(sizeof weight_types / sizeof weight_types[0])

/* ---- fp16 ---- */

/* Independent f16 -> f32: value = (-1)^s * 2^(e-15) * (1 + m/1024), subnormal 2^-14 * m/1024. */
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void test_fp16(void) {
    int bad_decode = 0, bad_roundtrip = 0, bad_ties = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = pi2_f16_to_f32((pi2_f16)h);
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        if (e == 0x1f) {
            if (m == 0 ? !(isinf(f) && (signbit(f) != 0) == (h >> 15)) : !isnan(f)) bad_decode++;
            if (m == 0 && pi2_f32_to_f16(f) != h) bad_roundtrip++;
            if (m != 0 && ((pi2_f32_to_f16(f) & 0x7c00) != 0x7c00 || (pi2_f32_to_f16(f) & 0x3ff) == 0))
                bad_roundtrip++; /* NaN must stay NaN */
            continue;
        }
        if ((double)f != f16_value((uint16_t)h) || (signbit(f) != 0) != (h >> 15)) bad_decode++;
        if (pi2_f32_to_f16(f) != h) bad_roundtrip++;
        /* the midpoint to the next larger magnitude rounds to the even mantissa; just above/below it
         * round up/down */
        if ((h & 0x7fff) < 0x7bff) {
            double lo = f16_value((uint16_t)h), hi = f16_value((uint16_t)(h + 1));
            float mid = (float)((lo + hi) / 2); /* exact: needs 12 significant bits */
            uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
            if (pi2_f32_to_f16(mid) != want) bad_ties++;
            float above = nextafterf(mid, (float)(hi * 2)), below = nextafterf(mid, 0.0f);
            if (pi2_f32_to_f16(above) != (uint16_t)(h + 1) || pi2_f32_to_f16(below) != (uint16_t)h) bad_ties++;
        }
    }
    CHECK(bad_decode == 0);
    CHECK(bad_roundtrip == 0);
    CHECK(bad_ties == 0);
    CHECK(pi2_f32_to_f16(65519.0f) == 0x7bff);    /* below the overflow midpoint */
    CHECK(pi2_f32_to_f16(65520.0f) == 0x7c00);    /* the midpoint to 2^16 rounds to inf */
    CHECK(pi2_f32_to_f16(-1e30f) == 0xfc00);
    CHECK(pi2_f32_to_f16(INFINITY) == 0x7c00);
    CHECK(pi2_f32_to_f16(0x1p-25f) == 0x0000);    /* half the smallest subnormal: tie to even (0) */
    CHECK(pi2_f32_to_f16(0x1.8p-24f) == 0x0002);  /* 1.5 ulps: tie to even (2) */
    CHECK(pi2_f32_to_f16(0x1.000002p-25f) == 0x0001);
    CHECK(pi2_f32_to_f16(-0x1p-30f) == 0x8000);   /* underflow keeps the sign */
    CHECK(pi2_f32_to_f16(0x1.ffcp-15f) == 0x0400); /* largest-subnormal rounding up into the normals */
    uint16_t hn = pi2_f32_to_f16(NAN);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff) != 0);
    CHECK(pi2_f16_to_f32(0x3c00) == 1.0f && pi2_f16_to_f32(0xc000) == -2.0f);
    CHECK(pi2_f16_to_f32(0x0001) == 0x1p-24f);
}

/* ---- ggml compatibility ---- */

static void test_golden(void) {
    uint8_t out[128];
    pi2_quantize_row(PI2_Q4_0, golden_x, out, 64);
    CHECK(memcmp(out, golden_q4_0, sizeof golden_q4_0) == 0);
    pi2_quantize_row(PI2_Q4_1, golden_x, out, 64);
    CHECK(memcmp(out, golden_q4_1, sizeof golden_q4_1) == 0);
    pi2_quantize_row(PI2_Q8_0, golden_x, out, 64);
    CHECK(memcmp(out, golden_q8_0, sizeof golden_q8_0) == 0);
    CHECK(pi2_row_size(PI2_Q4_0, 64) == sizeof golden_q4_0 && pi2_row_size(PI2_Q4_1, 64) == sizeof golden_q4_1 &&
          pi2_row_size(PI2_Q8_0, 64) == sizeof golden_q8_0 && pi2_row_size(PI2_Q8_1, 64) == 72 &&
          pi2_row_size(PI2_F16, 64) == 128 && pi2_row_size(PI2_F32, 64) == 256);
    CHECK(pi2_act_type(PI2_Q4_0) == PI2_Q8_0 && pi2_act_type(PI2_Q8_0) == PI2_Q8_0 &&
          pi2_act_type(PI2_Q4_1) == PI2_Q8_1 && pi2_act_type(PI2_F16) == PI2_F16 && pi2_act_type(PI2_F32) == PI2_F32);
    CHECK(pi2_type_valid_weight(PI2_Q4_1) && !pi2_type_valid_weight(PI2_Q8_1) && !pi2_type_valid_weight(7));
    CHECK(strcmp(pi2_type_name(PI2_Q4_1), "Q4_1") == 0);
}

/* llama.cpp quantizes activations at run time with ties to even (the reference quantizer, used for
 * weights, rounds them away from zero). A block whose largest magnitude is 127 has scale 1 on every
 * architecture, so the ties below are exact. */
static void test_act_rounding(void) {
    float x[32] = {127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 1.5f, 126.5f};
    pi2_block_q8_0 act, ref;
    pi2_block_q8_1 act1;
    int fails = 0;
    for (int level = 0; level < PI2_KERNEL_LEVELS; level++) {
        if (pi2_kernels_force((pi2_kernel_level)level) != 0) continue;
        pi2_prepare_act(PI2_Q4_0, x, &act, 32);
        pi2_prepare_act(PI2_Q4_1, x, &act1, 32);
        const int8_t want[9] = {127, 2, 4, -2, -4, 0, 0, 2, 126};
        fails += memcmp(act.qs, want, 9) != 0 || memcmp(act1.qs, want, 9) != 0;
        fails += pi2_f16_to_f32(act.d) != 1.0f || pi2_f16_to_f32(act1.d) != 1.0f;
        fails += pi2_f16_to_f32(act1.s) != 127 + 2 + 4 - 2 - 4 + 0 + 0 + 2 + 126;
    }
    CHECK(fails == 0);
    pi2_kernels_force(PI2_KERNELS_SCALAR);
    pi2_quantize_row(PI2_Q8_0, x, &ref, 32);
    const int8_t want_ref[9] = {127, 3, 4, -3, -4, 1, -1, 2, 127};
    CHECK(memcmp(ref.qs, want_ref, 9) == 0);
    float zero[32] = {0};
    pi2_prepare_act(PI2_Q4_0, zero, &act, 32);
    CHECK(act.d == 0 && act.qs[0] == 0 && act.qs[31] == 0);
}

/* Bounds per block, with d the exact scale and d16 the stored fp16 scale: rounding to the grid costs
 * at most half a step, the fp16 scale at most |q| * |d - d16|. Q4_0's largest positive step is clamped
 * (the grid is -8..7 around the value mapped to -8), so it may be off by a whole step. */
static void test_quant_error(void) {
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t buf[N * sizeof(float)];
    fill_gauss(x, N, 1.0f);
    x[100] = 0; /* a block with a zero and one with all zeros */
    for (int j = 64; j < 96; j++) x[j] = 0.0f;
    int bad[5] = {0};
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        pi2_type t = weight_types[ti];
        pi2_quantize_row(t, x, buf, N);
        pi2_dequantize_row(t, buf, y, N);
        for (int b = 0; b < N / 32; b++) {
            const float *xb = x + b * 32, *yb = y + b * 32;
            float amax = 0, mn = xb[0], mx = xb[0];
            for (int j = 0; j < 32; j++) {
                amax = fmaxf(amax, fabsf(xb[j]));
                mn = fminf(mn, xb[j]);
                mx = fmaxf(mx, xb[j]);
            }
            double bound;
            if (t == PI2_F32) bound = 0;
            else if (t == PI2_F16) bound = amax * 0x1p-11; /* half an ulp of 10-bit mantissa */
            else if (t == PI2_Q8_0) {
                double d = amax / 127.0, d16 = pi2_f16_to_f32(pi2_f32_to_f16((float)d));
                bound = 0.5 * d + 127 * fabs(d - d16);
            } else if (t == PI2_Q4_0) {
                double d = amax / 8.0, d16 = pi2_f16_to_f32(pi2_f32_to_f16((float)d));
                bound = d + 8 * fabs(d - d16);
            } else {
                double d = (mx - mn) / 15.0, d16 = pi2_f16_to_f32(pi2_f32_to_f16((float)d));
                double m16 = pi2_f16_to_f32(pi2_f32_to_f16(mn));
                bound = 0.5 * d + 15 * fabs(d - d16) + fabs(mn - m16);
            }
            bound = bound * 1.0001 + 1e-7;
            for (int j = 0; j < 32; j++)
                if (fabs((double)xb[j] - yb[j]) > bound) bad[ti]++;
        }
    }
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        if (bad[ti]) fprintf(stderr, "quant error bound exceeded for %s: %d\n", pi2_type_name(weight_types[ti]), bad[ti]);
        CHECK(bad[ti] == 0);
    }
    /* Q8_1 (activations): s = d * sum(qs) */
    pi2_quantize_row(PI2_Q8_1, x, buf, 64);
    const pi2_block_q8_1 *q = (const pi2_block_q8_1 *)buf;
    int sum = 0;
    for (int j = 0; j < 32; j++) sum += q->qs[j];
    CHECK(fabsf(pi2_f16_to_f32(q->s) - sum * pi2_f16_to_f32(q->d)) <= fabsf(sum * pi2_f16_to_f32(q->d)) * 2e-3f + 1e-6f);
}

/* ---- kernels ---- */

struct case_data {
    pi2_type t;
    int64_t n, rows;
    uint8_t *w;        /* rows x row_size */
    float *x;          /* activation (floats) */
    float *wf, *af;    /* dequantized weights and activation */
};

static void make_case(struct case_data *c, pi2_type t, int64_t n, int64_t rows) {
    c->t = t;
    c->n = n;
    c->rows = rows;
    size_t rs = pi2_row_size(t, n);
    c->w = malloc(rs * rows);
    c->x = malloc(sizeof(float) * n);
    c->wf = malloc(sizeof(float) * n * rows);
    c->af = malloc(sizeof(float) * n);
    float *tmp = malloc(sizeof(float) * n);
    for (int64_t r = 0; r < rows; r++) {
        fill_gauss(tmp, n, 0.05f);
        if (r % 5 == 3) tmp[0] = 1.0f; /* an outlier */
        pi2_quantize_row(t, tmp, c->w + r * rs, n);
        pi2_dequantize_row(t, c->w + r * rs, c->wf + r * n, n);
    }
    fill_gauss(c->x, n, 2.0f);
    free(tmp);
}

static void free_case(struct case_data *c) {
    free(c->w);
    free(c->x);
    free(c->wf);
    free(c->af);
}

/* Two results of the same dot product computed in a different order (or from the dequantized
 * values in double) may differ by float rounding: each of at most n additions errs by <= 2^-24 of
 * the partial sum, which is <= sum|w*a|. Blocked SIMD sums and the double reference stay far from
 * the n * 2^-24 worst case; 1e-5 * sum|w*a| (= 168 ulps for n=4096) leaves room while still catching
 * any wrong element, scale, or offset, which shows up at the size of one term (>= 1e-3 of the sum). */
static double dot_tolerance(const float *w, const float *a, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += fabs((double)w[i] * a[i]);
    return 1e-5 * s + 1e-30;
}

static double exact_dot(const float *w, const float *a, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)w[i] * a[i];
    return s;
}

/* Scalar semantics against plain math on dequantized values. */
static void test_scalar_semantics(void) {
    pi2_kernels_force(PI2_KERNELS_SCALAR);
    int bad = 0;
    const int64_t ns[] = {32, 64, 96, 4096};
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            struct case_data c;
            make_case(&c, weight_types[ti], ns[k], 3);
            pi2_type at = pi2_act_type(c.t);
            uint8_t *act = malloc(pi2_row_size(at, c.n));
            pi2_prepare_act(c.t, c.x, act, c.n);
            pi2_dequantize_row(at, act, c.af, c.n);
            for (int64_t r = 0; r < c.rows; r++) {
                float got = pi2_vec_dot(c.t, c.n, c.w + r * pi2_row_size(c.t, c.n), act);
                double want = exact_dot(c.wf + r * c.n, c.af, c.n);
                /* Q8_1's s is stored in fp16 (rel. error 2^-11) and multiplies the row's min, so Q4_1
                 * gets an extra allowance of 2^-11 * |m * s| summed over blocks */
                double tol = dot_tolerance(c.wf + r * c.n, c.af, c.n);
                if (c.t == PI2_Q4_1) {
                    const pi2_block_q4_1 *wb = (const pi2_block_q4_1 *)(c.w + r * pi2_row_size(c.t, c.n));
                    const pi2_block_q8_1 *ab = (const pi2_block_q8_1 *)act;
                    for (int64_t b = 0; b < c.n / 32; b++)
                        tol += fabs(pi2_f16_to_f32(wb[b].m) * pi2_f16_to_f32(ab[b].s)) * 0x1p-10;
                }
                if (fabs(got - want) > tol) {
                    bad++;
                    fprintf(stderr, "scalar %s n=%lld: got %g want %g\n", pi2_type_name(c.t), (long long)c.n, got, want);
                }
            }
            /* axpy: y += a * dequant(row) */
            float *y = malloc(sizeof(float) * c.n);
            for (int64_t i = 0; i < c.n; i++) y[i] = c.x[i];
            pi2_axpy(c.t, c.n, -0.75f, c.w, y);
            for (int64_t i = 0; i < c.n; i++)
                if (fabs(y[i] - (c.x[i] - 0.75 * c.wf[i])) > 1e-6 * (fabs(c.x[i]) + fabs(c.wf[i]))) bad++;
            free(y);
            free(act);
            free_case(&c);
        }
    }
    CHECK(bad == 0);
}

static int close_to(float got, float want, double tol) { return fabs((double)got - want) <= tol; }

/* Every SIMD level against the scalar level, all entry points. */
static void test_level(pi2_kernel_level level) {
    const int64_t ns[] = {32, 64, 160, 256, 4096 + 96};
    const int64_t row_counts[] = {1, 3, 7, 17};
    const int64_t token_counts[] = {1, 2, 5, 16, 19};
    int bad_act = 0, bad_dot = 0, bad_gemv = 0, bad_gather = 0, bad_axpy = 0, bad_gemm = 0, bad_strided = 0,
        bad_packed = 0;
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            int64_t rows = row_counts[(ti + k) % 4];
            int64_t tokens = token_counts[(ti * 3 + k) % 5];
            if (ns[k] == 32) rows = 17; /* n=32 with an odd row count */
            if (ns[k] > 4096) tokens = 70; /* more tokens than one gemm tile holds at this n (<= 64) */
            struct case_data c;
            make_case(&c, weight_types[ti], ns[k], rows);
            pi2_type at = pi2_act_type(c.t);
            size_t rs = pi2_row_size(c.t, c.n), as = pi2_row_size(at, c.n);
            /* tokens activations, one buffer per level */
            uint8_t *acts_s = malloc(as * tokens), *acts_v = malloc(as * tokens);
            float *xs = malloc(sizeof(float) * c.n * tokens);
            fill_gauss(xs, c.n * tokens, 1.0f);
            memcpy(xs, c.x, sizeof(float) * c.n);
            pi2_kernels_force(PI2_KERNELS_SCALAR);
            for (int64_t t = 0; t < tokens; t++) pi2_prepare_act(c.t, xs + t * c.n, acts_s + t * as, c.n);
            pi2_kernels_force(level);
            for (int64_t t = 0; t < tokens; t++) pi2_prepare_act(c.t, xs + t * c.n, acts_v + t * as, c.n);
            /* activations must be byte-identical: they decide which tokens llama.cpp picks */
            if (memcmp(acts_s, acts_v, as * tokens) != 0) bad_act++;

            float *ref = malloc(sizeof(float) * rows * tokens);
            double *tolerance = malloc(sizeof(double) * rows * tokens);
            pi2_kernels_force(PI2_KERNELS_SCALAR);
            float *af = malloc(sizeof(float) * c.n);
            for (int64_t t = 0; t < tokens; t++) {
                pi2_dequantize_row(at, acts_s + t * as, af, c.n);
                for (int64_t r = 0; r < rows; r++) {
                    ref[t * rows + r] = pi2_vec_dot(c.t, c.n, c.w + r * rs, acts_s + t * as);
                    tolerance[t * rows + r] = dot_tolerance(c.wf + r * c.n, af, c.n);
                }
            }
            pi2_kernels_force(level);
            /* vec_dot and gemv */
            float *y = malloc(sizeof(float) * (rows + 1) * (tokens + 1));
            for (int64_t r = 0; r < rows; r++)
                if (!close_to(pi2_vec_dot(c.t, c.n, c.w + r * rs, acts_v), ref[r], tolerance[r])) bad_dot++;
            y[rows] = 12345.0f;
            pi2_gemv(c.t, c.w, rows, c.n, acts_v, y);
            for (int64_t r = 0; r < rows; r++) {
                if (!close_to(y[r], ref[r], tolerance[r])) bad_gemv++;
                /* A row through gemv and through vec_dot at the same level: the same float, bit for
                 * bit (the sparse engine's per-neuron dots must equal the dense path's GEMV). */
                if (y[r] != pi2_vec_dot(c.t, c.n, c.w + r * rs, acts_v)) bad_gemv++;
            }
            if (y[rows] != 12345.0f) bad_gemv++;
            /* a packed activation gives vec_dot's float, bit for bit */
            {
                const size_t psz = pi2_packed_act_size(c.t, c.n);
                uint8_t *packed = aligned_alloc(64, (psz + 63) / 64 * 64);
                pi2_pack_act(c.t, acts_v, c.n, packed);
                for (int64_t r = 0; r < rows; r++)
                    if (pi2_vec_dot_packed(c.t, c.n, c.w + r * rs, packed) != pi2_vec_dot(c.t, c.n, c.w + r * rs, acts_v))
                        bad_packed++;
                /* and groups of up to 4 rows, in a shuffled order, give the same floats */
                for (int count = 1; count <= 4 && count <= rows; count++) {
                    const uint8_t *group[4];
                    float yg[4];
                    for (int j = 0; j < count; j++) group[j] = c.w + (size_t)((rows - 1 - j * 5 % rows + rows) % rows) * rs;
                    /* the rows read next (here: the matrix's first rows) change nothing, and are all
                     * asked for by the call's end */
                    pi2_ahead next;
                    pi2_ahead_init(&next, group, count, rs);
                    pi2_vec_dot_packed_rows(c.t, c.n, group, count, packed, yg, count % 2 ? &next : NULL);
                    if (count % 2 && (next.r != next.count || next.at != 0)) bad_packed++;
                    for (int j = 0; j < count; j++)
                        if (yg[j] != pi2_vec_dot_packed(c.t, c.n, group[j], packed)) bad_packed++;
                }
                free(packed);
            }
            /* gather: a shuffled list with repeats */
            int32_t idx[40];
            int64_t count = rows * 2 + 1;
            for (int64_t i = 0; i < count; i++) idx[i] = (int32_t)(rnd_u32() % rows);
            pi2_gather_gemv(c.t, c.w, c.n, idx, count, acts_v, y);
            for (int64_t i = 0; i < count; i++)
                if (!close_to(y[i], ref[idx[i]], tolerance[idx[i]])) bad_gather++;
            /* gemm with ldy > rows: the padding column must stay untouched */
            int64_t ldy = rows + 1;
            for (int64_t i = 0; i < ldy * tokens; i++) y[i] = -777.0f;
            pi2_gemm(c.t, c.w, rows, c.n, acts_v, tokens, y, ldy);
            for (int64_t t = 0; t < tokens; t++) {
                for (int64_t r = 0; r < rows; r++)
                    if (!close_to(y[t * ldy + r], ref[t * rows + r], tolerance[t * rows + r])) bad_gemm++;
                if (y[t * ldy + rows] != -777.0f) bad_gemm++;
            }
            /* strided rows: copy W into records of row size + 40 bytes */
            {
                const size_t stride = rs + 40;
                uint8_t *ws = malloc(stride * rows);
                memset(ws, 0xa5, stride * rows);
                for (int64_t r = 0; r < rows; r++) memcpy(ws + r * stride, c.w + r * rs, rs);
                pi2_gemv_strided(c.t, ws, stride, rows, c.n, acts_v, y);
                for (int64_t r = 0; r < rows; r++)
                    if (!close_to(y[r], ref[r], tolerance[r])) bad_strided++;
                for (int64_t i = 0; i < ldy * tokens; i++) y[i] = -777.0f;
                pi2_gemm_strided(c.t, ws, stride, rows, c.n, acts_v, tokens, y, ldy);
                for (int64_t t = 0; t < tokens; t++) {
                    for (int64_t r = 0; r < rows; r++)
                        if (!close_to(y[t * ldy + r], ref[t * rows + r], tolerance[t * rows + r])) bad_strided++;
                    if (y[t * ldy + rows] != -777.0f) bad_strided++;
                }
                free(ws);
            }
            /* axpy on each row: compare with the scalar level */
            float *ya = malloc(sizeof(float) * c.n), *yb = malloc(sizeof(float) * c.n);
            for (int64_t r = 0; r < rows; r++) {
                float a = rnd_gauss();
                memcpy(ya, c.x, sizeof(float) * c.n);
                memcpy(yb, c.x, sizeof(float) * c.n);
                pi2_kernels_force(PI2_KERNELS_SCALAR);
                pi2_axpy(c.t, c.n, a, c.w + r * rs, ya);
                pi2_kernels_force(level);
                pi2_axpy(c.t, c.n, a, c.w + r * rs, yb);
                /* a few roundings (2^-24 each) of terms no larger than |y| and |a| * (|d q| + |m|),
                 * where |m| and |d q| are bounded by twice the block's largest dequantized value */
                for (int64_t i = 0; i < c.n; i++) {
                    float bmax = 0;
                    for (int64_t j = i / 32 * 32; j < i / 32 * 32 + 32 && j < c.n; j++)
                        bmax = fmaxf(bmax, fabsf(c.wf[r * c.n + j]));
                    if (!close_to(yb[i], ya[i], 3e-7 * (fabs(c.x[i]) + fabs(a) * 2 * bmax) + 1e-30)) bad_axpy++;
                }
            }
            /* axpy_rows: groups of up to 4 rows in a shuffled order give the floats of one axpy per
             * row in that order, bit for bit, at this level */
            for (int count = 1; count <= 4 && count <= rows; count++) {
                const uint8_t *group[4];
                float a[4];
                for (int j = 0; j < count; j++) {
                    group[j] = c.w + (size_t)((rows - 1 - j * 5 % rows + rows) % rows) * rs;
                    a[j] = rnd_gauss();
                }
                memcpy(ya, c.x, sizeof(float) * c.n);
                memcpy(yb, c.x, sizeof(float) * c.n);
                for (int j = 0; j < count; j++) pi2_axpy(c.t, c.n, a[j], group[j], ya);
                pi2_ahead next;
                pi2_ahead_init(&next, group, count, rs);
                pi2_axpy_rows(c.t, c.n, a, group, count, yb, count % 2 ? &next : NULL);
                if (memcmp(ya, yb, sizeof(float) * c.n)) bad_axpy++;
                if (count % 2 && (next.r != next.count || next.at != 0)) bad_axpy++;
            }
            free(ya);
            free(yb);
            free(y);
            free(af);
            free(ref);
            free(tolerance);
            free(xs);
            free(acts_s);
            free(acts_v);
            free_case(&c);
        }
    }
    const char *name = pi2_kernel_level_name(level);
    if (bad_act + bad_dot + bad_gemv + bad_gather + bad_axpy + bad_gemm + bad_strided)
        fprintf(stderr, "%s: act %d dot %d gemv %d gather %d axpy %d gemm %d strided %d mismatches\n", name,
                bad_act, bad_dot, bad_gemv, bad_gather, bad_axpy, bad_gemm, bad_strided);
    CHECK(bad_act == 0);
    CHECK(bad_dot == 0);
    CHECK(bad_gemv == 0);
    CHECK(bad_gather == 0);
    CHECK(bad_axpy == 0);
    CHECK(bad_gemm == 0);
    CHECK(bad_strided == 0);
    CHECK(bad_packed == 0);
}

/* fp16 activations: every level converts exactly like the scalar code, including edge values. */
static void test_f16_act_edges(pi2_kernel_level level) {
    float x[64];
    fill_gauss(x, 64, 100.0f);
    x[0] = 65520.0f;
    x[1] = -0x1p-25f;
    x[2] = 0x1.8p-24f;
    x[3] = INFINITY;
    x[4] = 1e-10f;
    x[5] = 65519.0f;
    x[6] = 0x1.ffcp-15f;
    pi2_f16 a[64], b[64];
    pi2_kernels_force(PI2_KERNELS_SCALAR);
    pi2_prepare_act(PI2_F16, x, a, 64);
    pi2_kernels_force(level);
    pi2_prepare_act(PI2_F16, x, b, 64);
    CHECK(memcmp(a, b, sizeof a) == 0);
}

/* Attention (pi2_att_f16 + pi2_att_merge) at every level against softmax(scale q.K) V summed in
 * double from the same F16 inputs: a group of 3 query heads on one KV head, its positions in one part
 * and split in three (one of them empty) as decode splits them; head sizes with and without a
 * specialised copy and with a scalar tail; one position and many; mild scores and scores spread far
 * enough (below -87 under the maximum) to take att_exp's clamp. */
static void test_attention(pi2_kernel_level level) {
    enum { MAXHD = 128, G = 3, STRIDE = 2 * MAXHD, MAXPOS = 300 };
    static pi2_f16 k[MAXPOS * STRIDE], v[MAXPOS * STRIDE];
    static float f[MAXPOS * STRIDE], p[G * MAXPOS];
    const int64_t hds[] = {64, 128, 40, 72}, npos[] = {1, 7, MAXPOS};
    pi2_kernels_force(level);
    fill_gauss(f, MAXPOS * STRIDE, 3.0f);
    pi2_prepare_act(PI2_F16, f, k, MAXPOS * STRIDE);
    fill_gauss(f, MAXPOS * STRIDE, 1.0f);
    pi2_prepare_act(PI2_F16, f, v, MAXPOS * STRIDE);
    double lowest = 0.0; /* the lowest score under its maximum seen */
    for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
        for (size_t b = 0; b < 2 * sizeof npos / sizeof npos[0]; b++)
            for (int split = 0; split < 2; split++) {
                const int64_t hd = hds[a], n = npos[b / 2];
                /* parts: [0, n) whole, or [0, n/2), [n/2, n/2) (empty), [n/2, n) */
                const int parts = split ? 3 : 1;
                const int64_t s0[3] = {0, n / 2, n / 2}, s1[3] = {split ? n / 2 : n, n / 2, n};
                pi2_f16 q[G * MAXHD];
                float qf[G * MAXHD], out[3][G * MAXHD], m[3][G], l[3][G];
                fill_gauss(qf, G * hd, b % 2 ? 8.0f : 0.5f);
                pi2_prepare_act(PI2_F16, qf, q, G * hd);
                const float scale = 1.0f / sqrtf((float)hd);
                for (int i = 0; i < parts; i++)
                    pi2_att_f16(hd, G, q, k + s0[i] * STRIDE, v + s0[i] * STRIDE, STRIDE, s1[i] - s0[i], scale, p,
                                out[i], m[i], l[i]);
                for (int g = 0; g < G; g++) {
                    float y[MAXHD];
                    pi2_att_merge(hd, parts, &out[0][g * hd], G * MAXHD, &m[0][g], &l[0][g], G, y);
                    double sc[MAXPOS], mx = -1e300, sum = 0.0, ref[MAXHD] = {0}, amax = 0.0, err = 0.0;
                    for (int64_t s = 0; s < n; s++) {
                        double d = 0.0;
                        for (int64_t i = 0; i < hd; i++)
                            d += (double)pi2_f16_to_f32(q[g * hd + i]) * pi2_f16_to_f32(k[s * STRIDE + i]);
                        sc[s] = d * scale;
                        mx = sc[s] > mx ? sc[s] : mx;
                    }
                    for (int64_t s = 0; s < n; s++) sum += exp(sc[s] - mx), lowest = sc[s] - mx < lowest ? sc[s] - mx : lowest;
                    for (int64_t s = 0; s < n; s++)
                        for (int64_t i = 0; i < hd; i++) ref[i] += exp(sc[s] - mx) / sum * pi2_f16_to_f32(v[s * STRIDE + i]);
                    for (int64_t i = 0; i < hd; i++) {
                        amax = fabs(ref[i]) > amax ? fabs(ref[i]) : amax;
                        err = fabs(ref[i] - y[i]) > err ? fabs(ref[i] - y[i]) : err;
                    }
                    CHECK(err <= 1e-5 * amax + 1e-7);
                }
            }
    CHECK(lowest < -87.0);
    /* Scores that are not finite (a model with infinite weights: the fuzzer's): an infinite query gives
     * +-inf scores and inf - inf = NaN under the maximum. Every exp clamps them (NaN to -87, as the SIMD
     * max does) rather than converting NaN to an integer (undefined: the sanitizer build fails here). */
    {
        pi2_f16 q[G * 64];
        float qf[G * 64], out[G * 64], m[G], l[G];
        fill_gauss(qf, G * 64, 1.0f);
        qf[0] = qf[64 + 5] = INFINITY;
        qf[2 * 64 + 1] = NAN;
        pi2_prepare_act(PI2_F16, qf, q, G * 64);
        pi2_att_f16(64, G, q, k, v, STRIDE, 7, 0.125f, p, out, m, l);
        for (int g = 0; g < G; g++) CHECK(l[g] > 0.0f && isfinite(l[g]));
    }
    pi2_kernels_force(pi2_kernels_best());
}

/* Rows interleaved by four: where a level has the kernel, the packed matrix gives pi2_gemm's floats on
 * the plain rows bit for bit, for one token and for many; elsewhere the level says it has none. */
static void test_x4(pi2_kernel_level level) {
    if (!pi2_x4_supported(PI2_Q4_0)) {
        CHECK(level != PI2_KERNELS_AVX512); /* the level that has it must say so */
        return;
    }
    const int64_t ns[] = {32, 96, 4096};
    const int64_t tokens_list[] = {1, 2, 3, 5, 9, 13}; /* 13: past PI2_LANES_MIN_TOKENS */
    int bad = 0;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        /* 4096 wide: 35 groups of 9 KiB, so every stream count reads runs at least 32 KiB apart (8 runs
         * of 4 groups and 3 left at 8 streams); the narrower ones merge their runs into one */
        const int64_t n = ns[k], rows = n == 4096 ? 140 : 12 + 8 * (int64_t)k;
        struct case_data c;
        make_case(&c, PI2_Q4_0, n, rows);
        const size_t rs = pi2_row_size(PI2_Q4_0, n), as = pi2_row_size(PI2_Q8_0, n);
        uint8_t *packed = malloc(rs * rows), *acts = malloc(as * 13);
        float *x = malloc(sizeof(float) * n * 13), *ya = malloc(sizeof(float) * rows * 13 * 2),
              *yb = malloc(sizeof(float) * rows * 13 * 2);
        fill_gauss(x, n * 13, 1.0f);
        for (int t = 0; t < 13; t++) pi2_prepare_act(PI2_Q4_0, x + t * n, acts + t * as, n);
        pi2_x4_pack(PI2_Q4_0, c.w, rows, n, packed);
        for (size_t ti = 0; ti < sizeof tokens_list / sizeof tokens_list[0]; ti++) {
            const int64_t tokens = tokens_list[ti], ldy = rows + 3;
            for (int64_t i = 0; i < ldy * tokens; i++) ya[i] = yb[i] = -555.0f;
            pi2_gemm(PI2_Q4_0, c.w, rows, n, acts, tokens, ya, ldy);
            pi2_x4_gemm(PI2_Q4_0, packed, rows, n, acts, tokens, yb, ldy);
            if (memcmp(ya, yb, sizeof(float) * ldy * tokens)) bad++;
            /* any prefetch distance (pi2-probe gemv --prefetch), none included, gives the same floats */
            for (int pf = 0; pf <= 2048; pf += 2048) {
                CHECK(pi2_kernels_set_x4_prefetch(pf) == 0 && pi2_kernels_x4_prefetch() == pf);
                pi2_x4_gemm(PI2_Q4_0, packed, rows, n, acts, tokens, yb, ldy);
                if (memcmp(ya, yb, sizeof(float) * ldy * tokens)) bad++;
            }
            /* every stream count gives the same floats (decode reads S groups side by side) */
            for (int st = 1; st <= 8; st++) {
                if (pi2_kernels_set_x4_streams(st)) continue;
                for (int64_t i = 0; i < ldy * tokens; i++) yb[i] = -555.0f; /* every row written again */
                pi2_x4_gemm(PI2_Q4_0, packed, rows, n, acts, tokens, yb, ldy);
                if (memcmp(ya, yb, sizeof(float) * ldy * tokens)) bad++;
            }
            CHECK(pi2_kernels_set_x4_streams(5) == -1 && pi2_kernels_set_x4_streams(0) == -1);
            CHECK(pi2_kernels_set_x4_streams(PI2_X4_STREAMS_DEFAULT) == 0);
            CHECK(pi2_kernels_set_x4_prefetch(-1) == -1 && pi2_kernels_set_x4_prefetch(PI2_X4_PREFETCH_MAX + 1) == -1);
            CHECK(pi2_kernels_set_x4_prefetch(PI2_X4_PREFETCH_DEFAULT) == 0);
            /* from a group boundary inside the matrix: the last 4 rows alone */
            pi2_x4_gemm(PI2_Q4_0, packed + (rows - 4) * rs, 4, n, acts, tokens, yb, ldy);
            for (int64_t t = 0; t < tokens; t++)
                if (memcmp(ya + t * ldy + rows - 4, yb + t * ldy, 4 * sizeof(float))) bad++;
        }
        free(packed), free(acts), free(x), free(ya), free(yb);
        free_case(&c);
    }
    if (bad) fprintf(stderr, "%s: x4 gemm %d mismatches\n", pi2_kernel_level_name(level), bad);
    CHECK(bad == 0);
}

/* AVX-512's strided GEMM (rows as lanes, the FFN's batches) gives the scalar level's floats bit for bit
 * for Q4_0, Q4_1 and Q8_0: every token count of a register tile and past it, a last group of fewer than 16
 * rows, and rows taken from the middle of a matrix give the same floats as in the whole. */
static void test_gemm_lanes(void) {
    if (pi2_kernels_force(PI2_KERNELS_AVX512) != 0) return;
    const pi2_type types[] = {PI2_Q4_0, PI2_Q4_1, PI2_Q8_0};
    const int64_t ns[] = {32, 96, 4096};
    int bad = 0;
    for (size_t ty = 0; ty < 3; ty++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const pi2_type wt = types[ty];
            const int64_t rows = 37, n = ns[k], maxt = 19;
            struct case_data c;
            make_case(&c, wt, n, rows);
            const size_t rs = pi2_row_size(wt, n), stride = rs + 6, as = pi2_row_size(pi2_act_type(wt), n);
            uint8_t *ws = malloc(stride * rows), *acts = malloc(as * maxt);
            float *x = malloc(sizeof(float) * n * maxt), *ya = malloc(sizeof(float) * (rows + 1) * maxt),
                  *yb = malloc(sizeof(float) * (rows + 1) * maxt);
            memset(ws, 0x5a, stride * rows);
            for (int64_t r = 0; r < rows; r++) memcpy(ws + r * stride, c.w + r * rs, rs);
            fill_gauss(x, n * maxt, 1.0f);
            for (int64_t t = 0; t < maxt; t++) pi2_prepare_act(wt, x + t * n, acts + t * as, n);
            for (int64_t tokens = 2; tokens <= maxt; tokens++) {
                const int64_t ldy = rows + 1;
                for (int64_t i = 0; i < ldy * tokens; i++) ya[i] = yb[i] = -555.0f;
                pi2_kernels_force(PI2_KERNELS_SCALAR);
                pi2_gemm_strided(wt, ws, stride, rows, n, acts, tokens, ya, ldy);
                pi2_kernels_force(PI2_KERNELS_AVX512);
                pi2_gemm_strided(wt, ws, stride, rows, n, acts, tokens, yb, ldy);
                if (memcmp(ya, yb, sizeof(float) * ldy * tokens)) bad++;
                /* rows 5..25 alone: groups that start elsewhere */
                pi2_gemm_strided(wt, ws + 5 * stride, stride, 21, n, acts, tokens, yb, ldy);
                for (int64_t t = 0; t < tokens; t++)
                    if (memcmp(ya + t * ldy + 5, yb + t * ldy, 21 * sizeof(float))) bad++;
            }
            free(ws), free(acts), free(x), free(ya), free(yb);
            free_case(&c);
        }
    if (bad) fprintf(stderr, "avx512: strided gemm %d mismatches with the scalar level\n", bad);
    CHECK(bad == 0);
    pi2_kernels_force(pi2_kernels_best());
}

/* The batch GEMM (kernels.h, pi2_batch_gemm) against the scalar level's pi2_gemm_strided: plain rows
 * and rows inside larger records, and rows interleaved by four (pi2_x4_pack); every
 * token count of a tile and past it, a last group of fewer than 16 rows, rows from the middle of a
 * matrix. x86 levels give the scalar floats bit for bit (the GEMM keeps one float order there); arm
 * levels sum in their own order, within dot_tolerance of the scalar result. The scalar level has the
 * reference kernel; a level without a kernel must report size 0. */
static void test_batch(pi2_kernel_level level) {
    pi2_kernels_force(level);
    const int64_t min_tokens = PI2_BATCH_MIN_TOKENS;
    if (pi2_batch_size(PI2_Q4_0, 64, min_tokens) == 0) {
        CHECK(level == PI2_KERNELS_NEON); /* the others have one */
        return;
    }
    CHECK(pi2_batch_size(PI2_Q4_0, 64, min_tokens - 1) == 0); /* below the threshold: pi2_gemm */
    const int exact = level == PI2_KERNELS_SCALAR || level == PI2_KERNELS_AVX2 || level == PI2_KERNELS_AVX512 ||
                      level == PI2_KERNELS_AMX;
    const int64_t ns[] = {32, 96, 4096};
    const int64_t token_counts[] = {12, 13, 16, 19, 33};
    int bad = 0;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const int64_t rows = 36, n = ns[k], maxt = 33;
        struct case_data c;
        make_case(&c, PI2_Q4_0, n, rows);
        const size_t rs = pi2_row_size(PI2_Q4_0, n), stride = rs + 6, as = pi2_row_size(PI2_Q8_0, n);
        uint8_t *ws = malloc(stride * rows), *acts = malloc(as * maxt), *x4 = malloc(rs * rows);
        float *x = malloc(sizeof(float) * n * maxt), *af = malloc(sizeof(float) * n);
        float *ya = malloc(sizeof(float) * (rows + 1) * maxt), *yb = malloc(sizeof(float) * (rows + 1) * maxt);
        double *tol = malloc(sizeof(double) * rows * maxt);
        memset(ws, 0x5a, stride * rows);
        for (int64_t r = 0; r < rows; r++) memcpy(ws + r * stride, c.w + r * rs, rs);
        fill_gauss(x, n * maxt, 1.0f);
        for (int64_t t = 0; t < maxt; t++) {
            pi2_prepare_act(PI2_Q4_0, x + t * n, acts + t * as, n);
            pi2_dequantize_row(PI2_Q8_0, acts + t * as, af, n);
            for (int64_t r = 0; r < rows; r++) tol[t * rows + r] = exact ? 0.0 : dot_tolerance(c.wf + r * n, af, n);
        }
        pi2_x4_pack(PI2_Q4_0, c.w, rows, n, x4); /* the layout is data: every batch kernel reads it */
        for (size_t ti = 0; ti < sizeof token_counts / sizeof token_counts[0]; ti++) {
            const int64_t tokens = token_counts[ti], ldy = rows + 1;
            const size_t bytes = pi2_batch_size(PI2_Q4_0, n, tokens);
            void *batch = aligned_alloc(64, bytes);
            pi2_batch_pack(PI2_Q4_0, acts, n, tokens, batch);
            for (int64_t i = 0; i < ldy * tokens; i++) ya[i] = -555.0f;
            pi2_kernels_force(PI2_KERNELS_SCALAR);
            pi2_gemm_strided(PI2_Q4_0, ws, stride, rows, n, acts, tokens, ya, ldy);
            pi2_kernels_force(level);
            for (int layout = 0; layout < 3; layout++) {
                for (int64_t i = 0; i < ldy * tokens; i++) yb[i] = -777.0f;
                const uint8_t *w = layout == 0 ? ws : layout == 1 ? c.w : x4;
                pi2_batch_gemm(PI2_Q4_0, w, layout == 0 ? stride : rs, layout == 2, rows, n, batch, tokens, yb, ldy);
                for (int64_t t = 0; t < tokens; t++) {
                    for (int64_t r = 0; r < rows; r++)
                        if (!(fabs((double)yb[t * ldy + r] - ya[t * ldy + r]) <= tol[t * rows + r])) bad++;
                    if (yb[t * ldy + rows] != -777.0f) bad++; /* the padding column stays */
                }
                /* rows 4..23 alone (x4: from a group boundary; plain: a last group of 4 rows) */
                const size_t off = layout == 2 ? 4 * rs : layout == 0 ? 4 * stride : 4 * rs;
                pi2_batch_gemm(PI2_Q4_0, w + off, layout == 0 ? stride : rs, layout == 2, 20, n, batch, tokens, yb, ldy);
                for (int64_t t = 0; t < tokens; t++)
                    for (int64_t r = 0; r < 20; r++)
                        if (!(fabs((double)yb[t * ldy + r] - ya[t * ldy + 4 + r]) <= tol[t * rows + 4 + r])) bad++;
            }
            free(batch);
        }
        free(ws), free(acts), free(x4), free(x), free(af), free(ya), free(yb), free(tol);
        free_case(&c);
    }
    if (bad) fprintf(stderr, "%s: batch gemm %d mismatches with the scalar level\n", pi2_kernel_level_name(level), bad);
    CHECK(bad == 0);
    pi2_kernels_force(level);
}

/* AMX's batch GEMM (16 tokens x 16 rows a step, one block per tile dot) against the scalar reference
 * bit for bit, each over its own level's batch (amx's quants go token by token), on the shapes its
 * tiles cut unevenly: rows not a multiple of 16 (a single row, 15, 17, 52), tokens not a multiple of
 * 16 nor of the batch's 8 (a step of one record, padded records),
 * widths of one block to 4096, plain rows in records and rows interleaved by four. Skipped with a line
 * where the CPU (or the build) lacks it. */
static void test_batch_amx(void) {
    if (pi2_kernels_force(PI2_KERNELS_AMX) != 0) {
        printf("amx: not %s here, its batch GEMM is not tested\n",
               pi2_kernels_compiled(PI2_KERNELS_AMX) ? "runnable" : "built");
        return;
    }
    const int64_t ns[] = {32, 64, 160, 4096};
    const int64_t rows_list[] = {1, 15, 17, 52};
    const int64_t token_counts[] = {12, 16, 17, 24, 31, 33, 40, 65};
    int bad = 0, cases = 0;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0]; ri++) {
            const int64_t rows = rows_list[ri], n = ns[k], maxt = 65, ldy = rows + 3;
            struct case_data c;
            make_case(&c, PI2_Q4_0, n, rows);
            const size_t rs = pi2_row_size(PI2_Q4_0, n), stride = rs + 10, as = pi2_row_size(PI2_Q8_0, n);
            uint8_t *ws = malloc(stride * rows), *acts = malloc(as * maxt), *x4 = malloc(rs * rows);
            float *x = malloc(sizeof(float) * n * maxt), *ya = malloc(sizeof(float) * ldy * maxt),
                  *yb = malloc(sizeof(float) * ldy * maxt);
            memset(ws, 0x5a, stride * rows);
            for (int64_t r = 0; r < rows; r++) memcpy(ws + r * stride, c.w + r * rs, rs);
            fill_gauss(x, n * maxt, 1.0f);
            for (int64_t t = 0; t < maxt; t++) pi2_prepare_act(PI2_Q4_0, x + t * n, acts + t * as, n);
            if (rows % 4 == 0) pi2_x4_pack(PI2_Q4_0, c.w, rows, n, x4);
            for (size_t ti = 0; ti < sizeof token_counts / sizeof token_counts[0]; ti++) {
                const int64_t tokens = token_counts[ti];
                const size_t bytes = pi2_batch_size(PI2_Q4_0, n, tokens);
                void *batch = aligned_alloc(64, bytes), *ref = aligned_alloc(64, bytes);
                pi2_batch_pack(PI2_Q4_0, acts, n, tokens, batch); /* amx's layout: token by token */
                for (int64_t i = 0; i < ldy * tokens; i++) ya[i] = -555.0f;
                pi2_kernels_force(PI2_KERNELS_SCALAR);
                pi2_batch_pack(PI2_Q4_0, acts, n, tokens, ref);
                pi2_batch_gemm(PI2_Q4_0, ws, stride, 0, rows, n, ref, tokens, ya, ldy);
                free(ref);
                pi2_kernels_force(PI2_KERNELS_AMX);
                for (int layout = 0; layout < (rows % 4 ? 1 : 2); layout++, cases++) {
                    for (int64_t i = 0; i < ldy * tokens; i++) yb[i] = -555.0f;
                    if (layout) pi2_batch_gemm(PI2_Q4_0, x4, rs, 1, rows, n, batch, tokens, yb, ldy);
                    else pi2_batch_gemm(PI2_Q4_0, ws, stride, 0, rows, n, batch, tokens, yb, ldy);
                    if (memcmp(ya, yb, sizeof(float) * ldy * tokens)) bad++; /* padding columns included */
                }
                free(batch);
            }
            free(ws), free(acts), free(x4), free(x), free(ya), free(yb);
            free_case(&c);
        }
    printf("amx: batch gemm %d cases against the scalar reference, %d mismatches\n", cases, bad);
    CHECK(bad == 0);
    pi2_kernels_force(pi2_kernels_best());
}

/* pi2_axpy_batch (prefill's down pass) gives one pi2_axpy per token and column in list order, bit for
 * bit, at every level: columns in records of row size + 40 bytes, more of them than one group of the
 * kernels' (128), lists of every length (none, one, every column), outputs ldy > n apart whose padding
 * stays. */
static void test_axpy_batch(pi2_kernel_level level) {
    pi2_kernels_force(level);
    const pi2_type types[] = {PI2_Q4_0, PI2_Q4_1, PI2_Q8_0, PI2_F16};
    const int64_t ns[] = {32, 96, 1024};
    const int64_t token_counts[] = {1, 2, 13, 40};
    int bad = 0;
    for (size_t ty = 0; ty < sizeof types / sizeof types[0]; ty++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const int64_t n = ns[k], ncols = 300, ldy = n + 8, maxt = 40;
            struct case_data c;
            make_case(&c, types[ty], n, ncols);
            const size_t rs = pi2_row_size(types[ty], n), stride = rs + 40;
            uint8_t *cols = malloc(stride * ncols);
            memset(cols, 0x5a, stride * ncols);
            for (int64_t r = 0; r < ncols; r++) memcpy(cols + r * stride, c.w + r * rs, rs);
            int32_t *ix = malloc(sizeof(int32_t) * ncols * maxt), count[40];
            float *av = malloc(sizeof(float) * ncols * maxt), *y0 = malloc(sizeof(float) * ldy * maxt);
            float *ya = malloc(sizeof(float) * ldy * maxt), *yb = malloc(sizeof(float) * ldy * maxt);
            const int32_t *idx[40];
            const float *a[40];
            for (int64_t t = 0; t < maxt; t++) {
                const uint32_t pct = t % 5 == 1 ? 0 : t % 5 == 2 ? 100 : t % 5 == 3 ? 1 : 20; /* live share */
                count[t] = 0;
                for (int32_t col = 0; col < ncols; col++)
                    if (rnd_u32() % 100 < pct || (pct == 1 && col == ncols - 1)) {
                        ix[t * ncols + count[t]] = col;
                        av[t * ncols + count[t]++] = rnd_gauss();
                    }
                idx[t] = ix + t * ncols, a[t] = av + t * ncols;
            }
            fill_gauss(y0, ldy * maxt, 2.0f);
            for (size_t ti = 0; ti < sizeof token_counts / sizeof token_counts[0]; ti++) {
                const int64_t tokens = token_counts[ti];
                memcpy(ya, y0, sizeof(float) * ldy * maxt);
                memcpy(yb, y0, sizeof(float) * ldy * maxt);
                for (int64_t t = 0; t < tokens; t++)
                    for (int32_t j = 0; j < count[t]; j++)
                        pi2_axpy(types[ty], n, a[t][j], cols + (size_t)idx[t][j] * stride, ya + t * ldy);
                pi2_axpy_batch(types[ty], n, cols, stride, tokens, idx, a, count, yb, ldy);
                if (memcmp(ya, yb, sizeof(float) * ldy * maxt)) bad++;
            }
            free(cols), free(ix), free(av), free(y0), free(ya), free(yb);
            free_case(&c);
        }
    if (bad) fprintf(stderr, "%s: axpy_batch %d mismatches with one axpy per column\n", pi2_kernel_level_name(level), bad);
    CHECK(bad == 0);
}

/* The engine's way to the batch GEMM (parmat.c): the batch packed by a pool's threads, tile by tile,
 * is the single-threaded batch byte for byte (33 tokens: tiles split unevenly, a padded last one), and
 * pi2_par_matmul gives the level's pi2_gemm (plain rows) and pi2_x4_gemm (x4) floats, 12+ tokens taking
 * the batch and fewer the old path. */
static void test_par_batch(void) {
    const int64_t rows = 40, n = 256, maxt = 33;
    struct case_data c;
    make_case(&c, PI2_Q4_0, n, rows);
    const size_t rs = pi2_row_size(PI2_Q4_0, n), as = pi2_row_size(PI2_Q8_0, n);
    uint8_t *acts = malloc(as * maxt), *x4 = malloc(rs * rows);
    float *x = malloc(sizeof(float) * n * maxt), *ya = malloc(sizeof(float) * rows * maxt),
          *yb = malloc(sizeof(float) * rows * maxt);
    fill_gauss(x, n * maxt, 1.0f);
    for (int64_t t = 0; t < maxt; t++) pi2_prepare_act(PI2_Q4_0, x + t * n, acts + t * as, n);
    pi2_x4_pack(PI2_Q4_0, c.w, rows, n, x4);
    pi2_pool *pool = pi2_pool_create(3, NULL);
    CHECK(pool != NULL);
    int bad = 0;
    const size_t bytes = pi2_batch_size(PI2_Q4_0, n, maxt);
    if (bytes) {
        uint8_t *one = pi2_par_batch(NULL, PI2_Q4_0, acts, n, maxt), *three = pi2_par_batch(pool, PI2_Q4_0, acts, n, maxt);
        CHECK(one && three && memcmp(one, three, bytes) == 0);
        free(one), free(three);
    }
    CHECK(pi2_par_batch(pool, PI2_Q4_0, acts, n, PI2_BATCH_MIN_TOKENS - 1) == NULL);
    for (int64_t tokens = 2; tokens <= maxt; tokens += 10) {
        for (int layout = 0; layout < 2; layout++) {
            if (layout == 1 && !pi2_x4_supported(PI2_Q4_0)) continue;
            pi2_mat m = {.data = layout ? x4 : c.w, .type = PI2_Q4_0, .rows = rows, .cols = n, .row_bytes = rs,
                         .stride = rs, .x4 = layout};
            if (layout) pi2_x4_gemm(PI2_Q4_0, x4, rows, n, acts, tokens, ya, rows);
            else pi2_gemm(PI2_Q4_0, c.w, rows, n, acts, tokens, ya, rows);
            pi2_par_matmul(pool, &m, acts, tokens, yb, rows);
            if (memcmp(ya, yb, sizeof(float) * (size_t)(rows * tokens))) bad++;
        }
    }
    if (bad) fprintf(stderr, "%s: par_matmul %d mismatches with the kernels\n", pi2_kernel_level_name(pi2_kernels_current()), bad);
    CHECK(bad == 0);
    pi2_pool_free(pool);
    free(acts), free(x4), free(x), free(ya), free(yb);
    free_case(&c);
}

int main(void) {
    test_fp16();
    test_golden();
    test_act_rounding();
    test_quant_error();
    test_scalar_semantics();
    printf("kernel levels: best %s\n", pi2_kernel_level_name(pi2_kernels_best()));
    int levels_tested = 0;
    for (int level = 0; level < PI2_KERNEL_LEVELS; level++) {
        if (pi2_kernels_force((pi2_kernel_level)level) != 0) continue;
        printf("testing level %s against scalar\n", pi2_kernel_level_name((pi2_kernel_level)level));
        test_level((pi2_kernel_level)level);
        test_f16_act_edges((pi2_kernel_level)level);
        test_attention((pi2_kernel_level)level);
        test_x4((pi2_kernel_level)level);
        test_batch((pi2_kernel_level)level);
        test_axpy_batch((pi2_kernel_level)level);
        /* where pi2_gemm has the batch's floats: the reference, and AVX-512 (rows as lanes from 12 tokens)
         * and AMX (whose pi2_gemm is AVX-512's) */
        if (level == PI2_KERNELS_SCALAR || level == PI2_KERNELS_AVX512 || level == PI2_KERNELS_AMX) test_par_batch();
        levels_tested++;
    }
    CHECK(levels_tested >= 1);
    test_gemm_lanes();
    test_batch_amx();
    CHECK(pi2_kernels_force((pi2_kernel_level)99) == -1);
    CHECK(pi2_kernels_force(pi2_kernels_best()) == 0 && pi2_kernels_current() == pi2_kernels_best());
    return pi2_test_summary("test_kernels");
}
