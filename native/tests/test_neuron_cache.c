/* The segmented neuron cache: lookups, LRU eviction per region, pins, the window drop, and that the
 * memory it reserves is exactly what its configuration (the budget's cache part) says. A random
 * sequence of operations is checked against a plain reference model of the same rules. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "neuron_cache.h"

static pi2_ncache_config small(void) {
    pi2_ncache_config c = {.n_blocks = 3, .n_ff = 64, .stride = 512, .cluster = 8, .hot_neurons = 16,
                           .hot_slots = 2, .cold_slots = 4};
    return c;
}

static void test_accounting(void) {
    pi2_ncache_config cfg = small();
    pi2_ncache *c = pi2_ncache_create(&cfg);
    CHECK(c != NULL);
    CHECK(pi2_ncache_bytes(c) == 2 * 8 * 512 + 4 * 512);
    CHECK(pi2_ncache_used(c, 0) == 0 && pi2_ncache_used(c, 1) == 0);
    CHECK(pi2_ncache_is_hot(c, 15) && !pi2_ncache_is_hot(c, 16));
    pi2_ncache_free(c);
    pi2_ncache_config bad = small();
    bad.hot_neurons = 65;
    CHECK(pi2_ncache_create(&bad) == NULL);
}

static void test_hot_clusters_share_a_slot(void) {
    pi2_ncache_config cfg = small();
    pi2_ncache *c = pi2_ncache_create(&cfg);
    int64_t h = pi2_ncache_acquire(c, 1, 3);
    CHECK(h >= cfg.cold_slots); /* hot handles come after the cold ones */
    CHECK(pi2_ncache_find(c, 1, 0) == h && pi2_ncache_find(c, 1, 7) == h && pi2_ncache_find(c, 1, 8) == -1);
    CHECK(pi2_ncache_find(c, 0, 3) == -1); /* another block */
    CHECK(pi2_ncache_bundle(c, h, 5) == pi2_ncache_bundle(c, h, 0) + 5 * 512);
    size_t bytes;
    int block, first;
    pi2_ncache_slot_data(c, h, &bytes, &block, &first);
    CHECK(bytes == 8 * 512 && block == 1 && first == 0);
    CHECK(pi2_ncache_state(c, h) == PI2_SLOT_EMPTY);
    pi2_ncache_set_state(c, h, PI2_SLOT_READY);
    CHECK(pi2_ncache_state(c, h) == PI2_SLOT_READY);
    pi2_ncache_free(c);
}

/* A small cache whose four cold slots hold neurons 20..23 of block 0 in h[], unpinned, least recently
 * used first. */
static pi2_ncache *four_in_lru_order(int64_t h[4]) {
    pi2_ncache_config cfg = small();
    pi2_ncache *c = pi2_ncache_create(&cfg);
    for (int i = 0; i < 4; i++) {
        h[i] = pi2_ncache_acquire(c, 0, 20 + i);
        pi2_ncache_unpin(c, h[i]);
        pi2_ncache_touch(c, h[i], i);
    }
    return c;
}

static void test_lru_and_pins(void) {
    int64_t h[4];
    pi2_ncache *c = four_in_lru_order(h);
    CHECK(pi2_ncache_used(c, 0) == 4);
    pi2_ncache_touch(c, h[0], 10);              /* 20 is now the most recently used */
    int64_t n = pi2_ncache_acquire(c, 0, 30);   /* evicts 21, the least recently used */
    CHECK(n == h[1] && pi2_ncache_find(c, 0, 21) == -1 && pi2_ncache_find(c, 0, 20) == h[0]);
    pi2_ncache_pin(c, h[2]);                    /* 22 pinned: 23 goes next */
    int64_t m = pi2_ncache_acquire(c, 0, 31);
    CHECK(m == h[3] && pi2_ncache_find(c, 0, 22) == h[2]);
    /* Everything pinned: no slot. */
    pi2_ncache_pin(c, h[0]);
    CHECK(pi2_ncache_acquire(c, 0, 40) == -1);
    pi2_ncache_free(c);
}

/* powerinfer2 demotes a miss ranked past the admit limit while its wave still pins it: the slot goes to
 * the least recently used end when its last pin goes (acquire would otherwise walk past it while it is
 * pinned), and a touch before then cancels the demotion. */
