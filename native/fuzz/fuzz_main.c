/* pi2-fuzz: the driver (see fuzz.h and docs/FUZZ.md).
 *   pi2-fuzz TARGET --corpus DIR [--seconds S | --iterations N] [--seed X] [--crashes DIR] [--timeout S]
 *   pi2-fuzz TARGET --replay FILE...     run inputs once each (regression inputs, saved crashes)
 *   pi2-fuzz TARGET --corpus DIR --seed X --only I --out FILE   write iteration I's input
 *   pi2-fuzz --list
 * One child process runs the iterations; the input being run sits in shared memory, so when the child
 * dies (signal, sanitizer report, abort) or stops making progress, the parent saves that input,
 * counts it, and starts a new child at the next iteration. Exit status: 0 no crash/hang, 1 findings,
 * 2 usage or setup error. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "fuzz.h"

#define FUZZ_MAX_INPUT (4u << 20)
#define MAX_SEEDS 256

static const fuzz_target *targets[] = {&fuzz_target_pi2file, &fuzz_target_plan, &fuzz_target_chat, &fuzz_target_http};

/* ---- shared helpers (declared in fuzz.h) ---- */

uint64_t fuzz_interesting(fuzz_rng *r, uint64_t near) {
    static const uint64_t v[] = {0, 1, 2, 3, 4, 7, 8, 16, 31, 32, 33, 63, 64, 127, 128, 255, 256, 511, 512,
                                 1023, 1024, 4095, 4096, 4097, 65535, 65536, 1u << 20, 1u << 24, 0x7fffffff,
                                 0x80000000u, 0xffffffffu, 1ull << 32, (1ull << 32) + 1, 1ull << 40,
                                 0x7fffffffffffffffull, 0x8000000000000000ull, ~0ull, ~0ull - 4095};
    switch (fuzz_below(r, 8)) {
    case 0: return near + 1;
    case 1: return near - 1;
    case 2: return near * 2;
    case 3: return near / 2 + fuzz_below(r, 2);
    case 4: return fuzz_next(r) >> fuzz_below(r, 64);
    default: return v[fuzz_below(r, sizeof v / sizeof v[0])];
    }
}

void fuzz_flip_bytes(fuzz_rng *r, uint8_t *buf, size_t len) {
    if (!len) return;
    for (int k = 1 + (int)fuzz_below(r, 4); k > 0; k--) {
        size_t at = fuzz_below(r, len);
        buf[at] = fuzz_below(r, 2) ? buf[at] ^ (uint8_t)(1u << fuzz_below(r, 8)) : (uint8_t)fuzz_next(r);
    }
}

size_t fuzz_insert_bytes(fuzz_rng *r, uint8_t *buf, size_t len, size_t cap) {
    size_t n = 1 + fuzz_below(r, 16), at = fuzz_below(r, len + 1);
    if (len + n > cap) return len;
    memmove(buf + at + n, buf + at, len - at);
    for (size_t i = 0; i < n; i++) buf[at + i] = (uint8_t)fuzz_next(r);
    return len + n;
}

size_t fuzz_insert_run(fuzz_rng *r, uint8_t *buf, size_t len, size_t cap, size_t max, uint8_t a, uint8_t b) {
    size_t n = 1 + fuzz_below(r, max), at = fuzz_below(r, len + 1);
    if (len + n > cap) return len;
    memmove(buf + at + n, buf + at, len - at);
    memset(buf + at, fuzz_below(r, 2) ? a : b, n);
    return len + n;
}

size_t fuzz_erase_bytes(fuzz_rng *r, uint8_t *buf, size_t len) {
    if (!len) return 0;
    size_t at = fuzz_below(r, len), n = 1 + fuzz_below(r, len - at < 16 ? len - at : 16);
    memmove(buf + at, buf + at + n, len - at - n);
    return len - n;
}

void fuzz_check_error_line(const char *target) {
    const char *e = pi2_last_error();
    if (!*e || !strcmp(e, "unknown error") || strchr(e, '\n') || strchr(e, '\r')) {
        fprintf(stderr, "pi2-fuzz: %s: refused without one clear error line: '%s'\n", target, e);
        abort();
    }
}

/* ---- corpus ---- */

typedef struct {
    uint8_t *data;
    size_t len;
    char name[256];
} seed_file;

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *buf = malloc(FUZZ_MAX_INPUT);
    size_t n = buf ? fread(buf, 1, FUZZ_MAX_INPUT, f) : 0;
    int big = buf && !feof(f) && fgetc(f) != EOF;
    fclose(f);
    if (!buf || big) {
        free(buf);
        if (big) fprintf(stderr, "pi2-fuzz: %s: larger than %u bytes\n", path, FUZZ_MAX_INPUT);
        return NULL;
    }
    *len = n;
    return buf;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const seed_file *)a)->name, ((const seed_file *)b)->name);
}

