/* The tokenizer's lookups, shared by the SPM and BPE encoders and tokenizer.c: a token's id by its
 * text, a merge's rank by its pair, and the counting output sink (tok_tables.h). */
#include <string.h>

#include "tok_tables.h"

int32_t pi2_tok_find(const pi2_tokenizer *tok, const char *text, size_t len) {
    uint64_t h = pi2_tok_hash(PI2_TOK_HASH_SEED, text, len);
    for (uint32_t slot = (uint32_t)h & tok->tok_mask;; slot = (slot + 1) & tok->tok_mask) {
        int32_t id = tok->tok_table[slot];
        if (id < 0) return -1;
        if (tok->tok_len[id] == len && memcmp(tok->pool + tok->tok_off[id], text, len) == 0) return id;
    }
}

int32_t pi2_tok_merge_rank(const pi2_tokenizer *tok, const char *l, size_t ln, const char *r, size_t rn) {
    if (!tok->merge_table) return -1;
    uint64_t h = pi2_tok_pair_hash(l, ln, r, rn);
    for (uint32_t slot = (uint32_t)h & tok->merge_mask;; slot = (slot + 1) & tok->merge_mask) {
        int32_t m = tok->merge_table[slot];
        if (m < 0) return -1;
        const pi2_merge *e = &tok->merges[m];
        if (e->left_len == ln && e->right_len == rn && memcmp(tok->merge_pool + e->off, l, ln) == 0 &&
            memcmp(tok->merge_pool + e->off + ln + 1, r, rn) == 0)
            return e->rank;
    }
}

void pi2_tok_emit(pi2_tok_out *o, int32_t id) {
    if (o->n < o->max) o->out[o->n] = id;
    o->n++;
}

