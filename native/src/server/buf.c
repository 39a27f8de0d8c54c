/* The server's byte buffer and JSON strings (buf.h). */
#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int reserve(pi2_buf *b, size_t more) {
    if (b->oom) return -1;
    if (b->len + more + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void pi2_buf_add(pi2_buf *b, const char *s, size_t n) {
    if (reserve(b, n)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void pi2_buf_puts(pi2_buf *b, const char *s) { pi2_buf_add(b, s, strlen(s)); }

void pi2_buf_printf(pi2_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        pi2_buf_add(b, tmp, (size_t)n);
        return;
    }
    if (reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void pi2_buf_free(pi2_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int pi2_utf8_valid_len(const unsigned char *s, size_t n) {
    if (!n) return 0;
    const unsigned c = s[0];
    int k;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) k = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) k = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) k = 4, min = 0x10000;
    else return 0;
    if (n < (size_t)k) return 0;
    unsigned cp = c & (0x7F >> k);
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0; /* overlong, surrogate */
    return k;
}

size_t pi2_utf8_incomplete_tail(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        const size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return want > back ? back : 0;
    }
    return 0;
}

void pi2_buf_json_str(pi2_buf *b, const char *s, size_t n) {
    pi2_buf_add(b, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        const unsigned c = u[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            pi2_buf_add(b, e, 2);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            pi2_buf_printf(b, "\\u%04x", c);
            i++;
        } else if (c < 0x80) {
            pi2_buf_add(b, s + i, 1);
            i++;
        } else {
            const int k = pi2_utf8_valid_len(u + i, n - i);
            if (k) pi2_buf_add(b, s + i, (size_t)k);
            else pi2_buf_puts(b, "\\ufffd");
            i += k ? (size_t)k : 1;
        }
    }
    pi2_buf_add(b, "\"", 1);
}
