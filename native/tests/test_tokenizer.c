/* Native tokenizer checks that need no model file (so they also run under qemu for arm64): the
 * pre-tokenizer splits (worked out by hand from the regexes llama.cpp uses), a tiny byte-level BPE
 * vocabulary, special-token handling and the error paths. The comparison with llama.cpp on real
 * vocabularies is in tests/test_tokenizer.py. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "pretok.h"
#include "tokenizer.h"
#include "unicode.h"

/* Split text with a pre-tokenizer and compare with the expected words joined by '|'. */
static int splits_as(int pre, const char *text, const char *want) {
    uint32_t cps[256];
    size_t n = 0, len = strlen(text);
    for (size_t pos = 0; pos < len;) cps[n++] = pi2_utf8_decode(text, len, &pos);
    size_t *lens = NULL;
    long n_words = pi2_pretokenize(pre, cps, n, &lens);
    char got[1024];
    size_t g = 0, start = 0;
    for (long w = 0; w < n_words; w++) {
        if (w) got[g++] = '|';
        for (size_t i = start; i < start + lens[w]; i++) g += (size_t)pi2_utf8_encode(cps[i], got + g);
        start += lens[w];
    }
    got[g] = 0;
    free(lens);
    if (strcmp(got, want) != 0) fprintf(stderr, "pre %d on '%s': got '%s', want '%s'\n", pre, text, got, want);
    return strcmp(got, want) == 0;
}

static void test_pretokenizers(void) {
    CHECK(splits_as(PI2_PRE_GPT2, "Hello world's  12", "Hello| world|'s| | 12"));
    CHECK(splits_as(PI2_PRE_GPT2, "x  ", "x|  "));                  /* trailing spaces stay together */
    CHECK(splits_as(PI2_PRE_GPT2, "a\t\n b", "a|\t\n| b"));
    CHECK(splits_as(PI2_PRE_GPT2, "don'T", "don|'|T"));             /* contractions are case-sensitive */
    CHECK(splits_as(PI2_PRE_SMOLLM, "a 12", "a| |1|2"));            /* digits isolated first */
    CHECK(splits_as(PI2_PRE_SMOLLM, "x 3.14", "x| |3|.|1|4"));
    CHECK(splits_as(PI2_PRE_LLAMA3, "Hello 12345\n\n world", "Hello| |123|45|\n\n| world"));
    CHECK(splits_as(PI2_PRE_LLAMA3, "DON'T", "DON|'T"));            /* case-insensitive contractions */
    CHECK(splits_as(PI2_PRE_LLAMA3, "(x)", "(x|)"));                 /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    CHECK(splits_as(PI2_PRE_QWEN2, "ab12", "ab|1|2"));
    CHECK(splits_as(PI2_PRE_DEFAULT, "x+=1234;", "x|+=|123|4|;"));
    CHECK(splits_as(PI2_PRE_GPT2, "caf\xc3\xa9 \xe6\x9d\xb1\xe4\xba\xac", "caf\xc3\xa9| \xe6\x9d\xb1\xe4\xba\xac"));
    CHECK(pi2_pre_type_from_name("smollm") == PI2_PRE_SMOLLM);
    CHECK(pi2_pre_type_from_name("no-such") == -1);
}

static void test_unicode(void) {
    CHECK(pi2_ucat('a') == PI2_UCAT_LETTER && pi2_ucat('7') == PI2_UCAT_NUMBER && pi2_ucat('!') == PI2_UCAT_PUNCTUATION);
    CHECK(pi2_ucat(0x6771) == PI2_UCAT_LETTER);   /* 東 */
    CHECK(pi2_ucat(0xBD) == PI2_UCAT_NUMBER);     /* ½ */
    CHECK(pi2_ucat(0x301) == PI2_UCAT_MARK);      /* combining acute */
    CHECK(pi2_ucat(0x1F642) == PI2_UCAT_SYMBOL);  /* 🙂 */
    CHECK(pi2_ucat(0x110000) == PI2_UCAT_UNDEFINED);
    CHECK(pi2_is_whitespace(0x3000) && pi2_is_whitespace('\n') && !pi2_is_whitespace(0x200B));
    for (int b = 0; b < 256; b++) CHECK(pi2_cp_to_byte(pi2_byte_to_cp((uint8_t)b)) == b);
    CHECK(pi2_byte_to_cp(' ') == 0x120 && pi2_byte_to_cp('A') == 'A'); /* "Ġ" */
    size_t pos = 0;
    CHECK(pi2_utf8_decode("\xff", 1, &pos) == 0xFFFD && pos == 1);
    pos = 0;
    CHECK(pi2_utf8_decode("\xe6\x9d", 2, &pos) == 0xFFFD && pos == 1); /* cut sequence */
}

