#include "common.h"

#include <ctype.h>
#include <sched.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char last_error[512];

void pi2_set_error(const char *fmt, ...) {
    /* Format into a copy first: callers add context to the error before, as in
     * pi2_set_error("%s: tokenizer section: %s", path, pi2_last_error()), and vsnprintf into the
     * buffer an argument points into is undefined (glibc printed the prefix twice, the reason lost). */
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* One line, whatever the message quotes from its input (a key with an escaped newline, a
     * tensor name with a tab): control characters become '?'. */
    for (char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    memcpy(last_error, msg, sizeof msg);
}

const char *pi2_last_error(void) { return last_error[0] ? last_error : "unknown error"; }

/* Strict on purpose (strtod took "1e3", "0x1p30", " 2G", "inf"): digits, at most one fractional
 * part of up to 6 digits with a unit, a unit K/M/G/T (any case) alone or with "iB" (powers of 1024) or
 * with "B" (powers of 1000: "19GB" is 19e9 bytes, as a spec sheet says it, not 19 GiB), nothing else;
 * whole bytes computed in integers, at least 1 and at most PI2_SIZE_MAX. pi2cli/units.py reads the same. */
int pi2_parse_size(const char *flag, const char *text, uint64_t *out) {
    const char *p = text ? text : "";
    uint64_t whole = 0, frac = 0, frac_div = 1, unit = 1;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        whole = whole * 10 + (uint64_t)(*p - '0');
        if (whole > PI2_SIZE_MAX) goto too_large;
    }
    if (!digits) goto bad;
    int frac_digits = 0;
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, frac_digits++) {
            if (frac_digits == 6) goto bad;
            frac = frac * 10 + (uint64_t)(*p - '0');
            frac_div *= 10;
        }
        if (!frac_digits) goto bad;
    }
    switch (*p) {
    case 'k': case 'K': unit = 1ull << 10; p++; break;
    case 'm': case 'M': unit = 1ull << 20; p++; break;
    case 'g': case 'G': unit = 1ull << 30; p++; break;
    case 't': case 'T': unit = 1ull << 40; p++; break;
    default: if (frac_digits) goto bad; /* "1.5" bytes */
    }
    if (unit > 1 && (*p == 'i' || *p == 'I') && (p[1] == 'B' || p[1] == 'b')) p += 2;
    else if (*p == 'B' || *p == 'b') {
        p++;
        for (uint64_t u = unit, d = 1000; u > 1; u >>= 10, d *= 1000) unit = d; /* K -> 10^3 ... T -> 10^12 */
    }
    if (*p) goto bad;
    /* whole <= 2^50 and unit <= 2^40: compare before multiplying; frac * unit < 10^6 * 2^40 < 2^60 */
    if (whole > PI2_SIZE_MAX / unit) goto too_large;
    const uint64_t bytes = whole * unit + frac * unit / frac_div;
    if (bytes > PI2_SIZE_MAX) goto too_large;
    if (bytes < 1) goto bad;
    *out = bytes;
    return 0;
too_large:
    pi2_set_error("%s: size '%s' is larger than the most this engine takes (1P = 2^50 bytes)", flag, text);
    return -1;
bad:
    pi2_set_error("%s: expected a size such as 2G, 1536M, 1.5GiB or 4294967296, got '%s'", flag, text ? text : "");
    return -1;
}

int pi2_parse_int_arg(const char *flag, const char *value, long lo, long hi, int *out) {
    char *end = NULL;
    errno = 0;
    long x = value ? strtol(value, &end, 10) : 0;
    if (!value || !*value || errno || *end || x < lo || x > hi) {
        pi2_set_error("%s needs an integer in [%ld, %ld], got '%s'", flag, lo, hi, value ? value : "");
        return -1;
    }
    *out = (int)x;
    return 0;
}

