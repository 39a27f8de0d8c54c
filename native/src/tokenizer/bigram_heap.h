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

int pi2_bigram_push(pi2_bigram_heap *h, pi2_bigram b); /* 0, or -1 when out of memory */
pi2_bigram pi2_bigram_pop(pi2_bigram_heap *h);          /* h->n must be > 0 */

#endif
