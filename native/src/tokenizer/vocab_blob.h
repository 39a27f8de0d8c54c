/* The serialized vocabulary ("vocab blob") that a .pi2 file stores verbatim in its tokenizer section.
 * pi2cli/tokenizer_blob.py writes it (from GGUF tokenizer.ggml.* data); pi2_vocab_blob_parse reads it.
 *
 * Layout, version 1. All integers little-endian; every section starts at a multiple of 4 bytes from
 * the start of the blob, and the blob itself must be 4-byte aligned in memory (the .pi2 writer aligns
 * the tokenizer section), because the parsed desc points straight into it.
 *
 *   off  size  field
 *   0    8     magic "PI2VOCAB"
 *   8    4     u32 version (= 1)
 *   12   4     u32 kind: 1 = SentencePiece BPE ("llama"), 2 = byte-level BPE ("gpt2")
 *   16   4     u32 flags: bit0 add_bos, bit1 add_space_prefix, bit2 has scores, bit3 has token types
 *   20   4     i32 n_vocab (1 .. 2^24)
 *   24   4     i32 n_merges (0 .. 2^24)
 *   28   16    i32 bos_id, eos_id, unk_id, pad_id (-1 when absent, else < n_vocab)
 *   44   4     u32 pre_len: bytes of the pre-tokenizer name (GGUF tokenizer.ggml.pre), at most 255
 *   48   4     u32 total_size: the whole blob's length in bytes (catches truncation)
 *   52   12    reserved, zero
 *   64         pre-tokenizer name: pre_len bytes, then a NUL, zero-padded to 4
 *              token_lens: u32[n_vocab]
 *              token bytes: all token texts back to back (sum of token_lens), zero-padded to 4
 *              scores: f32[n_vocab]            (only when flags bit2)
 *              token_types: i32[n_vocab]       (only when flags bit3; GGUF token types, 1..6)
 *              merge_lens: u32[n_merges]
 *              merge bytes: all merges ("left right") back to back, zero-padded to 4
 *   total_size ends exactly after the merge bytes.
 */
#ifndef PI2_VOCAB_BLOB_H
#define PI2_VOCAB_BLOB_H

#include <stddef.h>

#include "tokenizer.h"

#define PI2_VOCAB_BLOB_MAGIC "PI2VOCAB"
#define PI2_VOCAB_BLOB_VERSION 1u
#define PI2_VOCAB_BLOB_HEADER_SIZE 64u

enum {
    PI2_VOCAB_FLAG_ADD_BOS = 1u << 0,
    PI2_VOCAB_FLAG_ADD_SPACE_PREFIX = 1u << 1,
    PI2_VOCAB_FLAG_HAS_SCORES = 1u << 2,
    PI2_VOCAB_FLAG_HAS_TYPES = 1u << 3,
};

/* Fill *out with a view of the blob: its arrays point into the blob (which must outlive *out); the
 * two pointer arrays (tokens, merges) are allocated and freed by pi2_vocab_desc_release. Every
 * length and offset is validated: a malformed blob returns -1 with pi2_set_error and leaves *out
 * empty (safe to release). */
int pi2_vocab_blob_parse(const void *blob, size_t len, pi2_vocab_desc *out);
void pi2_vocab_desc_release(pi2_vocab_desc *desc);

/* The one check of a model's tokenizer section, shared by what tokenizes (generate, chat) and what
 * vouches for a file (`info`), so that a file info accepts is one generate can tokenize with
 * (docs/FORMAT.md): the blob parsed, the tokenizer built from it, and no more tokens than the model's
 * n_vocab (an id past the embedding table). The tokenizer, with *desc filled (release both); or NULL
 * with an error "PATH: tokenizer section: REASON" and *desc safe to release. */
pi2_tokenizer *pi2_tokenizer_from_section(const char *path, const void *blob, size_t len, uint32_t n_vocab,
                                          pi2_vocab_desc *desc);

#endif
