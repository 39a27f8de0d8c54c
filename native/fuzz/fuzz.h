/* pi2-fuzz: a deterministic, structure-aware mutation fuzzer for the engine's readers of untrusted
 * input (docs/FUZZ.md). clang's libFuzzer is not on the build machines, so the driver is our own:
 * iteration i of a run with seed S always builds the same input (a corpus file and 1-4 mutations that
 * know the format), runs it in a child process the driver restarts after a crash or a hang, and keeps
 * every crashing input. Built with PI2_SANITIZE=ON, a crash includes any ASan/UBSan report. */
#ifndef PI2_FUZZ_H
#define PI2_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* splitmix64: small, fast, and one 64-bit state is enough to replay an iteration. */
typedef struct {
    uint64_t s;
} fuzz_rng;

static inline uint64_t fuzz_next(fuzz_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline uint64_t fuzz_below(fuzz_rng *r, uint64_t n) { return n ? fuzz_next(r) % n : 0; }

/* A value that tends to break size arithmetic: boundaries of 8..64-bit integers, small counts, page
 * sizes, and `near` (the field's current value) plus or minus one, doubled or halved. */
uint64_t fuzz_interesting(fuzz_rng *r, uint64_t near);

/* Generic mutations every target may use on a buffer of len bytes (capacity cap). */
void fuzz_flip_bytes(fuzz_rng *r, uint8_t *buf, size_t len);
size_t fuzz_insert_bytes(fuzz_rng *r, uint8_t *buf, size_t len, size_t cap);
size_t fuzz_erase_bytes(fuzz_rng *r, uint8_t *buf, size_t len);
/* 1..max copies of one byte (a or b, picked at random) at a random place: a long value, or deep nesting. */
size_t fuzz_insert_run(fuzz_rng *r, uint8_t *buf, size_t len, size_t cap, size_t max, uint8_t a, uint8_t b);

typedef struct {
    const char *name, *about;
    /* Runs one input; returns 1 when the engine accepted it, 0 when it refused it with an error
     * (which the target checks is exactly one line). A bug crashes or aborts. */
    int (*run)(const uint8_t *data, size_t len);
    /* One format-aware mutation in place; returns the new length (<= cap). */
    size_t (*mutate)(fuzz_rng *r, uint8_t *buf, size_t len, size_t cap);
    /* Called after all mutations of an input (e.g. to repair checksums most of the time); may be NULL. */
    size_t (*finish)(fuzz_rng *r, uint8_t *buf, size_t len, size_t cap);
} fuzz_target;

extern const fuzz_target fuzz_target_pi2file, fuzz_target_plan, fuzz_target_chat, fuzz_target_http;

/* The error of a refused input must be one non-empty line; aborts (a finding) otherwise. */
void fuzz_check_error_line(const char *target);

#endif
