/* AMX (Sapphire Rapids and later): prefill's Q4_0 batch GEMM (kernels.h, pi2_batch_gemm) on the tile
 * unit. Everything else is the avx512 level's. Built with the AVX-512 and AMX flags and only called after
 * cpuid, XCR0 and the kernel's permission said yes (kernels_dispatch.c).
 *
 * The avx512 batch GEMM (kernels_lanes_avx512.c) spends 8 VPDPBUSD per 16 rows, token and block on
 * the integer dots, two thirds of its vector instructions. Here one TDPBSSD does the dots of 8 tokens
 * x 16 rows x one block (4096 products), and the vector ports are left with the float steps only (a
 * conversion, two multiplies and an add per 16 results and block), which now bound the kernel.
 *
 * Per row and token the floats are the avx512 kernel's and the scalar reference's
 * (kernels_scalar.c, batch_gemm_q4_0): sum += (float)isum * (d_w * d_a) block after block, no FMA,
 * with isum the block's exact integer dot. Each TDPBSSD covers a single block (K = 32), into a tile of
 * its own, so no two blocks' integers mix: a C tile is stored and turned into floats block by block.
 *   A tiles (8 x 32 bytes): the 8 tokens of a batch record, each one block's 32 int8 quants in
 *     element order, as this level's batch holds them (kernels.h: token by token); two records (16
 *     tokens) a step, so the B tile and the scales serve 16 tokens;
 *   B tile (8 x 64 bytes): 16 rows in VNNI order, row j of the tile holding each weight row's
 *     elements 4j..4j+3 (the avx512 batch GEMM's unpack, pi2_lanes_unpack_q4_0), less 8 (signed);
 *   C tiles (8 x 64 bytes): int32 isum[token][row], so a C row is one token's 16 rows: the lanes of
 *     the avx512 kernel's accumulators, stored the same way (masked, y + token * ldy). */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_impl.h"

#define AMX_ROWS 16 /* weight rows per B tile: one per int32 lane of a C row */
#define AMX_TOK 16  /* tokens per step: two records of the batch */

/* ldtilecfg's operand (palette 1): per tile register, its bytes per row and rows */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* The tile registers: the two records' C tiles and the B tile twice over, so block b + 1's dots run
 * while block b's results are stored and turned into floats. */
#define TC0A 0 /* even blocks: tokens 0..7 of the step */
#define TC0B 1 /* even blocks: tokens 8..15 */
#define TC1A 2 /* odd blocks */
#define TC1B 3
#define TAA 4 /* the step's first record */
#define TAB 5 /* its second */
#define TB0 6
#define TB1 7
#define AMX_REC_TOK PI2_BATCH_TILE /* tokens per record: the rows of an A tile */

/* Tiles are per thread: every call configures its own and releases them at the end. gcc's
 * _tile_loadconfig declares only the first 8 bytes of the struct as read, so the stores that fill
 * the rest look dead and gcc 12 drops them (the first LDTILECFG then faults, as llama.cpp's AMX path
 * does): the asm below takes the struct's address and clobbers memory, so every field is written
 * first. */
static void tiles_config(void) {
    tile_config cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int c = TC0A; c <= TC1B; c++) cfg.rows[c] = AMX_REC_TOK, cfg.colsb[c] = AMX_ROWS * 4;
    cfg.rows[TAA] = cfg.rows[TAB] = AMX_REC_TOK, cfg.colsb[TAA] = cfg.colsb[TAB] = PI2_QK;
    cfg.rows[TB0] = cfg.rows[TB1] = PI2_QK / 4, cfg.colsb[TB0] = cfg.colsb[TB1] = AMX_ROWS * 4;
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* Block b's floats for the 16 tokens of the two C tiles stored at c (int32 [token][row]), tokens 0..7
 * scaled by da0, 8..15 by da1: acc[t] += cvt(c[t]) * (d_w * d_a[t]), the avx512 batch_tile's steps
 * (the rounding-mode forms keep gcc from fusing the multiply and the add into an FMA). */
static inline __attribute__((always_inline)) void block_floats(const int32_t *c, const float *dw, const float *da0,
                                                              const float *da1, __m512 *acc) {
    const __m512 d = _mm512_load_ps(dw);
#pragma GCC unroll 16
    for (int t = 0; t < AMX_TOK; t++) {
        const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(t < AMX_REC_TOK ? da0[t] : da1[t - AMX_REC_TOK]));
        const __m512 p = _mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + t * AMX_ROWS)), scale,
                                             _MM_FROUND_CUR_DIRECTION);
        acc[t] = _mm512_add_round_ps(acc[t], p, _MM_FROUND_CUR_DIRECTION);
    }
}

/* Block b's dots into tiles CA, CB (zeroed first): the step's two records by the B tile */
#define AMX_DOT(CA, CB, B, b)                                                  \
    do {                                                                       \
        _tile_loadd(B, u + (size_t)(b) * (PI2_QK / 4) * 64, 64);               \
        _tile_loadd(TAA, a0[b].qs, PI2_QK);                                    \
        _tile_zero(CA);                                                        \
        _tile_dpbssd(CA, TAA, B);                                              \
        _tile_loadd(TAB, a1[(b) * s1].qs, PI2_QK);                             \
        _tile_zero(CB);                                                        \
        _tile_dpbssd(CB, TAB, B);                                              \
    } while (0)

