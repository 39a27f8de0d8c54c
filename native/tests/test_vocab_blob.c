/* The vocab blob parser must reject every malformed blob cleanly (never read past it), and a valid
 * blob must give a working tokenizer. A tiny SentencePiece vocabulary exercises merges by score, the
 * space prefix, byte fallback, special-token parsing and token_to_piece. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "tokenizer.h"
#include "vocab_blob.h"

#define SP "\xe2\x96\x81" /* U+2581, SentencePiece's space */

static const char *const TOKENS[] = {"<unk>", "<s>", "</s>", SP, "a", "b", SP "a", "ab", SP "ab", "<0x63>", "<|im_start|>"};
static const float SCORES[] = {0, 0, 0, -1, -2, -3, -0.5f, -0.2f, -0.1f, 0, 0};
static const int32_t TYPES[] = {2, 3, 3, 1, 1, 1, 1, 1, 1, 6, 3};
#define N_TOK 11

typedef struct {
    uint8_t *p;
    size_t n;
} buf;

static void put(buf *b, const void *src, size_t n) {
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void pad(buf *b) {
    while (b->n % 4) b->p[b->n++] = 0;
}

/* Writes the blob into mem (4-aligned, big enough) and returns its size. */
static size_t build_blob(uint8_t *mem) {
    buf b = {mem, 0};
    memset(mem, 0, 64);
    put(&b, "PI2VOCAB", 8);
    put_u32(&b, 1);                /* version */
    put_u32(&b, PI2_TOK_SPM);      /* kind */
    put_u32(&b, 1 | 2 | 4 | 8);    /* add_bos, add_space_prefix, scores, types */
    put_u32(&b, N_TOK);
    put_u32(&b, 0);                /* merges */
    int32_t ids[4] = {1, 2, 0, -1};
    put(&b, ids, 16);
    put_u32(&b, 0);                /* pre_len */
    size_t total_at = b.n;
    put_u32(&b, 0);                /* total_size, patched below */
    b.n = 64;
    b.p[b.n++] = 0;                /* empty pre name + NUL */
    pad(&b);
    for (int i = 0; i < N_TOK; i++) put_u32(&b, (uint32_t)strlen(TOKENS[i]));
    for (int i = 0; i < N_TOK; i++) put(&b, TOKENS[i], strlen(TOKENS[i]));
    pad(&b);
    put(&b, SCORES, sizeof(SCORES));
    put(&b, TYPES, sizeof(TYPES));
    uint32_t total = (uint32_t)b.n;
    memcpy(mem + total_at, &total, 4);
    return b.n;
}

static int parses(const uint8_t *blob, size_t len) {
    pi2_vocab_desc d;
    int rc = pi2_vocab_blob_parse(blob, len, &d);
    pi2_vocab_desc_release(&d);
    return rc == 0;
}

static int ids_equal(const int32_t *got, int n, const int32_t *want, int n_want) {
    return n == n_want && memcmp(got, want, (size_t)n * sizeof(int32_t)) == 0;
}

static void test_tokenizer_on_valid_blob(const uint8_t *blob, size_t len) {
    pi2_vocab_desc d;
    CHECK(pi2_vocab_blob_parse(blob, len, &d) == 0);
    CHECK(d.n_vocab == N_TOK && d.kind == PI2_TOK_SPM && d.add_bos && d.add_space_prefix);
    CHECK(d.token_lens[8] == 5 && memcmp(d.tokens[8], SP "ab", 5) == 0);
    pi2_tokenizer *tok = pi2_tokenizer_create(&d);
    pi2_vocab_desc_release(&d);
    CHECK(tok != NULL);
    if (!tok) return;
    int32_t out[16];
    /* "ab" -> "▁ab": a+b (score -0.2) beats ▁+a (-0.5), then ▁+ab (-0.1) */
    int n = pi2_tokenize(tok, "ab", 2, 1, 1, out, 16);
    CHECK(ids_equal(out, n, (int32_t[]){1, 8}, 2));
    /* "c" has no token: byte fallback <0x63> */
    n = pi2_tokenize(tok, "c", 1, 0, 1, out, 16);
    CHECK(ids_equal(out, n, (int32_t[]){3, 9}, 2));
    /* special token in the text; the text after it gets the space prefix again */
    n = pi2_tokenize(tok, "ab<|im_start|>b", 15, 0, 1, out, 16);
    CHECK(ids_equal(out, n, (int32_t[]){8, 10, 3, 5}, 4));
    /* too small an output buffer: the size needed */
    CHECK(pi2_tokenize(tok, "ab<|im_start|>b", 15, 1, 1, out, 2) == -5);
    CHECK(pi2_tokenize(tok, "", 0, 1, 1, out, 16) == 1 && out[0] == 1);
    char piece[8];
    CHECK(pi2_token_to_piece(tok, 8, piece, 8) == 3 && memcmp(piece, " ab", 3) == 0);
    CHECK(pi2_token_to_piece(tok, 9, piece, 8) == 1 && piece[0] == 'c');
    CHECK(pi2_token_to_piece(tok, 1, piece, 8) == 0);
    CHECK(pi2_token_to_piece(tok, 8, piece, 2) == -3);
    CHECK(pi2_token_to_piece(tok, 99, piece, 8) == 0);
    CHECK(pi2_token_is_eog(tok, 2) && !pi2_token_is_eog(tok, 1) && !pi2_token_is_eog(tok, -1));
    CHECK(pi2_tokenizer_bos(tok) == 1 && pi2_tokenizer_eos(tok) == 2 && pi2_tokenizer_n_vocab(tok) == N_TOK);
    pi2_tokenizer_free(tok);
}

/* Flip bytes at random: parsing must never crash, and whatever parses must tokenize safely. */
static void fuzz(const uint8_t *good, size_t len, uint8_t *mem) {
    uint32_t seed = 12345;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(mem, good, len);
        int flips = 1 + iter % 4;
        for (int f = 0; f < flips; f++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % len;
            seed = seed * 1103515245u + 12345u;
            mem[at] ^= (uint8_t)(1u << ((seed >> 16) % 8));
        }
        pi2_vocab_desc d;
        if (pi2_vocab_blob_parse(mem, len, &d) != 0) continue;
        pi2_tokenizer *tok = pi2_tokenizer_create(&d);
        if (tok) {
            int32_t out[64];
            pi2_tokenize(tok, "ab c<|im_start|>\xff", 17, 1, 1, out, 64);
            char piece[16];
            for (int32_t id = 0; id < pi2_tokenizer_n_vocab(tok); id++) pi2_token_to_piece(tok, id, piece, 16);
            pi2_tokenizer_free(tok);
        }
        pi2_vocab_desc_release(&d);
    }
}

