/* Unicode helpers for the tokenizers (see unicode.h). */
#include "unicode.h"

uint8_t pi2_ucat(uint32_t cp) {
    if (cp > 0x10FFFF) return PI2_UCAT_UNDEFINED;
    /* last range whose start <= cp */
    int lo = 0, hi = pi2_ucat_n_ranges - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (pi2_ucat_ranges[mid].start <= cp)
            lo = mid;
        else
            hi = mid - 1;
    }
    return pi2_ucat_ranges[lo].flag;
}

int pi2_is_whitespace(uint32_t cp) {
    /* Unicode PropList.txt White_Space */
    if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680) return 1;
    if (cp >= 0x2000 && cp <= 0x200A) return 1;
    return cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t pi2_utf8_len(uint8_t first) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[first >> 4];
}

static int is_cont(const char *text, size_t len, size_t at) {
    return at < len && (((uint8_t)text[at]) & 0xC0) == 0x80;
}

uint32_t pi2_utf8_decode(const char *text, size_t len, size_t *pos) {
    size_t p = *pos;
    uint8_t c = (uint8_t)text[p];
    if (c < 0x80) {
        *pos = p + 1;
        return c;
    }
    /* no overlong/surrogate checks: llama.cpp accepts those too, and matching it is the point */
    if ((c & 0xE0) == 0xC0 && is_cont(text, len, p + 1)) {
        *pos = p + 2;
        return ((uint32_t)(c & 0x1F) << 6) | ((uint8_t)text[p + 1] & 0x3F);
    }
    if ((c & 0xF0) == 0xE0 && is_cont(text, len, p + 1) && is_cont(text, len, p + 2)) {
        *pos = p + 3;
        return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)((uint8_t)text[p + 1] & 0x3F) << 6) |
               ((uint8_t)text[p + 2] & 0x3F);
    }
    if ((c & 0xF8) == 0xF0 && is_cont(text, len, p + 1) && is_cont(text, len, p + 2) && is_cont(text, len, p + 3)) {
        *pos = p + 4;
        return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)((uint8_t)text[p + 1] & 0x3F) << 12) |
               ((uint32_t)((uint8_t)text[p + 2] & 0x3F) << 6) | ((uint8_t)text[p + 3] & 0x3F);
    }
    *pos = p + 1;
    return 0xFFFD;
}

int pi2_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | ((cp >> 18) & 0x07));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int byte_is_self_mapped(int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t pi2_byte_to_cp(uint8_t byte) {
    if (byte_is_self_mapped(byte)) return byte;
    /* the n-th byte (in byte order) that is not self-mapped gets U+0100 + n */
    uint32_t n = 0;
    for (int b = 0; b < byte; b++)
        if (!byte_is_self_mapped(b)) n++;
    return 0x100 + n;
}

int pi2_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_is_self_mapped((int)cp) ? (int)cp : -1;
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) {
        if (byte_is_self_mapped(b)) continue;
        if (0x100 + n == cp) return b;
        n++;
    }
    return -1;
}
