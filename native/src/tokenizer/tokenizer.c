/* The tokenizers (contract in tokenizer.h). Semantics follow llama.cpp's llama-vocab.cpp so that the
 * engine feeds the model exactly the ids llama.cpp would:
 *   1. special-token partition: control / user-defined token texts found in the input become those
 *      tokens (control ones only with parse_special), longest token text first;
 *   2. SPM: spaces -> U+2581, optional leading space, then greedy bigram merges by token score, with
 *      <0xNN> byte tokens for anything the vocabulary lacks;
 *   3. byte-level BPE: a pre-tokenizer (pretok.c) splits the text into words, each word's bytes are
 *      mapped to GPT-2's printable code points, then merges apply by rank.
 * Deliberate differences, none of which changes the ids for a well-formed vocabulary: a missing SPM
 * byte token gives unk (llama.cpp throws); equal-length special tokens are tried in id order
 * (llama.cpp's order is unspecified); the per-model LSTRIP/RSTRIP token attributes llama.cpp sets by
 * model name (phi-3, jina) are not applied; a non-byte-level character in a BPE token decodes to
 * itself; the Unicode category tables may be newer than llama.cpp's (unicode_tables.c). */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "pretok.h"
#include "tok_tables.h"
#include "unicode.h"

/* ---------- hash tables ---------- */

static uint32_t table_size_for(size_t n) {
    uint32_t size = 16;
    while (size < n * 2 + 16) size <<= 1;
    return size;
}

static void tok_insert(pi2_tokenizer *tok, int32_t id) {
    const char *text = tok->pool + tok->tok_off[id];
    uint64_t h = pi2_tok_hash(PI2_TOK_HASH_SEED, text, tok->tok_len[id]);
    for (uint32_t slot = (uint32_t)h & tok->tok_mask;; slot = (slot + 1) & tok->tok_mask) {
        int32_t other = tok->tok_table[slot];
        if (other < 0) {
            tok->tok_table[slot] = id;
            return;
        }
        /* a repeated text maps to its last id, as llama.cpp's token_to_id map does */
        if (tok->tok_len[other] == tok->tok_len[id] && memcmp(tok->pool + tok->tok_off[other], text, tok->tok_len[id]) == 0) {
            tok->tok_table[slot] = id;
            return;
        }
    }
}

/* Insert merge m unless its pair is already there: the first (highest-priority) rank wins. */
static void merge_insert(pi2_tokenizer *tok, int32_t m) {
    const pi2_merge *e = &tok->merges[m];
    const char *l = tok->merge_pool + e->off, *r = l + e->left_len + 1;
    uint64_t h = pi2_tok_pair_hash(l, e->left_len, r, e->right_len);
    for (uint32_t slot = (uint32_t)h & tok->merge_mask;; slot = (slot + 1) & tok->merge_mask) {
        int32_t other = tok->merge_table[slot];
        if (other < 0) {
            tok->merge_table[slot] = m;
            return;
        }
        const pi2_merge *o = &tok->merges[other];
        if (o->left_len == e->left_len && o->right_len == e->right_len &&
            memcmp(tok->merge_pool + o->off, l, e->left_len + 1 + e->right_len) == 0)
            return;
    }
}

/* ---------- construction ---------- */

/* Token texts that end generation (llama.cpp marks these end-of-generation and control). */
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[",
};

static int text_is(const pi2_tokenizer *tok, int32_t id, const char *s) {
    size_t n = strlen(s);
    return tok->tok_len[id] == n && memcmp(tok->pool + tok->tok_off[id], s, n) == 0;
}

