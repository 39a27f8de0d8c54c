/* Quantized weight types and the compute kernels the engine is built on.
 *
 * Block layouts are bit-compatible with GGUF/ggml so weights convert without loss; type ids are
 * ggml's. As in ggml, a weight row of type T is multiplied with an activation vector that was first
 * converted to T's "activation type" (pi2_act_type): Q4_0 and Q8_0 rows pair with Q8_0
 * activations, Q4_1 with Q8_1, F16 with F16, F32 with F32. Keeping ggml's pairing keeps our logits
 * within rounding of llama.cpp's on the same weights.
 *
 * Kernels are single-threaded; callers split rows across the thread pool. Every kernel has a scalar
 * reference; SIMD paths (AVX2/FMA, AVX-512, AMX, NEON, NEON dotprod, i8mm) are chosen once at run time from
 * the CPU's features, and tests compare each with the scalar path. */
#ifndef PI2_KERNELS_H
#define PI2_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    PI2_F32 = 0,
    PI2_F16 = 1,
    PI2_Q4_0 = 2,
    PI2_Q4_1 = 3,
    PI2_Q8_0 = 8,
    PI2_Q8_1 = 9, /* activations only */
} pi2_type;

#define PI2_QK 32 /* elements per quantized block (all block types here) */

typedef uint16_t pi2_f16;

typedef struct { pi2_f16 d; uint8_t qs[PI2_QK / 2]; } pi2_block_q4_0;          /* 18 bytes */
typedef struct { pi2_f16 d, m; uint8_t qs[PI2_QK / 2]; } pi2_block_q4_1;       /* 20 bytes */
typedef struct { pi2_f16 d; int8_t qs[PI2_QK]; } pi2_block_q8_0;               /* 34 bytes */
typedef struct { pi2_f16 d, s; int8_t qs[PI2_QK]; } pi2_block_q8_1;            /* 36 bytes; s = d*sum(qs) */

/* A weight matrix: `rows` rows of `cols` elements of `type`, row r at data + r * stride. Dense
 * tensors have stride = row_bytes; gate/up rows inside bundles have stride = bundle_stride. Here, not
 * in model.h, because the matrix products over the pool (parmat.h) take it. */
typedef struct {
    const uint8_t *data;
    pi2_type type;
    int64_t rows, cols;
    size_t row_bytes, stride;
    int x4;                /* rows interleaved by four (pi2_x4_pack) in a malloc'ed copy: pi2_model_repack */
} pi2_mat;

const char *pi2_type_name(pi2_type t);
int pi2_type_valid_weight(int t);          /* 1 for F32, F16, Q4_0, Q4_1, Q8_0 */
size_t pi2_row_size(pi2_type t, int64_t n);  /* bytes of one row of n elements (n % 32 == 0 for quants) */
pi2_type pi2_act_type(pi2_type weight_type);

float pi2_f16_to_f32(pi2_f16 h);
pi2_f16 pi2_f32_to_f16(float f);

/* Row conversion (n elements). quantize_row follows ggml's reference rounding. */
void pi2_quantize_row(pi2_type t, const float *x, void *out, int64_t n);
void pi2_dequantize_row(pi2_type t, const void *row, float *out, int64_t n);

/* Convert activation x (n floats) into act_type(wt) for use with rows of type wt. buf holds
 * pi2_row_size(pi2_act_type(wt), n) bytes. */
void pi2_prepare_act(pi2_type wt, const float *x, void *buf, int64_t n);

/* dot(row, act) over n elements; act prepared by pi2_prepare_act(wt, ...). */
float pi2_vec_dot(pi2_type wt, int64_t n, const void *row, const void *act);

/* Many dots against one activation (the sparse FFN's single neurons): pack it once, where a level
 * has a faster layout for that (avx512), else the packed form is a copy. pi2_vec_dot_packed gives
 * pi2_vec_dot's float bit for bit. `packed` holds pi2_packed_act_size bytes, 64-byte aligned; pack
 * and dot at the same kernel level. */
