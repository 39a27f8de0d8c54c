/* Run-time choice of the kernel level and the public kernel entry points (kernels.h).
 *
 * The level is picked once from the CPU's features (cpuid on x86, getauxval on arm64), so one binary
 * uses dotprod/i8mm where the core has them and never executes an instruction the core lacks. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernels_impl.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
#endif

#if defined(__x86_64__) && defined(__linux__) && defined(PI2_HAVE_AMX)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* AMX: the CPU has the tiles and their int8 dot (cpuid leaf 7: EDX bits 24, 25), the OS saves the
 * tile state (XCR0 bits 17, 18), and Linux lets this process use it: the tile data is 8 KiB of state
 * that the kernel gives only to processes that ask, once (every thread, later ones too, has it then);
 * a process that runs a tile instruction without it is killed. */
static int amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE: xgetbv is there */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#endif

#define PI2_HAVE_SIMD_FILES 1
#define N_LEVELS PI2_KERNEL_LEVELS

static pi2_kernel_table tables[N_LEVELS];
static int supported[N_LEVELS];
static pi2_kernel_level best_level = PI2_KERNELS_SCALAR;
static _Atomic(const pi2_kernel_table *) current_table;
static _Atomic int current_level;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void x4_tuning_from_env(void); /* below, beside the tuning it reads */

static void detect_and_fill(void) {
    supported[PI2_KERNELS_SCALAR] = 1;
    pi2_kernels_fill_scalar(&tables[PI2_KERNELS_SCALAR]);
#if (defined(__x86_64__) || defined(__i386__)) && PI2_HAVE_SIMD_FILES
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        /* F16C has no __builtin_cpu_supports name in gcc 12; every AVX2 CPU has it (Haswell+, Zen). */
        supported[PI2_KERNELS_AVX2] = 1;
        tables[PI2_KERNELS_AVX2] = tables[PI2_KERNELS_SCALAR];
        memset(tables[PI2_KERNELS_AVX2].batch_gemm, 0, sizeof tables[0].batch_gemm); /* the reference's: too slow */
        pi2_kernels_fill_avx2(&tables[PI2_KERNELS_AVX2]);
        best_level = PI2_KERNELS_AVX2;
    }
    /* AVX-512 with VNNI: the int8 dot products take one instruction instead of two. libgcc reports
     * AVX-512 features only where the OS saves the zmm state. */
    if (supported[PI2_KERNELS_AVX2] && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
        supported[PI2_KERNELS_AVX512] = 1;
        tables[PI2_KERNELS_AVX512] = tables[PI2_KERNELS_AVX2];
        pi2_kernels_fill_avx512(&tables[PI2_KERNELS_AVX512]);
        best_level = PI2_KERNELS_AVX512;
#if defined(__x86_64__) && defined(__linux__) && defined(PI2_HAVE_AMX)
        if (amx_usable()) {
            supported[PI2_KERNELS_AMX] = 1;
            tables[PI2_KERNELS_AMX] = tables[PI2_KERNELS_AVX512];
            pi2_kernels_fill_amx(&tables[PI2_KERNELS_AMX]);
            best_level = PI2_KERNELS_AMX;
        }
#endif
    }
#elif defined(__aarch64__) && PI2_HAVE_SIMD_FILES
    unsigned long hw = 0, hw2 = 0;
#if defined(__linux__)
    hw = getauxval(AT_HWCAP);
    hw2 = getauxval(AT_HWCAP2);
