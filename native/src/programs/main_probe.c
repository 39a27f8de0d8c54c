/* pi2-probe: the hardware profiler the planner reads (pi2 profile runs it on the target).
 *   membw    memory read bandwidth, GB/s, with N threads
 *   storage  random reads of one block size and queue depth through the engine's reader, MB/s and IOPS
 *   pool     the thread pool's cost a job, back to back and after a serial gap
 *   gemv     the dense decode GEMV's GB/s as the engine runs it, with N threads */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "events.h"
#include "kernels.h"
#include "probe.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: pi2-probe COMMAND [OPTIONS]\n"
            "commands:\n"
            "  membw [--threads N] [--mib M] [--passes P] [--streams S] [--json]\n"
            "      read bandwidth: each of N threads (default 1) sums its own M MiB buffer (default 256;\n"
            "      make N*M larger than the last-level cache), P passes (default 5), median GB/s.\n"
            "      S (1..8, default 1): the buffer as S runs read side by side, a line of each in turn\n"
            "  storage --file F [--block B] [--qd Q] [--method auto|uring|pread|buffered] [--seconds S]\n"
            "          [--io-threads T] [--seed X] [--wave N [--range R]] [--json]\n"
            "      random block-aligned reads of B bytes (default 8192) over all of F, Q in flight\n"
            "      (default 32), for S seconds (default 3): MB/s, IOPS, latency. O_DIRECT bypasses the page\n"
            "      cache; buffered reads evict F's cached pages first, yet re-reads of a small F still hit\n"
            "      memory. T: pread-pool threads (default Q). Use a file larger than the page cache.\n"
            "      --wave N: reads in waves as decode issues a block's misses: N offsets within R bytes\n"
            "      (default 128M) at a random place, sorted, sent at once (Q in flight), collected whole.\n"
            "  gemv [--threads N] [--mib M] [--reps R] [--layout x4|rows] [--prefetch B] [--streams S] [--json]\n"
            "      the dense decode GEMV as the engine runs it: M MiB (default 512) of Q4_0 4096 x 4096\n"
            "      matrices (its layout: interleaved by four where the kernels have that; rows: the file's\n"
            "      rows, as --no-repack), one token, one matrix after another on N threads (default 1), R\n"
            "      passes (default 5): the weights' GB/s, median. Beside membw: whether the kernel or the\n"
            "      memory bounds attention and the output head. B: how far ahead the interleaved\n"
            "      kernel asks for its stream (default 512, the engine's; 0: not at all). S (1, 2, 4 or\n"
            "      8; default 1, the engine's): how many runs of groups a thread's rows are read as, side by\n"
            "      side (runs under 32 KiB apart are merged). The engine takes both from PI2_X4_PREFETCH\n"
            "      and PI2_X4_STREAMS.\n"
            "  pool [--threads N] [--jobs J] [--gap-us G] [--json]\n"
            "      the engine's thread pool: N threads (default: online CPUs) run an empty job J times back\n"
            "      to back (default 20000), then J/10 times each after the calling thread spun G us alone\n"
            "      (default 500: the workers fall asleep after 250): us a job, median and p90\n"
            "  --version\n");
}

static int parse_method(const char *v, pi2_io_method *m) {
    static const char *names[] = {"auto", "uring", "pread", "buffered"};
    for (int i = 0; v && i < 4; i++)
        if (!strcmp(v, names[i]) || (i == 1 && !strcmp(v, "io_uring"))) return *m = (pi2_io_method)i, 0;
    pi2_set_error("--method needs auto, uring, pread or buffered, got '%s'", v ? v : "");
    return -1;
}

static int run_membw(int argc, char **argv) {
    int threads = 1, mib = 256, passes = 5, json = 0, streams = 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--threads")) { if (pi2_parse_int_arg(a, v, 1, 1024, &threads)) return -1; i++; }
        else if (!strcmp(a, "--mib")) { if (pi2_parse_int_arg(a, v, 1, 1 << 20, &mib)) return -1; i++; }
        else if (!strcmp(a, "--passes")) { if (pi2_parse_int_arg(a, v, 1, PI2_MEMBW_MAX_PASSES, &passes)) return -1; i++; }
        else if (!strcmp(a, "--streams")) { if (pi2_parse_int_arg(a, v, 1, PI2_MEMBW_MAX_STREAMS, &streams)) return -1; i++; }
        else return pi2_set_error("membw: unknown option '%s' (pi2-probe --help)", a), -1;
    }
    pi2_membw_result r;
    if (pi2_probe_membw(threads, (size_t)mib << 20, passes, streams, &r)) return -1;
    if (json) {
        printf("{\"probe\": \"membw\", \"threads\": %d, \"mib_per_thread\": %d, \"streams\": %d, \"passes_gb_per_s\": [",
               threads, mib, streams);
        for (int p = 0; p < passes; p++) printf("%s%.3f", p ? ", " : "", r.pass_gbps[p]);
        printf("], \"gb_per_s\": %.3f}\n", r.median_gbps);
    } else {
        char st[32] = "";
        if (streams > 1) snprintf(st, sizeof st, ", %d streams each", streams);
        printf("memory read bandwidth: %.2f GB/s (%d thread%s x %d MiB%s, median of %d passes)\n", r.median_gbps,
               threads, threads > 1 ? "s" : "", mib, st, passes);
    }
    return 0;
}

