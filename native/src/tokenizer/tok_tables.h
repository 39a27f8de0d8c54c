/* What tokenizer.c, tokenizer_lookup.c, tokenizer_spm.c and tokenizer_bpe.c share: the tokenizer's tables and an output
 * sink that keeps counting past the caller's buffer (so pi2_tokenize can report the size needed). */
#ifndef PI2_TOK_TABLES_H
#define PI2_TOK_TABLES_H

#include <stddef.h>
#include <stdint.h>

#include "bigram_heap.h"
#include "tokenizer.h"

typedef struct {
    uint32_t off;                  /* into merge_pool, which holds "left right" */
    uint32_t left_len, right_len;
    int32_t rank;                  /* index in the GGUF merge list: lower merges first */
} pi2_merge;

struct pi2_tokenizer {
    pi2_tok_kind kind;
    int32_t n_vocab;
    char *pool;                    /* all token texts */
    uint32_t *tok_off, *tok_len;
    float *scores;
    uint8_t *type;                 /* PI2_TOKTYPE_* after llama.cpp's overrides; 0 = undefined */
    uint8_t *eog;
    int32_t *tok_table;            /* open addressing: text -> id, -1 empty */
    uint32_t tok_mask;
    int32_t *specials;             /* control/user-defined/unknown ids, longest text first */
    int n_specials;
    char *merge_pool;
    pi2_merge *merges;
    int32_t n_merges;
    int32_t *merge_table;          /* (left, right) -> index in merges */
    uint32_t merge_mask;
    int pre_type, ignore_merges;
    int32_t bos_id, eos_id, unk_id, pad_id;
    int add_bos, add_space_prefix;
    int32_t byte_token[256];       /* SPM: <0xNN> token per byte (unk / -1 when missing) */
    char byte_utf8[256][4];        /* BPE: GPT-2 printable code point per byte, as UTF-8 */
    uint8_t byte_utf8_len[256];
};

typedef struct {
    int32_t *out;
    size_t max;
    size_t n;
} pi2_tok_out;

/* FNV-1a: the tables' hash (tokenizer.c builds them, tokenizer_lookup.c reads them). */
static inline uint64_t pi2_tok_hash(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define PI2_TOK_HASH_SEED 0xcbf29ce484222325ULL

static inline uint64_t pi2_tok_pair_hash(const char *l, size_t ln, const char *r, size_t rn) {
    uint64_t h = pi2_tok_hash(PI2_TOK_HASH_SEED, l, ln);
    h = pi2_tok_hash(h ^ 0xFF, "\xff", 1); /* separator no UTF-8 text contains */
    return pi2_tok_hash(h, r, rn);
}

/* tokenizer_lookup.c */
void pi2_tok_emit(pi2_tok_out *o, int32_t id);
/* id of the token with exactly this text, or -1 */
int32_t pi2_tok_find(const pi2_tokenizer *tok, const char *text, size_t len);
/* rank of the merge (left, right), or -1 */
int32_t pi2_tok_merge_rank(const pi2_tokenizer *tok, const char *l, size_t ln, const char *r, size_t rn);

/* Encode one raw-text fragment. 0, or -1 (pi2_set_error) when out of memory. */
int pi2_spm_encode(const pi2_tokenizer *tok, const char *text, size_t len, int space_prefix, pi2_tok_out *o);
int pi2_bpe_encode(const pi2_tokenizer *tok, const char *text, size_t len, pi2_tok_out *o);

#endif
