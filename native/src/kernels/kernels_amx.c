/* AMX (Sapphire Rapids and later): prefill's Q4_0 batch GEMM (kernels.h, pi2_batch_gemm) on the tile
 * unit. Everything else is the avx512 level's. Built with the AVX-512 and AMX flags and only called after
 * cpuid, XCR0 and the kernel's permission said yes (kernels_dispatch.c).
 *
 * The avx512 batch GEMM (kernels_lanes_avx512.c) spends 8 VPDPBUSD per 16 rows, token and block on
 * the integer dots, which keeps its one 512-bit multiply port busy most of the time. Here one TDPBSSD
 * does the dots of 16 tokens x 16 rows x one block (8192 products), and the vector ports are left with
 * the float steps only (a conversion, two multiplies and an add per 16 results and block).
 *
 * Per row and token the floats are the avx512 kernel's and the scalar reference's
 * (kernels_scalar.c, batch_gemm_q4_0): sum += (float)isum * (d_w * d_a) block after block, no FMA,
 * with isum the block's exact integer dot. Each TDPBSSD covers a single block (K = 32), into a tile of
 * its own, so no two blocks' integers mix: a C tile is stored and turned into floats block by block.
 *   A tile (16 x 32 bytes): 16 tokens, each one block's 32 int8 quants in element order;
 *   B tile (8 x 64 bytes): 16 rows in VNNI order, row j of the tile holding each weight row's
 *     elements 4j..4j+3 (the avx512 batch GEMM's unpack, pi2_lanes_unpack_q4_0), less 8 (signed);
 *   C tile (16 x 64 bytes): int32 isum[token][row], so a C row is one token's 16 rows: the lanes of
 *     the avx512 kernel's accumulators, stored the same way (masked, y + token * ldy).
 * The batch is the same bytes as at every level; each call regroups the tokens' quants of its 8-token
 * records into 16-token A tiles once (a few percent of a call's work at 16 rows x 128 tokens). */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_impl.h"

#define AMX_ROWS 16 /* weight rows per B tile: one per int32 lane of a C row */
#define AMX_TOK 16  /* tokens per A tile */

/* ldtilecfg's operand (palette 1): per tile register, its bytes per row and rows */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* The tile registers: two of each kind, so block b + 1's dot runs while block b's result is stored
 * and block b - 1's floats are computed (tiles are not renamed: a register must not be rewritten
 * before the instruction reading it has finished). */
#define TC0 0
#define TC1 1
#define TA0 2
#define TA1 3
#define TB0 4
#define TB1 5

/* Tiles are per thread: every call configures its own and releases them at the end. gcc's
 * _tile_loadconfig declares only the first 8 bytes of the struct as read, so the stores that fill
 * the rest look dead and gcc 12 drops them (the first LDTILECFG then faults, as llama.cpp's AMX path
 * does): the asm below takes the struct's address and clobbers memory, so every field is written
 * first. */
static void tiles_config(void) {
    tile_config cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    cfg.rows[TC0] = cfg.rows[TC1] = AMX_TOK, cfg.colsb[TC0] = cfg.colsb[TC1] = AMX_ROWS * 4;
    cfg.rows[TA0] = cfg.rows[TA1] = AMX_TOK, cfg.colsb[TA0] = cfg.colsb[TA1] = PI2_QK;
    cfg.rows[TB0] = cfg.rows[TB1] = PI2_QK / 4, cfg.colsb[TB0] = cfg.colsb[TB1] = AMX_ROWS * 4;
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
}

/* A 16-token tile's activations for one block: the A tile's quants, then the tokens' scales */
typedef struct {
    int8_t q[AMX_TOK][PI2_QK];
    float d[AMX_TOK];
} amx_act; /* 576 bytes: every record 64-byte aligned */

/* The batch (8-token records, kernels.h) -> 16-token amx_act records, tile by tile and block by
 * block; tokens past the batch's last record are zero. A record's token pair p is one zmm of 8-byte
 * chunks [chunk c][token of the pair i]: one permute puts each token's four chunks side by side. */
static void acts_regroup(const pi2_batch_block *batch, int64_t nb, int64_t tokens, amx_act *out) {
    const int64_t recs = (tokens + PI2_BATCH_TILE - 1) / PI2_BATCH_TILE, tiles = (tokens + AMX_TOK - 1) / AMX_TOK;
    const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
    for (int64_t tt = 0; tt < tiles; tt++)
        for (int64_t b = 0; b < nb; b++) {
            amx_act *o = out + tt * nb + b;
            for (int h = 0; h < AMX_TOK / PI2_BATCH_TILE; h++) {
                const int64_t rec = tt * (AMX_TOK / PI2_BATCH_TILE) + h;
                int8_t(*q)[PI2_QK] = o->q + h * PI2_BATCH_TILE;
                if (rec >= recs) {
                    memset(q, 0, PI2_BATCH_TILE * PI2_QK);
                    memset(o->d + h * PI2_BATCH_TILE, 0, PI2_BATCH_TILE * sizeof(float));
                    continue;
                }
                const pi2_batch_block *a = batch + rec * nb + b;
                for (int p = 0; p < PI2_BATCH_TILE / 2; p++)
                    _mm512_store_si512(q + 2 * p, _mm512_permutexvar_epi64(order, _mm512_load_si512(a->qs[p])));
                memcpy(o->d + h * PI2_BATCH_TILE, a->d, sizeof a->d);
            }
        }
}

/* Block b's floats for the 16 tokens of a C tile stored at c (int32 [token][row]): acc[t] += cvt(c[t])
 * * (d_w * d_a[t]), the avx512 batch_tile's steps (the rounding-mode forms keep gcc from fusing the
 * multiply and the add into an FMA). */
