#include "pi2file.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "crc32.h"
#include "kernels.h"

static const char *section_names[PI2_N_SECTIONS] = {"neuron region", "resident region", "tensor table",
                                                    "tokenizer", "metadata"};

const char *pi2_section_name(int s) { return s >= 0 && s < PI2_N_SECTIONS ? section_names[s] : "?"; }
const char *pi2_arch_name(uint32_t a) { return a == PI2_ARCH_LLAMA ? "llama" : a == PI2_ARCH_MOE ? "moe" : "?"; }
const char *pi2_act_name(uint32_t a) {
    return a == PI2_ACT_SWIGLU ? "swiglu" : a == PI2_ACT_RELU ? "relu" : a == PI2_ACT_DRELU ? "drelu" : "?";
}

static uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static float rdf32(const uint8_t *p) { float v; memcpy(&v, p, 4); return v; }

#define FAIL(...)                                        \
    do {                                                 \
        char msg_[400];                                  \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);        \
        pi2_set_error("%s: %s", f->path, msg_);          \
        return -1;                                       \
    } while (0)

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static int is_block_type(int t) { return t == PI2_Q4_0 || t == PI2_Q4_1 || t == PI2_Q8_0; }

/* Bytes of one row of n elements, or 0 when the type is unknown or n does not fit its blocks. */
static uint64_t row_bytes(int type, int64_t n) {
    if (n <= 0) return 0;
    if (type == PI2_TYPE_I32) return (uint64_t)n * 4;
    if (!pi2_type_valid_weight(type)) return 0;
    if (is_block_type(type) && n % PI2_QK) return 0;
    return pi2_row_size((pi2_type)type, n);
}