#endif
    if (hw & HWCAP_ASIMD) {
        supported[PI2_KERNELS_NEON] = 1;
        tables[PI2_KERNELS_NEON] = tables[PI2_KERNELS_SCALAR];
        memset(tables[PI2_KERNELS_NEON].batch_gemm, 0, sizeof tables[0].batch_gemm); /* the reference's: too slow */
        pi2_kernels_fill_neon(&tables[PI2_KERNELS_NEON]);
        best_level = PI2_KERNELS_NEON;
        if (hw & HWCAP_ASIMDDP) {
            supported[PI2_KERNELS_DOTPROD] = 1;
            tables[PI2_KERNELS_DOTPROD] = tables[PI2_KERNELS_NEON];
            pi2_kernels_fill_dotprod(&tables[PI2_KERNELS_DOTPROD]);
            best_level = PI2_KERNELS_DOTPROD;
            if (hw2 & HWCAP2_I8MM) {
                supported[PI2_KERNELS_I8MM] = 1;
                tables[PI2_KERNELS_I8MM] = tables[PI2_KERNELS_DOTPROD];
                pi2_kernels_fill_i8mm(&tables[PI2_KERNELS_I8MM]);
                best_level = PI2_KERNELS_I8MM;
            }
        }
    }
#endif
    const char *env = getenv("PI2_KERNELS"); /* e.g. PI2_KERNELS=scalar to rule out a SIMD bug */
    pi2_kernel_level use = best_level;
    if (env && *env) {
        for (int l = 0; l < N_LEVELS; l++)
            if (strcmp(env, pi2_kernel_level_name((pi2_kernel_level)l)) == 0 && supported[l]) use = l;
    }
    atomic_store(&current_level, (int)use);
    atomic_store(&current_table, &tables[use]);
    x4_tuning_from_env();
}

void pi2_kernels_init(void) { pthread_once(&init_once, detect_and_fill); }

/* The decode GEMV's tuning (kernels.h). Read from the environment once, with the level, so that an
 * experiment can run the engine itself with other values; the setters (pi2-probe gemv) come after. */
static _Atomic int x4_prefetch = PI2_X4_PREFETCH_DEFAULT, x4_streams = PI2_X4_STREAMS_DEFAULT;

/* each setting's rule, for the environment and the setters alike */
static int prefetch_ok(long bytes) { return bytes >= 0 && bytes <= PI2_X4_PREFETCH_MAX; }
static int streams_ok(long n) { return n == 1 || n == 2 || n == 4 || n == 8; }

/* A value out of range is said once on stderr and the default kept (the start event records what ran). */
static void x4_tuning_from_env(void) {
    const char *v = getenv("PI2_X4_PREFETCH");
    char *end;
    if (v && *v) {
        const long b = strtol(v, &end, 10);
        if (*end || !prefetch_ok(b))
            fprintf(stderr, "pi2: PI2_X4_PREFETCH=%s ignored: give 0..%d bytes\n", v, PI2_X4_PREFETCH_MAX);
        else atomic_store(&x4_prefetch, (int)b);
    }
    if ((v = getenv("PI2_X4_STREAMS")) && *v) {
        const long n = strtol(v, &end, 10);
        if (*end || !streams_ok(n)) fprintf(stderr, "pi2: PI2_X4_STREAMS=%s ignored: give 1, 2, 4 or 8\n", v);
        else atomic_store(&x4_streams, (int)n);
    }
}

int pi2_kernels_set_x4_prefetch(int bytes) {
    if (!prefetch_ok(bytes)) return -1;
    pi2_kernels_init();
    atomic_store(&x4_prefetch, bytes);
    return 0;
}

int pi2_kernels_x4_prefetch(void) { return atomic_load_explicit(&x4_prefetch, memory_order_relaxed); }

int pi2_kernels_set_x4_streams(int n) {
    if (!streams_ok(n)) return -1;
    pi2_kernels_init();
    atomic_store(&x4_streams, n);
    return 0;
}

int pi2_kernels_x4_streams(void) { return atomic_load_explicit(&x4_streams, memory_order_relaxed); }

pi2_kernel_level pi2_kernels_best(void) {
    pi2_kernels_init();
    return best_level;
}

int pi2_kernels_force(pi2_kernel_level level) {
    pi2_kernels_init();
    if ((int)level < 0 || (int)level >= N_LEVELS || !supported[level]) return -1;
    atomic_store(&current_level, (int)level);
    atomic_store(&current_table, &tables[level]);
    return 0;
}