/* Rows the caller reads next (the sparse FFN's next neurons, at random places in memory). A row kernel
 * given them asks for their lines a few per step while it computes, to L2, so the next call starts
 * from cache instead of waiting for DRAM at every row start; what a kernel has not asked for by its
 * end is asked for then. One core keeps only ~20 misses of its own loads in flight: issued all at
 * once, the requests stall the kernel instead of overlapping it. pi2_ahead_init before the first
 * call; the kernels keep their place in it. */
typedef struct {
    const uint8_t *const *rows; /* rows[0..count), `bytes` each */
    int count, r;               /* r, at: the next line to ask for */
    size_t bytes, at;
    int per_step;               /* lines a kernel step asks for (set by the kernel) */
} pi2_ahead;
void pi2_ahead_init(pi2_ahead *a, const uint8_t *const *rows, int count, size_t bytes);

size_t pi2_packed_act_size(pi2_type wt, int64_t n);
void pi2_pack_act(pi2_type wt, const void *act, int64_t n, void *packed);
float pi2_vec_dot_packed(pi2_type wt, int64_t n, const void *row, const void *packed);
/* y[r] = pi2_vec_dot_packed(wt, n, rows[r], packed) for r < count (1..4): rows anywhere in memory (the
 * sparse FFN's neurons sit in random cache slots) go through the activation together, so it is read
 * once per pass and the rows' memory streams overlap. The same floats as one dot at a time. ahead:
 * the rows read next (NULL: none). */
void pi2_vec_dot_packed_rows(pi2_type wt, int64_t n, const uint8_t *const *rows, int count, const void *packed,
                             float *y, pi2_ahead *ahead);

/* y[r] = dot(W[r], act) for r in [0, rows); W is rows x n, row-major, rows of pi2_row_size(wt, n). */
void pi2_gemv(pi2_type wt, const void *w, int64_t rows, int64_t n, const void *act, float *y);

/* y[i] = dot(W[idx[i]], act) for i in [0, count): the sparse FFN's gather over active neurons. */
void pi2_gather_gemv(pi2_type wt, const void *w, int64_t n, const int32_t *idx, int64_t count,
                     const void *act, float *y);

/* y[0..n) += a * dequant(row): down-projection columns stored as rows, scaled by a neuron's output. */
void pi2_axpy(pi2_type wt, int64_t n, float a, const void *row, float *y);

/* y[0..n) += a[r] * dequant(rows[r]) for r = 0, 1, .. count-1 (1..4) in that order: the sparse FFN's
 * down columns of a group of neurons, y read and written once per group rather than once per row.
 * The same floats as count pi2_axpy calls in a row. ahead: the rows read next (NULL: none). */
void pi2_axpy_rows(pi2_type wt, int64_t n, const float *a, const uint8_t *const *rows, int count, float *y,
                   pi2_ahead *ahead);

/* The down pass of a batch (prefill), whose down weights are columns stored as rows (the bundles'):
 * for every token t < tokens and k < count[t] in that order, y[t * ldy + j] += a[t][k] * dequant(column
 * idx[t][k])[j] for j < n, column c at cols + c * stride; each idx[t] strictly ascending. The floats of
 * one pi2_axpy per (t, k) in that order, but a level may unpack a column once for every token that
 * uses it, where one axpy per token redoes the unpack (most of an axpy's work) for each. */
void pi2_axpy_batch(pi2_type wt, int64_t n, const uint8_t *cols, size_t stride, int64_t tokens,
                    const int32_t *const *idx, const float *const *a, const int32_t *count, float *y, int64_t ldy);

/* Rows interleaved by four ("x4"): a matrix whose rows are a multiple of 4, stored group by group of
 * 4 rows and block by block, each record holding the 4 rows' quants and then their scales (Q4_0: 4 x
 * 16 bytes, 4 F16 scales). A level that has a kernel for it multiplies such a matrix with far fewer
 * shuffles per byte than row by row (decode's dense GEMVs are compute-bound otherwise on cores that
 * split 512-bit work in two). pi2_x4_supported: whether this level has one for wt (Q4_0 at avx512);
 * pi2_x4_pack: the layout (same size as the rows); pi2_x4_gemm: y[t * ldy + r] = dot(row r, acts[t])
 * for rows r of the packed matrix w (from a group boundary), tokens >= 1, acts as for pi2_gemm. */
