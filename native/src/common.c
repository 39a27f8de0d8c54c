#include "common.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local char last_error[512];

void pi2_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

const char *pi2_last_error(void) { return last_error[0] ? last_error : "unknown error"; }

int pi2_parse_size(const char *text, uint64_t *out) {
    if (!text || !*text) {
        pi2_set_error("empty size");
        return -1;
    }
    errno = 0;
    char *end = NULL;
    double value = strtod(text, &end);
    if (end == text || errno || value < 0) {
        pi2_set_error("bad size '%s' (expected e.g. 4096, 512K, 2G)", text);
        return -1;
    }
    double scale = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': scale = 1024.0; end++; break;
    case 'M': scale = 1024.0 * 1024; end++; break;
    case 'G': scale = 1024.0 * 1024 * 1024; end++; break;
    case 'T': scale = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (toupper((unsigned char)*end) == 'I') end++;
    if (toupper((unsigned char)*end) == 'B') end++;
    if (*end != '\0' || value * scale > 1.8e19) {
        pi2_set_error("bad size '%s' (expected e.g. 4096, 512K, 2G)", text);
        return -1;
    }
    *out = (uint64_t)(value * scale);
    return 0;
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

static uint64_t status_kib(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
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

uint64_t pi2_peak_rss_bytes(void) { return status_kib("VmHWM:"); }
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

uint64_t pi2_available_memory_bytes(void) {
    uint64_t avail = file_number("/proc/meminfo", "MemAvailable:");
    if (avail == UINT64_MAX) return 0;
    avail *= 1024;
    const uint64_t cg = cgroup_headroom();
    return cg < avail ? cg : avail;
}
