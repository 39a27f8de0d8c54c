/* Fuzz targets "plan" (an execution plan file through plan.c and every flag parser its settings
 * reach) and "chat" (one `pi2-engine chat` request line through chat_request.c), both on the strict
 * flat-object reader json_flat.c. The mutator knows JSON's tokens: it swaps values for numbers, sizes
 * and strings that broke parsers before (1e40, 0x1p30, lone surrogates, NUL escapes), renames and
 * repeats keys, nests, truncates and injects invalid UTF-8. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "chat_request.h"
#include "common.h"
#include "fuzz.h"
#include "plan.h"
#include "session_options.h"

/* ---- run ---- */

static int refused(const char *target) {
    fuzz_check_error_line(target);
    return 0;
}

static int run_chat(const uint8_t *data, size_t len) {
    pi2_chat_request req;
    if (pi2_chat_request_parse((const char *)data, len, &req) != 0) return refused("chat");
    if (!req.prompt || strlen(req.prompt) > req.prompt_len) abort(); /* the decoded prompt, NUL-terminated */
    pi2_chat_request_free(&req);
    return 1;
}

/* The plan's flags go through the parsers the engine's command line uses. */
static int run_plan(const uint8_t *data, size_t len) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        if ((fd = memfd_create("pi2-fuzz-plan", MFD_CLOEXEC)) < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) || ftruncate(fd, (off_t)len) || pwrite(fd, data, len, 0) != (ssize_t)len) abort();
    char *argv[] = {"pi2-engine", "generate", "-m", "m.pi2", "--plan", path, "-n", "1", NULL};
    int n = 0;
    char **args = NULL;
    if (pi2_plan_expand_args(8, argv, &n, &args) != 0) return refused("plan");
    pi2_options o; /* the engine's own option parser, as `generate` runs it */
    const int ok = pi2_options_parse(PI2_CMD_GENERATE, n, args, &o) == 0;
    if (!ok && !strncmp(pi2_last_error(), "unknown ", 8)) abort(); /* a plan produced a flag nobody parses */
    pi2_plan_free_args(n, args);
    return ok ? 1 : refused("plan");
}

/* ---- mutate ---- */

static const char *values[] = {
    "0", "-0", "1", "-1", "1.5", "1e3", "1e40", "-1e40", "1e-400", "1.7976931348623157e309", "99999999999999999999999",
    "0x10", "NaN", "Infinity", "2779774976", "01", "1.", ".5", "1e", "--1", "true", "false", "null", "[1]", "{}",
    "\"\"", "\"1e3\"", "\"0x1p30\"", "\" 2G\"", "\"2G \"", "\"99999999999999T\"", "\"1025T\"", "\"1P\"", "\"64M\"",
    "\"1.5GiB\"", "\"0\"", "\"powerinfer2\"", "\"uring\"", "\"0,1,2\"", "\"0,,1\"", "\"-1\"", "\"\\u0000\"",
    "\"\\ud800\"", "\"\\udc00\\ud800\"", "\"\\uDBFF\\uDFFF\"", "\"\\ud83d\\ude00\"", "\"\\x41\"", "\"\\u12\"",
    "\"a\nb\"", "\"\\\"", "\"\\n\\r\\t\\b\\f\\/\\\\\"", "\"\xff\xfe\"", "\"\xc0\x80\"", "\"\xed\xa0\x80\"",
};
static const char *keys[] = {"format", "version", "policy", "memory_budget", "threads", "affinity", "hot_fraction",
                             "hot_share", "cluster", "two_phase", "lookahead", "io", "io_threads", "io_affinity",
                             "pred_threshold", "model", "why", "predicted_x", "measured_y", "prompt", "n_predict",
                             "ignore_eos", "reset", "unknown", "", "pro\\u006dpt", "format\\u0000"};

