#include "neuron_cache.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"

/* One region: slots in a doubly linked LRU list (head = least recently used) plus a stack of free
 * slots, so eviction and window drops never walk over empty entries. */
typedef struct {
    int64_t n;
    size_t slot_bytes;
    uint8_t *mem;
    int32_t *prev, *next, *free_stack;
    int64_t head, tail, n_free;
    int64_t *owner;    /* key of the content (block * units + unit), -1 when free */
    int64_t *last_use; /* token index of the last touch */
    uint8_t *state;
    int32_t *pins;
    uint8_t *demoted; /* pi2_ncache_demote on a pinned slot: it moves when its last pin goes */
} region;

struct pi2_ncache {
    pi2_ncache_config cfg;
    int clusters_per_block;
    region hot, cold;
    int32_t *hot_of;  /* [n_blocks * clusters_per_block] -> hot slot or -1 */
    int32_t *cold_of; /* [n_blocks * n_ff] -> cold slot or -1 */
};

static void list_unlink(region *r, int64_t s) {
    int64_t p = r->prev[s], n = r->next[s];
    if (p >= 0) r->next[p] = (int32_t)n; else r->head = n;
    if (n >= 0) r->prev[n] = (int32_t)p; else r->tail = p;
    r->prev[s] = r->next[s] = -1;
}

static void list_append(region *r, int64_t s) { /* at the most recently used end */
    r->prev[s] = (int32_t)r->tail;
    r->next[s] = -1;
    if (r->tail >= 0) r->next[r->tail] = (int32_t)s; else r->head = s;
    r->tail = s;
}

static int region_init(region *r, int64_t n, size_t slot_bytes) {
    memset(r, 0, sizeof *r);
    r->n = n;
    r->slot_bytes = slot_bytes;
    r->head = r->tail = -1;
    if (!n) return 0;
    /* Anonymous and page aligned (O_DIRECT reads land here); untouched pages cost no RSS. */
    r->mem = mmap(NULL, (size_t)n * slot_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r->mem == MAP_FAILED) {
        r->mem = NULL;
        return -1;
    }
    pi2_huge_advise(r->mem, (size_t)n * slot_bytes); /* bundles at scattered places: a TLB miss each */
    r->prev = malloc(sizeof(int32_t) * (size_t)n);
    r->next = malloc(sizeof(int32_t) * (size_t)n);
    r->free_stack = malloc(sizeof(int32_t) * (size_t)n);
    r->owner = malloc(sizeof(int64_t) * (size_t)n);
    r->last_use = calloc((size_t)n, sizeof(int64_t));
    r->state = calloc((size_t)n, 1);
    r->pins = calloc((size_t)n, sizeof(int32_t));
    r->demoted = calloc((size_t)n, 1);
    if (!r->prev || !r->next || !r->free_stack || !r->owner || !r->last_use || !r->state || !r->pins || !r->demoted)
        return -1;
    for (int64_t s = 0; s < n; s++) {
        r->prev[s] = r->next[s] = -1;
        r->owner[s] = -1;
        r->free_stack[s] = (int32_t)(n - 1 - s); /* slot 0 first */
    }
    r->n_free = n;
    return 0;
}

static void region_free(region *r) {
    if (r->mem) munmap(r->mem, (size_t)r->n * r->slot_bytes);
    free(r->prev);
    free(r->next);
    free(r->free_stack);
    free(r->owner);
    free(r->last_use);
    free(r->state);
    free(r->pins);
    free(r->demoted);
}

pi2_ncache *pi2_ncache_create(const pi2_ncache_config *cfg) {
    if (cfg->n_blocks < 1 || cfg->n_ff < 1 || cfg->cluster < 1 || cfg->hot_neurons < 0 ||
        cfg->hot_neurons > cfg->n_ff || cfg->hot_slots < 0 || cfg->cold_slots < 0 || cfg->stride == 0 ||
        cfg->hot_slots > INT32_MAX || cfg->cold_slots > INT32_MAX) {
        pi2_set_error("neuron cache: invalid configuration");
        return NULL;
    }
    pi2_ncache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->cfg = *cfg;
    if (!c->cfg.cold_bytes || c->cfg.cold_bytes > cfg->stride) c->cfg.cold_bytes = cfg->stride;
    cfg = &c->cfg;
    c->clusters_per_block = (cfg->hot_neurons + cfg->cluster - 1) / cfg->cluster;
    int64_t hot_keys = (int64_t)cfg->n_blocks * c->clusters_per_block, cold_keys = (int64_t)cfg->n_blocks * cfg->n_ff;
    int ok = region_init(&c->hot, cfg->hot_slots, (size_t)cfg->cluster * cfg->stride) == 0 &&
             region_init(&c->cold, cfg->cold_slots, cfg->cold_bytes) == 0;
    c->hot_of = malloc(sizeof(int32_t) * (size_t)(hot_keys ? hot_keys : 1));
    c->cold_of = malloc(sizeof(int32_t) * (size_t)cold_keys);
    if (!ok || !c->hot_of || !c->cold_of) {
        pi2_set_error("neuron cache: cannot reserve %.1f MiB", pi2_ncache_bytes(c) / 1048576.0);
        pi2_ncache_free(c);
        return NULL;
    }
    for (int64_t i = 0; i < hot_keys; i++) c->hot_of[i] = -1;
    for (int64_t i = 0; i < cold_keys; i++) c->cold_of[i] = -1;
    return c;
}

