/* Neuron store reader. Both back ends share one bookkeeping: queue_depth slots (a read the kernel or a
 * pool thread owns), and a queue of completions waiting for pi2_io_reap. A slot frees as soon as its
 * read completes, so queue_depth bounds the reads the storage sees, not the ones the caller reaps.
 *
 * io_uring: raw syscalls on mmap'ed rings (no liburing), IORING_OP_READV so kernels from 5.1 on work
 * (Android phones run 5.4 and 5.10). Exactly one thread at a time harvests the completion ring: the one
 * sleeping in io_uring_enter. Others wait on a condition variable; otherwise a thread could sleep in the
 * kernel for a completion someone else already took. */
#include "neuron_io.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common.h"

#if defined(__has_include)
#if __has_include(<linux/io_uring.h>)
#include <linux/io_uring.h>
#endif
#endif
#ifndef IORING_FEAT_SINGLE_MMAP /* older uapi headers: the bit is fixed ABI */
#define IORING_FEAT_SINGLE_MMAP (1U << 0)
#endif
#if defined(IORING_OFF_SQ_RING) && defined(__NR_io_uring_setup) && defined(__NR_io_uring_enter)
#define HAVE_URING 1
#else
#define HAVE_URING 0
#endif

typedef struct {
    uint64_t off, tag, first_off; /* off/dst/len: the part still to read; first_*: for messages */
    char *dst;
    size_t len, first_len;
    struct iovec iov;
    char *err; /* set when the read failed */
} io_slot;

typedef struct {
    uint64_t tag;
    char *err;
} io_done;

struct pi2_io {
    char *path;
    int fd, direct, qd;
    pi2_io_method method;
    size_t align;
    pthread_mutex_t mu;
    pthread_cond_t state_cv; /* a slot freed or a completion arrived */
    io_slot *slots;
    int *free_slots, n_free;
    io_done *done; /* ring of completions not yet reaped */
    int done_cap, done_head, done_n;
    int unreaped; /* submitted and not yet returned by reap */
    pi2_io_stats st;
    /* pread pool */
    pthread_cond_t work_cv;
    pthread_t *threads;
    int n_threads /* started */, n_started /* have read their index */, *queue, q_head, q_n, stopping;
    const int *cpus;
    int n_cpus;
    /* the fault-injection test hook (PI2_IO_FAULT, see fault_from_env) */
    int fault_kind;
    uint64_t fault_at, n_results;
    /* io_uring */
    int ring_fd, unflushed, kernel_waiter;
    void *sq_map, *cq_map;
    size_t sq_map_len, cq_map_len, sqes_len;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    void *sqes, *cqes;
};

const char *pi2_io_method_name(pi2_io_method m) {
    static const char *names[] = {"auto", "io_uring", "pread", "buffered"};
    return (unsigned)m < 4 ? names[m] : "unknown";
}

/* ---- shared bookkeeping (all under io->mu) ---- */

static char oom_message[] = "out of memory"; /* a failed read's message when none can be allocated */

static void fail_slot(pi2_io *io, io_slot *s, const char *why) {
    char buf[600];
    snprintf(buf, sizeof buf, "%s: read of %zu bytes at offset %llu failed: %s", io->path, s->first_len,
             (unsigned long long)s->first_off, why);
    s->err = strdup(buf);
    if (!s->err) s->err = oom_message;
}

static void free_message(char *m) {
    if (m != oom_message) free(m);
}

/* Test hook: PI2_IO_FAULT=KIND:N, read once at open, makes the N-th read result of this store (1 =
 * the first; io_uring completions and pread calls alike, counted where both are accounted) fail:
 *   eio:N    the read fails with EIO (a dying flash chip)
 *   eof:N    the read returns 0 bytes (the file was truncated under the engine)
 *   short:N  the read returns half its bytes, the rest is read again (must give the same result)
 * so tests can check that a failed neuron read ends the run with one error line and no hang. Compiled
 * out with -DPI2_NO_TEST_HOOKS; without the variable it costs one branch a read. */
