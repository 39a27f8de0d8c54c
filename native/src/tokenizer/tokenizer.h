/* Tokenizers built from the vocabulary stored in the model file (GGUF's tokenizer.ggml.* data):
 * SentencePiece-style BPE (Llama/Mistral: scores, "▁" for spaces, byte-fallback tokens <0xNN>) and
 * byte-level BPE (GPT-2 style, as SmolLM2 uses: merges, byte-to-unicode mapping, pre-tokenizer
 * regex chosen by GGUF's tokenizer.ggml.pre). Output matches llama.cpp's tokenizer on the same vocab. */
#ifndef PI2_TOKENIZER_H
#define PI2_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef enum { PI2_TOK_SPM = 1, PI2_TOK_BPE = 2 } pi2_tok_kind;

/* GGUF token types */
enum { PI2_TOKTYPE_NORMAL = 1, PI2_TOKTYPE_UNKNOWN = 2, PI2_TOKTYPE_CONTROL = 3,
       PI2_TOKTYPE_USER_DEFINED = 4, PI2_TOKTYPE_UNUSED = 5, PI2_TOKTYPE_BYTE = 6 };

/* A view of the vocabulary; pi2_tokenizer_create copies what it needs (the view and the memory it
 * points into may go away right after). */
typedef struct {
    pi2_tok_kind kind;
    int32_t n_vocab;
    const char *const *tokens;      /* token text exactly as GGUF stores it (not NUL-terminated) */
    const uint32_t *token_lens;
    const float *scores;            /* SPM merge priority; may be NULL for BPE */
    const int32_t *token_types;     /* PI2_TOKTYPE_*; may be NULL (all normal) */
    int32_t n_merges;               /* BPE: "left right" pairs, highest priority first */
    const char *const *merges;
    const uint32_t *merge_lens;
    const char *pre;                /* GGUF tokenizer.ggml.pre ("default", "smollm", "gpt2", "llama3"...) */
    int32_t bos_id, eos_id, unk_id, pad_id; /* -1 when absent */
    int add_bos;                    /* GGUF tokenizer.ggml.add_bos_token */
    int add_space_prefix;           /* SPM: prepend "▁" to the text (GGUF add_space_prefix, default 1) */
} pi2_vocab_desc;

typedef struct pi2_tokenizer pi2_tokenizer;

/* NULL (with pi2_set_error) on an inconsistent vocabulary. */
pi2_tokenizer *pi2_tokenizer_create(const pi2_vocab_desc *desc);
void pi2_tokenizer_free(pi2_tokenizer *tok);

/* Encode text. add_bos: prepend BOS if the vocabulary asks for it (desc.add_bos, from GGUF
 * add_bos_token) and has one, like llama.cpp's add_special (SmolLM2, for one, wants no BOS); 0 never
 * adds it. parse_special: text spans equal to control/user-defined tokens (e.g. "<|im_start|>")
 * become those tokens, as llama.cpp does with parse_special. Returns the number of ids, or -(needed)
 * when max_out is too small (-1 with pi2_set_error only when out of memory). */
int pi2_tokenize(const pi2_tokenizer *tok, const char *text, size_t len, int add_bos, int parse_special,
                 int32_t *out, int max_out);

/* The raw bytes a token decodes to (may be part of a UTF-8 sequence; control tokens decode to "").
 * Returns bytes written, or -(needed) when buflen is too small. */
int pi2_token_to_piece(const pi2_tokenizer *tok, int32_t id, char *buf, int buflen);

int32_t pi2_tokenizer_n_vocab(const pi2_tokenizer *tok);
int32_t pi2_tokenizer_bos(const pi2_tokenizer *tok);
int32_t pi2_tokenizer_eos(const pi2_tokenizer *tok);
/* 1 if generation should stop at this token (EOS, or an end-of-turn control token such as
 * <|im_end|> / <|eot_id|> / </s>). */
int pi2_token_is_eog(const pi2_tokenizer *tok, int32_t id);

#endif