static inline __attribute__((always_inline)) void block_floats(const int32_t *c, const float *dw, const amx_act *a,
                                                              __m512 *acc) {
    const __m512 d = _mm512_load_ps(dw);
#pragma GCC unroll 16
    for (int t = 0; t < AMX_TOK; t++) {
        const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a->d[t]));
        const __m512 p = _mm512_mul_round_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + t * AMX_ROWS)), scale,
                                             _MM_FROUND_CUR_DIRECTION);
        acc[t] = _mm512_add_round_ps(acc[t], p, _MM_FROUND_CUR_DIRECTION);
    }
}

/* Block b's dot into tile C (zeroed first) from its A and B tiles */
#define AMX_DOT(C, A, B, b)                                                    \
    do {                                                                       \
        _tile_loadd(A, act[b].q, PI2_QK);                                      \
        _tile_loadd(B, u + (size_t)(b) * (PI2_QK / 4) * 64, 64);               \
        _tile_zero(C);                                                         \
        _tile_dpbssd(C, A, B);                                                 \
    } while (0)

/* Tile C stored as int32 [16][16] at c: _tile_stored's asm clobbers all memory, which keeps the 16
 * accumulators of amx_tile in memory (gcc spills and reloads them around every store); this one names
 * the bytes it writes instead. */
#define AMX_STORE_C(C, c) AMX_STORE_C_(C, c) /* C expanded to its number first */
#define AMX_STORE_C_(C, c) \
    __asm__ volatile("tilestored %%tmm" #C ", (%1,%2,1)" : "=m"(*(int32_t(*)[256])(c)) : "r"(c), "r"((long)64))

/* One 16-row group (u, dw: its unpacked blocks) by one 16-token tile (act: its nb records): block b + 1's
 * dot is issued before block b's result is stored and turned into floats, so the tile unit works
 * while the vector ports do. */
static void amx_tile(const int8_t *u, const float *dw, int64_t nb, const amx_act *act, int32_t (*cbuf)[256],
                     float *y, int64_t ldy, __mmask16 mask, int nt) {
    __m512 acc[AMX_TOK];
#pragma GCC unroll 16
    for (int t = 0; t < AMX_TOK; t++) acc[t] = _mm512_setzero_ps();
    AMX_DOT(TC0, TA0, TB0, 0);
    for (int64_t b = 0; b < nb; b += 2) { /* two blocks a turn: tile registers are named in the instructions */
        if (b + 1 < nb) AMX_DOT(TC1, TA1, TB1, b + 1);
        AMX_STORE_C(TC0, cbuf[0]);
        block_floats(cbuf[0], dw + b * AMX_ROWS, act + b, acc);
        if (b + 1 == nb) break;
        if (b + 2 < nb) AMX_DOT(TC0, TA0, TB0, b + 2);
        AMX_STORE_C(TC1, cbuf[1]);
        block_floats(cbuf[1], dw + (b + 1) * AMX_ROWS, act + b + 1, acc);
    }
#pragma GCC unroll 16
    for (int t = 0; t < AMX_TOK; t++) /* constant indices: the accumulators stay in registers */
        if (t < nt) _mm512_mask_storeu_ps(y + t * ldy, mask, acc[t]);
}

static void batch_gemm_q4_0_amx(const void *w, size_t row_bytes, int x4, int64_t rows, int64_t n,
                                const pi2_batch_block *batch, int64_t tokens, float *y, int64_t ldy) {
    const int64_t nb = n / PI2_QK, tiles = (tokens + AMX_TOK - 1) / AMX_TOK;
    int8_t *u = aligned_alloc(64, (size_t)nb * PI2_QK * AMX_ROWS);
    float *dw = aligned_alloc(64, (size_t)nb * AMX_ROWS * sizeof(float));
    amx_act *act = aligned_alloc(64, (size_t)(tiles * nb) * sizeof(amx_act));
    int32_t(*cbuf)[256] = aligned_alloc(64, 2 * 256 * sizeof(int32_t));
    if (!u || !dw || !act || !cbuf) abort();
    acts_regroup(batch, nb, tokens, act);
    tiles_config();
    const __m512i eight = _mm512_set1_epi8(8);
    for (int64_t r = 0; r < rows; r += AMX_ROWS) {
        const int nr = rows - r < AMX_ROWS ? (int)(rows - r) : AMX_ROWS;
        const __mmask16 mask = (__mmask16)((1u << nr) - 1);
        pi2_lanes_unpack_q4_0((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, x4, nr, nb, u, dw);
        for (int64_t i = 0; i < nb * PI2_QK * AMX_ROWS / 64; i++) /* nibbles 0..15 -> q - 8 */
            _mm512_store_si512(u + 64 * i, _mm512_sub_epi8(_mm512_load_si512(u + 64 * i), eight));
        /* the tile loads below read u and act without telling gcc (their asm has no memory operand) */
        __asm__ volatile("" : : : "memory");
        for (int64_t tt = 0; tt < tiles; tt++) {
            const int nt = tokens - tt * AMX_TOK < AMX_TOK ? (int)(tokens - tt * AMX_TOK) : AMX_TOK;
            amx_tile(u, dw, nb, act + tt * nb, cbuf, y + tt * AMX_TOK * ldy + r, ldy, mask, nt);
        }
    }
    _tile_release();
    free(u);
    free(dw);
    free(act);
    free(cbuf);
}

void pi2_kernels_fill_amx(pi2_kernel_table *t) { t->batch_gemm[PI2_Q4_0] = batch_gemm_q4_0_amx; }
