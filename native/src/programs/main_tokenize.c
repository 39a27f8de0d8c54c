/* pi2-tokenize: encode stdin with a vocab blob (the tokenizer section of a .pi2 file), or decode ids.
 *
 *   pi2-tokenize --vocab FILE [--no-bos] [--no-special] < text      prints ids, space-separated
 *   pi2-tokenize --vocab FILE --decode < ids                         prints the text they decode to
 *
 * --no-bos: do not prepend BOS even when the vocabulary asks for it. --no-special: treat control-token
 * texts like "<|im_start|>" in the input as plain text. Used by the tests to compare with llama.cpp. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "tokenizer.h"
#include "vocab_blob.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: pi2-tokenize --vocab FILE [--no-bos] [--no-special] [--decode]\n"
            "  Reads text from stdin and prints its token ids (space-separated), or with --decode\n"
            "  reads token ids (whitespace-separated) and prints the text they decode to.\n"
            "  FILE is a vocab blob (pi2cli.tokenizer_blob), the tokenizer section of a .pi2 model.\n"
            "  --no-bos      never prepend BOS (default: as the vocabulary says)\n"
            "  --no-special  do not turn control-token texts in the input into control tokens\n");
}

/* Read a whole stream; returns a malloc'ed buffer (8-byte aligned) or NULL. */
static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static int decode(const pi2_tokenizer *tok, const char *in, size_t len) {
    char *copy = malloc(len + 1);
    if (!copy) return 1;
    memcpy(copy, in, len);
    copy[len] = 0;
    char *p = copy;
    char piece[512];
    for (;;) {
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') p++;
        if (!*p) break;
        errno = 0;
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p || errno || id < 0 || id >= pi2_tokenizer_n_vocab(tok)) {
            fprintf(stderr, "pi2-tokenize: error: bad token id near '%.20s' (vocabulary has %d tokens)\n", p,
                    pi2_tokenizer_n_vocab(tok));
            free(copy);
            return 1;
        }
        p = end;
        int n = pi2_token_to_piece(tok, (int32_t)id, piece, sizeof(piece));
        if (n < 0) {
            char *big = malloc((size_t)-n);
            if (!big) break;
            n = pi2_token_to_piece(tok, (int32_t)id, big, -n);
            fwrite(big, 1, (size_t)n, stdout);
            free(big);
        } else {
            fwrite(piece, 1, (size_t)n, stdout);
        }
    }
    free(copy);
    return 0;
}

int main(int argc, char **argv) {
    const char *vocab_path = NULL;
    int add_bos = 1, parse_special = 1, do_decode = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--vocab") == 0 && i + 1 < argc) {
            vocab_path = argv[++i];
        } else if (strcmp(argv[i], "--no-bos") == 0) {
            add_bos = 0;
        } else if (strcmp(argv[i], "--no-special") == 0) {
            parse_special = 0;
        } else if (strcmp(argv[i], "--decode") == 0) {
            do_decode = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "pi2-tokenize: error: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!vocab_path) {
        fprintf(stderr, "pi2-tokenize: error: --vocab FILE is required\n");
        usage(stderr);
        return 2;
    }
    FILE *f = fopen(vocab_path, "rb");
    if (!f) {
        fprintf(stderr, "pi2-tokenize: error: cannot open %s: %s\n", vocab_path, strerror(errno));
        return 1;
    }
    size_t blob_len = 0;
    char *blob = read_all(f, &blob_len);
    fclose(f);
    if (!blob) {
        fprintf(stderr, "pi2-tokenize: error: cannot read %s\n", vocab_path);
        return 1;
    }
    pi2_vocab_desc desc;
    if (pi2_vocab_blob_parse(blob, blob_len, &desc) != 0) {
        fprintf(stderr, "pi2-tokenize: error: %s: %s\n", vocab_path, pi2_last_error());
        free(blob);
        return 1;
    }
    pi2_tokenizer *tok = pi2_tokenizer_create(&desc);
    pi2_vocab_desc_release(&desc);
    free(blob);
    if (!tok) {
        fprintf(stderr, "pi2-tokenize: error: %s\n", pi2_last_error());
        return 1;
    }

    size_t len = 0;
    char *text = read_all(stdin, &len);
    if (!text) {
        fprintf(stderr, "pi2-tokenize: error: cannot read stdin\n");
        pi2_tokenizer_free(tok);
        return 1;
    }
    int rc = 0;
    if (do_decode) {
        rc = decode(tok, text, len);
    } else {
        int cap = (int)(len + 16 < 1u << 30 ? len + 16 : 1u << 30);
        int32_t *ids = malloc((size_t)cap * sizeof(int32_t));
        int n = ids ? pi2_tokenize(tok, text, len, add_bos, parse_special, ids, cap) : -1;
        if (n < 0) {
            fprintf(stderr, "pi2-tokenize: error: %s\n", ids ? pi2_last_error() : "out of memory");
            rc = 1;
        } else {
            for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
        }
        free(ids);
    }
    free(text);
    pi2_tokenizer_free(tok);
    return rc;
}
