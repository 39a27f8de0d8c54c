/* The priority queue of candidate merges (bigram_heap.h). */
#include "bigram_heap.h"

#include <stdlib.h>

#include "common.h"

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