static void mark_end_of_generation(pi2_tokenizer *tok) {
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        for (size_t k = 0; k < sizeof(EOG_TEXTS) / sizeof(EOG_TEXTS[0]); k++) {
            if (text_is(tok, id, EOG_TEXTS[k])) {
                tok->eog[id] = 1;
                tok->type[id] = PI2_TOKTYPE_CONTROL; /* llama.cpp forces these to control */
                break;
            }
        }
    }
    if (tok->eos_id >= 0) tok->eog[tok->eos_id] = 1;
    /* o200k_harmony / solar-open: with <|return|>+<|call|> (or <|calls|>+<|flush|>) present, <|end|>
     * ends a message, not the generation */
    int32_t end_id = -1;
    int has_return = 0, has_call = 0, has_flush = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        if (!tok->eog[id]) continue;
        if (text_is(tok, id, "<|return|>")) has_return = 1;
        if (text_is(tok, id, "<|call|>") || text_is(tok, id, "<|calls|>")) has_call = 1;
        if (text_is(tok, id, "<|flush|>")) has_flush = 1;
        if (text_is(tok, id, "<|end|>")) end_id = id;
    }
    if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
        tok->eog[end_id] = 0;
        tok->type[end_id] = PI2_TOKTYPE_USER_DEFINED;
    }
}

typedef struct {
    uint32_t len;
    int32_t id;
} special_key;

static int cmp_special(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int build_specials(pi2_tokenizer *tok) {
    int n = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        uint8_t t = tok->type[id];
        if (t == PI2_TOKTYPE_CONTROL || t == PI2_TOKTYPE_USER_DEFINED || t == PI2_TOKTYPE_UNKNOWN) n++;
    }
    tok->specials = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    if (!tok->specials) return -1;
    n = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        uint8_t t = tok->type[id];
        if (t == PI2_TOKTYPE_CONTROL || t == PI2_TOKTYPE_USER_DEFINED || t == PI2_TOKTYPE_UNKNOWN) tok->specials[n++] = id;
    }
    tok->n_specials = n;
    /* longest first, so "<|im_start|>" wins over a shorter token inside it */
    special_key *keys = malloc((size_t)(n ? n : 1) * sizeof(*keys));
    if (!keys) return -1;
    for (int i = 0; i < n; i++) keys[i] = (special_key){tok->tok_len[tok->specials[i]], tok->specials[i]};
    qsort(keys, (size_t)n, sizeof(*keys), cmp_special);
    for (int i = 0; i < n; i++) tok->specials[i] = keys[i].id;
    free(keys);
    return 0;
}

static int build_merges(pi2_tokenizer *tok, const pi2_vocab_desc *d) {
    size_t pool = 0;
    for (int32_t i = 0; i < d->n_merges; i++) pool += d->merge_lens[i];
    tok->merge_pool = malloc(pool ? pool : 1);
    tok->merges = malloc((size_t)(d->n_merges > 0 ? d->n_merges : 1) * sizeof(pi2_merge));
    tok->merge_mask = table_size_for((size_t)d->n_merges) - 1;
    tok->merge_table = malloc(((size_t)tok->merge_mask + 1) * sizeof(int32_t));
    if (!tok->merge_pool || !tok->merges || !tok->merge_table) return -1;
    memset(tok->merge_table, 0xFF, ((size_t)tok->merge_mask + 1) * sizeof(int32_t));
    size_t off = 0;
    int32_t n = 0;
    for (int32_t i = 0; i < d->n_merges; i++) {
        const char *m = d->merges[i];
        uint32_t len = d->merge_lens[i];
        /* "left right": split at the first space after the first byte (a token may start with one) */
        const char *space = len > 1 ? memchr(m + 1, ' ', len - 1) : NULL;
        if (!space) continue; /* llama.cpp files it under an empty pair that never matches */
        memcpy(tok->merge_pool + off, m, len);
        tok->merges[n].off = (uint32_t)off;
        tok->merges[n].left_len = (uint32_t)(space - m);
        tok->merges[n].right_len = len - (uint32_t)(space - m) - 1;
        tok->merges[n].rank = i;
        merge_insert(tok, n);
        off += len;
        n++;
    }
    tok->n_merges = n;
    return 0;
}

static void build_byte_tokens(pi2_tokenizer *tok) {
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        int32_t id = -1;
        if (tok->kind == PI2_TOK_SPM) {
            char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
            id = pi2_tok_find(tok, name, 6);
            if (id < 0) {
                char c = (char)b;
                id = pi2_tok_find(tok, &c, 1);
            }
            if (id < 0) id = tok->unk_id; /* llama.cpp would throw here; unk is the gentle reading */
        }
        tok->byte_token[b] = id;
        /* GPT-2 byte -> printable code point, pre-encoded as UTF-8 */
        tok->byte_utf8_len[b] = (uint8_t)pi2_utf8_encode(pi2_byte_to_cp((uint8_t)b), tok->byte_utf8[b]);
    }
}