static int parse_header(pi2_file *f) {
    const uint8_t *p = f->map;
    pi2_header *h = &f->h;
    if (memcmp(p, "PI2MODEL", 8) != 0) FAIL("not a .pi2 model file (bad magic)");
    h->version = rd32(p + 8);
    if (h->version != PI2_FORMAT_VERSION)
        FAIL("format version %u, this engine reads version %d (re-convert the model)", h->version,
             PI2_FORMAT_VERSION);
    if (pi2_crc32(0, p, PI2_HEADER_BYTES - 4) != rd32(p + PI2_HEADER_BYTES - 4)) FAIL("header checksum mismatch (corrupted header)");
    if (rd32(p + 12) != PI2_HEADER_BYTES) FAIL("header_bytes is %u, expected %d", rd32(p + 12), PI2_HEADER_BYTES);
    uint32_t *u[] = {&h->arch, &h->ffn_act, &h->n_vocab, &h->n_embd, &h->n_layer, &h->n_head, &h->n_head_kv,
                     &h->head_dim, &h->n_ff, &h->n_expert, &h->n_expert_used, &h->n_ctx_train};
    for (int i = 0; i < 12; i++) *u[i] = rd32(p + 16 + 4 * i);
    h->rope_theta = rdf32(p + 64);
    h->rms_eps = rdf32(p + 68);
    h->rope_type = rd32(p + 72);
    h->flags = rd32(p + 76);
    h->neuron_type = rd32(p + 80);
    h->bundle_align = rd32(p + 84);
    h->part_bytes = rd64(p + 88);
    h->bundle_stride = rd64(p + 96);
    h->ffn_block_bytes = rd64(p + 104);
    h->n_tensors = rd32(p + 112);
    h->file_bytes = rd64(p + 120);
    for (int s = 0; s < PI2_N_SECTIONS; s++) {
        const uint8_t *q = p + 128 + 24 * s;
        h->sections[s].offset = rd64(q);
        h->sections[s].size = rd64(q + 8);
        h->sections[s].crc32 = rd32(q + 16);
    }

    if (h->file_bytes != f->size)
        FAIL("file is %zu bytes but its header says %llu (truncated or padded file)", f->size,
             (unsigned long long)h->file_bytes);
    if (h->arch != PI2_ARCH_LLAMA && h->arch != PI2_ARCH_MOE) FAIL("unknown arch %u", h->arch);
    if (h->ffn_act < PI2_ACT_SWIGLU || h->ffn_act > PI2_ACT_DRELU) FAIL("unknown ffn activation %u", h->ffn_act);
    if (h->n_vocab < 1 || h->n_vocab > (1u << 24)) FAIL("n_vocab %u out of range", h->n_vocab);
    if (h->n_embd < 32 || h->n_embd > 65536 || h->n_embd % 32) FAIL("n_embd %u is not a multiple of 32 in [32, 65536]", h->n_embd);
    if (h->n_layer < 1 || h->n_layer > 1024) FAIL("n_layer %u out of range", h->n_layer);
    if (h->n_head < 1 || h->n_head > 1024 || h->n_head_kv < 1 || h->n_head % h->n_head_kv)
        FAIL("n_head %u / n_head_kv %u: need n_head_kv >= 1 dividing n_head", h->n_head, h->n_head_kv);
    if (h->head_dim < 2 || h->head_dim > 1024 || h->head_dim % 2) FAIL("head_dim %u must be even in [2, 1024]", h->head_dim);
    if (h->n_ff < 1 || h->n_ff > (1u << 20)) FAIL("n_ff %u out of range", h->n_ff);
    if (h->arch == PI2_ARCH_MOE) {
        if (h->n_expert < 2 || h->n_expert > 256 || h->n_expert_used < 1 || h->n_expert_used > h->n_expert)
            FAIL("moe needs 2 <= n_expert <= 256 and 1 <= n_expert_used <= n_expert (got %u, %u)", h->n_expert,
                 h->n_expert_used);
    } else if (h->n_expert || h->n_expert_used) {
        FAIL("a dense model must have n_expert = n_expert_used = 0");
    }
    if (h->n_ctx_train < 1) FAIL("n_ctx_train is 0");
    if (!isfinite(h->rope_theta) || h->rope_theta <= 0) FAIL("rope_theta must be positive");
    if (!isfinite(h->rms_eps) || h->rms_eps <= 0) FAIL("rms_eps must be positive");
    if (h->rope_type != 0) FAIL("unknown rope_type %u", h->rope_type);
    if (h->flags & ~15u) FAIL("unknown flags 0x%x", h->flags);
    if ((h->flags & PI2_FLAG_GATE_PREDICTOR) && (!(h->flags & PI2_FLAG_PREDICTOR) || h->ffn_act != PI2_ACT_SWIGLU))
        FAIL("a gate predictor (flags bit3) needs the predictor bit (bit2) and a SwiGLU FFN");
    if (!pi2_type_valid_weight((int)h->neuron_type)) FAIL("neuron_type %u is not a weight type", h->neuron_type);
    uint32_t a = h->bundle_align;
    if (a < 512 || a > PI2_PAGE || (a & (a - 1))) FAIL("bundle_align %u is not a power of two in [512, 4096]", a);
    uint64_t part = row_bytes((int)h->neuron_type, h->n_embd);
    uint64_t stride = round_up(3 * part, a);
    uint64_t block = round_up((uint64_t)h->n_ff * stride, PI2_PAGE);
    if (h->part_bytes != part || h->bundle_stride != stride || h->ffn_block_bytes != block)
        FAIL("bundle geometry (part %llu, stride %llu, block %llu) does not match the dimensions",
             (unsigned long long)h->part_bytes, (unsigned long long)h->bundle_stride,
             (unsigned long long)h->ffn_block_bytes);
    if (h->n_tensors < 1 || h->n_tensors > 1000000) FAIL("n_tensors %u out of range", h->n_tensors);

    for (int s = 0; s < PI2_N_SECTIONS; s++) {
        const pi2_section *sec = &h->sections[s];
        if (sec->offset % PI2_PAGE || sec->offset < PI2_HEADER_BYTES)
            FAIL("%s offset %llu is not a 4 KiB boundary after the header", section_names[s],
                 (unsigned long long)sec->offset);
        if (sec->size > f->size || sec->offset > f->size - sec->size)
            FAIL("%s [%llu, +%llu) lies beyond the end of the file", section_names[s],
                 (unsigned long long)sec->offset, (unsigned long long)sec->size);
        for (int t = 0; t < s; t++) {
            const pi2_section *o = &h->sections[t];
            if (sec->size && o->size && sec->offset < o->offset + o->size && o->offset < sec->offset + sec->size)
                FAIL("sections %s and %s overlap", section_names[t], section_names[s]);
        }
    }
    /* The bounds above keep this under 2^58 (1024 layers x 256 experts x 2^20 neurons x 1 MiB
     * bundles); checked all the same, so a looser bound later cannot make it wrap. */
    uint64_t n_blocks = h->arch == PI2_ARCH_MOE ? h->n_expert : 1, neuron_bytes;
    if (__builtin_mul_overflow(h->n_layer * n_blocks, block, &neuron_bytes))
        FAIL("the dimensions need a neuron region of more than 2^64 bytes");
    if (h->sections[PI2_SEC_NEURONS].size != neuron_bytes)
        FAIL("neuron region is %llu bytes, the dimensions need %llu",
             (unsigned long long)h->sections[PI2_SEC_NEURONS].size, (unsigned long long)neuron_bytes);
    if (h->sections[PI2_SEC_TABLE].size != (uint64_t)h->n_tensors * 128)
        FAIL("tensor table is %llu bytes, %u entries need %llu", (unsigned long long)h->sections[PI2_SEC_TABLE].size,
             h->n_tensors, (unsigned long long)h->n_tensors * 128);
    return 0;
}

