/* The engine's JSONL event stream (--events FILE): one object per line, times in seconds on the
 * monotonic clock. This file writes lines; what they hold (the kinds start, token, turn, named, summary
 * and their fields) is event_schema.h's table. The host parses them (pi2cli/engines/pi2/events.py). */
#ifndef PI2_EVENTS_H
#define PI2_EVENTS_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *f;          /* NULL: events off */
    const char *path; /* for error lines */
    int err;          /* the errno of the first failed write, 0 while all is well */
    uint64_t flushed_ns; /* when a write last went out (pi2_events_line) */
} pi2_events;

/* The file is streamed (the host tails it while the run goes), so it is opened in place under the
 * rules of base/safe_write.h: a regular file or nothing at the path, never a link, device or FIFO. */
int pi2_events_open(pi2_events *ev, const char *path);
/* Flush, fsync and close; -1 with an error when any write failed (a run whose events were lost must
 * not exit 0). */
int pi2_events_close(pi2_events *ev);
/* One line (a JSON object, without its newline; the newline and flush happen here); -1 with an error
 * "--events PATH: write failed: REASON" when this or an earlier write failed. An urgent line (every kind but token) goes out at
 * once; a token line waits in the stream's buffer until PI2_EVENTS_FLUSH_MS have passed since the last
 * write went out, or until the next urgent line: a write per token cost ~30 us of the calling thread's
 * time between two forward passes (this VM), while the host tails the file for turns, not tokens. */
#define PI2_EVENTS_FLUSH_MS 20
int pi2_events_line(pi2_events *ev, const char *line, int urgent);
/* -1 with that error when a write to the events file (also a direct fprintf to ev->f) has failed. */
int pi2_events_check(pi2_events *ev);
double pi2_seconds(uint64_t ns);
/* Bytes this process read from storage (/proc/self/io read_bytes), 0 if unknown. */
uint64_t pi2_io_read_bytes(void);
/* Write s as a JSON string literal (with quotes) into out (size n); truncates safely. */
void pi2_json_string(char *out, size_t n, const char *s);

#endif