/* Every regular file of dir, sorted by name (so iteration i is the same input on every machine). */
static int load_corpus(const char *dir, seed_file *seeds) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "pi2-fuzz: corpus %s: %s\n", dir, strerror(errno));
        return -1;
    }
    int n = 0;
    for (struct dirent *de; (de = readdir(d)) && n < MAX_SEEDS;) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (de->d_name[0] == '.' || stat(path, &st) || !S_ISREG(st.st_mode)) continue;
        if (!(seeds[n].data = read_file(path, &seeds[n].len))) continue;
        snprintf(seeds[n].name, sizeof seeds[n].name, "%s", de->d_name);
        n++;
    }
    closedir(d);
    qsort(seeds, (size_t)n, sizeof *seeds, by_name);
    if (!n) fprintf(stderr, "pi2-fuzz: corpus %s has no files\n", dir);
    return n ? n : -1;
}

/* Iteration i's input: a corpus file and 1-4 mutations, all from (seed, i). */
static size_t make_input(const fuzz_target *t, const seed_file *seeds, int n_seeds, uint64_t seed, uint64_t i,
                         uint8_t *buf) {
    fuzz_rng r = {seed * 0x2545f4914f6cdd1dull + i * 0x9e3779b97f4a7c15ull};
    fuzz_next(&r);
    const seed_file *s = &seeds[fuzz_below(&r, (uint64_t)n_seeds)];
    memcpy(buf, s->data, s->len);
    size_t len = s->len;
    for (int k = 1 + (int)fuzz_below(&r, 4); k > 0; k--) len = t->mutate(&r, buf, len, FUZZ_MAX_INPUT);
    if (t->finish) len = t->finish(&r, buf, len, FUZZ_MAX_INPUT);
    return len;
}

/* ---- the supervised run ---- */

typedef struct {
    volatile uint64_t next_iter; /* the child's position: the input in data[] is iteration next_iter */
    volatile uint64_t execs, accepted;
    volatile uint32_t len;
    volatile int stop, finished;
    uint8_t data[FUZZ_MAX_INPUT];
} shared_state;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void child_loop(const fuzz_target *t, const seed_file *seeds, int n_seeds, uint64_t seed, uint64_t end,
                       shared_state *sh) {
    for (uint64_t i = sh->next_iter; i < end && !sh->stop; i = ++sh->next_iter) {
        sh->len = (uint32_t)make_input(t, seeds, n_seeds, seed, i, sh->data);
        const int ok = t->run(sh->data, sh->len);
        __atomic_add_fetch(&sh->execs, 1, __ATOMIC_RELAXED);
        if (ok) __atomic_add_fetch(&sh->accepted, 1, __ATOMIC_RELAXED);
    }
    sh->finished = 1;
    exit(0); /* not _exit: LeakSanitizer checks at exit, and a leak makes the status non-zero */
}

static void save_finding(const char *dir, const fuzz_target *t, const char *kind, uint64_t seed, uint64_t iter,
                         const shared_state *sh) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s-%s-seed%llu-iter%llu", dir, t->name, kind, (unsigned long long)seed,
             (unsigned long long)iter);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(sh->data, 1, sh->len, f) != sh->len || fclose(f)) {
        fprintf(stderr, "pi2-fuzz: cannot save %s\n", path);
        return;
    }
    fprintf(stderr, "pi2-fuzz: %s: %s at iteration %llu, input saved as %s\n", t->name, kind,
            (unsigned long long)iter, path);
}

