/* A bounded reader of one JSON document into a tree, for the server's request bodies (openai.c) and
 * the model's metadata (the chat template). Strict: RFC 8259 grammar only, nesting at most
 * PI2_JD_MAX_DEPTH, strings must be valid UTF-8 and may not hold NUL (raw or \u0000: the engine's
 * strings are C strings, and a NUL would cut a prompt short without anyone noticing). Errors go to
 * pi2_set_error (thread-local) with the byte offset. */
#ifndef PI2_SERVER_JSON_DOC_H
#define PI2_SERVER_JSON_DOC_H

#include <stddef.h>

#define PI2_JD_MAX_DEPTH 16

typedef enum { PI2_JD_NULL, PI2_JD_FALSE, PI2_JD_TRUE, PI2_JD_NUMBER, PI2_JD_STRING, PI2_JD_ARRAY, PI2_JD_OBJECT } pi2_jd_kind;

typedef struct pi2_jd {
    pi2_jd_kind kind;
    char *key;                   /* the member's key (decoded) when the parent is an object */
    char *str;                   /* a string's decoded UTF-8 (NUL-terminated), a number's text */
    size_t len;                  /* bytes of str */
    double num;                  /* a number's value */
    struct pi2_jd *child, *next; /* an array's or object's first member; the next sibling */
    int n;                       /* members of an array or object */
} pi2_jd;

/* The tree of text[0..len), or NULL with an error prefixed by `what`. Free with pi2_jd_free. */
pi2_jd *pi2_jd_parse(const char *what, const char *text, size_t len);
void pi2_jd_free(pi2_jd *d);
/* An object's member named key, or NULL (a repeated key is refused when parsing). */
const pi2_jd *pi2_jd_get(const pi2_jd *obj, const char *key);
const char *pi2_jd_kind_name(pi2_jd_kind k);

#endif