int pi2_parse_int_list(const char *flag, const char *text, long hi, int32_t *out, int max) {
    int n = 0;
    for (const char *s = text; *s;) {
        char *end = NULL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > hi || (*end && *end != ',') || n >= max) {
            pi2_set_error("%s: bad list '%s' (expected e.g. 0,1,2; at most %d values up to %ld)", flag, text, max, hi);
            return -1;
        }
        out[n++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    if (!n) {
        pi2_set_error("%s: empty list", flag);
        return -1;
    }
    return n;
}

int pi2_parse_float_arg(const char *flag, const char *value, float *out) {
    char *end = NULL;
    errno = 0;
    float x = value ? strtof(value, &end) : 0;
    if (!value || !*value || errno || *end || !(x == x)) {
        pi2_set_error("%s needs a number, got '%s'", flag, value ? value : "");
        return -1;
    }
    *out = x;
    return 0;
}

static uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t pi2_now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

uint64_t pi2_cpu_ns(void) { return clock_ns(CLOCK_PROCESS_CPUTIME_ID); }

/* The kiB figure after `key` in a /proc file, in bytes; 0 if unknown. */
static uint64_t proc_kib(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    const size_t n = strlen(key);
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, n) == 0) {
            kb = strtoull(line + n, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb * 1024;
}

static uint64_t status_kib(const char *key) { return proc_kib("/proc/self/status", key); }

uint64_t pi2_peak_rss_bytes(void) { return status_kib("VmHWM:"); }
uint64_t pi2_anon_huge_bytes(void) { return proc_kib("/proc/self/smaps_rollup", "AnonHugePages:"); }

int pi2_usable_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
uint64_t pi2_rss_bytes(void) { return status_kib("VmRSS:"); }

/* First number after `key` in a text file (`key` "" reads the first line), or UINT64_MAX. */
static uint64_t file_number(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return UINT64_MAX;
    char line[256];
    const size_t n = strlen(key);
    uint64_t v = UINT64_MAX;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, n) == 0) {
            char *end;
            unsigned long long x = strtoull(line + n, &end, 10);
            if (end != line + n) v = x; /* "max" (no limit) stays UINT64_MAX */
            break;
        }
    }
    fclose(f);
    return v;
}

/* What this process's memory cgroup still allows, or UINT64_MAX without a limit. */
static uint64_t cgroup_headroom(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return UINT64_MAX;
    char line[512], v1[400] = "", v2[400] = "";
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = 0; /* hierarchy:controllers:path */
        const char *controllers = c1 + 1, *path = c2 + 1;
        if (!strcmp(line, "0") && !*controllers) snprintf(v2, sizeof v2, "%s", path);
        else if (strstr(controllers, "memory")) snprintf(v1, sizeof v1, "%s", path);
    }
    fclose(f);
    char a[512], b[512];
    uint64_t limit = UINT64_MAX, usage = 0;
    if (v1[0]) {
        snprintf(a, sizeof a, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", v1);
        snprintf(b, sizeof b, "/sys/fs/cgroup/memory%s/memory.usage_in_bytes", v1);
    } else if (v2[0]) {
        snprintf(a, sizeof a, "/sys/fs/cgroup%s/memory.max", v2);
        snprintf(b, sizeof b, "/sys/fs/cgroup%s/memory.current", v2);
    } else {
        return UINT64_MAX;
    }
    limit = file_number(a, "");
    if (limit == UINT64_MAX || limit >= (1ull << 60)) return UINT64_MAX; /* v1 says "no limit" as ~2^63 */
    usage = file_number(b, "");
    if (usage == UINT64_MAX) usage = 0;
    return limit > usage ? limit - usage : 0;
}

uint64_t pi2_available_memory(const char **source) {
    uint64_t avail = file_number("/proc/meminfo", "MemAvailable:");
    if (source) *source = "unknown";
    if (avail == UINT64_MAX) return 0;
    avail *= 1024;
    const uint64_t cg = cgroup_headroom();
    if (source) *source = cg < avail ? "cgroup" : "MemAvailable";
    return cg < avail ? cg : avail;
}

uint64_t pi2_available_memory_bytes(void) { return pi2_available_memory(NULL); }

#define HUGE_PAGE ((size_t)2 << 20)

void pi2_huge_advise(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    const uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE, e = ((uintptr_t)p + bytes) / HUGE_PAGE * HUGE_PAGE;
    if (e > a) madvise((void *)a, e - a, MADV_HUGEPAGE); /* advice only: EINVAL without THP is fine */
#else
    (void)p, (void)bytes;
#endif
}

void *pi2_huge_alloc(size_t bytes) {
    if (bytes < HUGE_PAGE) return malloc(bytes ? bytes : 1);
    void *p = NULL; /* `bytes` from a 2 MiB boundary: the last partial huge page stays on 4 KiB pages */
    if (posix_memalign(&p, HUGE_PAGE, bytes) != 0) return NULL;
    pi2_huge_advise(p, bytes); /* before the first touch: the faults then take whole huge pages */
    return p;
}

int pi2_grow(void *arr, size_t *cap, size_t n, size_t elem, size_t first) {
    if (n < *cap) return 0;
    const size_t c = *cap ? *cap * 2 : first;
    void *v;
    memcpy(&v, arr, sizeof v); /* arr points at a T *, not a void *: copy the pointer rather than cast */
    v = realloc(v, c * elem);
    if (!v) return -1;
    memcpy(arr, &v, sizeof v);
    *cap = c;
    return 0;
}