static int fuzz(const fuzz_target *t, const char *corpus, double seconds, uint64_t iterations, uint64_t seed,
                const char *crash_dir, double timeout) {
    static seed_file seeds[MAX_SEEDS];
    int n_seeds = load_corpus(corpus, seeds);
    if (n_seeds < 0) return 2;
    mkdir(crash_dir, 0755);
    shared_state *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return perror("pi2-fuzz: mmap"), 2;
    const uint64_t end = iterations ? iterations : UINT64_MAX;
    const double t0 = now_s(), deadline = seconds > 0 ? t0 + seconds : 1e300;
    uint64_t crashes = 0, hangs = 0, leaks = 0, restarts = 0;
    while (sh->next_iter < end && now_s() < deadline) {
        pid_t pid = fork();
        if (pid < 0) return perror("pi2-fuzz: fork"), 2;
        if (pid == 0) child_loop(t, seeds, n_seeds, seed, end, sh);
        uint64_t seen = sh->next_iter;
        double progress_at = now_s();
        int status = 0;
        for (;;) {
            pid_t w = waitpid(pid, &status, WNOHANG);
            if (w == pid) break;
            usleep(20000);
            const double now = now_s();
            if (now >= deadline) sh->stop = 1;
            if (sh->next_iter != seen) seen = sh->next_iter, progress_at = now;
            else if (now - progress_at > timeout) { /* one input ran for too long: a hang */
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                save_finding(crash_dir, t, "hang", seed, sh->next_iter, sh);
                hangs++;
                sh->next_iter++;
                status = -1;
                break;
            }
        }
        if (status == -1) continue;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) break; /* the child finished the run */
        if (sh->finished) { /* finished, then failed at exit: the leak report above */
            fprintf(stderr, "pi2-fuzz: %s: the run leaked memory (report above; replay its inputs to find which)\n",
                    t->name);
            leaks++;
            break;
        }
        save_finding(crash_dir, t, "crash", seed, sh->next_iter, sh);
        crashes++;
        sh->next_iter++;
        if (++restarts > 1000) {
            fprintf(stderr, "pi2-fuzz: %s: more than 1000 crashes, stopping\n", t->name);
            break;
        }
    }
    const double el = now_s() - t0;
    printf("pi2-fuzz: %s: %llu executions in %.1f s (%.0f/s), %llu accepted, %llu crashes, %llu hangs, %llu leaks "
           "(seed %llu, corpus %d files)\n",
           t->name, (unsigned long long)sh->execs, el, sh->execs / (el > 0 ? el : 1),
           (unsigned long long)sh->accepted, (unsigned long long)crashes, (unsigned long long)hangs,
           (unsigned long long)leaks, (unsigned long long)seed, n_seeds);
    return crashes || hangs || leaks ? 1 : 0;
}

static int replay(const fuzz_target *t, int n, char **paths) {
    int accepted = 0;
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        uint8_t *data = read_file(paths[i], &len);
        if (!data) return fprintf(stderr, "pi2-fuzz: cannot read %s\n", paths[i]), 2;
        const int ok = t->run(data, len);
        accepted += ok;
        printf("%s: %s%s\n", paths[i], ok ? "accepted" : "refused: ", ok ? "" : pi2_last_error());
        free(data);
    }
    printf("pi2-fuzz: %s: replayed %d inputs, %d accepted, no crash\n", t->name, n, accepted);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: pi2-fuzz TARGET --corpus DIR [--seconds S | --iterations N] [--seed X] [--crashes DIR]\n"
               "                [--timeout S]\n"
               "       pi2-fuzz TARGET --replay FILE...\n"
               "       pi2-fuzz TARGET --corpus DIR [--seed X] --only I --out FILE\n"
               "targets:\n");
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
        fprintf(f, "  %-8s %s\n", targets[i]->name, targets[i]->about);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--list") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const fuzz_target *t = NULL;
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
        if (!strcmp(argv[1], targets[i]->name)) t = targets[i];
    if (!t) return fprintf(stderr, "pi2-fuzz: unknown target '%s' (--list)\n", argv[1]), 2;
    if (argc > 2 && !strcmp(argv[2], "--replay")) return replay(t, argc - 3, argv + 3);
    const char *corpus = NULL, *crashes = "fuzz-crashes", *out = NULL;
    double seconds = 0, timeout = 10;
    unsigned long long iterations = 0, seed = 1, only = 0;
    int have_only = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return fprintf(stderr, "pi2-fuzz: %s needs a value\n", a), 2;
        i++;
        if (!strcmp(a, "--corpus")) corpus = v;
        else if (!strcmp(a, "--crashes")) crashes = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--seconds")) seconds = atof(v);
        else if (!strcmp(a, "--timeout")) timeout = atof(v);
        else if (!strcmp(a, "--iterations")) iterations = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--only")) only = strtoull(v, NULL, 10), have_only = 1;
        else return fprintf(stderr, "pi2-fuzz: unknown option %s\n", a), usage(stderr), 2;
    }
    if (!corpus || (!have_only && seconds <= 0 && !iterations))
        return fprintf(stderr, "pi2-fuzz: give --corpus and --seconds or --iterations\n"), 2;
    if (have_only) { /* write one iteration's input, to look at or to replay */
        static seed_file seeds[MAX_SEEDS];
        static uint8_t buf[FUZZ_MAX_INPUT];
        int n = load_corpus(corpus, seeds);
        if (n < 0 || !out) return 2;
        size_t len = make_input(t, seeds, n, seed, only, buf);
        FILE *f = fopen(out, "wb");
        return f && fwrite(buf, 1, len, f) == len && !fclose(f) ? 0 : 2;
    }
    return fuzz(t, corpus, seconds, iterations, seed, crashes, timeout);
}
