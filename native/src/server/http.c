/* The request-head parser (http.h). It never reads past len and never writes past req's fields;
 * every length is checked before a copy. */
#include "http.h"

#include <string.h>

#include "common.h"

/* RFC 9110 tchar: the characters of a method or header name. */
static int tchar(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int bad(int status, const char *msg) {
    pi2_set_error("%s", msg);
    return -status;
}

static int ieq(const char *a, size_t n, const char *lit) { return strlen(lit) == n && !strncasecmp(a, lit, n); }

/* The request line s[0..n) (no CRLF). */
static int request_line(const char *s, size_t n, pi2_http_request *req) {
    size_t i = 0;
    while (i < n && tchar((unsigned char)s[i])) i++;
    if (!i || i >= n || s[i] != ' ') return bad(400, "bad request line: expected METHOD SP TARGET SP VERSION");
    if (i >= sizeof req->method) return bad(501, "unknown method");
    memcpy(req->method, s, i);
    req->method[i] = 0;
    const size_t t = ++i;
    while (i < n && s[i] != ' ') {
        const unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f) return bad(400, "bad byte in the request target");
        i++;
    }
    if (i >= n) return bad(400, "bad request line: no HTTP version");
    if (s[t] != '/') return bad(400, "the request target must start with '/'");
    if (i - t > PI2_HTTP_MAX_TARGET) return bad(414, "request target too long");
    size_t plen = i - t;
    const char *q = memchr(s + t, '?', plen);
    if (q) plen = (size_t)(q - (s + t));
    memcpy(req->path, s + t, plen);
    req->path[plen] = 0;
    i++;
    if (n - i != 8 || memcmp(s + i, "HTTP/1.", 7)) return bad(n - i >= 5 && !memcmp(s + i, "HTTP/", 5) ? 505 : 400, "bad HTTP version");
    if (s[i + 7] != '0' && s[i + 7] != '1') return bad(505, "HTTP version not supported (HTTP/1.0 or 1.1)");
    req->minor = s[i + 7] - '0';
    return 0;
}

/* One header line s[0..n) (no CRLF). */
static int header_line(const char *s, size_t n, const pi2_http_limits *lim, pi2_http_request *req) {
    if (s[0] == ' ' || s[0] == '\t') return bad(400, "obsolete header line folding");
    size_t i = 0;
    while (i < n && tchar((unsigned char)s[i])) i++;
    if (!i || i >= n || s[i] != ':') return bad(400, "bad header line: expected Name: value");
    const char *name = s;
    const size_t nlen = i++;
    while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
    size_t e = n;
    while (e > i && (s[e - 1] == ' ' || s[e - 1] == '\t')) e--;
    for (size_t k = i; k < e; k++) {
        const unsigned char c = (unsigned char)s[k];
        if ((c < 0x20 && c != '\t') || c == 0x7f) return bad(400, "control byte in a header value");
    }
    const char *v = s + i;
    const size_t vlen = e - i;
    if (ieq(name, nlen, "Content-Length")) {
        if (!vlen || vlen > 18) return bad(400, "bad Content-Length");
        long long cl = 0;
        for (size_t k = 0; k < vlen; k++) {
            if (v[k] < '0' || v[k] > '9') return bad(400, "bad Content-Length");
            cl = cl * 10 + (v[k] - '0');
        }
        if (req->content_length >= 0 && req->content_length != cl) return bad(400, "conflicting Content-Length headers");
        req->content_length = cl;
        if ((unsigned long long)cl > lim->max_body) {
            pi2_set_error("request body of %lld bytes is over the limit of %zu", cl, lim->max_body);
            return -413;
        }
    } else if (ieq(name, nlen, "Transfer-Encoding")) {
        return bad(501, "Transfer-Encoding is not supported: send Content-Length");
    } else if (ieq(name, nlen, "Expect")) {
        req->expect_continue = ieq(v, vlen, "100-continue");
    } else if (ieq(name, nlen, "Authorization")) {
        const size_t k = vlen < sizeof req->auth ? vlen : sizeof req->auth - 1;
        memcpy(req->auth, v, k);
        req->auth[k] = 0;
    }
    return 0;
}

int pi2_http_parse_head(const char *buf, size_t len, const pi2_http_limits *lim, pi2_http_request *req) {
    memset(req, 0, sizeof *req);
    req->content_length = -1;
    const size_t scan = len < lim->max_head ? len : lim->max_head;
    /* Every CR must start CRLF and every LF end one; stop at the first empty line. */
    size_t end = 0;
    for (size_t i = 0; i < scan; i++) {
        const char c = buf[i];
        if (c == '\r') {
            if (i + 1 >= scan) break; /* the LF may come with the next read */
            if (buf[i + 1] != '\n') return bad(400, "bare CR in the request head");
        } else if (c == '\n') {
            if (!i || buf[i - 1] != '\r') return bad(400, "bare LF in the request head (lines end with CRLF)");
            if (i >= 3 && buf[i - 2] == '\n' && buf[i - 3] == '\r') {
                end = i + 1;
                break;
            }
        } else if (c == 0) {
            return bad(400, "NUL byte in the request head");
        }
    }
    if (!end) {
        if (len >= lim->max_head) {
            pi2_set_error("request head over the limit of %zu bytes", lim->max_head);
            return -431;
        }
        return 0;
    }
    req->head_len = end;
    int lines = 0;
    for (size_t s = 0; s < end - 2;) {
        const char *nl = memchr(buf + s, '\n', end - s);
        const size_t n = (size_t)(nl - (buf + s)) - 1; /* without CRLF */
        if (!n) return bad(400, "empty line in the request head");
        const int rc = lines++ == 0 ? request_line(buf + s, n, req) : header_line(buf + s, n, lim, req);
        if (rc) return rc;
        if (lines > PI2_HTTP_MAX_HEADERS + 1) return bad(431, "too many header lines");
        s += n + 2;
    }
    if (!lines) return bad(400, "empty request");
    return 1;
}

const char *pi2_http_reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}