int pi2_x4_supported(pi2_type wt);
void pi2_x4_pack(pi2_type wt, const void *w, int64_t rows, int64_t n, void *out);
void pi2_x4_gemm(pi2_type wt, const void *w, int64_t rows, int64_t n, const void *acts, int64_t tokens, float *y,
                 int64_t ldy);

/* Prefill's activations packed once per matrix product: a "batch". Q4_0 only. The GEMM kernels that
 * take weight rows as lanes (kernels_lanes_avx512.c, kernels_arm_common.h) read every token's
 * quants once per group of rows and block; from the prepared rows (pi2_prepare_act) each call would
 * redo the per-token work (block sums, scales), a fixed cost that dominated the small row ranges
 * each thread takes at high thread counts (16 rows x 128 tokens ran at half speed), and it would
 * keep eight token pointers live in the micro-kernel. So the tokens are interleaved by
 * PI2_BATCH_TILE, as llama.cpp interleaves its activations by four (block_q8_0x4): one record per
 * tile and block, the tile's tokens side by side, padded with zero tokens. Within a record the quants
 * go by token pairs in 8-byte chunks (qs[pair][chunk][token of the pair][8]: element 8c + k of token
 * 2p + i at qs[p][c][i][k]), the operand of an i8mm SMMLA as it stands, while AVX-512 and SDOT read
 * a token's 4-byte groups at fixed offsets all the same. One rule differs by level: at amx the
 * quants of a record go token by token instead (element k of token i at byte 32 i + k of qs), the
 * rows of an AMX A tile as they stand, so no call regroups them (a per-call regroup cost more than
 * the kernel at 16 rows a call); sizes, records and the rest are the same. So pack and multiply at the
 * same level. A level without a batch kernel reports size 0 and callers keep pi2_gemm.
 *
 * pi2_batch_size: bytes of the batch of `tokens` activations of n elements for weights wt, 0 where
 * this level has no batch kernel for wt or `tokens` is below PI2_BATCH_MIN_TOKENS; pi2_batch_pack:
 * the batch from `tokens` activations prepared with pi2_prepare_act (pi2_row_size(act_type(wt), n)
 * bytes apart); out 64-byte aligned. pi2_batch_gemm: y[t * ldy + r] = dot(row r, act t) for the
 * rows of w (row_stride bytes apart, or, when x4, rows interleaved by four from pi2_x4_pack, from a
 * group boundary): the floats of pi2_gemm / pi2_gemm_strided / pi2_x4_gemm at the same level. */
#define PI2_BATCH_TILE 8
#define PI2_BATCH_MIN_TOKENS 12
typedef struct {
    int8_t qs[PI2_BATCH_TILE / 2][PI2_QK / 8][2][8]; /* [token pair][8-byte chunk][token of the pair];
                                                        * amx: [token][32] */
    int32_t nib_off[PI2_BATCH_TILE]; /* -8 * sum(qs[t]): the offset of Q4_0 nibbles taken as unsigned */
    float d[PI2_BATCH_TILE];
} pi2_batch_block; /* 320 bytes */
size_t pi2_batch_size(pi2_type wt, int64_t n, int64_t tokens);
void pi2_batch_pack(pi2_type wt, const void *acts, int64_t n, int64_t tokens, void *out);
void pi2_batch_gemm(pi2_type wt, const void *w, size_t row_stride, int x4, int64_t rows, int64_t n, const void *batch,
                    int64_t tokens, float *y, int64_t ldy);

/* Attention of the `group` query heads that share one KV head, over n_pos positions of an F16 KV
 * cache, in parts that merge exactly. q: group x hd F16 (the queries rounded to F16, as llama.cpp
 * does); k, v: the KV head's first position of the range, positions `stride` elements apart; p: group
 * x n_pos floats of scratch. For each head g: m[g] = max_s score, l[g] = sum_s exp(score - m[g]),
 * out[g * hd + d] = sum_s exp(score - m[g]) v[s][d] (not yet divided by l), where score = scale q.k.
 * kernels_att.h says why this is not llama.cpp's F16 accumulator. */
void pi2_att_f16(int64_t hd, int group, const pi2_f16 *q, const pi2_f16 *k, const pi2_f16 *v, int64_t stride,
                 int64_t n_pos, float scale, float *p, float *out, float *m, float *l);
