/* Byte-level BPE (GPT-2 style: SmolLM2, Llama 3, Qwen2 vocabularies), as llama.cpp's
 * llm_tokenizer_bpe does it: pre-tokenize into words, map each word's UTF-8 bytes to GPT-2's printable
 * code points, then repeatedly merge the adjacent pair with the lowest merge rank (ties: leftmost). */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "pretok.h"
#include "tok_tables.h"
#include "unicode.h"

static int add_bigram(const pi2_tokenizer *tok, const pi2_symbol *syms, int left, int right, pi2_bigram_heap *h) {
    if (left < 0 || right < 0) return 0;
    int32_t rank = pi2_tok_merge_rank(tok, syms[left].text, syms[left].n, syms[right].text, syms[right].n);
    if (rank < 0) return 0;
    return pi2_bigram_push(h, (pi2_bigram){left, right, rank, syms[left].n, syms[right].n});
}

typedef struct {
    pi2_symbol *syms;
    size_t cap;
    pi2_bigram_heap heap;
} bpe_scratch;

/* Merge one byte-encoded word and emit its tokens. */
static int encode_word(const pi2_tokenizer *tok, const char *w, size_t wn, bpe_scratch *sc, pi2_tok_out *o) {
    if (tok->ignore_merges) {
        int32_t id = pi2_tok_find(tok, w, wn);
        if (id >= 0) {
            pi2_tok_emit(o, id);
            return 0;
        }
    }
    if (wn > sc->cap) {
        pi2_symbol *s = realloc(sc->syms, wn * sizeof(*s));
        if (!s) return -1;
        sc->syms = s;
        sc->cap = wn;
    }
    pi2_symbol *syms = sc->syms;
    const int n = pi2_symbols_utf8(syms, w, wn);
    sc->heap.n = 0;
    for (int i = 1; i < n; i++)
        if (add_bigram(tok, syms, i - 1, i, &sc->heap) != 0) return -1;
    while (sc->heap.n > 0) {
        pi2_bigram b = pi2_bigram_pop(&sc->heap);
        pi2_symbol *l = &syms[b.left], *r = &syms[b.right];
        if (l->n == 0 || r->n == 0 || l->n != b.left_n || r->n != b.right_n) continue;
        pi2_symbol_merge(syms, b);
        if (add_bigram(tok, syms, l->prev, b.left, &sc->heap) != 0) return -1;
        if (add_bigram(tok, syms, b.left, l->next, &sc->heap) != 0) return -1;
    }
    for (int i = 0; i != -1 && n > 0; i = syms[i].next) {
        if (syms[i].n == 0) continue;
        int32_t id = pi2_tok_find(tok, syms[i].text, syms[i].n);
        if (id >= 0) {
            pi2_tok_emit(o, id);
            continue;
        }
        /* not in the vocabulary: each byte that is a token on its own (llama.cpp drops the rest) */
        for (size_t j = 0; j < syms[i].n; j++) {
            int32_t b = pi2_tok_find(tok, syms[i].text + j, 1);
            if (b >= 0) pi2_tok_emit(o, b);
        }
    }
    return 0;
}

int pi2_bpe_encode(const pi2_tokenizer *tok, const char *text, size_t len, pi2_tok_out *o) {
    if (len == 0) return 0;
    uint32_t *cps = malloc(len * sizeof(*cps));
    size_t *lens = NULL;
    char *word = NULL;
    bpe_scratch sc = {0};
    int rc = -1;
    if (!cps) goto done;
    size_t n = 0;
    for (size_t pos = 0; pos < len;) cps[n++] = pi2_utf8_decode(text, len, &pos);
    long n_words = pi2_pretokenize(tok->pre_type, cps, n, &lens);
    if (n_words < 0) goto done;
    /* a code point is at most 4 UTF-8 bytes, each byte at most 2 bytes once GPT-2 encoded */
    size_t word_cap = 0;
    size_t start = 0;
    for (long w = 0; w < n_words; w++) {
        size_t need = lens[w] * 8;
        if (need > word_cap) {
            char *nw = realloc(word, need);
            if (!nw) goto done;
            word = nw;
            word_cap = need;
        }
        size_t wn = 0;
        for (size_t i = start; i < start + lens[w]; i++) {
            char utf8[4];
            int k = pi2_utf8_encode(cps[i], utf8);
            for (int j = 0; j < k; j++) {
                uint8_t b = (uint8_t)utf8[j];
                memcpy(word + wn, tok->byte_utf8[b], tok->byte_utf8_len[b]);
                wn += tok->byte_utf8_len[b];
            }
        }
        start += lens[w];
        if (encode_word(tok, word, wn, &sc, o) != 0) goto done;
    }
    rc = 0;
done:
    if (rc != 0) pi2_set_error("tokenizer: out of memory");
    free(cps);
    free(lens);
    free(word);
    free(sc.syms);
    free(sc.heap.v);
    return rc;
}