enum { FAULT_NONE, FAULT_EIO, FAULT_EOF, FAULT_SHORT };

static void fault_from_env(pi2_io *io) {
#ifndef PI2_NO_TEST_HOOKS
    const char *v = getenv("PI2_IO_FAULT");
    if (!v || !*v) return;
    static const char *kinds[] = {"eio:", "eof:", "short:"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(kinds[k]);
        char *end = NULL;
        if (strncmp(v, kinds[k], n) == 0) {
            unsigned long long at = strtoull(v + n, &end, 10);
            if (at > 0 && end && !*end) {
                io->fault_kind = FAULT_EIO + k;
                io->fault_at = at;
                return;
            }
        }
    }
    fprintf(stderr, "pi2: warning: PI2_IO_FAULT='%s' ignored (expected eio:N, eof:N or short:N)\n", v);
#else
    (void)io;
#endif
}

static long inject_fault(pi2_io *io, long r) {
    if (!io->fault_kind || __atomic_add_fetch(&io->n_results, 1, __ATOMIC_RELAXED) != io->fault_at) return r;
    if (io->fault_kind == FAULT_EIO) return -EIO;
    if (io->fault_kind == FAULT_EOF) return 0;
    long half = r > 0 ? (long)((size_t)(r / 2) / io->align * io->align) : 0;
    return half > 0 ? half : r;
}

/* Accounts the result r of one read system call (-errno on failure) to slot s. 1: the read is done
 * (or failed: s->err), 0: the rest must be read (a short read, or EINTR/EAGAIN). */
static int slot_advance(pi2_io *io, io_slot *s, long r) {
    r = inject_fault(io, r);
    if (r == -EINTR || r == -EAGAIN) return 0;
    if (r < 0) return fail_slot(io, s, strerror((int)-r)), 1;
    if (r == 0) return fail_slot(io, s, "short read at end of file"), 1;
    s->off += (uint64_t)r, s->dst += r, s->len -= (size_t)r;
    if (s->len == 0) return 1;
    /* O_DIRECT returns an unaligned count only at the end of the file; the rest cannot be read. */
    if (io->direct && (size_t)r % io->align) return fail_slot(io, s, "short read at end of file"), 1;
    return 0;
}

/* Makes room for one more completion; done at submit so that completing a read cannot fail. The
 * queue grows without bound because the caller may submit far more than it reaps. */
static int reserve_done(pi2_io *io) {
    if (io->unreaped < io->done_cap) return 0;
    int cap = io->done_cap * 2;
    io_done *d = malloc((size_t)cap * sizeof *d);
    if (!d) return pi2_set_error("%s: out of memory", io->path), -1;
    for (int i = 0; i < io->done_n; i++) d[i] = io->done[(io->done_head + i) % io->done_cap];
    free(io->done);
    io->done = d, io->done_cap = cap, io->done_head = 0;
    return 0;
}

/* Moves a finished slot's tag to the completion queue and frees the slot. */
static void complete(pi2_io *io, int idx) {
    io_slot *s = &io->slots[idx];
    io->done[(io->done_head + io->done_n++) % io->done_cap] = (io_done){s->tag, s->err};
    if (!s->err) io->st.bytes += s->first_len, io->st.reads++;
    s->err = NULL;
    io->free_slots[io->n_free++] = idx;
    pthread_cond_broadcast(&io->state_cv);
}

/* ---- io_uring ---- */
#if HAVE_URING
static int uring_enter(pi2_io *io, unsigned to_submit, unsigned min_complete, unsigned flags) {
    return (int)syscall(__NR_io_uring_enter, io->ring_fd, to_submit, min_complete, flags, NULL, 0);
}