int pi2_kernels_compiled(pi2_kernel_level level) {
    switch (level) {
    case PI2_KERNELS_SCALAR: return 1;
#if (defined(__x86_64__) || defined(__i386__)) && PI2_HAVE_SIMD_FILES
    case PI2_KERNELS_AVX2: case PI2_KERNELS_AVX512: return 1;
#if defined(__x86_64__) && defined(__linux__) && defined(PI2_HAVE_AMX)
    case PI2_KERNELS_AMX: return 1;
#endif
#elif defined(__aarch64__) && PI2_HAVE_SIMD_FILES
    case PI2_KERNELS_NEON: case PI2_KERNELS_DOTPROD: case PI2_KERNELS_I8MM: return 1;
#endif
    default: return 0;
    }
}

int pi2_kernels_runnable(pi2_kernel_level level) {
    pi2_kernels_init();
    return (int)level >= 0 && (int)level < N_LEVELS && supported[level];
}

pi2_kernel_level pi2_kernels_current(void) {
    pi2_kernels_init();
    return (pi2_kernel_level)atomic_load(&current_level);
}

const char *pi2_kernel_level_name(pi2_kernel_level level) {
    switch (level) {
    case PI2_KERNELS_SCALAR: return "scalar";
    case PI2_KERNELS_AVX2: return "avx2";
    case PI2_KERNELS_AVX512: return "avx512";
    case PI2_KERNELS_NEON: return "neon";
    case PI2_KERNELS_DOTPROD: return "dotprod";
    case PI2_KERNELS_I8MM: return "i8mm";
    case PI2_KERNELS_AMX: return "amx";
    }
    return "unknown";
}

const pi2_kernel_table *pi2_kernels_table(void) {
    const pi2_kernel_table *t = atomic_load_explicit(&current_table, memory_order_acquire);
    if (__builtin_expect(t == NULL, 0)) {
        pi2_kernels_init();
        t = atomic_load(&current_table);
    }
    return t;
}

/* ---- public entry points: validate cheaply (a bad call is a programming error: abort with a line),
 * then dispatch. */

static void die(const char *what, pi2_type t, int64_t n) {
    fprintf(stderr, "pi2: %s: invalid call (type %d %s, n=%lld)\n", what, (int)t, pi2_type_name(t),
            (long long)n);
    abort();
}

static inline void check_weight(const char *what, pi2_type wt, int64_t n) {
    if (!pi2_type_valid_weight((int)wt) || n < 0 || ((wt != PI2_F32 && wt != PI2_F16) && n % PI2_QK))
        die(what, wt, n);
}

/* The row-group forms: a valid weight, and the 1-4 rows their kernels take at once. */
static inline void check_rows(const char *what, pi2_type wt, int64_t n, int count) {
    check_weight(what, wt, n);
    if (count < 1 || count > 4) die(what, wt, n);
}

void pi2_prepare_act(pi2_type wt, const float *x, void *buf, int64_t n) {
    check_weight("prepare_act", wt, n);
    const pi2_kernel_table *t = pi2_kernels_table();
    switch (pi2_act_type(wt)) {
    case PI2_Q8_0: t->act_q8_0(x, buf, n); return;
    case PI2_Q8_1: t->act_q8_1(x, buf, n); return;
    case PI2_F16: t->act_f16(x, buf, n); return;
    default: memcpy(buf, x, (size_t)n * sizeof(float)); return;
    }
}

float pi2_vec_dot(pi2_type wt, int64_t n, const void *row, const void *act) {
    check_weight("vec_dot", wt, n);
    return pi2_kernels_table()->dot[wt](n, row, act);
}

size_t pi2_packed_act_size(pi2_type wt, int64_t n) {
    check_weight("packed_act_size", wt, n);
    const pi2_kernel_table *t = pi2_kernels_table();
    return t->packed_size[wt] ? t->packed_size[wt](n) : pi2_row_size(pi2_act_type(wt), n);
}

