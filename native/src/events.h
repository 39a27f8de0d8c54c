/* The engine's JSONL event stream (--events FILE): one object per line, times in seconds on the
 * monotonic clock. Kinds: "start", "token" (per generated token), "turn" (TTFT, prefill and decode
 * rates), "summary" (peak RSS, bytes read from storage). The host parses these (pi2cli/engines/pi2.py). */
#ifndef PI2_EVENTS_H
#define PI2_EVENTS_H

#include <stdint.h>
#include <stdio.h>

typedef struct {
    FILE *f; /* NULL: events off */
} pi2_events;

int pi2_events_open(pi2_events *ev, const char *path);
void pi2_events_close(pi2_events *ev);
/* printf-style line; the caller writes the JSON object body, the newline and flush happen here. */
void pi2_events_emit(pi2_events *ev, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
double pi2_seconds(uint64_t ns);
/* Bytes this process read from storage (/proc/self/io read_bytes), 0 if unknown. */
uint64_t pi2_io_read_bytes(void);
/* Write s as a JSON string literal (with quotes) into out (size n); truncates safely. */
void pi2_json_string(char *out, size_t n, const char *s);

#endif
