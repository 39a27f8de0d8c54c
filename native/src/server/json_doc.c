/* The bounded JSON tree reader (json_doc.h). Recursive descent with an explicit depth bound, so a
 * body of 100 000 '[' is an error, not a stack overflow. */
#include "json_doc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "common.h"
#include "json_flat.h"

typedef struct {
    const char *what, *s;
    size_t n, i;
} cur;

static void ws(cur *c) {
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\r' || c->s[c->i] == '\n')) c->i++;
}

static int fail(cur *c, const char *msg) {
    pi2_set_error("%s: %s at byte %zu", c->what, msg, c->i);
    return -1;
}

static int hex4(cur *c, uint32_t *out) { /* json_flat.h's, at the cursor */
    if (pi2_json_hex4(c->s + c->i, c->n - c->i, out)) return -1;
    c->i += 4;
    return 0;
}

/* A string at the cursor (after its '"') -> malloc'd UTF-8; decoded text is never longer than its
 * source, so one allocation of the rest of the input bounds it... but that is O(n^2) memory over many
 * strings, so the string's extent is found first. */
static int string(cur *c, char **out, size_t *out_len) {
    size_t end = c->i;
    while (end < c->n && c->s[end] != '"') end += c->s[end] == '\\' ? 2 : 1;
    if (end >= c->n) return fail(c, "unterminated string");
    char *b = malloc(end - c->i + 1);
    if (!b) return fail(c, "out of memory");
    size_t o = 0;
    while (c->s[c->i] != '"') {
        const unsigned char ch = (unsigned char)c->s[c->i];
        if (ch < 0x20) { free(b); return fail(c, ch ? "raw control byte in a string" : "NUL byte in a string"); }
        if (ch >= 0x80) {
            const int k = pi2_utf8_valid_len((const unsigned char *)c->s + c->i, end - c->i);
            if (!k) { free(b); return fail(c, "invalid UTF-8 in a string"); }
            memcpy(b + o, c->s + c->i, (size_t)k);
            o += (size_t)k, c->i += (size_t)k;
            continue;
        }
        c->i++;
        if (ch != '\\') { b[o++] = (char)ch; continue; }
        const char e = c->s[c->i++];
        const int byte = pi2_json_escape_byte(e); /* json_flat.h's, as the \u pieces are */
        if (byte >= 0) { b[o++] = (char)byte; continue; }
        uint32_t cp, lo;
        switch (e) {
        case 'u':
            if (hex4(c, &cp)) { free(b); return fail(c, "bad \\u escape"); }
            if (cp >= 0xD800 && cp <= 0xDBFF) { /* a high surrogate needs its low half */
                if (c->i + 6 > end || c->s[c->i] != '\\' || c->s[c->i + 1] != 'u') { free(b); return fail(c, "lone surrogate"); }
                c->i += 2;
                if (hex4(c, &lo) || lo < 0xDC00 || lo > 0xDFFF) { free(b); return fail(c, "lone surrogate"); }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(b);
                return fail(c, "lone surrogate");
            }
            if (!cp) { free(b); return fail(c, "NUL (\\u0000) in a string"); }
            o += pi2_utf8_put(b + o, cp);
            break;
        default: free(b); return fail(c, "bad escape");
        }
    }
    c->i++;
    b[o] = 0;
    *out = b;
    *out_len = o;
    return 0;
}

static int number(cur *c, pi2_jd *d) {
    const size_t s = c->i;
    if (c->i < c->n && c->s[c->i] == '-') c->i++;
    if (c->i >= c->n || c->s[c->i] < '0' || c->s[c->i] > '9') return fail(c, "bad number");
    if (c->s[c->i] == '0') c->i++;
    else while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
    if (c->i < c->n && c->s[c->i] == '.') {
        c->i++;
        const size_t f = c->i;
        while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
        if (c->i == f) return fail(c, "bad number");
    }
    if (c->i < c->n && (c->s[c->i] == 'e' || c->s[c->i] == 'E')) {
        c->i++;
        if (c->i < c->n && (c->s[c->i] == '+' || c->s[c->i] == '-')) c->i++;
        const size_t f = c->i;
        while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
        if (c->i == f) return fail(c, "bad number");
    }
    if (c->i - s > 64) return fail(c, "number too long");
    if (!(d->str = malloc(c->i - s + 1))) return fail(c, "out of memory");
    memcpy(d->str, c->s + s, c->i - s);
    d->str[c->i - s] = 0;
    d->len = c->i - s;
    d->num = strtod(d->str, NULL);
    d->kind = PI2_JD_NUMBER;
    return 0;
}

