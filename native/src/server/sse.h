/* Server-sent events (the WHATWG event-stream format) as OpenAI streams them: each event is one
 * "data: JSON" line and a blank line, and the stream ends with "data: [DONE]". The JSON comes from
 * buf.h's writer, which escapes every newline, so an event never needs a second data line. */
#ifndef PI2_SERVER_SSE_H
#define PI2_SERVER_SSE_H

#include "buf.h"

/* The response head of an event stream (no Content-Length: the stream ends when the server closes). */
void pi2_sse_head(pi2_buf *out);
/* One event carrying json[0..n). A payload with a CR or LF would split the event, so it is refused: -1. */
int pi2_sse_event(pi2_buf *out, const char *json, size_t n);
void pi2_sse_done(pi2_buf *out);

#endif