void pi2_ncache_free(pi2_ncache *c) {
    if (!c) return;
    region_free(&c->hot);
    region_free(&c->cold);
    free(c->hot_of);
    free(c->cold_of);
    free(c);
}

const pi2_ncache_config *pi2_ncache_cfg(const pi2_ncache *c) { return &c->cfg; }

size_t pi2_ncache_bytes(const pi2_ncache *c) {
    return (size_t)c->cfg.hot_slots * c->cfg.cluster * c->cfg.stride + (size_t)c->cfg.cold_slots * c->cfg.cold_bytes;
}

int pi2_ncache_is_hot(const pi2_ncache *c, int k) { return k < c->cfg.hot_neurons; }

/* Handles: cold slots first, then hot. */
static region *region_of(pi2_ncache *c, int64_t h, int64_t *s) {
    if (h < c->cfg.cold_slots) {
        *s = h;
        return &c->cold;
    }
    *s = h - c->cfg.cold_slots;
    return &c->hot;
}

static const region *region_of_const(const pi2_ncache *c, int64_t h, int64_t *s) {
    return region_of((pi2_ncache *)c, h, s);
}

int64_t pi2_ncache_find(const pi2_ncache *c, int b, int k) {
    if (pi2_ncache_is_hot(c, k)) {
        int32_t s = c->hot_of[(int64_t)b * c->clusters_per_block + k / c->cfg.cluster];
        return s < 0 ? -1 : c->cfg.cold_slots + s;
    }
    return c->cold_of[(int64_t)b * c->cfg.n_ff + k];
}

int pi2_ncache_find_many(const pi2_ncache *c, int b, const int32_t *ks, int n, int64_t *h) {
    const int32_t *cold = c->cold_of + (int64_t)b * c->cfg.n_ff;
    int hot = 0;
    for (int i = 0; i < n; i++) {
        const int is_hot = ks[i] < c->cfg.hot_neurons;
        hot += is_hot;
        h[i] = is_hot ? pi2_ncache_find(c, b, ks[i]) : cold[ks[i]];
    }
    return hot;
}

static void forget(pi2_ncache *c, region *r, int64_t s) {
    if (r->owner[s] < 0) return;
    if (r == &c->hot) c->hot_of[r->owner[s]] = -1;
    else c->cold_of[r->owner[s]] = -1;
    r->owner[s] = -1;
    r->state[s] = PI2_SLOT_EMPTY;
    r->demoted[s] = 0;
}

int64_t pi2_ncache_acquire(pi2_ncache *c, int b, int k) {
    const int hot = pi2_ncache_is_hot(c, k);
    region *r = hot ? &c->hot : &c->cold;
    int64_t s = -1;
    if (r->n_free > 0) {
        s = r->free_stack[--r->n_free];
    } else {
        for (int64_t i = r->head; i >= 0; i = r->next[i])
            if (!r->pins[i]) {
                s = i;
                break;
            }
        if (s < 0) return -1;
        list_unlink(r, s);
        forget(c, r, s);
    }
    int64_t key = hot ? (int64_t)b * c->clusters_per_block + k / c->cfg.cluster : (int64_t)b * c->cfg.n_ff + k;
    r->owner[s] = key;
    r->state[s] = PI2_SLOT_EMPTY;
    r->pins[s] = 1;
    list_append(r, s);
    if (hot) c->hot_of[key] = (int32_t)s;
    else c->cold_of[key] = (int32_t)s;
    return hot ? c->cfg.cold_slots + s : s;
}

uint8_t *pi2_ncache_bundle(const pi2_ncache *c, int64_t h, int k) {
    int64_t s;
    const region *r = region_of_const(c, h, &s);
    uint8_t *base = r->mem + (size_t)s * r->slot_bytes;
    return r == &c->hot ? base + (size_t)(k % c->cfg.cluster) * c->cfg.stride : base;
}

