/* Fuzz target "http": what a network client sends `pi2-engine serve`, one request's bytes: the head
 * through http.c's parser (also on the prefixes the server sees while the bytes come in, which must
 * agree with the whole), then a complete body through openai.c's request reader (json_doc.c, the chat
 * template). The mutator knows the request's lines: it swaps in hostile header lines (bare CR/LF, NUL,
 * folding, conflicting lengths, Transfer-Encoding, long values), rewrites Content-Length, the method,
 * target and version, and splices JSON fragments that broke readers into the body. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fuzz.h"
#include "http.h"
#include "openai.h"

static const pi2_http_limits lim = {16u << 10, 64u << 10};

static int run_http(const uint8_t *data, size_t len) {
    const char *b = (const char *)data;
    pi2_http_request req, again;
    const int rc = pi2_http_parse_head(b, len, &lim, &req);
    if (rc < 0) {
        if (rc != -400 && rc != -413 && rc != -414 && rc != -431 && rc != -501 && rc != -505) abort();
        fuzz_check_error_line("http");
        return 0;
    }
    if (rc == 0) return 0; /* incomplete: the server reads on */
    if (req.head_len > len || req.path[0] != '/' || req.content_length > (long long)lim.max_body) abort();
    /* The server parses every prefix as it grows: the head ends where the whole input says it does. */
    if (pi2_http_parse_head(b, req.head_len, &lim, &again) != 1 || again.head_len != req.head_len ||
        strcmp(again.path, req.path) || again.content_length != req.content_length)
        abort();
    if (pi2_http_parse_head(b, req.head_len - 1, &lim, &again) > 0) abort();
    const size_t body = req.content_length > 0 ? (size_t)req.content_length : 0;
    if (len - req.head_len < body) return 1;
    pi2_oai_request r;
    const int chat = !strcmp(req.path, "/v1/chat/completions");
    const int st = pi2_oai_parse(b + req.head_len, body, chat, (pi2_chat_template)(len % 4), 4096, &r);
    if (!st && (!r.prompt.len || strlen(r.prompt.p) != r.prompt.len)) abort(); /* a NUL got through */
    pi2_oai_free(&r);
    if (st && st != 400 && st != 500) abort();
    if (st) fuzz_check_error_line("http");
    return !st;
}

static const char *lines[] = {
    "Content-Length: 0", "Content-Length: 18446744073709551616", "Content-Length: -1", "Content-Length:  12 ",
    "Content-Length: 1\r\nContent-Length: 2", "Transfer-Encoding: chunked", "Expect: 100-continue",
    "Authorization: Bearer k", "X: a\rb", "X: a\nb", " folded", "X:", ":", "X : y", "X: \x7f", "Host: x\x00y",
    "GET / HTTP/1.1", "POST /v1/chat/completions HTTP/1.1", "POST /v1/completions HTTP/1.0",
    "GET /health HTTP/2.0", "GET http://x/ HTTP/1.1", "GET /?q=1 HTTP/1.1", "PROPFIND /v1/models HTTP/1.1", "",
};

static const char *fragments[] = {
    "\"\\u0000\"", "\"\\ud800\"", "\"\\udc00\\ud800\"", "\"\xff\xfe\"", "\"\xc0\x80\"", "\"\xed\xa0\x80\"", "1e999",
    "-0", "[[[[[[[[[[[[[[[[[[[[", "{\"a\":", "null", "true", "\"<|im_start|>\"", "{\"role\": \"user\", \"content\": []}",
    "[{\"type\": \"text\", \"text\": \"x\"}]", "\"max_tokens\": 99999999999, ", "\"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\"], ",
    "\"n\": 2, ", "\"temperature\": -1, ", "\"seed\": 1.5, ", "\"x\": 1, \"x\": 2, ", "\"stream\": \"yes\", ",
};

static size_t splice(uint8_t *b, size_t len, size_t cap, size_t at, size_t cut, const char *with, size_t n) {
    if (at > len) at = len;
    if (cut > len - at) cut = len - at;
    if (len - cut + n > cap) return len;
    memmove(b + at + n, b + at + cut, len - at - cut);
    memcpy(b + at, with, n);
    return len - cut + n;
}

/* [start, end) of the k-th line (CRLF excluded), or -1. */
static int nth_line(const uint8_t *b, size_t len, uint64_t k, size_t *s, size_t *e) {
    size_t n = 0;
    for (size_t i = 0; i + 1 < len; i++) n += b[i] == '\r' && b[i + 1] == '\n';
    if (!n) return -1;
    k %= n;
    size_t start = 0;
    for (size_t i = 0; i + 1 < len; i++)
        if (b[i] == '\r' && b[i + 1] == '\n') {
            if (!k--) {
                *s = start, *e = i;
                return 0;
            }
            start = i + 2;
        }
    return -1;
}

static size_t body_start(const uint8_t *b, size_t len) {
    for (size_t i = 0; i + 3 < len; i++)
        if (!memcmp(b + i, "\r\n\r\n", 4)) return i + 4;
    return len;
}

static size_t mutate_http(fuzz_rng *r, uint8_t *b, size_t len, size_t cap) {
    size_t s, e;
    char tmp[64];
    const size_t body = body_start(b, len);
    switch (fuzz_below(r, 9)) {
    case 0: case 1: { /* a line replaced */
        if (nth_line(b, body, fuzz_next(r), &s, &e)) break;
        const char *l = lines[fuzz_below(r, sizeof lines / sizeof lines[0])];
        return splice(b, len, cap, s, e - s, l, strlen(l));
    }
    case 2: { /* a line added */
        if (nth_line(b, body, fuzz_next(r), &s, &e)) break;
        const char *l = lines[fuzz_below(r, sizeof lines / sizeof lines[0])];
        int n = snprintf(tmp, sizeof tmp, "%.50s\r\n", l);
        return splice(b, len, cap, e + 2 <= len ? e + 2 : len, 0, tmp, (size_t)n);
    }
    case 3: { /* Content-Length made right, or an interesting number */
        int n = snprintf(tmp, sizeof tmp, "Content-Length: %llu", fuzz_below(r, 2) ? (unsigned long long)(len - body)
                                                                                    : (unsigned long long)fuzz_interesting(r, len - body));
        if (nth_line(b, body, fuzz_next(r), &s, &e)) break;
        return splice(b, len, cap, s, e - s, tmp, (size_t)n);
    }
    case 4: case 5: { /* a JSON fragment into the body */
        const char *f = fragments[fuzz_below(r, sizeof fragments / sizeof fragments[0])];
        const size_t at = body + fuzz_below(r, len - body + 1);
        return splice(b, len, cap, at, fuzz_below(r, 3) ? 0 : fuzz_below(r, 8), f, strlen(f));
    }
    case 6: return fuzz_insert_run(r, b, len, cap, 20000, 'a', '['); /* a long header value or a long body */
    case 7: return fuzz_below(r, len + 1); /* truncated */
    default:
        if (fuzz_below(r, 2)) fuzz_flip_bytes(r, b, len);
        else return fuzz_below(r, 2) ? fuzz_insert_bytes(r, b, len, cap) : fuzz_erase_bytes(r, b, len);
    }
    return len;
}

const fuzz_target fuzz_target_http = {"http", "pi2-engine serve's requests: http.c's head parser, openai.c and json_doc.c on the body",
                                      run_http, mutate_http, NULL};
