/* SentencePiece-style BPE (Llama / Mistral vocabularies), as llama.cpp's llm_tokenizer_spm does it:
 * split the text into UTF-8 characters, then repeatedly merge the adjacent pair whose concatenation
 * is the vocabulary token with the highest score (ties: leftmost first). Characters that never
 * became a token are emitted as byte tokens <0xNN>. */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "tok_tables.h"
#include "unicode.h"

static int try_add_bigram(const pi2_tokenizer *tok, const pi2_symbol *syms, int left, int right, pi2_bigram_heap *h) {
    if (left < 0 || right < 0) return 0;
    size_t size = syms[left].n + syms[right].n; /* neighbours are contiguous in the text */
    int32_t id = pi2_tok_find(tok, syms[left].text, size);
    if (id < 0) return 0;
    /* highest score first: order by its negation */
    return pi2_bigram_push(h, (pi2_bigram){left, right, -(double)tok->scores[id], syms[left].n, syms[right].n});
}

static void emit_symbol(const pi2_tokenizer *tok, const pi2_symbol *s, pi2_tok_out *o) {
    int32_t id = pi2_tok_find(tok, s->text, s->n);
    if (id >= 0) {
        pi2_tok_emit(o, id);
        return;
    }
    for (size_t j = 0; j < s->n; j++) {
        int32_t b = tok->byte_token[(uint8_t)s->text[j]];
        if (b >= 0) pi2_tok_emit(o, b);
    }
}

int pi2_spm_encode(const pi2_tokenizer *tok, const char *text, size_t len, int space_prefix, pi2_tok_out *o) {
    /* escape: optional leading space, then every ' ' -> U+2581 "▁" (3 bytes) */
    size_t n_spaces = (size_t)space_prefix;
    for (size_t i = 0; i < len; i++) n_spaces += text[i] == ' ';
    size_t elen = len + (size_t)space_prefix + 2 * n_spaces;
    if (elen == 0) return 0;
    char *esc = malloc(elen);
    pi2_symbol *syms = malloc(elen * sizeof(*syms));
    pi2_bigram_heap heap = {0};
    if (!esc || !syms) goto oom;
    size_t k = 0;
    if (space_prefix) {
        memcpy(esc, "\xe2\x96\x81", 3);
        k = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + k, "\xe2\x96\x81", 3);
            k += 3;
        } else {
            esc[k++] = text[i];
        }
    }

    const int n = pi2_symbols_utf8(syms, esc, elen);
    for (int i = 1; i < n; i++)
        if (try_add_bigram(tok, syms, i - 1, i, &heap) != 0) goto oom;

    while (heap.n > 0) {
        pi2_bigram b = pi2_bigram_pop(&heap);
        pi2_symbol *l = &syms[b.left], *r = &syms[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.left_n + b.right_n) continue; /* stale */
        pi2_symbol_merge(syms, b);
        if (try_add_bigram(tok, syms, l->prev, b.left, &heap) != 0) goto oom;
        if (try_add_bigram(tok, syms, b.left, l->next, &heap) != 0) goto oom;
    }
    for (int i = 0; i != -1; i = syms[i].next) emit_symbol(tok, &syms[i], o);

    free(esc);
    free(syms);
    free(heap.v);
    return 0;
oom:
    free(esc);
    free(syms);
    free(heap.v);
    pi2_set_error("tokenizer: out of memory");
    return -1;
}
