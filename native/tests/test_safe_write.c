/* base/safe_write: whole files land whole or not at all, nothing is written through a link, and only a
 * regular file (or nothing) at the target is ever replaced or opened. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "safe_write.h"

static char dir[256];

static const char *at(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static int n_entries(void) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

static int holds(const char *path, const char *text) {
    char buf[256] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return n == strlen(text) && !memcmp(buf, text, n);
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/pi2-test-safe-write-XXXXXX");
    if (!mkdtemp(dir)) return 1;

    /* a new file, then a replaced one: the content whole, nothing else left in the directory */
    CHECK(pi2_safe_write(at("out.bin"), "first", 5, "--out") == 0 && holds(at("out.bin"), "first"));
    CHECK(pi2_safe_write(at("out.bin"), "second", 6, "--out") == 0 && holds(at("out.bin"), "second"));
    CHECK(n_entries() == 1);

    /* a symlink at the target: refused, the link and what it points to unchanged */
    put(at("victim"), "keep");
    CHECK(symlink(at("victim"), at("link")) == 0);
    CHECK(pi2_safe_write(at("link"), "x", 1, "--out") == -1);
    CHECK(strstr(pi2_last_error(), "is a symbolic link") != NULL);
    CHECK(holds(at("victim"), "keep"));
    struct stat st;
    CHECK(lstat(at("link"), &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(pi2_open_stream(at("link"), "--events") == NULL && holds(at("victim"), "keep"));

    /* a FIFO and a directory: refused without blocking */
    CHECK(mkfifo(at("fifo"), 0600) == 0);
    CHECK(pi2_safe_write(at("fifo"), "x", 1, "--out") == -1 && strstr(pi2_last_error(), "FIFO") != NULL);
    CHECK(pi2_open_stream(at("fifo"), "--events") == NULL && strstr(pi2_last_error(), "FIFO") != NULL);
    CHECK(mkdir(at("sub"), 0700) == 0);
    CHECK(pi2_safe_write(at("sub"), "x", 1, "--out") == -1 && strstr(pi2_last_error(), "directory") != NULL);
    CHECK(pi2_open_stream(at("sub"), "--events") == NULL);
    CHECK(pi2_check_output_target("/dev/null", "--out") == -1 && strstr(pi2_last_error(), "device") != NULL);
    CHECK(n_entries() == 5); /* out.bin victim link fifo sub: no temp file left by any refusal */

    /* a missing directory: one error, nothing created */
    CHECK(pi2_safe_write(at("no/such/dir/f"), "x", 1, "--out") == -1);
    CHECK(strstr(pi2_last_error(), "cannot create a file beside it") != NULL);

    /* a stream: truncated and written, its close checked */
    put(at("events"), "old old old");
    FILE *f = pi2_open_stream(at("events"), "--events");
    CHECK(f != NULL);
    if (f) {
        fputs("new", f);
        CHECK(pi2_close_stream(f, at("events"), "--events") == 0);
    }
    CHECK(holds(at("events"), "new"));
    CHECK(pi2_close_stream(NULL, "x", "--events") == 0);

    const char *names[] = {"out.bin", "victim", "link", "fifo", "events"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) unlink(at(names[k]));
    rmdir(at("sub"));
    rmdir(dir);
    return pi2_test_summary("test_safe_write");
}
