/* A tiny test harness for the native unit tests: CHECK records failures, pi2_test_summary() prints
 * "N passed, N failed" and returns the exit code ctest reads. */
#ifndef PI2_CHECK_H
#define PI2_CHECK_H

#include <stdio.h>

static int pi2_checks_passed, pi2_checks_failed;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (cond) {                                                                   \
            pi2_checks_passed++;                                                      \
        } else {                                                                      \
            pi2_checks_failed++;                                                      \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                             \
    } while (0)

static inline int pi2_test_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, pi2_checks_passed, pi2_checks_failed);
    return pi2_checks_failed ? 1 : 0;
}

#endif
