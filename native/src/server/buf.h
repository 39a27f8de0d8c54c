/* A growable byte buffer for the server's responses, and JSON string output that is always valid:
 * generated text may end inside a UTF-8 sequence or hold bytes that are not UTF-8 at all (byte-fallback
 * tokens), and a JSON document must not, so invalid bytes are written as U+FFFD. */
#ifndef PI2_SERVER_BUF_H
#define PI2_SERVER_BUF_H

#include <stddef.h>

typedef struct {
    char *p;
    size_t len, cap;
    int oom; /* an allocation failed: the contents are incomplete (the caller answers 500) */
} pi2_buf;

void pi2_buf_add(pi2_buf *b, const char *s, size_t n);
void pi2_buf_puts(pi2_buf *b, const char *s);
void pi2_buf_printf(pi2_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s[0..n) as a JSON string literal, quotes included; invalid UTF-8 becomes \ufffd. */
void pi2_buf_json_str(pi2_buf *b, const char *s, size_t n);
void pi2_buf_free(pi2_buf *b);

/* Bytes at the start of s[0..n) that form a valid UTF-8 sequence (0: not one); n == 0 gives 0. */
int pi2_utf8_valid_len(const unsigned char *s, size_t n);
/* How many bytes at the end of s[0..n) are the start of a UTF-8 sequence not yet complete (0..3):
 * streamed text holds them back until the next token completes them. */
size_t pi2_utf8_incomplete_tail(const char *s, size_t n);

#endif