uint8_t *pi2_ncache_slot_data(const pi2_ncache *c, int64_t h, size_t *bytes, int *block, int *first_k) {
    int64_t s;
    const region *r = region_of_const(c, h, &s);
    const int64_t key = r->owner[s];
    if (r == &c->hot) {
        *block = (int)(key / c->clusters_per_block);
        *first_k = (int)(key % c->clusters_per_block) * c->cfg.cluster;
        int n = c->cfg.n_ff - *first_k < c->cfg.cluster ? c->cfg.n_ff - *first_k : c->cfg.cluster;
        *bytes = (size_t)n * c->cfg.stride;
    } else {
        *block = (int)(key / c->cfg.n_ff);
        *first_k = (int)(key % c->cfg.n_ff);
        *bytes = c->cfg.cold_bytes;
    }
    return r->mem + (size_t)s * r->slot_bytes;
}

int pi2_ncache_state(const pi2_ncache *c, int64_t h) {
    int64_t s;
    return region_of_const(c, h, &s)->state[s];
}

void pi2_ncache_set_state(pi2_ncache *c, int64_t h, int state) {
    int64_t s;
    region_of(c, h, &s)->state[s] = (uint8_t)state;
}

void pi2_ncache_pin(pi2_ncache *c, int64_t h) {
    int64_t s;
    region_of(c, h, &s)->pins[s]++;
}

static void list_prepend(region *r, int64_t s) { /* at the least recently used end: the next to go */
    if (r->head == s) return;
    list_unlink(r, s);
    r->prev[s] = -1;
    r->next[s] = (int32_t)r->head;
    if (r->head >= 0) r->prev[r->head] = (int32_t)s; else r->tail = s;
    r->head = s;
}

void pi2_ncache_unpin(pi2_ncache *c, int64_t h) {
    int64_t s;
    region *r = region_of(c, h, &s);
    if (r->pins[s] > 0) r->pins[s]--;
    if (r->pins[s] == 0 && r->demoted[s]) {
        r->demoted[s] = 0;
        list_prepend(r, s);
    }
}

void pi2_ncache_touch(pi2_ncache *c, int64_t h, int64_t token) {
    int64_t s;
    region *r = region_of(c, h, &s);
    r->last_use[s] = token;
    r->demoted[s] = 0; /* used again: most recently used after all */
    if (r->tail != s) {
        list_unlink(r, s);
        list_append(r, s);
    }
}

/* A pinned slot waits for its last unpin: acquire looks for a victim from the least recently used end
 * and walks past pinned slots, so a wave's demoted misses (still pinned while they are read and
 * computed) piled there made every later acquire of the wave walk all of them. On the 47B shape at
 * 7 GiB (~1.7k misses a block, most ranked past admit_limit) that was ~1.4M list steps a block. The
 * slots end where they did (each to the end as its wave unpins it, in the wave's order), so the cache
 * evicts the same neurons as before. */
void pi2_ncache_demote(pi2_ncache *c, int64_t h) {
    int64_t s;
    region *r = region_of(c, h, &s);
    if (r->pins[s] > 0) r->demoted[s] = 1;
    else list_prepend(r, s);
}

static void drop(pi2_ncache *c, region *r, int64_t s) {
    list_unlink(r, s);
    forget(c, r, s);
    r->free_stack[r->n_free++] = (int32_t)s;
}

int64_t pi2_ncache_drop_older(pi2_ncache *c, int64_t min_token) {
    region *r = &c->cold;
    int64_t dropped = 0;
    /* The list is in touch order, so the old entries are a prefix (pinned ones are stepped over). */
    for (int64_t s = r->head; s >= 0;) {
        int64_t next = r->next[s];
        if (r->last_use[s] >= min_token) break;
        if (!r->pins[s]) {
            drop(c, r, s);
            dropped++;
        }
        s = next;
    }
    return dropped;
}

void pi2_ncache_drop_all(pi2_ncache *c) {
    region *rs[2] = {&c->cold, &c->hot};
    for (int i = 0; i < 2; i++)
        for (int64_t s = rs[i]->head; s >= 0;) {
            int64_t next = rs[i]->next[s];
            if (!rs[i]->pins[s]) drop(c, rs[i], s);
            s = next;
        }
}

int64_t pi2_ncache_used(const pi2_ncache *c, int hot) {
    const region *r = hot ? &c->hot : &c->cold;
    return r->n - r->n_free;
}