pi2_tokenizer *pi2_tokenizer_create(const pi2_vocab_desc *d) {
    if (!d || (d->kind != PI2_TOK_SPM && d->kind != PI2_TOK_BPE)) {
        pi2_set_error("tokenizer: unknown vocabulary kind");
        return NULL;
    }
    if (d->n_vocab < 1 || !d->tokens || !d->token_lens) {
        pi2_set_error("tokenizer: empty vocabulary");
        return NULL;
    }
    if (d->n_merges < 0 || (d->n_merges > 0 && (!d->merges || !d->merge_lens))) {
        pi2_set_error("tokenizer: bad merge list");
        return NULL;
    }
    int32_t ids[4] = {d->bos_id, d->eos_id, d->unk_id, d->pad_id};
    for (int i = 0; i < 4; i++) {
        if (ids[i] < -1 || ids[i] >= d->n_vocab) {
            pi2_set_error("tokenizer: special token id %d outside the vocabulary (%d tokens)", ids[i], d->n_vocab);
            return NULL;
        }
    }
    int pre_type = PI2_PRE_NONE;
    if (d->kind == PI2_TOK_BPE) {
        if (d->n_merges == 0) {
            pi2_set_error("tokenizer: byte-level BPE vocabulary without merges");
            return NULL;
        }
        pre_type = pi2_pre_type_from_name(d->pre ? d->pre : "");
        if (pre_type < 0) {
            pi2_set_error("tokenizer: pre-tokenizer '%s' is not supported", d->pre ? d->pre : "");
            return NULL;
        }
    }

    pi2_tokenizer *tok = calloc(1, sizeof(*tok));
    if (!tok) goto oom;
    tok->kind = d->kind;
    tok->n_vocab = d->n_vocab;
    tok->pre_type = pre_type;
    tok->ignore_merges = pi2_pre_ignores_merges(pre_type);
    tok->bos_id = d->bos_id;
    tok->eos_id = d->eos_id;
    tok->unk_id = d->unk_id;
    tok->pad_id = d->pad_id;
    tok->add_bos = d->add_bos;
    tok->add_space_prefix = d->add_space_prefix;

    size_t pool = 0;
    for (int32_t i = 0; i < d->n_vocab; i++) pool += d->token_lens[i];
    tok->pool = malloc(pool ? pool : 1);
    tok->tok_off = malloc((size_t)d->n_vocab * sizeof(uint32_t));
    tok->tok_len = malloc((size_t)d->n_vocab * sizeof(uint32_t));
    tok->scores = calloc((size_t)d->n_vocab, sizeof(float));
    tok->type = malloc((size_t)d->n_vocab);
    tok->eog = calloc((size_t)d->n_vocab, 1);
    tok->tok_mask = table_size_for((size_t)d->n_vocab) - 1;
    tok->tok_table = malloc(((size_t)tok->tok_mask + 1) * sizeof(int32_t));
    if (!tok->pool || !tok->tok_off || !tok->tok_len || !tok->scores || !tok->type || !tok->eog || !tok->tok_table)
        goto oom;
    if (pool > UINT32_MAX) {
        pi2_tokenizer_free(tok);
        pi2_set_error("tokenizer: token texts exceed 4 GiB");
        return NULL;
    }
    memset(tok->tok_table, 0xFF, ((size_t)tok->tok_mask + 1) * sizeof(int32_t));
    size_t off = 0;
    for (int32_t i = 0; i < d->n_vocab; i++) {
        memcpy(tok->pool + off, d->tokens[i], d->token_lens[i]);
        tok->tok_off[i] = (uint32_t)off;
        tok->tok_len[i] = d->token_lens[i];
        off += d->token_lens[i];
        if (d->scores) tok->scores[i] = d->scores[i];
        int32_t t = d->token_types ? d->token_types[i] : PI2_TOKTYPE_NORMAL;
        tok->type[i] = (uint8_t)((t >= PI2_TOKTYPE_NORMAL && t <= PI2_TOKTYPE_BYTE) ? t : 0); /* 0: undefined */
        if (tok->tok_len[i] > 0) tok_insert(tok, i);
    }
    mark_end_of_generation(tok);
    /* gpt-oss: these structure tokens are always rendered as text, so they act as user-defined */
    static const char *const always_rendered[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};
    for (int32_t id = 0; id < tok->n_vocab; id++)
        for (size_t k = 0; k < 4; k++)
            if (text_is(tok, id, always_rendered[k])) tok->type[id] = PI2_TOKTYPE_USER_DEFINED;
    if (build_specials(tok) != 0) goto oom;
    if (d->kind == PI2_TOK_BPE && build_merges(tok, d) != 0) goto oom;
    build_byte_tokens(tok);
    return tok;

oom:
    pi2_tokenizer_free(tok);
    pi2_set_error("tokenizer: out of memory");
    return NULL;
}