static int uring_init(pi2_io *io) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    io->ring_fd = (int)syscall(__NR_io_uring_setup, (unsigned)io->qd, &p);
    if (io->ring_fd < 0) return -1;
    io->sq_map_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    io->cq_map_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    int single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0; /* 5.4+: one mapping for both rings */
    if (single && io->cq_map_len > io->sq_map_len) io->sq_map_len = io->cq_map_len;
    io->sq_map = mmap(NULL, io->sq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, io->ring_fd,
                      IORING_OFF_SQ_RING);
    if (io->sq_map == MAP_FAILED) return io->sq_map = NULL, -1;
    io->cq_map = single ? io->sq_map
                        : mmap(NULL, io->cq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                               io->ring_fd, IORING_OFF_CQ_RING);
    if (io->cq_map == MAP_FAILED) return io->cq_map = NULL, -1;
    io->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    io->sqes = mmap(NULL, io->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, io->ring_fd,
                    IORING_OFF_SQES);
    if (io->sqes == MAP_FAILED) return io->sqes = NULL, -1;
    char *sq = io->sq_map, *cq = io->cq_map;
    io->sq_tail = (unsigned *)(sq + p.sq_off.tail), io->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    io->sq_array = (unsigned *)(sq + p.sq_off.array);
    io->cq_head = (unsigned *)(cq + p.cq_off.head), io->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    io->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask), io->cqes = cq + p.cq_off.cqes;
    return 0;
}

static void uring_free(pi2_io *io) {
    if (io->sqes) munmap(io->sqes, io->sqes_len);
    if (io->cq_map && io->cq_map != io->sq_map) munmap(io->cq_map, io->cq_map_len);
    if (io->sq_map) munmap(io->sq_map, io->sq_map_len);
    if (io->ring_fd >= 0) close(io->ring_fd);
}

/* Writes slot idx's read into the submission ring; the kernel sees it at the next flush. Never
 * overflows: the ring has >= queue_depth entries and each slot holds at most one. */
static void uring_queue(pi2_io *io, int idx) {
    io_slot *s = &io->slots[idx];
    unsigned tail = *io->sq_tail, i = tail & *io->sq_mask;
    struct io_uring_sqe *sqe = (struct io_uring_sqe *)io->sqes + i;
    memset(sqe, 0, sizeof *sqe);
    s->iov = (struct iovec){s->dst, s->len};
    sqe->opcode = IORING_OP_READV;
    sqe->fd = io->fd;
    sqe->off = s->off;
    sqe->addr = (uint64_t)(uintptr_t)&s->iov;
    sqe->len = 1;
    sqe->user_data = (uint64_t)idx;
    io->sq_array[i] = i;
    __atomic_store_n(io->sq_tail, tail + 1, __ATOMIC_RELEASE);
    io->unflushed++;
}

