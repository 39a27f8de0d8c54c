/* A strict reader of one flat JSON object: {"key": value, ...} with string, number or boolean values
 * (no nesting, no null). Shared by the chat requests (chat_request.c) and the execution plan
 * (plan.c). Errors name the problem and its byte offset, prefixed by `what`. */
#ifndef PI2_JSON_FLAT_H
#define PI2_JSON_FLAT_H

#include <stddef.h>
#include <stdint.h>

typedef enum { PI2_JSON_STRING, PI2_JSON_NUMBER, PI2_JSON_TRUE, PI2_JSON_FALSE } pi2_json_kind;

/* One member: key and value NUL-terminated; value is the decoded UTF-8 of a string, the literal text
 * of a number, or "true"/"false". Return 0 to go on, -1 (after pi2_set_error) to stop. */
typedef int (*pi2_json_member_fn)(void *user, const char *key, pi2_json_kind kind, const char *value,
                                  size_t value_len);

/* 0 when text[0..len) is one such object (surrounding whitespace allowed) and fn accepted every
 * member; -1 with pi2_set_error otherwise. */
int pi2_json_flat_parse(const char *what, const char *text, size_t len, pi2_json_member_fn fn, void *user);

/* The same, but members whose value is an object or an array are skipped (not passed to fn): for
 * reading the flat part of a richer document, such as `pi2-engine info --json`'s facts. */
int pi2_json_flat_parse_skipping(const char *what, const char *text, size_t len, pi2_json_member_fn fn, void *user);

/* The pieces of a string's escapes, for the server's tree reader too (server/json_doc.c): the code
 * point of the 4 hex digits at s (-1 when fewer than 4 or not hex), and cp's UTF-8 into o (1-4 bytes). */
int pi2_json_hex4(const char *s, size_t n, uint32_t *out);
size_t pi2_utf8_put(char *o, uint32_t cp);
/* The byte a one-character escape \e stands for ('n' -> '\n'), or -1 when e is not one of them ('u' included). */
int pi2_json_escape_byte(char e);

#endif
