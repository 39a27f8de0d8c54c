/* Small shared helpers: errors, sizes, clocks. Everything else in the engine builds on these. */
#ifndef PI2_COMMON_H
#define PI2_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define PI2_VERSION "0.1.0"

/* Error handling: functions that can fail on bad input return 0 on success and -1 on failure after
 * recording one human-readable line with pi2_set_error(). The program prints pi2_last_error() once. */
void pi2_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *pi2_last_error(void);

/* The one size parser (--memory-budget, plan files): "4096", "512K", "2G", "1.5GiB" (powers of
 * 1024; unit K/M/G/T in any case, optional "B"/"iB"; a fraction only with a unit, up to 6 digits).
 * Nothing else: no spaces, signs, exponents or hex. Between 1 byte and PI2_SIZE_MAX. 0, or -1 with
 * an error naming the flag. */
#define PI2_SIZE_MAX (1ull << 50)
int pi2_parse_size(const char *flag, const char *text, uint64_t *out);

/* Command-line values: an integer in [lo, hi] / a finite float, else -1 with an error naming the flag.
 * A NULL value (the flag was last on the line) is an error too. */
int pi2_parse_int_arg(const char *flag, const char *value, long lo, long hi, int *out);
int pi2_parse_float_arg(const char *flag, const char *value, float *out);
/* A comma-separated list of integers in [0, hi] ("0,1,4": token ids, CPU numbers) into out[0..max):
 * the count, or -1 with an error naming the flag. */
int pi2_parse_int_list(const char *flag, const char *text, long hi, int32_t *out, int max);

/* Monotonic clock in nanoseconds. */
uint64_t pi2_now_ns(void);
/* CPU time of the whole process (every thread), which time stolen by a hypervisor does not count */
uint64_t pi2_cpu_ns(void);

/* Peak resident set size of this process in bytes (VmHWM), 0 if unknown. */
uint64_t pi2_peak_rss_bytes(void);
/* Anonymous memory of this process on transparent huge pages now (smaps_rollup), 0 if none or unknown:
 * whether the kernel gave pi2_huge_alloc's weights 2 MiB pages. */
uint64_t pi2_anon_huge_bytes(void);
/* CPUs this process may run on (its affinity mask), at least 1 */
int pi2_usable_cpus(void);
/* Resident set size now (VmRSS), 0 if unknown. */
uint64_t pi2_rss_bytes(void);
/* Memory this process can still take without pushing others out: MemAvailable (/proc/meminfo), capped
 * by what its memory cgroup's limit leaves (v2 memory.max - memory.current, v1 limit_in_bytes -
 * usage_in_bytes). 0 when unknown (not Linux). */
uint64_t pi2_available_memory_bytes(void);
/* The same, and which of the two set it: "MemAvailable", "cgroup" or "unknown". */
uint64_t pi2_available_memory(const char **source);

/* Room for element n of a growing array: *(T **)arr holds *cap elements of elem bytes; when n reaches
 * *cap it doubles (from `first`). 0, or -1 when out of memory with the array left as it was.
 * Usage: if (pi2_grow(&l->v, &l->cap, l->n, sizeof *l->v, 16)) return -1; l->v[l->n++] = x; */
int pi2_grow(void *arr, size_t *cap, size_t n, size_t elem, size_t first);

/* Weights read on every token (the repacked attention and output matrices, the predictors, the neuron
 * cache) on 2 MiB pages where the kernel has transparent huge pages in madvise mode (Linux's and most
 * distributions' default; "always" gives them anyway, "never" and phones without THP give 4 KiB pages
 * as before). With 4 KiB pages a token's reads took a TLB miss every 4 KiB of a matrix and one or more
 * per neuron of the sparse FFN, whose rows sit at scattered places; on 2 MiB pages decode ran ~12%
 * faster on the 8-layer 7B shape at 1 and 2 threads here (AMD EPYC VM, alternated runs).
 * pi2_huge_alloc: `bytes` from a 2 MiB boundary, freed with free(), NULL when out of memory;
 * pi2_huge_advise: ask for huge pages over the 2 MiB-aligned part of an existing mapping. */
void *pi2_huge_alloc(size_t bytes);
void pi2_huge_advise(void *p, size_t bytes);

/* A spin-wait's pause: tells the core (and a hyperthread sibling) this thread is only polling. */
static inline void pi2_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