/* CRC of a section through pread into a small buffer, so checking the (large) neuron region does
 * not pull its pages into this process's resident set; -1 when the file cannot be read. */
static int crc_by_reading(const pi2_file *f, const pi2_section *sec, uint32_t *crc) {
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = malloc(CHUNK);
    uint32_t c = 0;
    uint64_t done = 0;
    int ok = buf != NULL;
    while (ok && done < sec->size) {
        size_t want = sec->size - done < CHUNK ? (size_t)(sec->size - done) : CHUNK;
        ssize_t got = pread(fd, buf, want, (off_t)(sec->offset + done));
        if (got <= 0) ok = 0;
        else {
            c = pi2_crc32(c, buf, (size_t)got);
            done += (uint64_t)got;
        }
    }
    free(buf);
    close(fd);
    *crc = c;
    return ok ? 0 : -1;
}

int pi2_file_verify_section(const pi2_file *f, int s) {
    const pi2_section *sec = &f->h.sections[s];
    uint32_t crc;
    if (s != PI2_SEC_NEURONS || crc_by_reading(f, sec, &crc) != 0) crc = pi2_crc32(0, f->map + sec->offset, sec->size);
    if (crc != sec->crc32) FAIL("%s checksum mismatch (corrupted file)", section_names[s]);
    return 0;
}

/* Tensor names are looked up through an open-addressing hash of their indices (FNV-1a, linear
 * probing, at most half full): a file may hold up to 1M entries, and both the duplicate check here and
 * every pi2_file_find must stay O(1), not a scan of the table (100k entries took 18 s that way). */
static uint32_t name_hash(const char *s) {
    uint32_t x = 2166136261u;
    for (; *s; s++) x = (x ^ (uint8_t)*s) * 16777619u;
    return x;
}

/* The slot holding `name`, or the empty slot where it would go. */
static uint32_t *name_slot(const pi2_file *f, const char *name) {
    uint32_t i = name_hash(name) & f->name_mask;
    for (;; i = (i + 1) & f->name_mask) {
        uint32_t *slot = &f->name_index[i];
        if (!*slot || strcmp(f->tensors[*slot - 1].name, name) == 0) return slot; /* slots hold index + 1 */
    }
}

