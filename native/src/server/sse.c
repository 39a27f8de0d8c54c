/* The event-stream writer (sse.h). */
#include "sse.h"

#include <string.h>

void pi2_sse_head(pi2_buf *out) {
    pi2_buf_puts(out, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                      "X-Accel-Buffering: no\r\nConnection: close\r\n\r\n");
}

int pi2_sse_event(pi2_buf *out, const char *json, size_t n) {
    if (memchr(json, '\n', n) || memchr(json, '\r', n)) return -1;
    pi2_buf_add(out, "data: ", 6);
    pi2_buf_add(out, json, n);
    pi2_buf_add(out, "\n\n", 2);
    return 0;
}

void pi2_sse_done(pi2_buf *out) { pi2_buf_puts(out, "data: [DONE]\n\n"); }
