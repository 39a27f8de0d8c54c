/* The priority queue of candidate merges and the symbols they merge (bigram_heap.h). */
#include "bigram_heap.h"

#include <stdlib.h>

#include "common.h"
#include "unicode.h"

int pi2_symbols_utf8(pi2_symbol *syms, const char *text, size_t n) {
    int count = 0;
    for (size_t off = 0; off < n;) {
        size_t cl = pi2_utf8_len((uint8_t)text[off]);
        if (cl > n - off) cl = n - off;
        syms[count] = (pi2_symbol){count - 1, off + cl == n ? -1 : count + 1, text + off, cl};
        off += cl;
        count++;
    }
    return count;
}

static int bigram_before(const pi2_bigram *a, const pi2_bigram *b) {
    if (a->order != b->order) return a->order < b->order;
    return a->left < b->left;
}

int pi2_bigram_push(pi2_bigram_heap *h, pi2_bigram b) {
    if (pi2_grow(&h->v, &h->cap, h->n, sizeof *h->v, 64)) return -1;
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(&b, &h->v[parent])) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = b;
    return 0;
}

pi2_bigram pi2_bigram_pop(pi2_bigram_heap *h) {
    pi2_bigram top = h->v[0];
    pi2_bigram last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && bigram_before(&h->v[c + 1], &h->v[c])) c++;
        if (!bigram_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0) h->v[i] = last;
    return top;
}