static int uring_flush(pi2_io *io) {
    while (io->unflushed > 0) {
        int r = uring_enter(io, (unsigned)io->unflushed, 0, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return pi2_set_error("%s: io_uring_enter: %s", io->path, strerror(errno)), -1;
        io->unflushed -= r;
    }
    return 0;
}

/* Takes every completion from the ring: resubmits the rest of short reads, completes the others. */
static int uring_harvest(pi2_io *io) {
    unsigned head = *io->cq_head, tail = __atomic_load_n(io->cq_tail, __ATOMIC_ACQUIRE);
    for (; head != tail; head++) {
        struct io_uring_cqe *cqe = (struct io_uring_cqe *)io->cqes + (head & *io->cq_mask);
        int idx = (int)cqe->user_data;
        if (slot_advance(io, &io->slots[idx], cqe->res)) complete(io, idx);
        else uring_queue(io, idx);
    }
    __atomic_store_n(io->cq_head, head, __ATOMIC_RELEASE);
    return uring_flush(io);
}

/* Sleeps in the kernel until a read completes, then harvests. Called with io->mu held and no other
 * thread harvesting; drops the lock while asleep so others can submit. */
static int uring_wait(pi2_io *io) {
    if (uring_flush(io)) return -1;
    io->kernel_waiter = 1;
    pthread_mutex_unlock(&io->mu);
    int r = uring_enter(io, 0, 1, IORING_ENTER_GETEVENTS), e = errno;
    pthread_mutex_lock(&io->mu);
    io->kernel_waiter = 0;
    pthread_cond_broadcast(&io->state_cv);
    if (r < 0 && e != EINTR) return pi2_set_error("%s: io_uring_enter: %s", io->path, strerror(e)), -1;
    return uring_harvest(io);
}
#else
static int uring_init(pi2_io *io) { return errno = ENOSYS, -1; }
static void uring_free(pi2_io *io) {}
static void uring_queue(pi2_io *io, int idx) {}
static int uring_flush(pi2_io *io) { return 0; }
static int uring_harvest(pi2_io *io) { return 0; }
static int uring_wait(pi2_io *io) { return 0; }
#endif

/* Makes progress while the caller waits (io->mu held): io_uring harvests, or sleeps in the kernel if no
 * other thread does; otherwise the pool threads post completions and we wait for the broadcast. */
static int wait_progress(pi2_io *io) {
    if (io->method == PI2_IO_URING && !io->kernel_waiter) return uring_wait(io);
    pthread_cond_wait(&io->state_cv, &io->mu);
    return 0;
}

/* ---- pread pool ---- */

static void *pool_main(void *arg) {
    pi2_io *io = arg;
    pthread_mutex_lock(&io->mu);
    int me = io->n_started++;
    if (io->cpus && io->n_cpus > 0) {
        int cpu = io->cpus[me % io->n_cpus];
        cpu_set_t set;
        CPU_ZERO(&set);
        if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &set);
        if (cpu < 0 || cpu >= CPU_SETSIZE || pthread_setaffinity_np(pthread_self(), sizeof set, &set))
            fprintf(stderr, "pi2: warning: I/O thread %d: cannot pin to cpu %d, left unpinned\n", me, cpu);
    }
    for (;;) {
        while (io->q_n == 0 && !io->stopping) pthread_cond_wait(&io->work_cv, &io->mu);
        if (io->q_n == 0) break; /* stopping, and every queued read is done */
        int idx = io->queue[io->q_head];
        io->q_head = (io->q_head + 1) % io->qd, io->q_n--;
        io_slot *s = &io->slots[idx];
        pthread_mutex_unlock(&io->mu);
        int done;
        do { /* the slot is this thread's alone until completed */
            ssize_t r = pread(io->fd, s->dst, s->len, (off_t)s->off);
            done = slot_advance(io, s, r < 0 ? -errno : (long)r);
        } while (!done);
        pthread_mutex_lock(&io->mu);
        complete(io, idx);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

/* ---- public interface ---- */

/* O_DIRECT's alignment, found by trying: the smallest power of two from 512 for which a read of that
 * length into a buffer aligned to exactly that is accepted. Also proves O_DIRECT reads work at all.
 * 0 when none does. */
static size_t probe_direct_align(int fd) {
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 16384, 16384)) return 0;
    size_t found = 0;
    for (size_t a = 512; a <= 8192 && !found; a *= 2)
        if (pread(fd, buf + a, a, 0) >= 0) found = a;
    free(buf);
    return found;
}

