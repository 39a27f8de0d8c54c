/* A strict, bounded HTTP/1.1 request-head parser for `pi2-engine serve` (serve.c reads the bytes;
 * this file only judges them, so the fuzzer runs it on its own: native/fuzz/target_http.c).
 * Accepted: "METHOD SP /target SP HTTP/1.1|HTTP/1.0 CRLF", then header lines "Name: value CRLF", then
 * CRLF. Refused with a status: a bare LF or CR, control bytes, obs-fold (continuation lines), a head
 * over max_head bytes or PI2_HTTP_MAX_HEADERS lines (431), a target over 255 bytes (414), other
 * versions (505), Transfer-Encoding (501: bodies must say their Content-Length), a bad or repeated
 * Content-Length (400) or one over max_body (413). */
#ifndef PI2_SERVER_HTTP_H
#define PI2_SERVER_HTTP_H

#include <stddef.h>

#define PI2_HTTP_MAX_HEADERS 64
#define PI2_HTTP_MAX_TARGET 255

typedef struct {
    size_t max_head, max_body;
} pi2_http_limits;

typedef struct {
    char method[8];
    char path[PI2_HTTP_MAX_TARGET + 1]; /* the target up to '?' */
    int minor;                          /* HTTP/1.minor */
    long long content_length;           /* -1: none given */
    int expect_continue;                /* "Expect: 100-continue": the client waits for a go-ahead before its body */
    char auth[256];                     /* the Authorization value ("" when absent; longer ones are cut and so fail) */
    size_t head_len;                    /* bytes of the head, its final CRLF CRLF included */
} pi2_http_request;

/* Judge buf[0..len): 0 when the head is not complete yet (read more), 1 when it is complete and
 * parsed into req, or -STATUS (-400, -413, -414, -431, -501, -505) with the reason in pi2_set_error. */
int pi2_http_parse_head(const char *buf, size_t len, const pi2_http_limits *lim, pi2_http_request *req);
/* The reason phrase of a status this server sends. */
const char *pi2_http_reason(int status);

#endif
