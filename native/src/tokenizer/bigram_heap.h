/* Both BPE flavours merge adjacent symbols through one priority queue of candidate pairs. Lower
 * `order` merges first (byte-level BPE: the merge rank; SPM: minus the merged token's score), ties go
 * to the leftmost pair. left_n/right_n are the symbols' sizes when queued, so a pair whose symbols
 * have changed since is recognised as stale when popped. */
#ifndef PI2_BIGRAM_HEAP_H
#define PI2_BIGRAM_HEAP_H

#include <stddef.h>

typedef struct {
    int left, right;
    double order;
    size_t left_n, right_n;
} pi2_bigram;

typedef struct {
    pi2_bigram *v;
    size_t n, cap;
} pi2_bigram_heap;

/* The text both flavours merge: one symbol per UTF-8 character at first, linked both ways. */
typedef struct {
    int prev, next;
    const char *text;
    size_t n; /* 0 once merged into its left neighbour */
} pi2_symbol;

/* syms[0..count) for text[0..n), one per UTF-8 character (a truncated last one keeps the bytes it
 * has); syms holds n. The count. */
int pi2_symbols_utf8(pi2_symbol *syms, const char *text, size_t n);

/* Merge a popped pair: the right symbol joins the left one (neighbours are contiguous in the text). */
static inline void pi2_symbol_merge(pi2_symbol *syms, pi2_bigram b) {
    pi2_symbol *l = &syms[b.left], *r = &syms[b.right];
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0) syms[r->next].prev = b.left;
}

int pi2_bigram_push(pi2_bigram_heap *h, pi2_bigram b); /* 0, or -1 when out of memory */
pi2_bigram pi2_bigram_pop(pi2_bigram_heap *h);          /* h->n must be > 0 */

#endif