void pi2_pack_act(pi2_type wt, const void *act, int64_t n, void *packed) {
    check_weight("pack_act", wt, n);
    const pi2_kernel_table *t = pi2_kernels_table();
    if (t->pack[wt]) t->pack[wt](act, n, packed);
    else memcpy(packed, act, pi2_row_size(pi2_act_type(wt), n));
}

float pi2_vec_dot_packed(pi2_type wt, int64_t n, const void *row, const void *packed) {
    check_weight("vec_dot_packed", wt, n);
    const pi2_kernel_table *t = pi2_kernels_table();
    return t->dot_packed[wt] ? t->dot_packed[wt](n, row, packed) : t->dot[wt](n, row, packed);
}

void pi2_ahead_init(pi2_ahead *a, const uint8_t *const *rows, int count, size_t bytes) {
    *a = (pi2_ahead){.rows = rows, .count = bytes ? count : 0, .bytes = bytes};
}

/* what a kernel left of `ahead`, asked for now (a level whose kernel does not step it asks here) */
static void ahead_rest(pi2_ahead *a) {
    if (a) a->per_step = 1 << 30;
    pi2_ahead_step(a);
}

void pi2_vec_dot_packed_rows(pi2_type wt, int64_t n, const uint8_t *const *rows, int count, const void *packed,
                             float *y, pi2_ahead *ahead) {
    check_rows("vec_dot_packed_rows", wt, n, count);
    const pi2_kernel_table *t = pi2_kernels_table();
    if (t->dot_packed_rows[wt]) t->dot_packed_rows[wt](n, rows, count, packed, y, ahead);
    else for (int r = 0; r < count; r++) y[r] = pi2_vec_dot_packed(wt, n, rows[r], packed); /* a row at a time */
    ahead_rest(ahead);
}

void pi2_gemv(pi2_type wt, const void *w, int64_t rows, int64_t n, const void *act, float *y) {
    check_weight("gemv", wt, n);
    if (rows < 0) die("gemv", wt, n);
    pi2_kernels_table()->rows[wt](w, pi2_row_size(wt, n), NULL, rows, n, act, y);
}

void pi2_gather_gemv(pi2_type wt, const void *w, int64_t n, const int32_t *idx, int64_t count,
                     const void *act, float *y) {
    check_weight("gather_gemv", wt, n);
    if (count < 0 || (count > 0 && !idx)) die("gather_gemv", wt, n);
    pi2_kernels_table()->rows[wt](w, pi2_row_size(wt, n), idx, count, n, act, y);
}

void pi2_axpy(pi2_type wt, int64_t n, float a, const void *row, float *y) {
    check_weight("axpy", wt, n);
    pi2_kernels_table()->axpy[wt](n, a, row, y);
}

void pi2_axpy_rows(pi2_type wt, int64_t n, const float *a, const uint8_t *const *rows, int count, float *y,
                   pi2_ahead *ahead) {
    check_rows("axpy_rows", wt, n, count);
    const pi2_kernel_table *t = pi2_kernels_table();
    if (t->axpy_rows[wt]) t->axpy_rows[wt](n, a, rows, count, y, ahead);
    else for (int r = 0; r < count; r++) t->axpy[wt](n, a[r], rows[r], y); /* a row at a time */
    ahead_rest(ahead);
}

void pi2_axpy_batch(pi2_type wt, int64_t n, const uint8_t *cols, size_t stride, int64_t tokens,
                    const int32_t *const *idx, const float *const *a, const int32_t *count, float *y, int64_t ldy) {
    check_weight("axpy_batch", wt, n);
    if (tokens < 0 || (tokens > 1 && ldy < n)) die("axpy_batch", wt, n);
    for (int64_t i = 0; i < tokens; i++) /* the kernels walk the lists in column order */
        for (int32_t k = 0; k < count[i]; k++)
            if (idx[i][k] < 0 || (k && idx[i][k] <= idx[i][k - 1])) die("axpy_batch", wt, n);
    const pi2_kernel_table *t = pi2_kernels_table();
    if (t->axpy_batch[wt]) {
        t->axpy_batch[wt](n, cols, stride, tokens, idx, a, count, y, ldy);
        return;
    }
    for (int64_t i = 0; i < tokens; i++)
        for (int32_t k = 0; k < count[i]; k++) t->axpy[wt](n, a[i][k], cols + (size_t)idx[i][k] * stride, y + i * ldy);
}