static int value(cur *c, pi2_jd *d, int depth);

static int members(cur *c, pi2_jd *d, int depth, int object) {
    const char close = object ? '}' : ']';
    c->i++;
    ws(c);
    if (c->i < c->n && c->s[c->i] == close) {
        c->i++;
        return 0;
    }
    pi2_jd **tail = &d->child;
    for (;;) {
        pi2_jd *m = calloc(1, sizeof *m);
        if (!m) return fail(c, "out of memory");
        *tail = m;
        tail = &m->next;
        d->n++;
        ws(c);
        if (object) {
            size_t klen;
            if (c->i >= c->n || c->s[c->i] != '"') return fail(c, "expected a key");
            c->i++;
            if (string(c, &m->key, &klen)) return -1;
            for (const pi2_jd *o = d->child; o != m; o = o->next)
                if (!strcmp(o->key, m->key)) return fail(c, "repeated key");
            ws(c);
            if (c->i >= c->n || c->s[c->i] != ':') return fail(c, "expected ':'");
            c->i++;
        }
        if (value(c, m, depth + 1)) return -1;
        ws(c);
        if (c->i < c->n && c->s[c->i] == ',') { c->i++; continue; }
        if (c->i < c->n && c->s[c->i] == close) { c->i++; return 0; }
        return fail(c, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int literal(cur *c, const char *lit, pi2_jd *d, pi2_jd_kind k) {
    const size_t n = strlen(lit);
    if (c->n - c->i < n || memcmp(c->s + c->i, lit, n)) return fail(c, "unexpected token");
    c->i += n;
    d->kind = k;
    return 0;
}

static int value(cur *c, pi2_jd *d, int depth) {
    if (depth > PI2_JD_MAX_DEPTH) return fail(c, "nested too deeply");
    ws(c);
    if (c->i >= c->n) return fail(c, "unexpected end");
    switch (c->s[c->i]) {
    case '{': d->kind = PI2_JD_OBJECT; return members(c, d, depth, 1);
    case '[': d->kind = PI2_JD_ARRAY; return members(c, d, depth, 0);
    case '"': c->i++; d->kind = PI2_JD_STRING; return string(c, &d->str, &d->len);
    case 't': return literal(c, "true", d, PI2_JD_TRUE);
    case 'f': return literal(c, "false", d, PI2_JD_FALSE);
    case 'n': return literal(c, "null", d, PI2_JD_NULL);
    default: return number(c, d);
    }
}

pi2_jd *pi2_jd_parse(const char *what, const char *text, size_t len) {
    cur c = {what, text, len, 0};
    pi2_jd *d = calloc(1, sizeof *d);
    if (!d) {
        pi2_set_error("%s: out of memory", what);
        return NULL;
    }
    if (value(&c, d, 0) == 0) {
        ws(&c);
        if (c.i == c.n) return d;
        fail(&c, "trailing bytes after the document");
    }
    pi2_jd_free(d);
    return NULL;
}

void pi2_jd_free(pi2_jd *d) {
    while (d) {
        pi2_jd *next = d->next;
        pi2_jd_free(d->child);
        free(d->key);
        free(d->str);
        free(d);
        d = next;
    }
}

const pi2_jd *pi2_jd_get(const pi2_jd *obj, const char *key) {
    if (!obj || obj->kind != PI2_JD_OBJECT) return NULL;
    for (const pi2_jd *m = obj->child; m; m = m->next)
        if (!strcmp(m->key, key)) return m;
    return NULL;
}

const char *pi2_jd_kind_name(pi2_jd_kind k) {
    static const char *const names[] = {"null", "false", "true", "a number", "a string", "an array", "an object"};
    return names[k];
}
