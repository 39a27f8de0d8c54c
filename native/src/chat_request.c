/* A strict parser for the one JSON object `pi2-engine chat` reads per line (see chat_request.h).
 * It is not a general JSON library: it knows the four keys it needs, decodes string escapes
 * (including \uXXXX surrogate pairs) to UTF-8, and rejects everything else with a clear message. */
#include "chat_request.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
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
        pi2_set_error("chat request: expected '%c' at byte %zu", ch, c->i);
        return -1;
    }
    c->i++;
    return 0;
}

static int hex4(cursor *c, uint32_t *out) {
    if (c->i + 4 > c->n) return -1;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char h = c->s[c->i + k];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= (uint32_t)(h - '0');
        else if (h >= 'a' && h <= 'f') v |= (uint32_t)(h - 'a' + 10);
        else if (h >= 'A' && h <= 'F') v |= (uint32_t)(h - 'A' + 10);
        else return -1;
    }
    c->i += 4;
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, uint32_t cp) {
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

/* A JSON string at the cursor -> malloc'd UTF-8 (decoded text is never longer than its escapes). */
static int parse_string(cursor *c, char **out, size_t *out_len) {
    if (expect(c, '"')) return -1;
    char *buf = malloc(c->n - c->i + 1);
    if (!buf) { pi2_set_error("chat request: out of memory"); return -1; }
    size_t o = 0;
    while (1) {
        if (c->i >= c->n) { pi2_set_error("chat request: unterminated string"); goto fail; }
        unsigned char ch = (unsigned char)c->s[c->i++];
        if (ch == '"') break;
        if (ch < 0x20) { pi2_set_error("chat request: raw control byte 0x%02x in a string at byte %zu", ch, c->i - 1); goto fail; }
        if (ch != '\\') { buf[o++] = (char)ch; continue; }
        if (c->i >= c->n) { pi2_set_error("chat request: unterminated escape"); goto fail; }
        char e = c->s[c->i++];
        switch (e) {
        case '"': buf[o++] = '"'; break;
        case '\\': buf[o++] = '\\'; break;
        case '/': buf[o++] = '/'; break;
        case 'b': buf[o++] = '\b'; break;
        case 'f': buf[o++] = '\f'; break;
        case 'n': buf[o++] = '\n'; break;
        case 'r': buf[o++] = '\r'; break;
        case 't': buf[o++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (hex4(c, &cp)) { pi2_set_error("chat request: bad \\u escape at byte %zu", c->i); goto fail; }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (c->i + 2 > c->n || c->s[c->i] != '\\' || c->s[c->i + 1] != 'u') {
                    pi2_set_error("chat request: lone high surrogate at byte %zu", c->i);
                    goto fail;
                }
                c->i += 2;
                if (hex4(c, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    pi2_set_error("chat request: bad low surrogate at byte %zu", c->i);
                    goto fail;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                pi2_set_error("chat request: lone low surrogate at byte %zu", c->i);
                goto fail;
            }
            if (cp == 0) { pi2_set_error("chat request: \\u0000 is not allowed in a prompt"); goto fail; }
            o += put_utf8(buf + o, cp);
            break;
        }
        default: pi2_set_error("chat request: unknown escape '\\%c' at byte %zu", e, c->i - 1); goto fail;
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

static int parse_bool(cursor *c, const char *key, int *out) {
    skip_ws(c);
    if (c->n - c->i >= 4 && !memcmp(c->s + c->i, "true", 4)) { c->i += 4; *out = 1; return 0; }
    if (c->n - c->i >= 5 && !memcmp(c->s + c->i, "false", 5)) { c->i += 5; *out = 0; return 0; }
    pi2_set_error("chat request: \"%s\" must be true or false", key);
    return -1;
}

static int parse_count(cursor *c, const char *key, int *out) {
    skip_ws(c);
    long v = 0;
    size_t start = c->i;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') {
        v = v * 10 + (c->s[c->i++] - '0');
        if (v > (1 << 20)) { pi2_set_error("chat request: \"%s\" is too large (at most %d)", key, 1 << 20); return -1; }
    }
    if (c->i == start || (c->i < c->n && (c->s[c->i] == '.' || c->s[c->i] == 'e' || c->s[c->i] == 'E'))) {
        pi2_set_error("chat request: \"%s\" must be a non-negative integer", key);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int pi2_chat_request_parse(const char *line, size_t len, pi2_chat_request *req) {
    memset(req, 0, sizeof *req);
    req->n_predict = -1;
    req->ignore_eos = -1;
    cursor c = {line, len, 0};
    if (expect(&c, '{')) goto fail;
    skip_ws(&c);
    if (c.i < c.n && c.s[c.i] == '}') {
        c.i++;
    } else {
        while (1) {
            char *key = NULL;
            size_t key_len = 0;
            if (parse_string(&c, &key, &key_len)) goto fail;
            int rc = expect(&c, ':');
            if (!rc) {
                if (!strcmp(key, "prompt")) {
                    if (req->prompt) { pi2_set_error("chat request: \"prompt\" given twice"); rc = -1; }
                    else rc = parse_string(&c, &req->prompt, &req->prompt_len);
                } else if (!strcmp(key, "n_predict")) rc = parse_count(&c, key, &req->n_predict);
                else if (!strcmp(key, "ignore_eos")) rc = parse_bool(&c, key, &req->ignore_eos);
                else if (!strcmp(key, "reset")) rc = parse_bool(&c, key, &req->reset);
                else { pi2_set_error("chat request: unknown key \"%.40s\" (prompt, n_predict, ignore_eos, reset)", key); rc = -1; }
            }
            free(key);
            if (rc) goto fail;
            skip_ws(&c);
            if (c.i < c.n && c.s[c.i] == ',') { c.i++; continue; }
            if (expect(&c, '}')) goto fail;
            break;
        }
    }
    skip_ws(&c);
    if (c.i != c.n) { pi2_set_error("chat request: unexpected text after the object at byte %zu", c.i); goto fail; }
    if (!req->prompt) { pi2_set_error("chat request: \"prompt\" is missing"); goto fail; }
    return 0;
fail:
    pi2_chat_request_free(req);
    return -1;
}

void pi2_chat_request_free(pi2_chat_request *req) {
    free(req->prompt);
    req->prompt = NULL;
    req->prompt_len = 0;
}
