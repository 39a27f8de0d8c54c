/* Writing output files without touching anything but the file asked for.
 *
 * A path the engine writes to may name something planted there (a symlink to another file, a device
 * node, a FIFO that blocks, a directory) or sit on a disk that fills up. The rules, for every file the
 * engine writes:
 *   - the target is a regular file or does not exist; a symlink, device, FIFO, socket or directory at
 *     the target is refused in one line and left as it is;
 *   - nothing is written through a link (O_NOFOLLOW; temp files are created with O_EXCL);
 *   - every write, the fsync and the close are checked: an error is one line, never a silent loss.
 *
 * Whole files (eval --logits-out) go through pi2_safe_write: a temp file created exclusively in the
 * target's directory, renamed over the target only when complete, removed on every failure, so the
 * target holds the old file or the new one. Streams that a reader tails while the run goes (--events)
 * cannot be renamed into place at the end: pi2_open_stream opens the target itself under the same rules.
 */
#ifndef PI2_SAFE_WRITE_H
#define PI2_SAFE_WRITE_H

#include <stddef.h>
#include <stdio.h>

/* 0 when `path` is absent or a regular file; else -1 with an error "WHAT PATH: is a symbolic link
 * (...)" (or a device, FIFO, socket, directory). */
int pi2_check_output_target(const char *path, const char *what);

/* Write n bytes to path atomically (temp + fsync + rename). 0, or -1 with one error line naming
 * `what` and path; on failure the target is untouched and no temp file is left. */
int pi2_safe_write(const char *path, const void *data, size_t n, const char *what);

/* Open path for a stream of lines (truncated, created 0666 & ~umask), refusing what
 * pi2_check_output_target refuses, also when the target changes between the check and the open
 * (O_NOFOLLOW | O_NONBLOCK, then fstat of what was opened). NULL with an error on failure. */
FILE *pi2_open_stream(const char *path, const char *what);

/* Flush, fsync and close a stream from pi2_open_stream, reporting any write error it met (ferror).
 * 0, or -1 with an error "WHAT PATH: reason". f may be NULL (0). */
int pi2_close_stream(FILE *f, const char *path, const char *what);

#endif
