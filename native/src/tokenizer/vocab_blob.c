/* Parser for the vocab blob (layout in vocab_blob.h). Trusts nothing: a .pi2 file can be truncated
 * or corrupted, so every count, length and offset is checked against the blob's real size. */
#include "vocab_blob.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the vocab blob is little-endian and parsed in place"
#endif

#define MAX_ENTRIES (1 << 24)
#define MAX_PRE_LEN 255u

static uint32_t rd_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int32_t rd_i32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t pad4(uint64_t n) { return (n + 3u) & ~(uint64_t)3u; }

/* Take `size` bytes at *pos, or fail when they run past the blob. */
static const uint8_t *take(const uint8_t *base, size_t len, uint64_t *pos, uint64_t size, const char *what) {
    if (size > len || *pos > len - size) {
        pi2_set_error("vocab blob truncated: %s runs past the end (needs %llu bytes at offset %llu, blob has %zu)",
                      what, (unsigned long long)size, (unsigned long long)*pos, len);
        return NULL;
    }
    const uint8_t *p = base + *pos;
    *pos += size;
    return p;
}

/* Sum of n u32 lengths, or -1 when it cannot fit the blob anyway. */
static int64_t sum_lens(const uint32_t *lens, int32_t n, size_t len) {
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        total += lens[i];
        if (total > len) return -1;
    }
    return (int64_t)total;
}

/* n strings stored as n u32 lengths, then their bytes padded to 4; `noun` names them in errors
 * ("token": "token lengths", "token texts"). 0, or -1 with the error. */
static int take_strings(const uint8_t *b, size_t len, uint64_t *pos, int32_t n, const char *noun,
                        const uint8_t **lens, const uint8_t **bytes) {
    char what[32];
    snprintf(what, sizeof what, "%s lengths", noun);
    *lens = take(b, len, pos, (uint64_t)n * 4, what);
    if (!*lens) return -1;
    const int64_t total = sum_lens((const uint32_t *)*lens, n, len);
    if (total < 0) {
        pi2_set_error("vocab blob: %s lengths add up to more than the blob holds", noun);
        return -1;
    }
    snprintf(what, sizeof what, "%s texts", noun);
    *bytes = take(b, len, pos, pad4((uint64_t)total), what);
    return *bytes ? 0 : -1;
}

/* Point ptrs[i] at consecutive strings of lens[i] bytes starting at bytes. */
static const char **string_table(const uint8_t *bytes, const uint32_t *lens, int32_t n) {
    const char **ptrs = malloc((size_t)(n > 0 ? n : 1) * sizeof(*ptrs));
    if (!ptrs) {
        pi2_set_error("out of memory parsing the vocab blob");
        return NULL;
    }
    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        ptrs[i] = (const char *)bytes + off;
        off += lens[i];
    }
    return ptrs;
}

