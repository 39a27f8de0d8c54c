/* Unicode helpers the tokenizers need: a UTF-8 decoder that treats bad bytes the way llama.cpp does,
 * general-category flags for the pre-tokenizer "regexes", and GPT-2's byte <-> code point mapping. */
#ifndef PI2_UNICODE_H
#define PI2_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* One flag per Unicode general category group (\p{N}, \p{L}, ...); PI2_UCAT_UNDEFINED = unassigned. */
enum {
    PI2_UCAT_UNDEFINED = 0x01,
    PI2_UCAT_NUMBER = 0x02,
    PI2_UCAT_LETTER = 0x04,
    PI2_UCAT_SEPARATOR = 0x08,
    PI2_UCAT_MARK = 0x10,
    PI2_UCAT_PUNCTUATION = 0x20,
    PI2_UCAT_SYMBOL = 0x40,
    PI2_UCAT_CONTROL = 0x80,
};

typedef struct {
    uint32_t start;
    uint8_t flag;
} pi2_ucat_range;

extern const pi2_ucat_range pi2_ucat_ranges[]; /* unicode_tables.c (generated) */
extern const int pi2_ucat_n_ranges;

/* Category flag of a code point (PI2_UCAT_UNDEFINED beyond U+10FFFF). */
uint8_t pi2_ucat(uint32_t cp);
/* Unicode White_Space property (what \s matches). */
int pi2_is_whitespace(uint32_t cp);

/* Byte length of the UTF-8 sequence that starts with this byte, from its high bits alone (1..4). */
size_t pi2_utf8_len(uint8_t first);

/* Decode one code point at text[*pos], advancing *pos. An invalid or truncated sequence yields
 * U+FFFD and advances one byte, as llama.cpp's unicode_cpts_from_utf8 does (so results match). */
uint32_t pi2_utf8_decode(const char *text, size_t len, size_t *pos);

/* Encode cp as UTF-8 into out (4 bytes room); returns the byte count. */
int pi2_utf8_encode(uint32_t cp, char *out);

/* GPT-2 byte-level BPE: every byte maps to one printable code point (bytes that are printable
 * Latin-1 map to themselves; the rest to U+0100 upward in byte order). */
uint32_t pi2_byte_to_cp(uint8_t byte);
/* The inverse: 0..255, or -1 for a code point no byte maps to. */
int pi2_cp_to_byte(uint32_t cp);

#endif
