/* pi2-rusage: run a command to completion and report its peak resident set as the kernel counted it.
 *
 *   pi2-rusage -o FILE [--] COMMAND [ARG...]
 *
 * When COMMAND ends, FILE gets one JSON line:
 *   {"pid": 1234, "exit_code": 0, "signal": null, "exec_errno": 0, "maxrss_bytes": 104857600,
 *    "utime_s": 0.71, "stime_s": 0.05, "wall_s": 0.80}
 * maxrss_bytes is wait4()'s ru_maxrss: the highest resident set the command (or any child it waited
 * for) ever had, however briefly, so a run of 50 ms is measured as exactly as one of an hour. Polling
 * /proc/PID/status misses every peak between two reads.
 *
 * Why a program of its own rather than wait4() from the host's Python: at exec the kernel carries the
 * old address space's high-water mark into the new program's ru_maxrss, and a child forked from Python
 * starts with Python's address space (~100 MB). Forked from this small static program instead, the
 * command inherits only this program's few hundred KiB.
 *
 * pi2-rusage exits with the command's status: its exit code, 128 + N when signal N killed it, 127 when
 * it was not found and 126 when it could not be run (as a shell does; exec_errno says why). SIGINT,
 * SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to pi2-rusage are passed on to the command, and the
 * command is killed when pi2-rusage dies (PR_SET_PDEATHSIG), so stopping either stops both. Its own
 * errors (bad usage, FILE not writable) are one line on stderr and exit status 125. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "safe_write.h"

#define OWN_ERROR 125

static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
#define N_FORWARDED ((int)(sizeof forwarded / sizeof forwarded[0]))

static volatile sig_atomic_t child_pid = 0;

static void forward(int sig) {
    if (child_pid > 0) kill((pid_t)child_pid, sig);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: pi2-rusage -o FILE [--] COMMAND [ARG...]\n"
            "  Runs COMMAND to completion, then writes one JSON line to FILE: pid, exit_code, signal,\n"
            "  exec_errno, maxrss_bytes (wait4's ru_maxrss: the command's peak resident set), utime_s,\n"
            "  stime_s, wall_s. Exits with the command's status (128 + N when signal N killed it).\n");
}

static double seconds(struct timeval tv) { return (double)tv.tv_sec + tv.tv_usec / 1e6; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    const char *out = NULL;
    int i = 1;
    for (; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        } else if (strcmp(argv[i], "-o") == 0 || strcmp(argv[i], "--out") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "pi2-rusage: %s needs a file name\n", argv[i]);
                return OWN_ERROR;
            }
            out = argv[++i];
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "pi2-rusage: unknown option %s (see pi2-rusage --help)\n", argv[i]);
            return OWN_ERROR;
        } else {
            break;
        }
    }
    if (!out || i >= argc) {
        fprintf(stderr, "pi2-rusage: %s (usage: pi2-rusage -o FILE [--] COMMAND [ARG...])\n",
                out ? "no command given" : "no report file given (-o FILE)");
        return OWN_ERROR;
    }
    /* Opened before anything runs, so an unwritable report fails before the command costs anything. */
    /* A regular file or nothing at the path: never through a link, never a device or FIFO (safe_write.h). */
    FILE *report = pi2_open_stream(out, "-o");
    if (!report) {
        fprintf(stderr, "pi2-rusage: %s\n", pi2_last_error());
        return OWN_ERROR;
    }
    /* The child writes exec's errno here; a successful exec closes it (O_CLOEXEC) and we read nothing. */
    int exec_pipe[2];
    if (pipe2(exec_pipe, O_CLOEXEC) != 0) {
        fprintf(stderr, "pi2-rusage: pipe: %s\n", strerror(errno));
        return OWN_ERROR;
    }
    /* Signals stay blocked until the handlers know the child's pid, so none is lost in between. */
    sigset_t fwd, old;
    sigemptyset(&fwd);
    for (int k = 0; k < N_FORWARDED; k++) sigaddset(&fwd, forwarded[k]);
    sigprocmask(SIG_BLOCK, &fwd, &old);
    const pid_t parent = getpid();
    const double t0 = now_s();
    const pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "pi2-rusage: fork: %s\n", strerror(errno));
        return OWN_ERROR;
    }
    if (pid == 0) {
        close(exec_pipe[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);  /* never outlive pi2-rusage (killed with SIGKILL, say) */
        if (getppid() != parent) _exit(127); /* it died before the line above took effect */
        sigprocmask(SIG_SETMASK, &old, NULL);
        execvp(argv[i], argv + i);
        const int err = errno;
        ssize_t w = write(exec_pipe[1], &err, sizeof err);
        (void)w;
        _exit(err == ENOENT ? 127 : 126);
    }
    child_pid = pid;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < N_FORWARDED; k++) sigaction(forwarded[k], &sa, NULL);
    sigprocmask(SIG_SETMASK, &old, NULL);

    close(exec_pipe[1]);
    int exec_errno = 0;
    ssize_t got;
    do got = read(exec_pipe[0], &exec_errno, sizeof exec_errno);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof exec_errno) exec_errno = 0;
    close(exec_pipe[0]);

    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    pid_t done;
    do done = wait4(pid, &status, 0, &ru);
    while (done < 0 && errno == EINTR);
    const double wall = now_s() - t0;
    child_pid = 0;
    if (done < 0) {
        fprintf(stderr, "pi2-rusage: wait4: %s\n", strerror(errno));
        return OWN_ERROR;
    }
    int code, sig = 0;
    if (WIFSIGNALED(status)) {
        sig = WTERMSIG(status);
        code = 128 + sig;
    } else {
        code = WEXITSTATUS(status);
    }
    char exit_text[16], sig_text[16];
    snprintf(exit_text, sizeof exit_text, "%d", code);
    snprintf(sig_text, sizeof sig_text, "%d", sig);
    /* ru_maxrss is in KiB on Linux (and Android) */
    int n = fprintf(report,
                    "{\"pid\": %d, \"exit_code\": %s, \"signal\": %s, \"exec_errno\": %d, \"maxrss_bytes\": %lld, "
                    "\"utime_s\": %.6f, \"stime_s\": %.6f, \"wall_s\": %.6f}\n",
                    (int)pid, sig ? "null" : exit_text, sig ? sig_text : "null", exec_errno,
                    (long long)ru.ru_maxrss * 1024, seconds(ru.ru_utime), seconds(ru.ru_stime), wall);
    if (pi2_close_stream(report, out, "-o") != 0 || n < 0) {
        fprintf(stderr, "pi2-rusage: %s\n", n < 0 ? "cannot write the report" : pi2_last_error());
        return OWN_ERROR;
    }
    if (exec_errno) fprintf(stderr, "pi2-rusage: cannot run %s: %s\n", argv[i], strerror(exec_errno));
    return code;
}