int pi2_vocab_blob_parse(const void *blob, size_t len, pi2_vocab_desc *out) {
    memset(out, 0, sizeof(*out));
    const uint8_t *b = blob;
    if (!blob) {
        pi2_set_error("vocab blob missing");
        return -1;
    }
    if (((uintptr_t)blob & 3u) != 0) {
        pi2_set_error("vocab blob is not 4-byte aligned in memory (the tokenizer section must be aligned)");
        return -1;
    }
    if (len < PI2_VOCAB_BLOB_HEADER_SIZE) {
        pi2_set_error("vocab blob truncated: %zu bytes, the header alone is %u", len, PI2_VOCAB_BLOB_HEADER_SIZE);
        return -1;
    }
    if (memcmp(b, PI2_VOCAB_BLOB_MAGIC, 8) != 0) {
        pi2_set_error("not a vocab blob (bad magic)");
        return -1;
    }
    uint32_t version = rd_u32(b + 8);
    if (version != PI2_VOCAB_BLOB_VERSION) {
        pi2_set_error("vocab blob version %u is not supported (this build reads version %u)", version,
                      PI2_VOCAB_BLOB_VERSION);
        return -1;
    }
    uint32_t kind = rd_u32(b + 12);
    uint32_t flags = rd_u32(b + 16);
    int32_t n_vocab = rd_i32(b + 20);
    int32_t n_merges = rd_i32(b + 24);
    int32_t ids[4] = {rd_i32(b + 28), rd_i32(b + 32), rd_i32(b + 36), rd_i32(b + 40)};
    uint32_t pre_len = rd_u32(b + 44);
    uint32_t total_size = rd_u32(b + 48);

    if (kind != PI2_TOK_SPM && kind != PI2_TOK_BPE) {
        pi2_set_error("vocab blob: unknown tokenizer kind %u", kind);
        return -1;
    }
    if (flags & ~0xFu) {
        pi2_set_error("vocab blob: unknown flags 0x%x", flags);
        return -1;
    }
    if (n_vocab < 1 || n_vocab > MAX_ENTRIES) {
        pi2_set_error("vocab blob: bad vocabulary size %d", n_vocab);
        return -1;
    }
    if (n_merges < 0 || n_merges > MAX_ENTRIES) {
        pi2_set_error("vocab blob: bad merge count %d", n_merges);
        return -1;
    }
    static const char *id_names[4] = {"bos", "eos", "unk", "pad"};
    for (int i = 0; i < 4; i++) {
        if (ids[i] < -1 || ids[i] >= n_vocab) {
            pi2_set_error("vocab blob: %s id %d outside the vocabulary (%d tokens)", id_names[i], ids[i], n_vocab);
            return -1;
        }
    }
    if (pre_len > MAX_PRE_LEN) {
        pi2_set_error("vocab blob: pre-tokenizer name too long (%u bytes)", pre_len);
        return -1;
    }
    if (total_size != len) {
        pi2_set_error("vocab blob size mismatch: header says %u bytes, section has %zu", total_size, len);
        return -1;
    }

    uint64_t pos = PI2_VOCAB_BLOB_HEADER_SIZE;
    const uint8_t *pre = take(b, len, &pos, pad4((uint64_t)pre_len + 1), "pre-tokenizer name");
    if (!pre) return -1;
    if (pre[pre_len] != 0 || memchr(pre, 0, pre_len) != NULL) {
        pi2_set_error("vocab blob: pre-tokenizer name is not a clean NUL-terminated string");
        return -1;
    }
    const uint8_t *tok_lens, *tok_bytes;
    if (take_strings(b, len, &pos, n_vocab, "token", &tok_lens, &tok_bytes)) return -1;
    const uint8_t *scores = NULL, *types = NULL;
    if (flags & PI2_VOCAB_FLAG_HAS_SCORES) {
        scores = take(b, len, &pos, (uint64_t)n_vocab * 4, "scores");
        if (!scores) return -1;
    }
    if (flags & PI2_VOCAB_FLAG_HAS_TYPES) {
        types = take(b, len, &pos, (uint64_t)n_vocab * 4, "token types");
        if (!types) return -1;
    }
    const uint8_t *merge_lens, *merge_bytes;
    if (take_strings(b, len, &pos, n_merges, "merge", &merge_lens, &merge_bytes)) return -1;
    if (pos != len) {
        pi2_set_error("vocab blob: %llu stray bytes after the merges", (unsigned long long)(len - pos));
        return -1;
    }
    if (kind == PI2_TOK_BPE && n_merges == 0) {
        pi2_set_error("vocab blob: byte-level BPE vocabulary without merges");
        return -1;
    }

    const char **tokens = string_table(tok_bytes, (const uint32_t *)tok_lens, n_vocab);
    if (!tokens) return -1;
    const char **merges = string_table(merge_bytes, (const uint32_t *)merge_lens, n_merges);
    if (!merges) {
        free(tokens);
        return -1;
    }

    out->kind = (pi2_tok_kind)kind;
    out->n_vocab = n_vocab;
    out->tokens = tokens;
    out->token_lens = (const uint32_t *)tok_lens;
    out->scores = (const float *)scores;
    out->token_types = (const int32_t *)types;
    out->n_merges = n_merges;
    out->merges = merges;
    out->merge_lens = (const uint32_t *)merge_lens;
    out->pre = (const char *)pre;
    out->bos_id = ids[0];
    out->eos_id = ids[1];
    out->unk_id = ids[2];
    out->pad_id = ids[3];
    out->add_bos = (flags & PI2_VOCAB_FLAG_ADD_BOS) != 0;
    out->add_space_prefix = (flags & PI2_VOCAB_FLAG_ADD_SPACE_PREFIX) != 0;
    return 0;
}

void pi2_vocab_desc_release(pi2_vocab_desc *desc) {
    if (!desc) return;
    free((void *)desc->tokens);
    free((void *)desc->merges);
    memset(desc, 0, sizeof(*desc));
}

pi2_tokenizer *pi2_tokenizer_from_section(const char *path, const void *blob, size_t len, uint32_t n_vocab,
                                          pi2_vocab_desc *desc) {
    memset(desc, 0, sizeof *desc);
    pi2_tokenizer *tok = NULL;
    if (pi2_vocab_blob_parse(blob, len, desc) != 0 || !(tok = pi2_tokenizer_create(desc))) {
        pi2_set_error("%s: tokenizer section: %s", path, pi2_last_error());
        return NULL;
    }
    if ((uint32_t)pi2_tokenizer_n_vocab(tok) > n_vocab) {
        pi2_set_error("%s: tokenizer section: %d tokens, the model has %u", path, pi2_tokenizer_n_vocab(tok), n_vocab);
        pi2_tokenizer_free(tok);
        return NULL;
    }
    return tok;
}