pi2_io *pi2_io_open(const char *path, const pi2_io_config *cfg) {
    pi2_io_config c = cfg ? *cfg : (pi2_io_config){0};
    if ((unsigned)c.method > PI2_IO_BUFFERED || c.queue_depth < 0 || c.queue_depth > 4096 || c.n_threads < 0 ||
        c.n_threads > 256 || c.n_cpus < 0) {
        pi2_set_error("%s: bad I/O configuration (method %d, queue depth %d, threads %d)", path, c.method,
                      c.queue_depth, c.n_threads);
        return NULL;
    }
    pi2_io *io = calloc(1, sizeof *io);
    if (!io) return pi2_set_error("%s: out of memory", path), NULL;
    io->ring_fd = -1;
    io->qd = c.queue_depth ? c.queue_depth : 64;
    io->cpus = c.cpus, io->n_cpus = c.n_cpus;
    io->path = strdup(path);
    io->slots = calloc((size_t)io->qd, sizeof *io->slots);
    io->free_slots = malloc((size_t)io->qd * sizeof(int));
    io->queue = malloc((size_t)io->qd * sizeof(int));
    io->done_cap = io->qd;
    io->done = malloc((size_t)io->done_cap * sizeof *io->done);
    int n_threads = c.n_threads ? c.n_threads : 2;
    io->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->state_cv, NULL);
    pthread_cond_init(&io->work_cv, NULL);
    io->fd = -1;
    if (!io->path || !io->slots || !io->free_slots || !io->queue || !io->done || !io->threads) {
        pi2_set_error("%s: out of memory", path);
        goto fail;
    }
    for (int i = 0; i < io->qd; i++) io->free_slots[i] = io->qd - 1 - i;
    io->n_free = io->qd;
    fault_from_env(io);

    int want_direct = !c.no_direct && c.method != PI2_IO_BUFFERED;
    io->fd = open(path, O_RDONLY | O_CLOEXEC | (want_direct ? O_DIRECT : 0));
    if (want_direct && io->fd >= 0) io->direct = (io->align = probe_direct_align(io->fd)) > 0;
    /* tmpfs and friends refuse O_DIRECT at open (EINVAL) or at the first read: read buffered there */
    if (want_direct && !io->direct && (io->fd >= 0 || errno == EINVAL)) {
        if (io->fd >= 0) close(io->fd);
        io->fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (!io->direct) io->align = 1;
    struct stat sb;
    if (io->fd < 0 || fstat(io->fd, &sb)) {
        pi2_set_error("%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode) && !S_ISBLK(sb.st_mode)) {
        pi2_set_error("%s: not a regular file", path);
        goto fail;
    }

    if (c.method == PI2_IO_URING || c.method == PI2_IO_AUTO) {
        if (uring_init(io) == 0) {
            io->method = PI2_IO_URING;
            return io;
        }
        int e = errno;
        uring_free(io);
        io->ring_fd = -1, io->sq_map = io->cq_map = io->sqes = NULL;
        if (c.method == PI2_IO_URING) {
            pi2_set_error("%s: io_uring unavailable: %s%s", path, strerror(e),
                          e == ENOSYS   ? " (kernel older than 5.1, built without it, or an emulator)"
                          : e == EPERM  ? " (blocked by seccomp, SELinux or kernel.io_uring_disabled)"
                                        : "");
            goto fail;
        }
    }
    io->method = io->direct ? PI2_IO_PREAD : PI2_IO_BUFFERED;
    for (; io->n_threads < n_threads; io->n_threads++) {
        int e = pthread_create(&io->threads[io->n_threads], NULL, pool_main, io);
        if (e) {
            pi2_set_error("%s: cannot start I/O thread: %s", path, strerror(e));
            goto fail;
        }
    }
    return io;
fail:
    pi2_io_close(io);
    return NULL;
}

pi2_io_method pi2_io_method_used(const pi2_io *io) { return io->method; }
int pi2_io_is_direct(const pi2_io *io) { return io->direct; }
size_t pi2_io_align(const pi2_io *io) { return io->align; }

static int submit(pi2_io *io, uint64_t off, size_t len, void *dst, uint64_t tag, int counted) {
    size_t a = io->align;
    if (len == 0 || !dst || off % a || len % a || (uintptr_t)dst % a) {
        pi2_set_error("%s: bad read of %zu bytes at offset %llu into %p (O_DIRECT needs multiples of %zu)",
                      io->path, len, (unsigned long long)off, dst, a);
        return -1;
    }
    pthread_mutex_lock(&io->mu);
    int rc = 0;
    if (io->n_free == 0) {
        uint64_t t0 = pi2_now_ns();
        while (io->n_free == 0 && rc == 0) rc = wait_progress(io);
        if (counted) io->st.wait_ns += pi2_now_ns() - t0;
    }
    if (rc == 0) rc = reserve_done(io);
    if (rc == 0) {
        int idx = io->free_slots[--io->n_free];
        io->slots[idx] = (io_slot){.off = off, .tag = tag, .first_off = off, .dst = dst, .len = len, .first_len = len};
        io->unreaped++;
        if (io->method == PI2_IO_URING) {
            uring_queue(io, idx);
            if (io->unflushed * 4 >= io->qd) rc = uring_flush(io); /* batches syscalls */
        } else {
            io->queue[(io->q_head + io->q_n++) % io->qd] = idx;
            pthread_cond_signal(&io->work_cv);
        }
    }
    pthread_mutex_unlock(&io->mu);
    return rc;
}

int pi2_io_submit(pi2_io *io, uint64_t off, size_t len, void *dst, uint64_t tag) {
    return submit(io, off, len, dst, tag, 1);
}
int pi2_io_submit_bg(pi2_io *io, uint64_t off, size_t len, void *dst, uint64_t tag) {
    return submit(io, off, len, dst, tag, 0);
}

int pi2_io_flush(pi2_io *io) {
    if (io->method != PI2_IO_URING) return 0;
    pthread_mutex_lock(&io->mu);
    int rc = uring_flush(io);
    pthread_mutex_unlock(&io->mu);
    return rc;
}

int pi2_io_reap(pi2_io *io, uint64_t *tags, int max, int wait) {
    int n = 0;
    uint64_t t0 = 0;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        /* completions first; a failed read ends the batch and is reported alone */
        while (n < max && io->done_n > 0) {
            io_done *d = &io->done[io->done_head];
            if (d->err && n > 0) break;
            io->done_head = (io->done_head + 1) % io->done_cap, io->done_n--, io->unreaped--;
            if (d->err) {
                pi2_set_error("%s", d->err);
                free_message(d->err);
                n = -1;
                break;
            }
            tags[n++] = d->tag;
        }
        if (n != 0 || max <= 0 || io->unreaped == 0) break;
        if (io->method == PI2_IO_URING && !io->kernel_waiter) { /* collect what is there, no sleep */
            if (uring_flush(io) || uring_harvest(io)) {
                n = -1;
                break;
            }
            if (io->done_n > 0) continue;
        }
        if (!wait) break;
        if (!t0) t0 = pi2_now_ns();
        if (wait_progress(io)) {
            n = -1;
            break;
        }
    }
    if (t0) io->st.wait_ns += pi2_now_ns() - t0;
    pthread_mutex_unlock(&io->mu);
    return n;
}

