/* Output files that touch nothing but themselves (safe_write.h). */
#include "safe_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

/* What a non-regular file is, for the one-line refusal. */
static const char *kind_of(mode_t mode) {
    if (S_ISLNK(mode)) return "is a symbolic link (output is never written through a link)";
    if (S_ISDIR(mode)) return "is a directory";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "is a device, not a regular file";
    if (S_ISFIFO(mode)) return "is a FIFO, not a regular file";
    if (S_ISSOCK(mode)) return "is a socket, not a regular file";
    return "is not a regular file";
}

int pi2_check_output_target(const char *path, const char *what) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        pi2_set_error("%s %s: %s", what, path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        pi2_set_error("%s %s: %s", what, path, kind_of(st.st_mode));
        return -1;
    }
    return 0;
}

static int write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) { /* no progress and no error: treat as a full device */
            errno = ENOSPC;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A temp file beside the target, created exclusively (O_EXCL: never an existing file or a link that
 * someone planted under the name; a name that is taken is skipped). The fd, or -1 with errno. */
static int create_temp(const char *path, char *tmp, size_t cap) {
    const char *slash = strrchr(path, '/');
    const int dir_len = slash ? (int)(slash - path + 1) : 0;
    const char *base = slash ? slash + 1 : path;
    uint64_t seed = pi2_now_ns() ^ ((uint64_t)getpid() << 32);
    for (int attempt = 0; attempt < 64; attempt++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull; /* an LCG: names, not secrets */
        int len = snprintf(tmp, cap, "%.*s.%s.%08x.tmp", dir_len, path, base, (unsigned)(seed >> 32));
        if (len < 0 || (size_t)len >= cap) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}

/* fsync the directory holding path, so the rename itself survives a crash (best effort: some file
 * systems refuse fsync on a directory, which loses nothing already written). */
static void sync_dir(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

int pi2_safe_write(const char *path, const void *data, size_t n, const char *what) {
    if (pi2_check_output_target(path, what) != 0) return -1;
    char tmp[4096];
    int fd = create_temp(path, tmp, sizeof tmp);
    if (fd < 0) {
        pi2_set_error("%s %s: cannot create a file beside it: %s", what, path, strerror(errno));
        return -1;
    }
    const char *step = "write";
    if (write_all(fd, data, n) != 0) goto failed;
    step = "fsync";
    if (fsync(fd) != 0) goto failed;
    step = "close";
    int rc = close(fd);
    fd = -1;
    if (rc != 0) goto failed;
    /* Checked again just before the rename, which replaces whatever entry is there (never writing
     * through it): a link or device planted meanwhile is refused, not replaced. */
    if (pi2_check_output_target(path, what) != 0) {
        unlink(tmp);
        return -1;
    }
    step = "rename";
    if (rename(tmp, path) != 0) goto failed;
    sync_dir(path);
    return 0;
failed:;
    const int err = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    pi2_set_error("%s %s: %s failed: %s", what, path, step, strerror(err));
    return -1;
}

FILE *pi2_open_stream(const char *path, const char *what) {
    if (pi2_check_output_target(path, what) != 0) return NULL;
    /* O_NONBLOCK: a FIFO swapped in after the check must not block the open; fstat then refuses it. */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd < 0) {
        pi2_set_error("%s %s: %s", what, path,
                      errno == ELOOP ? "is a symbolic link (output is never written through a link)" : strerror(errno));
        return NULL;
    }
    struct stat st;
    const int stat_rc = fstat(fd, &st);
    if (stat_rc != 0 || !S_ISREG(st.st_mode)) {
        pi2_set_error("%s %s: %s", what, path, stat_rc != 0 ? strerror(errno) : kind_of(st.st_mode));
        close(fd);
        return NULL;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    FILE *f = fdopen(fd, "w");
    if (!f) {
        pi2_set_error("%s %s: %s", what, path, strerror(errno));
        close(fd);
    }
    return f;
}

int pi2_close_stream(FILE *f, const char *path, const char *what) {
    if (!f) return 0;
    errno = 0;
    int bad = fflush(f) != 0 || ferror(f);
    int err = errno;
    if (!bad && fsync(fileno(f)) != 0) bad = 1, err = errno;
    if (fclose(f) != 0 && !bad) bad = 1, err = errno;
    if (bad) pi2_set_error("%s %s: write failed: %s", what, path, err ? strerror(err) : "I/O error");
    return bad ? -1 : 0;
}