void pi2_tokenizer_free(pi2_tokenizer *tok) {
    if (!tok) return;
    free(tok->pool);
    free(tok->tok_off);
    free(tok->tok_len);
    free(tok->scores);
    free(tok->type);
    free(tok->eog);
    free(tok->tok_table);
    free(tok->specials);
    free(tok->merge_pool);
    free(tok->merges);
    free(tok->merge_table);
    free(tok);
}

/* ---------- special-token partition ---------- */

typedef struct {
    int32_t token; /* -1: raw text */
    size_t off, len;
} fragment;

typedef struct {
    fragment *v;
    size_t n, cap;
} fragment_list;

static int frag_push(fragment_list *l, int32_t token, size_t off, size_t len) {
    if (pi2_grow(&l->v, &l->cap, l->n, sizeof *l->v, 16)) return -1;
    l->v[l->n++] = (fragment){token, off, len};
    return 0;
}

static const char *find_bytes(const char *hay, size_t hn, const char *needle, size_t nn) {
    if (nn == 0 || nn > hn) return NULL;
    return memmem(hay, hn, needle, nn);
}

/* Split the text around every special token (longest first), like llama.cpp's tokenizer_st_partition. */
static int partition(const pi2_tokenizer *tok, const char *text, size_t len, int parse_special, fragment_list *out) {
    fragment_list cur = {0}, next = {0};
    if (len > 0 && frag_push(&cur, -1, 0, len) != 0) goto oom;
    for (int s = 0; s < tok->n_specials; s++) {
        int32_t id = tok->specials[s];
        uint8_t t = tok->type[id];
        if (!parse_special && (t == PI2_TOKTYPE_CONTROL || t == PI2_TOKTYPE_UNKNOWN)) continue;
        const char *st = tok->pool + tok->tok_off[id];
        size_t sn = tok->tok_len[id];
        int changed = 0;
        next.n = 0;
        for (size_t f = 0; f < cur.n; f++) {
            fragment fr = cur.v[f];
            if (fr.token >= 0) {
                if (frag_push(&next, fr.token, 0, 0) != 0) goto oom;
                continue;
            }
            size_t pos = fr.off, end = fr.off + fr.len;
            const char *hit;
            while ((hit = find_bytes(text + pos, end - pos, st, sn)) != NULL) {
                size_t at = (size_t)(hit - text);
                if (at > pos && frag_push(&next, -1, pos, at - pos) != 0) goto oom;
                if (frag_push(&next, id, 0, 0) != 0) goto oom;
                pos = at + sn;
                changed = 1;
            }
            if (pos < end && frag_push(&next, -1, pos, end - pos) != 0) goto oom;
        }
        if (changed) {
            fragment_list tmp = cur;
            cur = next;
            next = tmp;
        }
    }
    free(next.v);
    *out = cur;
    return 0;
oom:
    free(cur.v);
    free(next.v);
    pi2_set_error("tokenizer: out of memory");
    return -1;
}

/* ---------- public API ---------- */