#define G "\xc4\xa0" /* Ġ: GPT-2's code point for the space byte */

static void test_tiny_bpe(void) {
    const char *tokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab", G, G "ab", "<|im", "\xc3\xa9"};
    uint32_t lens[10];
    for (int i = 0; i < 10; i++) lens[i] = (uint32_t)strlen(tokens[i]);
    int32_t types[10] = {3, 3, 3, 1, 1, 1, 1, 1, 4, 1};
    const char *merges[] = {"a b", G " ab", "bogus"};
    uint32_t merge_lens[] = {3, 5, 5};
    pi2_vocab_desc d = {.kind = PI2_TOK_BPE, .n_vocab = 10, .tokens = tokens, .token_lens = lens, .token_types = types,
                        .n_merges = 3, .merges = merges, .merge_lens = merge_lens, .pre = "smollm",
                        .bos_id = 1, .eos_id = 0, .unk_id = -1, .pad_id = -1, .add_bos = 0};
    pi2_tokenizer *tok = pi2_tokenizer_create(&d);
    CHECK(tok != NULL);
    if (!tok) return;
    int32_t out[16];
    int n = pi2_tokenize(tok, "ab ab", 5, 1, 1, out, 16); /* add_bos asked, but this vocab says no */
    CHECK(n == 2 && out[0] == 5 && out[1] == 7);
    /* longest special first: "<|im_start|>" wins over the user-defined "<|im" inside it */
    n = pi2_tokenize(tok, "<|im_start|>ab<|im_end|>", 24, 0, 1, out, 16);
    CHECK(n == 3 && out[0] == 1 && out[1] == 5 && out[2] == 2);
    /* without parse_special the user-defined "<|im" still splits out, as in llama.cpp */
    n = pi2_tokenize(tok, "<|im_start|>", 12, 0, 0, out, 16);
    CHECK(n >= 1 && out[0] == 8);
    n = pi2_tokenize(tok, "\xc3\xa9", 2, 0, 1, out, 16); /* é: bytes C3 A9 -> "Ã©" unknown here: dropped */
    CHECK(n == 0);
    char piece[16];
    CHECK(pi2_token_to_piece(tok, 7, piece, 16) == 3 && memcmp(piece, " ab", 3) == 0);
    CHECK(pi2_token_to_piece(tok, 8, piece, 16) == 4 && memcmp(piece, "<|im", 4) == 0); /* user-defined: as is */
    CHECK(pi2_token_to_piece(tok, 2, piece, 16) == 0);
    CHECK(pi2_token_is_eog(tok, 2) && pi2_token_is_eog(tok, 0) && !pi2_token_is_eog(tok, 1));
    CHECK(pi2_tokenize(tok, "ab ab ab", 8, 0, 1, out, 1) == -3);
    pi2_tokenizer_free(tok);

    d.add_bos = 1;
    tok = pi2_tokenizer_create(&d);
    CHECK(tok && pi2_tokenize(tok, "ab", 2, 1, 1, out, 16) == 2 && out[0] == 1);
    CHECK(tok && pi2_tokenize(tok, "ab", 2, 0, 1, out, 16) == 1 && out[0] == 5);
    pi2_tokenizer_free(tok);

    d.pre = "no-such-pre";
    CHECK(pi2_tokenizer_create(&d) == NULL && strstr(pi2_last_error(), "no-such-pre") != NULL);
    d.pre = "smollm";
    d.eos_id = 10;
    CHECK(pi2_tokenizer_create(&d) == NULL && strstr(pi2_last_error(), "outside") != NULL);
    d.eos_id = 0;
    d.n_merges = 0;
    CHECK(pi2_tokenizer_create(&d) == NULL);
}

int main(void) {
    test_unicode();
    test_pretokenizers();
    test_tiny_bpe();
    return pi2_test_summary("test_tokenizer");
}