static int run_storage(int argc, char **argv) {
    pi2_storage_probe p = {.block = 8192, .queue_depth = 32, .method = PI2_IO_AUTO, .seconds = 3, .seed = 1};
    int json = 0, block = 8192;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!v) return pi2_set_error("option %s needs a value", a), -1;
        i++;
        if (!strcmp(a, "--file")) p.path = v;
        else if (!strcmp(a, "--block")) { if (pi2_parse_int_arg(a, v, 1, 64 << 20, &block)) return -1; }
        else if (!strcmp(a, "--qd")) { if (pi2_parse_int_arg(a, v, 1, 1024, &p.queue_depth)) return -1; }
        else if (!strcmp(a, "--io-threads")) { if (pi2_parse_int_arg(a, v, 1, 256, &p.io_threads)) return -1; }
        else if (!strcmp(a, "--method")) { if (parse_method(v, &p.method)) return -1; }
        else if (!strcmp(a, "--wave")) { if (pi2_parse_int_arg(a, v, 1, 1 << 20, &p.wave)) return -1; }
        else if (!strcmp(a, "--range")) { if (pi2_parse_size(a, v, &p.range)) return -1; }
        else if (!strcmp(a, "--seed")) { int s; if (pi2_parse_int_arg(a, v, 0, 1 << 30, &s)) return -1; p.seed = (uint64_t)s; }
        else if (!strcmp(a, "--seconds")) {
            float s;
            if (pi2_parse_float_arg(a, v, &s)) return -1;
            if (!(s > 0 && s <= 3600)) return pi2_set_error("--seconds needs a value in (0, 3600], got '%s'", v), -1;
            p.seconds = s;
        }
        else return pi2_set_error("storage: unknown option '%s' (pi2-probe --help)", a), -1;
    }
    if (!p.path) return pi2_set_error("storage: --file is required (pi2-probe --help)"), -1;
    p.block = (size_t)block;
    pi2_storage_result r;
    if (pi2_probe_storage(&p, &r)) return -1;
    const char *method = pi2_io_method_name(r.method);
    if (json) {
        char file[16400]; /* every byte may become \u00XX */
        pi2_json_string(file, sizeof file, p.path);
        printf("{\"probe\": \"storage\", \"file\": %s, \"file_bytes\": %llu, \"block\": %zu, \"qd\": %d, \"wave\": %d, \"range\": %llu, "
               "\"method\": \"%s\", \"o_direct\": %s, \"page_cache_bypassed\": %s, \"seconds\": %.3f, "
               "\"reads\": %llu, \"bytes\": %llu, \"mb_per_s\": %.2f, \"iops\": %.1f, \"lat_p50_us\": %.1f, "
               "\"lat_p99_us\": %.1f}\n",
               file, (unsigned long long)r.file_bytes, p.block, p.queue_depth, p.wave, (unsigned long long)r.range, method, r.direct ? "true" : "false",
               r.direct ? "true" : "false", r.seconds, (unsigned long long)r.reads, (unsigned long long)r.bytes,
               r.mb_per_s, r.iops, r.lat_p50_us, r.lat_p99_us);
    } else {
        printf("storage: %s (%.1f MiB), %s, %s\n", p.path, (double)r.file_bytes / (1 << 20), method,
               r.direct ? "O_DIRECT: page cache bypassed"
                        : "buffered: through the page cache (evicted first; re-reads may hit it)");
        printf("random reads of %zu B, queue depth %d, %.2f s: %.1f MB/s, %.0f IOPS, latency p50 %.0f us, "
               "p99 %.0f us\n",
               p.block, p.queue_depth, r.seconds, r.mb_per_s, r.iops, r.lat_p50_us, r.lat_p99_us);
    }
    return 0;
}

