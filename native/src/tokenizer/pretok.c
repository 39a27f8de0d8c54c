/* Pre-tokenizers (see pretok.h). Every pass takes the list of pieces from the previous pass (lengths
 * in code points) and splits each piece on its own: a piece's end counts as end of text, which is
 * how llama.cpp runs its regex sequences and what makes e.g. "\s+(?!\S)" behave at digit borders. */
#include "pretok.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "unicode.h"

typedef struct {
    size_t *v;
    size_t n, cap;
} len_list;

static int push_len(len_list *l, size_t len) {
    if (len == 0) return 0;
    if (pi2_grow(&l->v, &l->cap, l->n, sizeof *l->v, 32)) return -1;
    l->v[l->n++] = len;
    return 0;
}

/* Code point flags as llama.cpp's unicode_cpt_flags sees them: category bits plus whitespace; 0 outside the piece. */
enum { F_WS = 0x100 };

typedef struct {
    const uint32_t *cps;
    size_t ini, end;
} piece;

#define OUT_OF_RANGE 0xFFFFFFFFu

static uint32_t cp_at(const piece *p, size_t pos) { return pos >= p->ini && pos < p->end ? p->cps[pos] : OUT_OF_RANGE; }

static unsigned flags_at(const piece *p, size_t pos) {
    if (pos < p->ini || pos >= p->end) return 0;
    uint32_t cp = p->cps[pos];
    return pi2_ucat(cp) | (pi2_is_whitespace(cp) ? F_WS : 0);
}

#define IS_L(f) ((f) & PI2_UCAT_LETTER)
#define IS_N(f) ((f) & PI2_UCAT_NUMBER)
#define IS_WS(f) ((f) & F_WS)

typedef struct {
    len_list *out;
    size_t prev_end;
    int failed;
} token_sink;

static size_t add_token(token_sink *s, size_t end) {
    size_t len = end - s->prev_end;
    if (push_len(s->out, len) != 0) s->failed = 1;
    s->prev_end = end;
    return len;
}

/* 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive (llama3); returns the match length or 0. */
static size_t contraction(const piece *p, size_t pos, int ignore_case) {
    if (cp_at(p, pos) != '\'' || pos + 1 >= p->end) return 0;
    uint32_t a = cp_at(p, pos + 1);
    if (ignore_case && a >= 'A' && a <= 'Z') a += 32;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (pos + 2 >= p->end) return 0;
    uint32_t b = cp_at(p, pos + 2);
    if (ignore_case && b >= 'A' && b <= 'Z') b += 32;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* Both splitters try a contraction first: when one is at *pos, it becomes the token and *pos moves past it. */
static int take_contraction(const piece *p, token_sink *s, size_t *pos, int ignore_case) {
    const size_t c = contraction(p, *pos, ignore_case);
    if (c) *pos += add_token(s, *pos + c);
    return c != 0;
}

/* The last alternatives both splitters share, for a run of n_ws whitespace code points at pos:
 * \s+(?!\S) (leave one for the next word), \s+, else one code point alone. Where the token ends. */
static size_t ws_token_end(const piece *p, size_t pos, size_t n_ws) {
    if (n_ws > 1 && cp_at(p, pos + n_ws) != OUT_OF_RANGE) return pos + n_ws - 1;
    if (n_ws > 0) return pos + n_ws;
    return pos + 1;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S) (and \s+ at the end) */
static void split_gpt2(const piece *p, token_sink *s) {
    for (size_t pos = p->ini; pos < p->end;) {
        uint32_t cp = cp_at(p, pos);
        unsigned flags = flags_at(p, pos);
        if (take_contraction(p, s, &pos, 0)) continue;
        unsigned f2 = cp == ' ' ? flags_at(p, pos + 1) : flags;
        if (IS_L(f2)) {
            pos += cp == ' ';
            while (IS_L(f2)) f2 = flags_at(p, ++pos);
            add_token(s, pos);
            continue;
        }
        if (IS_N(f2)) {
            pos += cp == ' ';
            while (IS_N(f2)) f2 = flags_at(p, ++pos);
            add_token(s, pos);
            continue;
        }
        if (!(IS_WS(f2) || IS_L(f2) || IS_N(f2)) && f2) {
            pos += cp == ' ';
            while (!(IS_WS(f2) || IS_L(f2) || IS_N(f2)) && f2) f2 = flags_at(p, ++pos);
            add_token(s, pos);
            continue;
        }
        size_t n_ws = 0;
        while (IS_WS(flags_at(p, pos + n_ws))) n_ws++;
        pos = ws_token_end(p, pos, n_ws);
        add_token(s, pos);
    }
}

/* Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static void split_llama3(const piece *p, token_sink *s, int max_digits) {
    for (size_t pos = p->ini; pos < p->end;) {
        uint32_t cp = cp_at(p, pos);
        unsigned flags = flags_at(p, pos);
        if (take_contraction(p, s, &pos, 1)) continue;
        if (!(cp == '\r' || cp == '\n' || IS_N(flags))) {
            if (IS_L(flags) || IS_L(flags_at(p, pos + 1))) {
                pos++;
                while (IS_L(flags_at(p, pos))) pos++;
                add_token(s, pos);
                continue;
            }
        }
        if (IS_N(flags)) {
            size_t ini = pos;
            while (IS_N(flags_at(p, pos))) {
                if (++pos - ini >= (size_t)max_digits) {
                    add_token(s, pos);
                    ini = pos;
                }
            }
            add_token(s, pos);
            continue;
        }
        unsigned f2 = cp == ' ' ? flags_at(p, pos + 1) : flags;
        if (!(IS_WS(f2) || IS_L(f2) || IS_N(f2)) && flags) {
            pos += cp == ' ';
            while (!(IS_WS(f2) || IS_L(f2) || IS_N(f2)) && f2) f2 = flags_at(p, ++pos);
            uint32_t c2 = cp_at(p, pos);
            while (c2 == '\r' || c2 == '\n') c2 = cp_at(p, ++pos);
            add_token(s, pos);
            continue;
        }
        size_t n_ws = 0, last_rn_end = 0;
        while (IS_WS(flags_at(p, pos + n_ws))) {
            uint32_t c2 = cp_at(p, pos + n_ws);
            if (c2 == '\r' || c2 == '\n') last_rn_end = pos + n_ws + 1;
            n_ws++;
        }
        if (last_rn_end > 0) { /* \s*[\r\n]+ */
            pos = last_rn_end;
            add_token(s, pos);
            continue;
        }
        pos = ws_token_end(p, pos, n_ws);
        add_token(s, pos);
    }
}

