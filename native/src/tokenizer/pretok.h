/* Pre-tokenizers for byte-level BPE: split text (as code points) into the words that BPE merges never
 * cross. Each GGUF tokenizer.ggml.pre names a sequence of regexes in llama.cpp; these are
 * hand-written equivalents of the ones pi2 supports (no regex engine), including llama.cpp's quirks
 * (each regex only sees the pieces the previous one produced). */
#ifndef PI2_PRETOK_H
#define PI2_PRETOK_H

#include <stddef.h>
#include <stdint.h>

enum {
    PI2_PRE_NONE = 0,     /* SPM: no pre-tokenizer */
    PI2_PRE_DEFAULT,      /* punctuation runs | GPT-2 | \p{N}+ | [0-9]{3} */
    PI2_PRE_GPT2,         /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) */
    PI2_PRE_SMOLLM,       /* \p{N} isolated, then GPT-2 */
    PI2_PRE_LLAMA3,       /* Llama 3: digits in threes, [^\r\n\p{L}\p{N}]?\p{L}+, ... (ignores merges) */
    PI2_PRE_LLAMA3_MERGE, /* Llama 3's regex, merges always applied (dbrx, smaug-bpe) */
    PI2_PRE_QWEN2,        /* Llama 3's regex with single digits */
};

/* PI2_PRE_* for a GGUF tokenizer.ggml.pre value ("" = default), or -1 when unsupported. */
int pi2_pre_type_from_name(const char *name);
/* 1 when a word that is itself a vocabulary token is taken whole, skipping merges (llama3). */
int pi2_pre_ignores_merges(int pre_type);

/* Split cps[0..n) into words; *lens receives each word's length in code points (caller frees).
 * Returns the number of words, or -1 when out of memory. */
long pi2_pretokenize(int pre_type, const uint32_t *cps, size_t n, size_t **lens);

#endif
