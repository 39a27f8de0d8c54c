/* Test helper: a process whose true peak resident set is known and lasts no time at all.
 *
 *   alloc_touch MIB [DELAY_MS [EXIT_CODE]]
 *
 * Sleeps DELAY_MS (default 50) with a tiny resident set, then maps MIB MiB, writes every page (so all of
 * it is resident), prints an MLC-style stats line (it doubles as an MLC command runner) and exits at
 * once with EXIT_CODE. A poll of /proc/PID/status almost never sees the peak; the kernel's ru_maxrss
 * always does. tests/test_rusage.py builds it with the host's cc. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: alloc_touch MIB [DELAY_MS [EXIT_CODE]]\n");
        return 2;
    }
    const size_t bytes = (size_t)atol(argv[1]) << 20;
    const long delay_ms = argc > 2 ? atol(argv[2]) : 50;
    struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    volatile char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("alloc_touch: mmap");
        return 3;
    }
    for (size_t off = 0; off < bytes; off += 4096) p[off] = 1;
    printf("prefill: 10.0 tok/s, decode: 5.0 tok/s\n");
    fflush(stdout);
    return argc > 3 ? atoi(argv[3]) : 0;
}