/* Classes for the "isolate matches" passes. llama.cpp runs these through std::regex on a collapsed
 * text where ASCII stays itself and every other code point becomes its category, so \p{P} means
 * "ASCII punctuation per its table, or a non-ASCII, non-space punctuation code point". */
typedef int (*cp_class)(uint32_t cp);

static int non_ascii_cat(uint32_t cp, uint8_t cat) { return !pi2_is_whitespace(cp) && pi2_ucat(cp) == cat; }

static int class_number(uint32_t cp) { return cp < 128 ? (cp >= '0' && cp <= '9') : non_ascii_cat(cp, PI2_UCAT_NUMBER); }

static int class_ascii_digit(uint32_t cp) { return cp >= '0' && cp <= '9'; }

/* [\p{P}\$\+<=>\^~\|] */
static int class_default_punct(uint32_t cp) {
    if (cp >= 128) return non_ascii_cat(cp, PI2_UCAT_PUNCTUATION);
    /* llama.cpp's ASCII \p{P}: !-#  %-*  ,-/  :-;  ?-@  [-]  _  {  }  plus $ + < = > ^ ~ | */
    return cp ? strchr("!\"#%&'()*,-./:;?@[\\]_{}$+<=>^~|", (int)cp) != NULL : 0;
}

/* Isolate matches of class{min,max} (max 0 = unbounded; greedy, leftmost, non-overlapping) within a piece. */
static void split_matches(const piece *p, token_sink *s, cp_class cls, size_t min, size_t max) {
    size_t pos = p->ini;
    while (pos < p->end) {
        if (!cls(p->cps[pos])) {
            pos++;
            continue;
        }
        size_t run = 0;
        while (pos + run < p->end && cls(p->cps[pos + run]) && (max == 0 || run < max)) run++;
        if (run < min) {
            pos++;
            continue;
        }
        add_token(s, pos); /* the gap before the match */
        add_token(s, pos + run);
        pos += run;
    }
    add_token(s, p->end);
}

typedef enum { PASS_GPT2, PASS_LLAMA3, PASS_QWEN2, PASS_NUMBER_EACH, PASS_NUMBER_RUN, PASS_DIGITS3, PASS_PUNCT } pass_kind;

