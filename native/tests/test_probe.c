/* The probes' functions on tiny inputs (correct accounting and argument checks, not speed), so they
 * are exercised on arm64 under qemu too; tests/test_probe.py covers the pi2-probe command line. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "probe.h"

int main(void) {
    pi2_membw_result m;
    CHECK(pi2_probe_membw(2, 1 << 20, 3, 1, &m) == 0);
    CHECK(m.threads == 2 && m.passes == 3 && m.streams == 1 && m.bytes_per_thread == 1 << 20);
    CHECK(m.pass_gbps[0] > 0 && m.pass_gbps[1] > 0 && m.pass_gbps[2] > 0);
    double lo = m.pass_gbps[0], hi = m.pass_gbps[0];
    for (int i = 1; i < 3; i++) lo = m.pass_gbps[i] < lo ? m.pass_gbps[i] : lo, hi = m.pass_gbps[i] > hi ? m.pass_gbps[i] : hi;
    CHECK(m.median_gbps >= lo && m.median_gbps <= hi);
    CHECK(pi2_probe_membw(0, 1 << 20, 3, 1, &m) == -1);
    CHECK(pi2_probe_membw(1, 1 << 20, PI2_MEMBW_MAX_PASSES + 1, 1, &m) == -1);
    /* streams: the runs read side by side; 3 does not divide 1 MiB into whole lines, so less is read */
    CHECK(pi2_probe_membw(1, 1 << 20, 3, 3, &m) == 0);
    CHECK(m.streams == 3 && m.bytes_per_thread == (1 << 20) / 64 / 3 * 64 * 3 && m.median_gbps > 0);
    CHECK(pi2_probe_membw(1, 1 << 20, 3, PI2_MEMBW_MAX_STREAMS, &m) == 0 && m.bytes_per_thread == 1 << 20);
    CHECK(pi2_probe_membw(1, 1 << 20, 3, 0, &m) == -1);
    CHECK(pi2_probe_membw(1, 1 << 20, 3, PI2_MEMBW_MAX_STREAMS + 1, &m) == -1);

    const char *dir = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/pi2-probe-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    static char block[65536];
    memset(block, 7, sizeof block);
    for (int i = 0; i < 16; i++) CHECK(write(fd, block, sizeof block) == (ssize_t)sizeof block); /* 1 MiB */
    close(fd);

    pi2_io_method methods[] = {PI2_IO_AUTO, PI2_IO_PREAD, PI2_IO_BUFFERED};
    for (int k = 0; k < 3; k++) {
        pi2_storage_probe p = {.path = path, .block = 4096, .queue_depth = 4, .method = methods[k], .seconds = 0.05, .seed = 3};
        pi2_storage_result r;
        CHECK(pi2_probe_storage(&p, &r) == 0);
        printf("%s: used %s, direct %d, %llu reads, %.0f IOPS\n", pi2_io_method_name(methods[k]),
               pi2_io_method_name(r.method), r.direct, (unsigned long long)r.reads, r.iops);
        CHECK(r.reads > 0 && r.bytes == r.reads * 4096 && r.file_bytes == 1 << 20);
        CHECK(r.seconds >= 0.05 && r.iops > 0 && r.lat_p50_us > 0 && r.lat_p50_us <= r.lat_p99_us);
        if (methods[k] == PI2_IO_BUFFERED) CHECK(r.method == PI2_IO_BUFFERED && !r.direct);
    }
    /* waves: whole waves of sorted reads within the range, so the count is a multiple of the wave */
    pi2_storage_probe w = {.path = path, .block = 4096, .queue_depth = 4, .seconds = 0.05, .seed = 5, .wave = 10,
                           .range = 256 << 10};
    pi2_storage_result wr;
    CHECK(pi2_probe_storage(&w, &wr) == 0);
    CHECK(wr.reads >= 10 && wr.reads % 10 == 0 && wr.bytes == wr.reads * 4096 && wr.iops > 0);
    CHECK(wr.lat_p50_us > 0 && wr.lat_p50_us <= wr.lat_p99_us && wr.range == 256 << 10);
    w.range = 64ull << 30; /* a range past the file's end: the whole file */
    CHECK(pi2_probe_storage(&w, &wr) == 0 && wr.reads % 10 == 0 && wr.range == 1 << 20);
    w.wave = -1;
    CHECK(pi2_probe_storage(&w, &wr) == -1);
    pi2_storage_probe big = {.path = path, .block = 2 << 20, .queue_depth = 1, .seconds = 0.1};
    pi2_storage_result r;
    CHECK(pi2_probe_storage(&big, &r) == -1);
    CHECK(strstr(pi2_last_error(), "smaller than one block") != NULL);
    big.block = 4096, big.queue_depth = 0;
    CHECK(pi2_probe_storage(&big, &r) == -1);
    unlink(path);
    return pi2_test_summary("test_probe");
}