/* Tile C stored as int32 [8][16] at c: _tile_stored's asm clobbers all memory, which keeps the 16
 * accumulators of amx_tile in memory (gcc spills and reloads them around every store); this one names
 * the bytes it writes instead. */
#define AMX_STORE_C(C, c) AMX_STORE_C_(C, c) /* C expanded to its number first */
#define AMX_STORE_C_(C, c)                                                                              \
    __asm__ volatile("tilestored %%tmm" #C ", (%1,%2,1)" : "=m"(*(int32_t(*)[AMX_REC_TOK * AMX_ROWS])(c)) \
                     : "r"(c), "r"((long)64))

/* One 16-row group (u, dw: its unpacked blocks) by 16 tokens: the records a0 and a1 of every block (a1
 * s1 records a block apart: 0 where the batch ends after a0 and a1 is a zero record). Block b + 1's
 * dots are issued before block b's results are stored and turned into floats, so the tile unit works
 * while the vector ports do. */
static void amx_tile(const int8_t *u, const float *dw, int64_t nb, const pi2_batch_block *a0,
                     const pi2_batch_block *a1, int64_t s1, int32_t (*cbuf)[256], float *y, int64_t ldy,
                     __mmask16 mask, int nt) {
    __m512 acc[AMX_TOK];
#pragma GCC unroll 16
    for (int t = 0; t < AMX_TOK; t++) acc[t] = _mm512_setzero_ps();
    AMX_DOT(TC0A, TC0B, TB0, 0);
    for (int64_t b = 0; b < nb; b += 2) { /* two blocks a turn: tile registers are named in the instructions */
        if (b + 1 < nb) AMX_DOT(TC1A, TC1B, TB1, b + 1);
        AMX_STORE_C(TC0A, cbuf[0]);
        AMX_STORE_C(TC0B, cbuf[0] + AMX_REC_TOK * AMX_ROWS);
        block_floats(cbuf[0], dw + b * AMX_ROWS, a0[b].d, a1[b * s1].d, acc);
        if (b + 1 == nb) break;
        if (b + 2 < nb) AMX_DOT(TC0A, TC0B, TB0, b + 2);
        AMX_STORE_C(TC1A, cbuf[1]);
        AMX_STORE_C(TC1B, cbuf[1] + AMX_REC_TOK * AMX_ROWS);
        block_floats(cbuf[1], dw + (b + 1) * AMX_ROWS, a0[b + 1].d, a1[(b + 1) * s1].d, acc);
    }
#pragma GCC unroll 16
    for (int t = 0; t < AMX_TOK; t++) /* constant indices: the accumulators stay in registers */
        if (t < nt) _mm512_mask_storeu_ps(y + t * ldy, mask, acc[t]);
}

/* the second record of a last step the batch has only one record of */
static const pi2_batch_block zero_record __attribute__((aligned(64)));

static void batch_gemm_q4_0_amx(const void *w, size_t row_bytes, int x4, int64_t rows, int64_t n,
                                const pi2_batch_block *batch, int64_t tokens, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK, recs = (tokens + AMX_REC_TOK - 1) / AMX_REC_TOK;
    int8_t *u = aligned_alloc(64, (size_t)nb * PI2_QK * AMX_ROWS);
    float *dw = aligned_alloc(64, (size_t)nb * AMX_ROWS * sizeof(float));
    int32_t(*cbuf)[256] = aligned_alloc(64, 2 * 256 * sizeof(int32_t));
    if (!u || !dw || !cbuf) abort();
    tiles_config();
    const __m512i eight = _mm512_set1_epi8(8);
    for (int64_t r = 0; r < rows; r += AMX_ROWS) {
        const int nr = rows - r < AMX_ROWS ? (int)(rows - r) : AMX_ROWS;
        const __mmask16 mask = (__mmask16)((1u << nr) - 1);
        pi2_lanes_unpack_q4_0((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, x4, nr, nb, u, dw);
        for (int64_t i = 0; i < nb * PI2_QK * AMX_ROWS / 64; i++) /* nibbles 0..15 -> q - 8 */
            _mm512_store_si512(u + 64 * i, _mm512_sub_epi8(_mm512_load_si512(u + 64 * i), eight));
        /* the tile loads below read u without telling gcc (their asm has no memory operand) */
        __asm__ volatile("" : : : "memory");
        for (int64_t rec = 0; rec < recs; rec += 2) {
            const int64_t t = rec * AMX_REC_TOK;
            const int nt = tokens - t < AMX_TOK ? (int)(tokens - t) : AMX_TOK;
            const int two = rec + 1 < recs;
            amx_tile(u, dw, nb, batch + rec * nb, two ? batch + (rec + 1) * nb : &zero_record, two, cbuf,
                     y + t * ldy + r, ldy, mask, nt);
        }
    }
    _tile_release();
    free(u);
    free(dw);
    free(cbuf);
}

void pi2_kernels_fill_amx(pi2_kernel_table *t) {
    t->batch_gemm[PI2_Q4_0] = batch_gemm_q4_0_amx;
    t->batch_by_token = 1; /* the A tiles' rows (kernels.h) */
}