static int run_gemv(int argc, char **argv) {
    int threads = 1, mib = 512, reps = 5, json = 0, rows = 0, prefetch = -1, streams = -1; /* -1: the engine's */
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--layout")) {
            if (!v || (strcmp(v, "x4") && strcmp(v, "rows")))
                return pi2_set_error("--layout needs x4 or rows, got '%s'", v ? v : ""), -1;
            rows = !strcmp(v, "rows"), i++;
        }
        else if (!strcmp(a, "--threads")) { if (pi2_parse_int_arg(a, v, 1, 1024, &threads)) return -1; i++; }
        else if (!strcmp(a, "--mib")) { if (pi2_parse_int_arg(a, v, 9, 1 << 20, &mib)) return -1; i++; }
        else if (!strcmp(a, "--reps")) { if (pi2_parse_int_arg(a, v, 1, PI2_MEMBW_MAX_PASSES, &reps)) return -1; i++; }
        else if (!strcmp(a, "--prefetch")) { if (pi2_parse_int_arg(a, v, 0, PI2_X4_PREFETCH_MAX, &prefetch)) return -1; i++; }
        else if (!strcmp(a, "--streams")) { if (pi2_parse_int_arg(a, v, 1, 8, &streams)) return -1; i++; }
        else return pi2_set_error("gemv: unknown option '%s' (pi2-probe --help)", a), -1;
    }
    if (streams >= 0 && pi2_kernels_set_x4_streams(streams))
        return pi2_set_error("--streams takes 1, 2, 4 or 8, got %d", streams), -1;
    if (prefetch >= 0) pi2_kernels_set_x4_prefetch(prefetch); /* parsed within its range */
    pi2_gemv_result r;
    if (pi2_probe_gemv(threads, (size_t)mib << 20, reps, rows, &r)) return -1;
    if (json) {
        printf("{\"probe\": \"gemv\", \"threads\": %d, \"level\": \"%s\", \"x4\": %s, \"x4_prefetch\": %d, "
               "\"x4_streams\": %d, \"matrices\": %d, \"bytes\": %zu, \"passes_gb_per_s\": [", threads, r.level,
               r.x4 ? "true" : "false", r.x4_prefetch, r.x4_streams, r.matrices, r.bytes);
        for (int p = 0; p < reps; p++) printf("%s%.3f", p ? ", " : "", r.pass_gbps[p]);
        printf("], \"gb_per_s\": %.3f}\n", r.median_gbps);
    } else {
        char pf[80] = "";
        if (r.x4) snprintf(pf, sizeof pf, ", prefetch %d B ahead, %d stream%s", r.x4_prefetch, r.x4_streams,
                           r.x4_streams > 1 ? "s" : "");
        printf("decode GEMV (%s%s%s): %.2f GB/s (%d thread%s, %d matrices of 4096 x 4096 Q4_0, %zu MiB, median of %d "
               "passes)\n", r.level, r.x4 ? ", rows interleaved by four" : "", pf, r.median_gbps, threads,
               threads > 1 ? "s" : "", r.matrices, r.bytes >> 20, reps);
    }
    return 0;
}

static int run_pool(int argc, char **argv) {
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), jobs = 20000, gap = 500, json = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--threads")) { if (pi2_parse_int_arg(a, v, 1, 1024, &threads)) return -1; i++; }
        else if (!strcmp(a, "--jobs")) { if (pi2_parse_int_arg(a, v, 10, 10000000, &jobs)) return -1; i++; }
        else if (!strcmp(a, "--gap-us")) { if (pi2_parse_int_arg(a, v, 0, 1000000, &gap)) return -1; i++; }
        else return pi2_set_error("pool: unknown option '%s' (pi2-probe --help)", a), -1;
    }
    pi2_pool_result r;
    if (pi2_probe_pool(threads, jobs, gap, &r)) return -1;
    if (json)
        printf("{\"probe\": \"pool\", \"threads\": %d, \"jobs\": %d, \"job_us_p50\": %.2f, \"job_us_p90\": %.2f, "
               "\"gap_us\": %d, \"gap_job_us_p50\": %.2f, \"gap_job_us_p90\": %.2f, \"worker_sleeps\": %llu}\n",
               threads, jobs, r.job_us_p50, r.job_us_p90, gap, r.gap_job_us_p50, r.gap_job_us_p90,
               (unsigned long long)r.worker_sleeps);
    else
        printf("thread pool, %d threads: %.2f us a job back to back (p90 %.2f); after %d us alone %.2f (p90 %.2f), "
               "%llu worker sleeps in %d jobs\n",
               threads, r.job_us_p50, r.job_us_p90, gap, r.gap_job_us_p50, r.gap_job_us_p90,
               (unsigned long long)r.worker_sleeps, jobs / 10);
    return 0;
}

int main(int argc, char **argv) {
    const char *cmd = argc > 1 ? argv[1] : NULL;
    if (!cmd || !strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(cmd ? stdout : stderr);
        return cmd ? 0 : 2;
    }
    if (!strcmp(cmd, "--version")) return printf("pi2-probe %s\n", PI2_VERSION), 0;
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(stdout), 0;
    int rc;
    if (!strcmp(cmd, "membw")) rc = run_membw(argc, argv);
    else if (!strcmp(cmd, "storage")) rc = run_storage(argc, argv);
    else if (!strcmp(cmd, "pool")) rc = run_pool(argc, argv);
    else if (!strcmp(cmd, "gemv")) rc = run_gemv(argc, argv);
    else {
        fprintf(stderr, "pi2-probe: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    if (rc) fprintf(stderr, "pi2-probe: %s\n", pi2_last_error());
    return rc ? 1 : 0;
}