int pi2_x4_supported(pi2_type wt) {
    return (unsigned)wt < PI2_N_TYPES && pi2_kernels_table()->x4_gemm[wt] != NULL;
}

void pi2_x4_pack(pi2_type wt, const void *w, int64_t rows, int64_t n, void *out) {
    check_weight("x4_pack", wt, n);
    if (wt != PI2_Q4_0 || rows % 4) die("x4_pack", wt, n);
    const int64_t nb = n / PI2_QK;
    const pi2_block_q4_0 *src = w;
    uint8_t *rec = out;
    for (int64_t g = 0; g < rows / 4; g++)
        for (int64_t b = 0; b < nb; b++, rec += 4 * sizeof(pi2_block_q4_0))
            for (int r = 0; r < 4; r++) {
                const pi2_block_q4_0 *x = src + (g * 4 + r) * nb + b;
                memcpy(rec + 16 * r, x->qs, 16);
                memcpy(rec + 64 + 2 * r, &x->d, 2);
            }
}

void pi2_x4_gemm(pi2_type wt, const void *w, int64_t rows, int64_t n, const void *acts, int64_t tokens, float *y,
                 int64_t ldy) {
    check_weight("x4_gemm", wt, n);
    if (!pi2_x4_supported(wt) || rows % 4 || tokens < 1) die("x4_gemm", wt, n);
    pi2_kernels_table()->x4_gemm[wt](w, rows, n, acts, tokens, y, ldy);
}

void pi2_att_f16(int64_t hd, int group, const pi2_f16 *q, const pi2_f16 *k, const pi2_f16 *v, int64_t stride,
                 int64_t n_pos, float scale, float *p, float *out, float *m, float *l) {
    if (hd < 1 || group < 1 || stride < hd || n_pos < 0) die("att_f16", PI2_F16, hd);
    pi2_kernels_table()->att_f16(hd, group, q, k, v, stride, n_pos, scale, p, out, m, l);
}

void pi2_att_merge(int64_t hd, int parts, const float *out, int64_t out_stride, const float *m, const float *l,
                   int64_t ml_stride, float *y) {
    float mx = -3.0e38f, sum = 0.0f;
    for (int i = 0; i < parts; i++) mx = m[i * ml_stride] > mx ? m[i * ml_stride] : mx;
    for (int64_t d = 0; d < hd; d++) y[d] = 0.0f;
    for (int i = 0; i < parts; i++) {
        const float li = l[i * ml_stride];
        if (li == 0.0f) continue; /* an empty range */
        const float w = expf(m[i * ml_stride] - mx);
        sum += li * w;
        for (int64_t d = 0; d < hd; d++) y[d] += out[i * out_stride + d] * w;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int64_t d = 0; d < hd; d++) y[d] *= inv;
}

void pi2_gemm(pi2_type wt, const void *w, int64_t rows, int64_t n, const void *acts, int64_t tokens,
              float *y, int64_t ldy) {
    check_weight("gemm", wt, n);
    if (rows < 0 || tokens < 0 || (tokens > 1 && ldy < rows)) die("gemm", wt, n);
    pi2_kernels_table()->gemm[wt](w, pi2_row_size(wt, n), rows, n, acts, pi2_row_size(pi2_act_type(wt), n),
                                  tokens, y, ldy);
}

