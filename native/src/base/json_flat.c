/* A strict reader of one flat JSON object whose values are strings, numbers or booleans: the shape
 * of a chat request (chat_request.c) and of an execution plan (plan.c). Not a general JSON library:
 * no nesting, no null; string escapes (including \\uXXXX surrogate pairs) are decoded to UTF-8;
 * anything else is rejected with a message naming the problem and its byte offset. */
#include "json_flat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
    const char *what; /* prefix of error messages */
    const char *s;
    size_t n, i;
} cursor;

static void skip_ws(cursor *c) {
    while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\r' || c->s[c->i] == '\n'))
        c->i++;
}

static int expect(cursor *c, char ch) {
    skip_ws(c);
    if (c->i >= c->n || c->s[c->i] != ch) {
        pi2_set_error("%s: expected '%c' at byte %zu", c->what, ch, c->i);
        return -1;
    }
    c->i++;
    return 0;
}

int pi2_json_hex4(const char *s, size_t n, uint32_t *out) {
    if (n < 4) return -1;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        const char h = s[k];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= (uint32_t)(h - '0');
        else if (h >= 'a' && h <= 'f') v |= (uint32_t)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') v |= (uint32_t)(h - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

size_t pi2_utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int pi2_json_escape_byte(char e) {
    switch (e) {
    case '"': return '"';
    case '\\': return '\\';
    case '/': return '/';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    default: return -1;
    }
}

static int hex4(cursor *c, uint32_t *out) {
    if (pi2_json_hex4(c->s + c->i, c->n - c->i, out)) return -1;
    c->i += 4;
    return 0;
}

/* A JSON string at the cursor -> malloc'd UTF-8 (decoded text is never longer than its escapes). */
static int parse_string(cursor *c, char **out, size_t *out_len) {
    if (expect(c, '"')) return -1;
    char *buf = malloc(c->n - c->i + 1);
    if (!buf) { pi2_set_error("%s: out of memory", c->what); return -1; }
    size_t o = 0;
    while (1) {
        if (c->i >= c->n) { pi2_set_error("%s: unterminated string", c->what); goto fail; }
        unsigned char ch = (unsigned char)c->s[c->i++];
        if (ch == '"') break;
        if (ch < 0x20) { pi2_set_error("%s: raw control byte 0x%02x in a string at byte %zu", c->what, ch, c->i - 1); goto fail; }
        if (ch != '\\') { buf[o++] = (char)ch; continue; }
        if (c->i >= c->n) { pi2_set_error("%s: unterminated escape", c->what); goto fail; }
        char e = c->s[c->i++];
        const int byte = pi2_json_escape_byte(e);
        if (byte >= 0) { buf[o++] = (char)byte; continue; }
        switch (e) {
        case 'u': {
            uint32_t cp;
            if (hex4(c, &cp)) { pi2_set_error("%s: bad \\u escape at byte %zu", c->what, c->i); goto fail; }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (c->i + 2 > c->n || c->s[c->i] != '\\' || c->s[c->i + 1] != 'u') {
                    pi2_set_error("%s: lone high surrogate at byte %zu", c->what, c->i);
                    goto fail;
                }
                c->i += 2;
                if (hex4(c, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    pi2_set_error("%s: bad low surrogate at byte %zu", c->what, c->i);
                    goto fail;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                pi2_set_error("%s: lone low surrogate at byte %zu", c->what, c->i);
                goto fail;
            }
            if (cp == 0) { pi2_set_error("%s: \\u0000 is not allowed", c->what); goto fail; }
            o += pi2_utf8_put(buf + o, cp);
            break;
        }
        default: pi2_set_error("%s: unknown escape '\\%c' at byte %zu", c->what, e, c->i - 1); goto fail;
        }
    }
    buf[o] = 0;
    *out = buf;
    *out_len = o;
    return 0;
fail:
    free(buf);
    return -1;
}


/* A JSON number at the cursor: its literal text (validated against the JSON grammar). */
static int parse_number(cursor *c, char **out, size_t *out_len) {
    skip_ws(c);
    const size_t start = c->i;
    const char *s = c->s;
    size_t i = c->i;
    if (i < c->n && s[i] == '-') i++;
    size_t digits = i;
    while (i < c->n && s[i] >= '0' && s[i] <= '9') i++;
    int ok = i > digits;
    if (ok && i < c->n && s[i] == '.') {
        size_t f = ++i;
        while (i < c->n && s[i] >= '0' && s[i] <= '9') i++;
        ok = i > f;
    }
    if (ok && i < c->n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < c->n && (s[i] == '+' || s[i] == '-')) i++;
        size_t e = i;
        while (i < c->n && s[i] >= '0' && s[i] <= '9') i++;
        ok = i > e;
    }
    if (!ok) {
        pi2_set_error("%s: expected a value at byte %zu", c->what, start);
        return -1;
    }
    char *buf = malloc(i - start + 1);
    if (!buf) { pi2_set_error("%s: out of memory", c->what); return -1; }
    memcpy(buf, s + start, i - start);
    buf[i - start] = 0;
    c->i = i;
    *out = buf;
    *out_len = i - start;
    return 0;
}

/* A nested object or array at the cursor, skipped whole (strings inside may hold brackets). */
static int skip_nested(cursor *c) {
    int depth = 0;
    for (; c->i < c->n; c->i++) {
        const char ch = c->s[c->i];
        if (ch == '"') {
            for (c->i++; c->i < c->n && c->s[c->i] != '"'; c->i++)
                if (c->s[c->i] == '\\') c->i++;
        } else if (ch == '{' || ch == '[') {
            depth++;
        } else if ((ch == '}' || ch == ']') && --depth == 0) {
            c->i++;
            return 0;
        }
    }
    pi2_set_error("%s: unterminated nested value", c->what);
    return -1;
}

static int parse_object(const char *what, const char *text, size_t len, pi2_json_member_fn fn, void *user,
                        int skip) {
    cursor c = {what, text, len, 0};
    if (expect(&c, '{')) return -1;
    skip_ws(&c);
    if (c.i < c.n && c.s[c.i] == '}') {
        c.i++;
    } else {
        while (1) {
            char *key = NULL, *value = NULL;
            size_t key_len = 0, value_len = 0;
            pi2_json_kind kind = PI2_JSON_STRING;
            if (parse_string(&c, &key, &key_len)) return -1;
            int rc = expect(&c, ':');
            if (!rc) {
                skip_ws(&c);
                const char *p = c.s + c.i;
                const size_t left = c.n - c.i;
                if (left && *p == '"') {
                    rc = parse_string(&c, &value, &value_len);
                } else if (left >= 4 && !memcmp(p, "true", 4)) {
                    kind = PI2_JSON_TRUE;
                    c.i += 4;
                } else if (left >= 5 && !memcmp(p, "false", 5)) {
                    kind = PI2_JSON_FALSE;
                    c.i += 5;
                } else if (skip && left && (*p == '{' || *p == '[')) {
                    if ((rc = skip_nested(&c)) == 0) goto next;
                } else if (left && (*p == '{' || *p == '[' || *p == 'n')) {
                    pi2_set_error("%s: \"%.40s\": only strings, numbers and true/false are accepted", what, key);
                    rc = -1;
                } else {
                    kind = PI2_JSON_NUMBER;
                    rc = parse_number(&c, &value, &value_len);
                }
                if (!rc) rc = fn(user, key, kind, value ? value : (kind == PI2_JSON_TRUE ? "true" : "false"), value_len);
            }
        next:
            free(key);
            free(value);
            if (rc) return -1;
            skip_ws(&c);
            if (c.i < c.n && c.s[c.i] == ',') { c.i++; continue; }
            if (expect(&c, '}')) return -1;
            break;
        }
    }
    skip_ws(&c);
    if (c.i != c.n) {
        pi2_set_error("%s: unexpected text after the object at byte %zu", what, c.i);
        return -1;
    }
    return 0;
}

int pi2_json_flat_parse(const char *what, const char *text, size_t len, pi2_json_member_fn fn, void *user) {
    return parse_object(what, text, len, fn, user, 0);
}

int pi2_json_flat_parse_skipping(const char *what, const char *text, size_t len, pi2_json_member_fn fn, void *user) {
    return parse_object(what, text, len, fn, user, 1);
}
