/* Internal to the kernels: the table of per-type functions that each SIMD level fills in, and the
 * scalar pieces every level may fall back on. Not part of the engine's contract (kernels.h is). */
#ifndef PI2_KERNELS_IMPL_H
#define PI2_KERNELS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#define PI2_N_TYPES 10 /* type ids index the tables: 0..9 */

typedef float (*pi2_dot_fn)(int64_t n, const void *row, const void *act);
/* idx == NULL: rows 0..count-1 of w; otherwise rows idx[0..count). */
typedef void (*pi2_rows_fn)(const void *w, size_t row_bytes, const int32_t *idx, int64_t count, int64_t n,
                            const void *act, float *y);
typedef void (*pi2_axpy_fn)(int64_t n, float a, const void *row, float *y);
typedef void (*pi2_gemm_fn)(const void *w, size_t row_bytes, int64_t rows, int64_t n, const void *acts,
                            size_t act_bytes, int64_t tokens, float *y, int64_t ldy);
typedef void (*pi2_convert_fn)(const float *x, void *out, int64_t n);
typedef void (*pi2_att_f16_fn)(int64_t hd, int group, const pi2_f16 *q, const pi2_f16 *k, const pi2_f16 *v,
                               int64_t stride, int64_t n_pos, float scale, float *p, float *out, float *m, float *l);

typedef struct {
    pi2_dot_fn dot[PI2_N_TYPES];
    pi2_rows_fn rows[PI2_N_TYPES];
    pi2_axpy_fn axpy[PI2_N_TYPES];
    pi2_gemm_fn gemm[PI2_N_TYPES];
    pi2_convert_fn act_q8_0, act_q8_1, act_f16; /* activation quantizers (llama.cpp's run-time rounding) */
    /* optional (NULL: the packed form is a copy of the activation and dot_packed is dot) */
    size_t (*packed_size[PI2_N_TYPES])(int64_t n);
    void (*pack[PI2_N_TYPES])(const void *act, int64_t n, void *packed);
    pi2_dot_fn dot_packed[PI2_N_TYPES];
    /* optional (NULL: one dot_packed per row); ahead may be NULL, and a kernel may leave it be */
    void (*dot_packed_rows[PI2_N_TYPES])(int64_t n, const uint8_t *const *rows, int count, const void *packed,
                                         float *y, pi2_ahead *ahead);
    /* optional (NULL: one axpy per row); ahead as above */
    void (*axpy_rows[PI2_N_TYPES])(int64_t n, const float *a, const uint8_t *const *rows, int count, float *y,
                                   pi2_ahead *ahead);
    /* optional (NULL: one axpy per token and column; kernels.h pi2_axpy_batch) */
    void (*axpy_batch[PI2_N_TYPES])(int64_t n, const uint8_t *cols, size_t stride, int64_t tokens,
                                    const int32_t *const *idx, const float *const *a, const int32_t *count, float *y,
                                    int64_t ldy);
    /* optional: GEMM over rows interleaved by four (pi2_x4_pack); NULL: no such layout at this level */
    void (*x4_gemm[PI2_N_TYPES])(const void *w, int64_t rows, int64_t n, const void *acts, int64_t tokens, float *y,
                                 int64_t ldy);
    /* optional: the GEMM of rows inside larger records (pi2_gemm_strided: the FFN's gate and up in a
     * batch); NULL: gemm */
    pi2_gemm_fn gemm_strided[PI2_N_TYPES];
    /* optional: the GEMM over a packed batch (kernels.h, pi2_batch_gemm); NULL: the level keeps gemm */
    void (*batch_gemm[PI2_N_TYPES])(const void *w, size_t row_stride, int x4, int64_t rows, int64_t n,
                                    const pi2_batch_block *batch, int64_t tokens, float *y, int64_t ldy);
    int batch_by_token; /* the batch's quants token by token (kernels.h, pi2_batch_block): amx */
    pi2_att_f16_fn att_f16; /* kernels_att.h over the level's dot_f16, axpy_f16 */
} pi2_kernel_table;

/* Sets t's per-type entries and the F16 accumulator from the static functions that each level's file
 * (kernels_scalar.c, kernels_x86_common.h, kernels_arm_common.h) defines under the same names:
 * dot_T, rows_T, axpy_T, gemm_T for T in f32, f16, q4_0, q4_1, q8_0, and att_f16 (kernels_att.h). */
#define PI2_KERNELS_SET_TYPE(t, ID, T) \
    (t)->dot[ID] = dot_##T;           \
    (t)->rows[ID] = rows_##T;         \
    (t)->axpy[ID] = axpy_##T;         \
    (t)->gemm[ID] = gemm_##T;
#define PI2_KERNELS_SET_COMMON(t)                  \
    do {                                           \
        PI2_KERNELS_SET_TYPE(t, PI2_F32, f32)      \
        PI2_KERNELS_SET_TYPE(t, PI2_F16, f16)      \
        PI2_KERNELS_SET_TYPE(t, PI2_Q4_0, q4_0)    \
        PI2_KERNELS_SET_TYPE(t, PI2_Q4_1, q4_1)    \
        PI2_KERNELS_SET_TYPE(t, PI2_Q8_0, q8_0)    \
        (t)->att_f16 = att_f16;                    \
    } while (0)

/* pi2_ahead (kernels.h) inside a kernel: pace it over the kernel's steps once, then step once per step;
 * both take NULL (no rows named) and then do nothing.
 * Locality 2 (L2): the next rows must not push the current ones out of L1. On the 2-vCPU AMD VM's FFN
 * micro-benchmark (8 layers' decode waves, one thread) to L1 was slower than to L2. */