static int parse_table(pi2_file *f) {
    const pi2_header *h = &f->h;
    f->tensors = calloc(h->n_tensors, sizeof *f->tensors);
    uint32_t cap = 2;
    while (cap < 2 * h->n_tensors) cap *= 2;
    f->name_index = calloc(cap, sizeof *f->name_index);
    f->name_mask = cap - 1;
    if (!f->tensors || !f->name_index) FAIL("out of memory for %u tensor entries", h->n_tensors);
    const uint8_t *tab = f->map + h->sections[PI2_SEC_TABLE].offset;
    for (uint32_t i = 0; i < h->n_tensors; i++) {
        const uint8_t *e = tab + 128 * (size_t)i;
        pi2_tensor *t = &f->tensors[i];
        if (!memchr(e, 0, PI2_NAME_BYTES) || e[0] == 0) FAIL("tensor entry %u has no NUL-terminated name", i);
        memcpy(t->name, e, PI2_NAME_BYTES);
        t->type = (int)rd32(e + 64);
        t->n_dims = (int)rd32(e + 68);
        if (t->n_dims < 1 || t->n_dims > 4) FAIL("tensor '%s' has %d dims (1..4 allowed)", t->name, t->n_dims);
        /* Every product below is checked: shapes of up to 2^32 per dimension multiply past 2^64
         * (1 x 2^32 x 2^32 wrapped to 0 rows, so a tensor could claim 0 bytes at the end of a
         * region and be read past the mapping). */
        uint64_t rows = 1;
        for (int d = 0; d < 4; d++) {
            uint64_t ne = rd64(e + 72 + 8 * d);
            if (ne < 1 || ne > (1ull << 32) || (d >= t->n_dims && ne != 1))
                FAIL("tensor '%s' has a bad dimension %d (%llu)", t->name, d, (unsigned long long)ne);
            t->ne[d] = (int64_t)ne;
            if (d > 0 && __builtin_mul_overflow(rows, ne, &rows))
                FAIL("tensor '%s': shape [%lld, %lld, %lld, %lld] overflows 64 bits", t->name, (long long)t->ne[0],
                     (long long)rd64(e + 80), (long long)rd64(e + 88), (long long)rd64(e + 96));
        }
        t->region = (int)rd32(e + 104);
        t->offset = rd64(e + 112);
        t->nbytes = rd64(e + 120);
        if (t->region != PI2_SEC_NEURONS && t->region != PI2_SEC_RESIDENT)
            FAIL("tensor '%s' names region %d (only the neuron and resident regions hold tensors)", t->name, t->region);
        uint64_t rb = row_bytes(t->type, t->ne[0]);
        if (!rb) FAIL("tensor '%s': type %d with rows of %lld elements is invalid", t->name, t->type, (long long)t->ne[0]);
        uint64_t want;
        if (__builtin_mul_overflow(t->region == PI2_SEC_NEURONS ? (uint64_t)t->ne[1] : rows,
                                   t->region == PI2_SEC_NEURONS ? h->bundle_stride : rb, &want))
            FAIL("tensor '%s': its shape needs more than 2^64 bytes", t->name);
        if (t->region == PI2_SEC_NEURONS && (t->n_dims != 2 || t->type != (int)h->neuron_type || t->ne[0] != h->n_embd))
            FAIL("bundle tensor '%s' must be [n_embd, n_ff] of the neuron type", t->name);
        if (t->nbytes != want)
            FAIL("tensor '%s' is %llu bytes, its shape needs %llu", t->name, (unsigned long long)t->nbytes,
                 (unsigned long long)want);
        if (t->offset % PI2_PAGE) FAIL("tensor '%s' offset is not 4 KiB-aligned", t->name);
        const pi2_section *sec = &h->sections[t->region];
        if (t->nbytes > sec->size || t->offset > sec->size - t->nbytes)
            FAIL("tensor '%s' extends past the end of the %s", t->name, section_names[t->region]);
        t->data = f->map + sec->offset + t->offset;
        uint32_t *slot = name_slot(f, t->name);
        if (*slot) FAIL("tensor '%s' appears twice", t->name);
        *slot = i + 1;
    }
    return 0;
}

int pi2_file_open(pi2_file *f, const char *path, int verify_neurons) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) FAIL("cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        FAIL("not a regular file");
    }
    if (st.st_size < PI2_HEADER_BYTES) {
        close(fd);
        FAIL("truncated: %lld bytes, a .pi2 header alone is %d", (long long)st.st_size, PI2_HEADER_BYTES);
    }
    f->size = (size_t)st.st_size;
    void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) FAIL("mmap failed: %s", strerror(errno));
    f->map = map;
    if (parse_header(f) != 0) goto fail;
    for (int s = PI2_SEC_RESIDENT; s < PI2_N_SECTIONS; s++)
        if (pi2_file_verify_section(f, s) != 0) goto fail;
    if (verify_neurons && pi2_file_verify_section(f, PI2_SEC_NEURONS) != 0) goto fail;
    if (parse_table(f) != 0) goto fail;
    f->metadata = (const char *)f->map + f->h.sections[PI2_SEC_METADATA].offset;
    f->metadata_len = f->h.sections[PI2_SEC_METADATA].size;
    f->tokenizer = f->map + f->h.sections[PI2_SEC_TOKENIZER].offset;
    f->tokenizer_len = f->h.sections[PI2_SEC_TOKENIZER].size;
    return 0;
fail:
    pi2_file_close(f);
    return -1;
}

void pi2_file_close(pi2_file *f) {
    if (f->map) munmap((void *)f->map, f->size);
    free(f->tensors);
    free(f->name_index);
    f->map = NULL;
    f->tensors = NULL;
    f->name_index = NULL;
}

const pi2_tensor *pi2_file_find(const pi2_file *f, const char *name) {
    if (!f->name_index) return NULL;
    const uint32_t *slot = name_slot(f, name);
    return *slot ? &f->tensors[*slot - 1] : NULL;
}