int pi2_tokenize(const pi2_tokenizer *tok, const char *text, size_t len, int add_bos, int parse_special, int32_t *out,
                 int max_out) {
    if (!tok || (!text && len > 0) || max_out < 0 || (!out && max_out > 0)) {
        pi2_set_error("tokenize: bad arguments");
        return -1; /* callers treat any negative as failure when max_out was large enough */
    }
    pi2_tok_out o = {out, (size_t)max_out, 0};
    fragment_list frags = {0};
    if (partition(tok, text, len, parse_special, &frags) != 0) return -1;
    if (add_bos && tok->add_bos && tok->bos_id >= 0) pi2_tok_emit(&o, tok->bos_id);
    int rc = 0;
    int prev_special = 1; /* SPM: the text after BOS / a special token gets the leading space */
    for (size_t f = 0; f < frags.n && rc == 0; f++) {
        const fragment *fr = &frags.v[f];
        if (fr->token >= 0) {
            pi2_tok_emit(&o, fr->token);
            prev_special = 1;
            continue;
        }
        if (tok->kind == PI2_TOK_SPM)
            rc = pi2_spm_encode(tok, text + fr->off, fr->len, tok->add_space_prefix && prev_special, &o);
        else
            rc = pi2_bpe_encode(tok, text + fr->off, fr->len, &o);
        prev_special = 0;
    }
    free(frags.v);
    if (rc != 0) return -1;
    if (o.n > (size_t)INT32_MAX) {
        pi2_set_error("tokenize: text too long (%zu tokens)", o.n);
        return -1;
    }
    if (o.n > (size_t)max_out) return -(int)o.n;
    return (int)o.n;
}

static int copy_piece(const char *src, size_t n, char *buf, int buflen) {
    if (n > (size_t)(buflen < 0 ? 0 : buflen)) return -(int)n;
    if (n) memcpy(buf, src, n);
    return (int)n;
}

int pi2_token_to_piece(const pi2_tokenizer *tok, int32_t id, char *buf, int buflen) {
    if (!tok || id < 0 || id >= tok->n_vocab) return 0;
    const char *text = tok->pool + tok->tok_off[id];
    size_t n = tok->tok_len[id];
    switch (tok->type[id]) {
    case PI2_TOKTYPE_CONTROL:
    case PI2_TOKTYPE_UNKNOWN:
        return 0;
    case PI2_TOKTYPE_USER_DEFINED:
        return copy_piece(text, n, buf, buflen);
    case PI2_TOKTYPE_BYTE: {
        /* "<0xNN>" */
        char byte;
        if (n == 6 && memcmp(text, "<0x", 3) == 0 && text[5] == '>') {
            char hex[3] = {text[3], text[4], 0};
            byte = (char)strtol(hex, NULL, 16);
            return copy_piece(&byte, 1, buf, buflen);
        }
        return 0;
    }
    case PI2_TOKTYPE_NORMAL:
        break;
    default:
        return 0; /* unused / undefined: nothing, as llama.cpp */
    }
    /* normal token: undo the encoding into a scratch buffer (the result is never longer) */
    char small[256];
    char *tmp = n <= sizeof(small) ? small : malloc(n);
    if (!tmp) return 0;
    size_t m = 0;
    if (tok->kind == PI2_TOK_SPM) {
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && memcmp(text + i, "\xe2\x96\x81", 3) == 0) {
                tmp[m++] = ' ';
                i += 3;
            } else {
                tmp[m++] = text[i++];
            }
        }
    } else {
        for (size_t i = 0; i < n;) {
            size_t start = i;
            uint32_t cp = pi2_utf8_decode(text, n, &i);
            int b = pi2_cp_to_byte(cp);
            if (b >= 0) {
                tmp[m++] = (char)b;
            } else {
                memcpy(tmp + m, text + start, i - start); /* not a byte-level char: keep it as is */
                m += i - start;
            }
        }
    }
    int r = copy_piece(tmp, m, buf, buflen);
    if (tmp != small) free(tmp);
    return r;
}

int32_t pi2_tokenizer_n_vocab(const pi2_tokenizer *tok) { return tok ? tok->n_vocab : 0; }
int32_t pi2_tokenizer_bos(const pi2_tokenizer *tok) { return tok ? tok->bos_id : -1; }
int32_t pi2_tokenizer_eos(const pi2_tokenizer *tok) { return tok ? tok->eos_id : -1; }

int pi2_token_is_eog(const pi2_tokenizer *tok, int32_t id) {
    return tok && id >= 0 && id < tok->n_vocab && tok->eog[id];
}