static inline void pi2_ahead_pace(pi2_ahead *a, int64_t steps) {
    if (!a || a->r >= a->count || steps <= 0) return;
    const int64_t lines = (int64_t)(a->count - a->r) * (int64_t)((a->bytes + 63) / 64) - (int64_t)(a->at / 64);
    a->per_step = (int)((lines + steps - 1) / steps);
}
static inline void pi2_ahead_step(pi2_ahead *a) {
    if (!a) return;
    for (int k = 0; k < a->per_step && a->r < a->count; k++) {
        __builtin_prefetch(a->rows[a->r] + a->at, 0, 2);
        a->at += 64;
        if (a->at >= a->bytes) a->at = 0, a->r++;
    }
}

/* Each level starts from the level below it and overrides what it does better. */
void pi2_kernels_fill_scalar(pi2_kernel_table *t);
#if defined(__x86_64__) || defined(__i386__)
void pi2_kernels_fill_avx2(pi2_kernel_table *t);
void pi2_kernels_fill_avx512(pi2_kernel_table *t);
void pi2_kernels_fill_lanes_avx512(pi2_kernel_table *t); /* kernels_lanes_avx512.c */
/* Q4_0 batches from this many tokens go through rows as lanes, in both layouts (kernels_lanes_avx512.c):
 * below it gemm512 and x4 are quicker (one thread, 4096 x 4096: lanes passes gemm512 at ~8
 * tokens and x4 at ~12; 1.3x x4 at 16 tokens, 2.1x at 64). */
#define PI2_LANES_MIN_TOKENS 12
void pi2_lanes_gemm_q4_0(const void *w, size_t row_bytes, int64_t rows, int64_t n, const void *acts, size_t act_bytes,
                         int64_t tokens, float *y, int64_t ldy);
void pi2_lanes_x4_gemm_q4_0(const void *w, int64_t rows, int64_t n, const void *acts, int64_t tokens, float *y,
                            int64_t ldy);
/* nr (1..16) rows of a Q4_0 matrix (row_bytes apart; x4: pi2_x4_pack's layout from a group boundary)
 * unpacked for nb blocks: u (nb * 512 bytes, 64-byte aligned) holds per block 8 x 64 bytes, 64-byte
 * chunk j holding each row's nibbles 4j..4j+3 of the block's 32 elements (0..15, unsigned) at 4 * row;
 * dw[b * 16 + row] its scale. Rows past nr are zero, scale 0. */
void pi2_lanes_unpack_q4_0(const uint8_t *w, size_t row_bytes, int x4, int nr, int64_t nb, void *u, float *dw);
void pi2_kernels_fill_amx(pi2_kernel_table *t); /* kernels_amx.c */
#endif
#if defined(__aarch64__)
void pi2_kernels_fill_neon(pi2_kernel_table *t);
void pi2_kernels_fill_dotprod(pi2_kernel_table *t);
void pi2_kernels_fill_i8mm(pi2_kernel_table *t);
#endif

/* The table of the level in use (chosen on first use). */
const pi2_kernel_table *pi2_kernels_table(void);

/* Scalar activation quantizers with the rounding llama.cpp uses at run time on this architecture
 * (see quant.c); every SIMD level must produce the same bytes. */
void pi2_act_quantize_q8_0_scalar(const float *x, void *out, int64_t n);
void pi2_act_quantize_q8_1_scalar(const float *x, void *out, int64_t n);
void pi2_act_convert_f16_scalar(const float *x, void *out, int64_t n);

/* Generic drivers built from a dot function: used by levels that only speed up the dot. */
void pi2_rows_via_dot(pi2_dot_fn dot, const void *w, size_t row_bytes, const int32_t *idx, int64_t count,
                      int64_t n, const void *act, float *y);
void pi2_gemm_via_dot(pi2_dot_fn dot, const void *w, size_t row_bytes, int64_t rows, int64_t n,
                      const void *acts, size_t act_bytes, int64_t tokens, float *y, int64_t ldy);

/* rows_T / gemm_T as the generic drivers over the level's dot_T, for types a level only speeds up the
 * dot of. */
#define PI2_ROWS_VIA_DOT(T)                                                                           \
    static void rows_##T(const void *w, size_t rb, const int32_t *idx, int64_t count, int64_t n,      \
                         const void *act, float *y) {                                                 \
        pi2_rows_via_dot(dot_##T, w, rb, idx, count, n, act, y);                                      \
    }
#define PI2_GEMM_VIA_DOT(T)                                                                           \
    static void gemm_##T(const void *w, size_t rb, int64_t rows, int64_t n, const void *acts, size_t ab, \
                         int64_t tokens, float *y, int64_t ldy) {                                     \
        pi2_gemm_via_dot(dot_##T, w, rb, rows, n, acts, ab, tokens, y, ldy);                          \
    }

/* A gemm_fn named NAME that calls a level's gemm driver DRIVER(KIND, ...) for one block type. */
#define PI2_GEMM_OF_KIND(NAME, DRIVER, KIND)                                                          \
    static void NAME(const void *w, size_t rb, int64_t rows, int64_t n, const void *acts, size_t ab,  \
                     int64_t tokens, float *y, int64_t ldy) {                                         \
        DRIVER(KIND, w, rb, rows, n, acts, ab, tokens, y, ldy);                                       \
    }

/* Tokens per gemm tile: a tile's activations (tokens x act row) stay in L1/L2 while each weight row
 * is streamed from memory once per tile. */
#define PI2_GEMM_TILE_TOKENS 16

#endif