static void test_demote_waits_for_the_last_unpin(void) {
    int64_t h[4];
    pi2_ncache *c = four_in_lru_order(h); /* least recently used first: 20 21 22 23 */
    int64_t a = pi2_ncache_acquire(c, 0, 30);    /* evicts 20; pinned */
    CHECK(a == h[0]);
    pi2_ncache_demote(c, a);                     /* pinned: it waits */
    int64_t b = pi2_ncache_acquire(c, 0, 31);    /* evicts 21, the least recently used unpinned slot */
    CHECK(b == h[1]);
    pi2_ncache_unpin(c, b);
    pi2_ncache_pin(c, a);                        /* a read in flight: two pins */
    pi2_ncache_unpin(c, a);
    pi2_ncache_unpin(c, a);                      /* the last pin goes: 30 is the next to go */
    CHECK(pi2_ncache_acquire(c, 0, 32) == a && pi2_ncache_find(c, 0, 30) == -1);
    pi2_ncache_demote(c, a);                     /* 32, demoted while pinned, then used again */
    pi2_ncache_touch(c, a, 6);
    pi2_ncache_unpin(c, a);
    CHECK(pi2_ncache_acquire(c, 0, 33) == h[2] && pi2_ncache_find(c, 0, 32) == a);
    pi2_ncache_free(c);
}

static void test_window_drop(void) {
    pi2_ncache_config cfg = small();
    cfg.hot_neurons = 0;
    cfg.hot_slots = 0;
    pi2_ncache *c = pi2_ncache_create(&cfg);
    int64_t h[4];
    for (int i = 0; i < 4; i++) {
        h[i] = pi2_ncache_acquire(c, 2, i);
        pi2_ncache_touch(c, h[i], i); /* used at steps 0..3 */
        pi2_ncache_unpin(c, h[i]);
    }
    pi2_ncache_pin(c, h[0]);
    CHECK(pi2_ncache_drop_older(c, 2) == 1);   /* step 0 is pinned, step 1 goes, 2 and 3 stay */
    CHECK(pi2_ncache_find(c, 2, 1) == -1 && pi2_ncache_find(c, 2, 0) == h[0] && pi2_ncache_find(c, 2, 3) == h[3]);
    CHECK(pi2_ncache_used(c, 0) == 3);
    pi2_ncache_unpin(c, h[0]);
    pi2_ncache_drop_all(c);
    CHECK(pi2_ncache_used(c, 0) == 0 && pi2_ncache_find(c, 2, 3) == -1);
    /* A dropped slot is reused before anything is evicted. */
    int64_t a = pi2_ncache_acquire(c, 0, 50);
    CHECK(a >= 0 && pi2_ncache_used(c, 0) == 1);
    pi2_ncache_free(c);
}

/* Reference: per region, a list of keys in LRU order, no pins. */
typedef struct { int64_t key[64]; int n, cap; } ref_region;

static int ref_find(const ref_region *r, int64_t key) {
    for (int i = 0; i < r->n; i++)
        if (r->key[i] == key) return i;
    return -1;
}

static void ref_use(ref_region *r, int64_t key) {
    int i = ref_find(r, key);
    if (i < 0) {
        if (r->n == r->cap) { /* evict the front */
            memmove(r->key, r->key + 1, sizeof(int64_t) * (size_t)(r->n - 1));
            r->n--;
        }
        r->key[r->n++] = key;
        return;
    }
    memmove(r->key + i, r->key + i + 1, sizeof(int64_t) * (size_t)(r->n - i - 1));
    r->key[r->n - 1] = key;
}

static void test_random_against_reference(void) {
    pi2_ncache_config cfg = {.n_blocks = 4, .n_ff = 40, .stride = 512, .cluster = 4, .hot_neurons = 8,
                             .hot_slots = 3, .cold_slots = 7};
    pi2_ncache *c = pi2_ncache_create(&cfg);
    ref_region hot = {.cap = 3}, cold = {.cap = 7};
    srand(7);
    int mismatches = 0;
    for (int step = 0; step < 5000; step++) {
        int b = rand() % cfg.n_blocks, k = rand() % cfg.n_ff;
        int is_hot = k < cfg.hot_neurons;
        int64_t key = is_hot ? (int64_t)b * 2 + k / 4 : (int64_t)b * cfg.n_ff + k;
        ref_region *r = is_hot ? &hot : &cold;
        int ref_hit = ref_find(r, key) >= 0;
        int64_t h = pi2_ncache_find(c, b, k);
        if ((h >= 0) != ref_hit) mismatches++;
        if (h < 0) {
            h = pi2_ncache_acquire(c, b, k);
            pi2_ncache_unpin(c, h);
        }
        pi2_ncache_touch(c, h, step);
        ref_use(r, key);
    }
    CHECK(mismatches == 0);
    CHECK(pi2_ncache_used(c, 1) == 3 && pi2_ncache_used(c, 0) == 7);
    pi2_ncache_free(c);
}

int main(void) {
    test_accounting();
    test_hot_clusters_share_a_slot();
    test_lru_and_pins();
    test_demote_waits_for_the_last_unpin();
    test_window_drop();
    test_random_against_reference();
    return pi2_test_summary("test_neuron_cache");
}
