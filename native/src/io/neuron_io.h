/* The neuron store's reader: many small reads of neuron bundles from one file, kept in flight at once
 * so flash storage works at its queue depth instead of one read at a time.
 *
 * Three ways to read, chosen at open: io_uring (one ring, no extra threads), a pool of pread threads,
 * or the same pool without O_DIRECT ("buffered"). O_DIRECT bypasses the page cache, so the engine's
 * memory budget covers everything the run holds; where the file system refuses it (tmpfs), reads go
 * through the page cache and pi2_io_is_direct() says so.
 *
 * Usage: submit reads (each with a tag), pi2_io_flush() after a batch, then pi2_io_reap() tags as
 * they complete. Submit and reap are thread-safe; any thread may reap any thread's reads. */
#ifndef PI2_NEURON_IO_H
#define PI2_NEURON_IO_H

#include <stddef.h>
#include <stdint.h>

typedef enum { PI2_IO_AUTO = 0, PI2_IO_URING, PI2_IO_PREAD, PI2_IO_BUFFERED } pi2_io_method;

typedef struct {
    pi2_io_method method; /* AUTO: io_uring (O_DIRECT where allowed), else the pread pool */
    int queue_depth;      /* most reads in flight; 0 = 64 */
    int n_threads;        /* pread-pool threads; 0 = 2 */
    const int *cpus;      /* CPUs the pread-pool threads are pinned to (round robin); NULL = unpinned.
                             io_uring ignores it: without SQPOLL it runs no threads of its own. */
    int n_cpus;
    int no_direct; /* 1: never O_DIRECT */
} pi2_io_config;

typedef struct pi2_io pi2_io;

/* cfg NULL = all defaults. NULL + pi2_set_error("PATH: why") on failure. An explicit PI2_IO_URING that
 * the kernel refuses (ENOSYS: old kernel or qemu-user; EPERM: seccomp/SELinux) fails; AUTO falls back.
 * The pread pool without O_DIRECT reports itself as PI2_IO_BUFFERED. */
pi2_io *pi2_io_open(const char *path, const pi2_io_config *cfg);
pi2_io_method pi2_io_method_used(const pi2_io *io);
int pi2_io_is_direct(const pi2_io *io);
const char *pi2_io_method_name(pi2_io_method m); /* "auto", "io_uring", "pread", "buffered" */

/* Alignment that offset, length and destination of every read must have: the O_DIRECT alignment
 * (512 or the device's logical block size, found by trying) when direct, else 1. */
size_t pi2_io_align(const pi2_io *io);

/* Queues a read of len (> 0) bytes at file offset off into dst; tag comes back from pi2_io_reap once
 * all len bytes are there (short reads are resumed internally). With queue_depth reads in flight it
 * waits for one to complete (keeping the completion for pi2_io_reap). io_uring collects submissions
 * and hands them to the kernel every queue_depth/4 reads, in pi2_io_flush and in pi2_io_reap.
 * 0, or -1 on bad arguments (unaligned for O_DIRECT, len 0) or a failed hand-over to the kernel. */
int pi2_io_submit(pi2_io *io, uint64_t off, size_t len, void *dst, uint64_t tag);
/* The same from a thread that only issues reads (the sparse engine's submitter): its waits for a free
 * slot stall no computation, so they are not counted in wait_ns. */
int pi2_io_submit_bg(pi2_io *io, uint64_t off, size_t len, void *dst, uint64_t tag);
int pi2_io_flush(pi2_io *io); /* hands queued reads to the kernel now (io_uring); 0 or -1 */

/* Up to max completed tags into tags[]; returns the count. wait=1 blocks until at least one completes
 * if any read is queued or in flight (returns 0 at once if none is). -1 for a failed read (one call
 * per failed read; its tag is not returned): the error names the file, offset, length and errno or
 * "short read at end of file". */
int pi2_io_reap(pi2_io *io, uint64_t *tags, int max, int wait);
int pi2_io_in_flight(const pi2_io *io); /* submitted and not yet returned by reap */

typedef struct {
    uint64_t bytes, reads; /* completed successfully */
    uint64_t wait_ns;      /* time blocked in reap(wait=1) or in a full submit */
} pi2_io_stats;
void pi2_io_stats_get(const pi2_io *io, pi2_io_stats *s);

/* Waits for reads in flight (their destinations are complete afterwards), frees everything. NULL ok. */
void pi2_io_close(pi2_io *io);

#endif