void pi2_gemv_strided(pi2_type wt, const void *w, size_t row_stride, int64_t rows, int64_t n, const void *act,
                      float *y) {
    check_weight("gemv_strided", wt, n);
    if (rows < 0 || row_stride < pi2_row_size(wt, n)) die("gemv_strided", wt, n);
    pi2_kernels_table()->rows[wt](w, row_stride, NULL, rows, n, act, y);
}

void pi2_gemm_strided(pi2_type wt, const void *w, size_t row_stride, int64_t rows, int64_t n, const void *acts,
                      int64_t tokens, float *y, int64_t ldy) {
    check_weight("gemm_strided", wt, n);
    if (rows < 0 || tokens < 0 || (tokens > 1 && ldy < rows) || row_stride < pi2_row_size(wt, n))
        die("gemm_strided", wt, n);
    const pi2_kernel_table *t = pi2_kernels_table();
    const pi2_gemm_fn f = t->gemm_strided[wt] && tokens > 1 ? t->gemm_strided[wt] : t->gemm[wt];
    f(w, row_stride, rows, n, acts, pi2_row_size(pi2_act_type(wt), n), tokens, y, ldy);
}

size_t pi2_batch_size(pi2_type wt, int64_t n, int64_t tokens) {
    check_weight("batch_size", wt, n);
    if (tokens < PI2_BATCH_MIN_TOKENS || !pi2_kernels_table()->batch_gemm[wt]) return 0;
    return (size_t)((tokens + PI2_BATCH_TILE - 1) / PI2_BATCH_TILE * (n / PI2_QK)) * sizeof(pi2_batch_block);
}

/* The same bytes at every level but amx, whose quants go token by token (kernels.h): the kernels
 * differ only in how they go through them. */
void pi2_batch_pack(pi2_type wt, const void *acts, int64_t n, int64_t tokens, void *out) {
    check_weight("batch_pack", wt, n);
    if (wt != PI2_Q4_0 || tokens < 1) die("batch_pack", wt, n);
    const int64_t nb = n / PI2_QK, tiles = (tokens + PI2_BATCH_TILE - 1) / PI2_BATCH_TILE;
    const size_t ab = pi2_row_size(PI2_Q8_0, n);
    pi2_batch_block *rec = out;
    const int by_token = pi2_kernels_table()->batch_by_token;
    memset(out, 0, (size_t)(tiles * nb) * sizeof *rec); /* the last tile's padding: zero tokens */
    for (int64_t t = 0; t < tokens; t++) {
        const pi2_block_q8_0 *a = (const pi2_block_q8_0 *)((const uint8_t *)acts + (size_t)t * ab);
        pi2_batch_block *r = rec + (t / PI2_BATCH_TILE) * nb;
        const int i = (int)(t % PI2_BATCH_TILE);
        for (int64_t b = 0; b < nb; b++) {
            int32_t sum = 0;
            for (int k = 0; k < PI2_QK; k++) sum += a[b].qs[k];
            if (by_token) memcpy((int8_t *)r[b].qs + PI2_QK * i, a[b].qs, PI2_QK);
            else for (int c = 0; c < PI2_QK / 8; c++) memcpy(r[b].qs[i / 2][c][i % 2], a[b].qs + 8 * c, 8);
            r[b].nib_off[i] = -8 * sum;
            r[b].d[i] = pi2_f16_to_f32(a[b].d);
        }
    }
}

void pi2_batch_gemm(pi2_type wt, const void *w, size_t row_stride, int x4, int64_t rows, int64_t n, const void *batch,
                    int64_t tokens, float *y, int64_t ldy) {
    check_weight("batch_gemm", wt, n);
    const pi2_kernel_table *t = pi2_kernels_table();
    if (!t->batch_gemm[wt] || rows < 0 || tokens < 1 || (tokens > 1 && ldy < rows) ||
        (x4 ? rows % 4 : row_stride < pi2_row_size(wt, n)))
        die("batch_gemm", wt, n);
    t->batch_gemm[wt](w, x4 ? pi2_row_size(wt, n) : row_stride, x4, rows, n, batch, tokens, y, ldy);
}