static int run_pass(pass_kind kind, const uint32_t *cps, len_list *pieces) {
    len_list out = {0};
    token_sink sink = {&out, 0, 0};
    size_t start = 0;
    for (size_t i = 0; i < pieces->n; i++) {
        piece p = {cps, start, start + pieces->v[i]};
        sink.prev_end = p.ini;
        switch (kind) {
        case PASS_GPT2: split_gpt2(&p, &sink); break;
        case PASS_LLAMA3: split_llama3(&p, &sink, 3); break;
        case PASS_QWEN2: split_llama3(&p, &sink, 1); break;
        case PASS_NUMBER_EACH: split_matches(&p, &sink, class_number, 1, 1); break;
        case PASS_NUMBER_RUN: split_matches(&p, &sink, class_number, 1, 0); break;
        case PASS_DIGITS3: split_matches(&p, &sink, class_ascii_digit, 3, 3); break;
        case PASS_PUNCT: split_matches(&p, &sink, class_default_punct, 1, 0); break;
        }
        start = p.end;
    }
    free(pieces->v);
    *pieces = out;
    return sink.failed ? -1 : 0;
}

int pi2_pre_type_from_name(const char *name) {
    static const struct {
        const char *name;
        int type;
    } table[] = {
        {"", PI2_PRE_DEFAULT},         {"default", PI2_PRE_DEFAULT},
        {"gpt-2", PI2_PRE_GPT2},       {"phi-2", PI2_PRE_GPT2},
        {"mpt", PI2_PRE_GPT2},         {"olmo", PI2_PRE_GPT2},           {"jais", PI2_PRE_GPT2},
        {"jina-es", PI2_PRE_GPT2},     {"jina-de", PI2_PRE_GPT2},        {"jina-v2-es", PI2_PRE_GPT2},
        {"jina-v2-de", PI2_PRE_GPT2},  {"exaone4", PI2_PRE_GPT2},        {"smollm", PI2_PRE_SMOLLM},
        {"starcoder", PI2_PRE_SMOLLM}, {"refact", PI2_PRE_SMOLLM},       {"command-r", PI2_PRE_SMOLLM},
        {"codeshell", PI2_PRE_SMOLLM}, {"exaone", PI2_PRE_SMOLLM},       {"minerva-7b", PI2_PRE_SMOLLM},
        {"llama3", PI2_PRE_LLAMA3},    {"llama-v3", PI2_PRE_LLAMA3},     {"llama-bpe", PI2_PRE_LLAMA3},
        {"falcon3", PI2_PRE_LLAMA3},   {"falcon-h1", PI2_PRE_LLAMA3},    {"pixtral", PI2_PRE_LLAMA3},
        {"midm-2.0", PI2_PRE_LLAMA3},  {"lfm2", PI2_PRE_LLAMA3},         {"dbrx", PI2_PRE_LLAMA3_MERGE},
        {"smaug-bpe", PI2_PRE_LLAMA3_MERGE}, {"qwen2", PI2_PRE_QWEN2},   {"deepseek-r1-qwen", PI2_PRE_QWEN2},
        {"megrez", PI2_PRE_QWEN2},     {"stablelm2", PI2_PRE_QWEN2},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (strcmp(name, table[i].name) == 0) return table[i].type;
    return -1;
}

int pi2_pre_ignores_merges(int pre_type) { return pre_type == PI2_PRE_LLAMA3; }

long pi2_pretokenize(int pre_type, const uint32_t *cps, size_t n, size_t **lens) {
    len_list pieces = {0};
    *lens = NULL;
    if (n == 0) return 0;
    if (push_len(&pieces, n) != 0) return -1;
    static const pass_kind seq_default[] = {PASS_PUNCT, PASS_GPT2, PASS_NUMBER_RUN, PASS_DIGITS3};
    static const pass_kind seq_gpt2[] = {PASS_GPT2};
    static const pass_kind seq_smollm[] = {PASS_NUMBER_EACH, PASS_GPT2};
    static const pass_kind seq_llama3[] = {PASS_LLAMA3};
    static const pass_kind seq_qwen2[] = {PASS_QWEN2};
    const pass_kind *seq;
    size_t n_seq;
    switch (pre_type) {
    case PI2_PRE_DEFAULT: seq = seq_default, n_seq = 4; break;
    case PI2_PRE_GPT2: seq = seq_gpt2, n_seq = 1; break;
    case PI2_PRE_SMOLLM: seq = seq_smollm, n_seq = 2; break;
    case PI2_PRE_LLAMA3:
    case PI2_PRE_LLAMA3_MERGE: seq = seq_llama3, n_seq = 1; break;
    case PI2_PRE_QWEN2: seq = seq_qwen2, n_seq = 1; break;
    default: seq = NULL, n_seq = 0; break;
    }
    for (size_t i = 0; i < n_seq; i++) {
        if (run_pass(seq[i], cps, &pieces) != 0) {
            free(pieces.v);
            return -1;
        }
    }
    *lens = pieces.v;
    return (long)pieces.n;
}