/* One head's attention from `parts` parts of pi2_att_f16 over disjoint position ranges (part i: its
 * out at out + i * out_stride, its m and l at i * ml_stride; an empty part has l = 0):
 * y[0..hd) = softmax(scores) V over their union. */
void pi2_att_merge(int64_t hd, int parts, const float *out, int64_t out_stride, const float *m, const float *l,
                   int64_t ml_stride, float *y);

/* Prefill: Y[t][r] = dot(W[r], A[t]) for t in [0, tokens), r in [0, rows). A holds `tokens`
 * activations prepared with pi2_prepare_act, each pi2_row_size(act_type(wt), n) bytes; Y is
 * tokens x ldy floats. Blocked so each weight row is read once per tile of tokens. */
void pi2_gemm(pi2_type wt, const void *w, int64_t rows, int64_t n, const void *acts, int64_t tokens,
              float *y, int64_t ldy);

/* Strided variants (an extension of the contract above): row r of W starts at w + r * row_stride
 * bytes, row_stride >= pi2_row_size(wt, n). For rows that sit inside larger records, e.g. the sparse
 * FFN's neuron bundles, so a whole range of rows goes through one call: pi2_gemm prepares per-tile
 * activation scales on every call, so calling it once per row would redo that work for each row. */
void pi2_gemv_strided(pi2_type wt, const void *w, size_t row_stride, int64_t rows, int64_t n, const void *act,
                      float *y);
void pi2_gemm_strided(pi2_type wt, const void *w, size_t row_stride, int64_t rows, int64_t n, const void *acts,
                      int64_t tokens, float *y, int64_t ldy);

/* Kernel selection. pi2_kernels_init() picks the best path the CPU supports (idempotent; called
 * lazily by the kernels). Tests force a level to compare it with PI2_KERNELS_SCALAR. */
typedef enum {
    PI2_KERNELS_SCALAR = 0,
    PI2_KERNELS_AVX2,
    PI2_KERNELS_AVX512,
    PI2_KERNELS_NEON,
    PI2_KERNELS_DOTPROD,
    PI2_KERNELS_I8MM,
    PI2_KERNELS_AMX, /* x86-64: avx512 plus prefill's Q4_0 batch GEMM on AMX tiles (last: the ids above stay) */
} pi2_kernel_level;

#define PI2_KERNEL_LEVELS (PI2_KERNELS_AMX + 1)

void pi2_kernels_init(void);
int pi2_kernels_compiled(pi2_kernel_level level); /* this build has the level's kernels */
int pi2_kernels_runnable(pi2_kernel_level level); /* ... and this CPU runs them */
pi2_kernel_level pi2_kernels_best(void);                /* best level this CPU supports */
int pi2_kernels_force(pi2_kernel_level level);          /* -1 if the CPU lacks it */
pi2_kernel_level pi2_kernels_current(void);
const char *pi2_kernel_level_name(pi2_kernel_level level);

/* The decode GEMV over rows interleaved by four (x4_gemm at one token: attention and the output head)
 * reads from DRAM at a rate set by how many of one core's misses are in flight, which differs from
 * machine to machine; two settings shape that, and pi2-probe gemv measures them on the machine at hand:
 * - prefetch: how far ahead (bytes) it asks for its stream (also at a few tokens); 0: not at all.
 * - streams (1, 2, 4 or 8): a call's rows read as that many runs of groups side by side, a block of
 *   each in turn, instead of one run after another (same floats). Runs under 32 KiB apart are merged:
 *   on the Zen 4 VM, streams 4-9 KiB apart read DRAM at 60-80% of one stream's rate.
 * The engine takes PI2_X4_PREFETCH and PI2_X4_STREAMS from the environment, else the defaults. */
#define PI2_X4_PREFETCH_DEFAULT 512
#define PI2_X4_PREFETCH_MAX 65536
#define PI2_X4_STREAMS_DEFAULT 1
int pi2_kernels_set_x4_prefetch(int bytes); /* -1 outside 0..PI2_X4_PREFETCH_MAX */
int pi2_kernels_x4_prefetch(void);
int pi2_kernels_set_x4_streams(int n); /* -1 unless 1, 2, 4 or 8 */
int pi2_kernels_x4_streams(void);

#endif