int main(void) {
    static uint32_t mem32[256], work32[256];
    uint8_t *mem = (uint8_t *)mem32, *work = (uint8_t *)work32;
    size_t len = build_blob(mem);
    CHECK(parses(mem, len));
    test_tokenizer_on_valid_blob(mem, len);

    /* every truncation */
    int truncated_ok = 1;
    for (size_t cut = 0; cut < len; cut++) {
        memcpy(work, mem, cut);
        if (parses(work, cut)) truncated_ok = 0;
        /* and with the header's total_size lying about it, so the section bounds checks must catch it */
        if (cut >= 64) {
            uint32_t lie = (uint32_t)cut;
            memcpy(work + 48, &lie, 4);
            if (parses(work, cut)) truncated_ok = 0;
        }
    }
    CHECK(truncated_ok);
    CHECK(!parses(NULL, len));

#define CORRUPT(offset, value)                                   \
    do {                                                         \
        memcpy(work, mem, len);                                  \
        uint32_t v_ = (uint32_t)(value);                         \
        memcpy(work + (offset), &v_, 4);                         \
        CHECK(!parses(work, len));                               \
    } while (0)
    CORRUPT(0, 0x58585858);        /* magic */
    CHECK(strstr(pi2_last_error(), "magic") != NULL);
    CORRUPT(8, 2);                 /* version */
    CHECK(strstr(pi2_last_error(), "version") != NULL);
    CORRUPT(12, 3);                /* kind */
    CORRUPT(16, 0x10);             /* unknown flag */
    CORRUPT(20, 0);                /* n_vocab */
    CORRUPT(20, 0x7FFFFFFF);
    CORRUPT(20, N_TOK + 1);        /* one token more than the data holds */
    CORRUPT(24, 0xFFFFFFFF);       /* negative merge count */
    CORRUPT(24, 1000);
    CORRUPT(28, N_TOK);            /* bos out of range */
    CORRUPT(36, -2);               /* unk below -1 */
    CORRUPT(44, 300);              /* pre name too long */
    CORRUPT(44, 1);                /* pre_len past its NUL */
    CORRUPT(48, len + 4);          /* total_size mismatch */
    CORRUPT(68, 0xFFFFFFFF);       /* first token length past the end */
    CHECK(strstr(pi2_last_error(), "token") != NULL);
    CORRUPT(68, 1000);

    /* a byte-level BPE blob without merges is refused */
    memcpy(work, mem, len);
    uint32_t bpe = PI2_TOK_BPE;
    memcpy(work + 12, &bpe, 4);
    CHECK(!parses(work, len));

    /* stray bytes after the data (total_size updated to match) */
    memcpy(work, mem, len);
    memset(work + len, 0, 4);
    uint32_t bigger = (uint32_t)len + 4;
    memcpy(work + 48, &bigger, 4);
    CHECK(!parses(work, len + 4));
    CHECK(strstr(pi2_last_error(), "stray") != NULL);

    /* misaligned in memory */
    memcpy(work + 1, mem, len);
    CHECK(!parses(work + 1, len));

    fuzz(mem, len, work);
    return pi2_test_summary("test_vocab_blob");
}