/* [start, end) of the value after the n-th ':' (or of the n-th key), or -1. */
static int find_token(const uint8_t *b, size_t len, uint64_t pick, int want_key, size_t *start, size_t *end) {
    size_t colons = 0;
    for (size_t i = 0; i < len; i++) colons += b[i] == ':';
    if (!colons) return -1;
    pick %= colons;
    size_t i = 0;
    for (size_t seen = 0; i < len; i++)
        if (b[i] == ':' && seen++ == pick) break;
    if (want_key) { /* the string just before the colon */
        size_t j = i;
        while (j > 0 && b[j - 1] != '"') j--;
        if (j == 0) return -1;
        size_t k = j - 1;
        while (k > 0 && b[k - 1] != '"') k--;
        if (k == 0) return -1;
        *start = k - 1, *end = j;
        return 0;
    }
    size_t s = i + 1;
    while (s < len && (b[s] == ' ' || b[s] == '\t')) s++;
    size_t e = s;
    if (e < len && b[e] == '"') {
        for (e++; e < len && b[e] != '"'; e++)
            if (b[e] == '\\') e++;
        if (e < len) e++;
    } else {
        while (e < len && b[e] != ',' && b[e] != '}' && b[e] != ' ' && b[e] != '\n') e++;
    }
    *start = s, *end = e > len ? len : e;
    return 0;
}

static size_t splice(uint8_t *b, size_t len, size_t cap, size_t start, size_t end, const char *with, size_t n) {
    if (len - (end - start) + n > cap) return len;
    memmove(b + start + n, b + end, len - end);
    memcpy(b + start, with, n);
    return len - (end - start) + n;
}

static size_t mutate_json(fuzz_rng *r, uint8_t *b, size_t len, size_t cap) {
    size_t s, e;
    char tmp[256];
    switch (fuzz_below(r, 10)) {
    case 0: case 1: case 2: { /* a value replaced */
        if (find_token(b, len, fuzz_next(r), 0, &s, &e)) break;
        const char *v = values[fuzz_below(r, sizeof values / sizeof values[0])];
        return splice(b, len, cap, s, e, v, strlen(v));
    }
    case 3: { /* a number value with random digits */
        if (find_token(b, len, fuzz_next(r), 0, &s, &e)) break;
        int n = snprintf(tmp, sizeof tmp, fuzz_below(r, 2) ? "%llu" : "\"%lluK\"",
                         (unsigned long long)fuzz_interesting(r, 0));
        return splice(b, len, cap, s, e, tmp, (size_t)n);
    }
    case 4: { /* a key renamed (repeated keys, unknown keys, escapes in keys) */
        if (find_token(b, len, fuzz_next(r), 1, &s, &e)) break;
        int n = snprintf(tmp, sizeof tmp, "\"%s\"", keys[fuzz_below(r, sizeof keys / sizeof keys[0])]);
        return splice(b, len, cap, s, e, tmp, (size_t)n);
    }
    case 5: { /* a member repeated or a nested/garbage member added after the '{' */
        static const char *add[] = {"\"a\": 1, ", "\"x\": {\"y\": 1}, ", "\"l\": [1, 2], ", "\"n\": null, ",
                                    "\"format\": \"pi2-plan\", ", "\"prompt\": \"p\", ", ", ", "\"k\" 1, "};
        const char *v = add[fuzz_below(r, sizeof add / sizeof add[0])];
        const uint8_t *brace = memchr(b, '{', len);
        if (!brace) break;
        s = (size_t)(brace - b) + 1;
        return splice(b, len, cap, s, s, v, strlen(v));
    }
    case 6: return fuzz_insert_run(r, b, len, cap, 3000, '[', 'a'); /* deep nesting or a long string */
    case 7: return fuzz_below(r, len + 1); /* truncated */
    case 8: return fuzz_below(r, 2) ? fuzz_insert_bytes(r, b, len, cap) : fuzz_erase_bytes(r, b, len);
    default: fuzz_flip_bytes(r, b, len);
    }
    return len;
}

const fuzz_target fuzz_target_plan = {"plan", "execution plan files (--plan): plan.c, json_flat.c, the flag parsers",
                                      run_plan, mutate_json, NULL};
const fuzz_target fuzz_target_chat = {"chat", "pi2-engine chat request lines: chat_request.c, json_flat.c", run_chat,
                                      mutate_json, NULL};