int pi2_io_in_flight(const pi2_io *io) {
    pi2_io *m = (pi2_io *)io; /* the lock is not part of the logical state */
    pthread_mutex_lock(&m->mu);
    int n = m->unreaped;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void pi2_io_stats_get(const pi2_io *io, pi2_io_stats *s) {
    pi2_io *m = (pi2_io *)io;
    pthread_mutex_lock(&m->mu);
    *s = m->st;
    pthread_mutex_unlock(&m->mu);
}

void pi2_io_close(pi2_io *io) {
    if (!io) return;
    pthread_mutex_lock(&io->mu);
    if (io->method == PI2_IO_URING) /* the kernel writes into the callers' buffers until these finish */
        while (io->n_free < io->qd)
            if (wait_progress(io)) break; /* a broken ring: nothing more can be waited for */
    io->stopping = 1;
    pthread_cond_broadcast(&io->work_cv);
    pthread_mutex_unlock(&io->mu);
    for (int i = 0; i < io->n_threads; i++) pthread_join(io->threads[i], NULL);
    uring_free(io);
    if (io->fd >= 0) close(io->fd);
    for (int i = 0; io->done && i < io->done_n; i++) {
        free_message(io->done[(io->done_head + i) % io->done_cap].err);
    }
    pthread_mutex_destroy(&io->mu);
    pthread_cond_destroy(&io->state_cv);
    pthread_cond_destroy(&io->work_cv);
    free(io->path), free(io->slots), free(io->free_slots), free(io->queue), free(io->done), free(io->threads);
    free(io);
}
