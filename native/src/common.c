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
