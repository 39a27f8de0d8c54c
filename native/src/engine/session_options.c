/* The engine's option table and its one parser (session_options.h). */
#include "session_options.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define G PI2_CMD_GENERATE
#define E PI2_CMD_EVAL
#define I PI2_CMD_INFO
#define C PI2_CMD_CHAT
#define S PI2_CMD_SIZE
#define V PI2_CMD_SERVE

/* Indexes into pi2_flags: the parser's switch names a flag by its row. */
enum {
    O_MODEL, O_FACTS, O_PROMPT, O_TOKENS, O_LOGITS_OUT, O_ALL, O_N_PREDICT, O_TEMPERATURE, O_TOP_P, O_SEED,
    O_IGNORE_EOS, O_EVENTS, O_THREADS, O_AFFINITY, O_CTX, O_BATCH, O_NO_VERIFY_NEURONS, O_NO_PACK, O_PLAN,
    O_JSON, O_VERIFY, O_HOST, O_PORT, O_API_KEY, O_MAX_QUEUE, O_MAX_TOKENS, O_READ_TIMEOUT, O_REQUEST_TIMEOUT, O_CHAT_TEMPLATE,
    /* the sparse engine's (docs/SPARSE.md) */
    O_POLICY, O_MEMORY_BUDGET, O_PREDICTOR, O_CHECK_PREDICTOR, O_PRED_THRESHOLD, O_LLMFLASH_WINDOW,
    O_HOT_FRACTION, O_HOT_SHARE, O_CLUSTER, O_TWO_PHASE, O_NO_TWO_PHASE, O_PREFILL_STREAM, O_MISS_THRESHOLD, O_READ_CAP,
    O_LRU_ONLY, O_LOOKAHEAD, O_NO_WARM, O_NO_REPACK, O_IO, O_IO_THREADS, O_IO_AFFINITY, O_NO_IO_SUBMITTER, O_END
};

const int pi2_flags_sparse = O_POLICY;

const pi2_flag pi2_flags[] = {
    [O_MODEL] = {"--model", "-m", 1, G | E | I | C | S | V, "the .pi2 model file"},
    [O_FACTS] = {"--facts", NULL, 1, S, "size a model from its header facts (the JSON of `info --json`) instead of -m"},
    [O_PROMPT] = {"--prompt", "-p", 1, G, "prompt text (special tokens in it are parsed)"},
    [O_TOKENS] = {"--tokens", NULL, 1, G | E, "prompt as token ids: 1,2,3"},
    [O_LOGITS_OUT] = {"--logits-out", NULL, 1, E, "write float32 logits here, row-major"},
    [O_ALL] = {"--all", NULL, 0, E, "logits of every position, not only the last"},
    [O_N_PREDICT] = {"--n-predict", "-n", 1, G | C, "tokens to generate   [64]"},
    [O_TEMPERATURE] = {"--temperature", "--temp", 1, G | C, "sampling temperature, 0 = greedy   [0]"},
    [O_TOP_P] = {"--top-p", NULL, 1, G | C, "nucleus sampling in (0, 1]   [1]"},
    [O_SEED] = {"--seed", NULL, 1, G | C, "sampler seed, a non-negative integer   [0]"},
    [O_IGNORE_EOS] = {"--ignore-eos", NULL, 0, G | C, "do not stop at end-of-generation tokens"},
    [O_EVENTS] = {"--events", NULL, 1, G | C, "JSONL events (start, token, turn, summary) to this file"},
    [O_THREADS] = {"--threads", "-t", 1, G | E | C | S | V, "compute threads   [all cores]"},
    [O_AFFINITY] = {"--affinity", NULL, 1, G | E | C | S | V, "pin the compute threads to these CPUs: 0,1,.."},
    [O_CTX] = {"--ctx", NULL, 1, G | E | C | S | V, "KV cache positions"},
    [O_BATCH] = {"--batch", NULL, 1, G | E | C | S | V, "most tokens per forward pass"},
    [O_NO_VERIFY_NEURONS] = {"--no-verify-neurons", NULL, 0, G | E | C | V, "dense: skip the neuron region's checksum"},
    [O_NO_PACK] = {"--no-pack-ffn", NULL, 0, G | E | C | S | V, "dense: compute straight from the bundles"},
    [O_PLAN] = {"--plan", NULL, 1, G | E | C | S | V, "the settings of a plan from `pi2 plan` (docs/PLAN.md); later flags override it"},
    [O_JSON] = {"--json", NULL, 0, I | S, "print JSON"},
    [O_VERIFY] = {"--verify", NULL, 0, I, "also check the neuron region's checksum"},
    [O_HOST] = {"--host", NULL, 1, V, "address to listen on (an IPv4 literal)   [127.0.0.1: this device only]"},
    [O_PORT] = {"--port", NULL, 1, V, "TCP port, 0 = any free one (the first stderr line names it)   [8080]"},
    [O_API_KEY] = {"--api-key", NULL, 1, V, "require 'Authorization: Bearer KEY' on /v1/ requests"},
    [O_MAX_QUEUE] = {"--max-queue", NULL, 1, V, "requests that may wait while one computes; more get 503   [4]"},
    [O_MAX_TOKENS] = {"--max-tokens", NULL, 1, V, "largest max_tokens a request may ask for (more: 400)   [4096]"},
    [O_READ_TIMEOUT] = {"--read-timeout", NULL, 1, V, "seconds a client has to send its whole request (else 408), and to take each write   [10]"},
    [O_REQUEST_TIMEOUT] = {"--request-timeout", NULL, 1, V, "seconds a request may compute; then it ends at its next token (finish_reason length)   [300]"},
    [O_CHAT_TEMPLATE] = {"--chat-template", NULL, 1, V, "chatml|llama2|llama3: render chats so   [the kind of the model's own template]"},
    [O_POLICY] = {"--policy", NULL, 1, G | E | C | S | V, "dense|bundle|llmflash|cache|powerinfer2   [dense]"},
    [O_MEMORY_BUDGET] = {"--memory-budget", NULL, 1, G | E | C | S | V, "whole-process budget, e.g. 2G, 1536M (sparse policies keep peak RSS under it)"},
    [O_PREDICTOR] = {"--predictor", NULL, 1, G | E | C | S | V, "model|oracle: oracle = true activations (a correctness tool)   [model]"},
    [O_CHECK_PREDICTOR] = {"--check-predictor", NULL, 0, G | E | C | S | V, "also compute true activations: recall/precision per layer"},
    [O_PRED_THRESHOLD] = {"--pred-threshold", NULL, 1, G | E | C | S | V, "predictor threshold in (0,1) for every layer   [the model file's]"},
    [O_LLMFLASH_WINDOW] = {"--llmflash-window", NULL, 1, G | E | C | S | V, "llmflash: keep neurons used by the last K tokens   [5]"},
    [O_HOT_FRACTION] = {"--hot-fraction", NULL, 1, G | E | C | S | V, "hot set: first F of each block's bundles   [0.2]"},
    [O_HOT_SHARE] = {"--hot-share", NULL, 1, G | E | C | S | V, "share of the neuron cache for hot clusters   [0.5]"},
    [O_CLUSTER] = {"--cluster", NULL, 1, G | E | C | S | V, "bundles per hot cluster   [32]"},
    [O_TWO_PHASE] = {"--two-phase", NULL, 0, G | E | C | S | V, "powerinfer2: cold INT4 bundles gate part first   [auto: from a storage probe at open]"},
    [O_NO_TWO_PHASE] = {"--no-two-phase", NULL, 0, G | E | C | S | V, "powerinfer2: cold INT4 bundles read whole"},
    [O_PREFILL_STREAM] = {"--prefill-stream", NULL, 1, G | E | C | S | V, "auto|on|off: powerinfer2 batches of 8+ tokens under a budget come through the GEMM chunk by chunk (cached bundles copied, the rest read singly or the chunk whole, whichever costs less; on = auto); off: through the cache's waves   [auto]"},
    [O_MISS_THRESHOLD] = {"--miss-threshold", NULL, 1, G | E | C | S | V, "decode: read a cold miss only if its predicted probability > P   [off]"},
    [O_READ_CAP] = {"--read-cap", NULL, 1, G | E | C | S | V, "decode: most cold misses read a token, the likeliest first: N, auto (what compute hides), off   [off]"},
    [O_LRU_ONLY] = {"--lru-only", NULL, 0, G | E | C | S | V, "cache, powerinfer2: plain LRU for cold misses, not insertion by rank"},
    [O_LOOKAHEAD] = {"--lookahead", NULL, 0, G | E | C | S | V, "powerinfer2: read what the coming layer's predictor wants during attention"},
    [O_NO_WARM] = {"--no-warm", NULL, 0, G | E | C | S | V, "powerinfer2 under a budget: start with an empty neuron cache (default: filled at open with what it keeps in the steady state)"},
    [O_NO_REPACK] = {"--no-repack", NULL, 0, G | E | C | S | V, "keep attention/output rows as stored (no interleaving by four)"},
    [O_IO] = {"--io", NULL, 1, G | E | C | S | V, "auto|uring|pread|buffered: neuron reads   [auto]"},
    [O_IO_THREADS] = {"--io-threads", NULL, 1, G | E | C | S | V, "pread-pool threads"},
    [O_IO_AFFINITY] = {"--io-affinity", NULL, 1, G | E | C | S | V, "the I/O threads' CPUs: 0,1 (the pread pool's; the first also the submitter's)"},
    [O_NO_IO_SUBMITTER] = {"--no-io-submitter", NULL, 0, G | E | C | S | V, "powerinfer2: decode's reads issued by the compute threads, not by a thread of their own (which runs only on --io-affinity's core or one the compute threads leave free)"},
    [O_END] = {NULL, NULL, 0, 0, NULL},
};

const pi2_default pi2_defaults[] = {
    {"hot_fraction", PI2_DEFAULT_HOT_FRACTION, "--hot-fraction: the hot set's share of each block's bundles"},
    {"hot_share", PI2_DEFAULT_HOT_SHARE, "--hot-share: the hot clusters' share of the neuron cache"},
    {"cluster", PI2_DEFAULT_CLUSTER, "--cluster: bundles per hot cluster"},
    {"llmflash_window", PI2_DEFAULT_LLMFLASH_WINDOW, "--llmflash-window: tokens"},
    {"queue_depth", PI2_DEFAULT_QUEUE_DEPTH, "neuron reads the engine keeps in flight"},
    {"read_align", PI2_MIN_READ_ALIGN, "the least unit direct reads and cold slots are rounded to (bytes)"},
    {"ctx", PI2_DEFAULT_CTX, "--ctx: KV cache positions (at most the model's training context)"},
    {NULL, 0, NULL},
};

const char *const pi2_command_names[] = {"generate", "eval", "info", "chat", "size", "serve"};

int pi2_command_count(void) { return (int)(sizeof pi2_command_names / sizeof pi2_command_names[0]); }

static const char *command_name(unsigned cmd) {
    for (int i = 0; i < pi2_command_count(); i++)
        if (cmd == 1u << i) return pi2_command_names[i];
    return "?";
}

static void options_default(pi2_options *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 64;
    o->top_p = 1.0f;
    o->verify_neurons = 1;
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_queue = 4;
    o->max_tokens = 4096;
    o->read_timeout_s = 10;
    o->request_timeout_s = 300;
    pi2_sparse_config_default(&o->sparse);
}

static int parse_fraction(const char *flag, const char *v, float *out) {
    if (pi2_parse_float_arg(flag, v, out) != 0) return -1;
    if (!(*out >= 0 && *out <= 1)) {
        pi2_set_error("%s must be between 0 and 1, got '%s'", flag, v);
        return -1;
    }
    return 0;
}

/* A threshold probability: strictly between 0 and 1 (its logit must be finite). */
static int parse_probability(const char *flag, const char *v, float *out) {
    if (parse_fraction(flag, v, out)) return -1;
    if (*out <= 0 || *out >= 1) {
        pi2_set_error("%s must be strictly between 0 and 1, got '%s'", flag, v);
        return -1;
    }
    return 0;
}

/* v among names[0..n): its index, or -1 with an error listing them. */
static int parse_choice(const char *flag, const char *v, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v, names[i])) return i;
    char list[200] = "";
    for (int i = 0, o = 0; i < n && o < (int)sizeof list; i++)
        o += snprintf(list + o, sizeof list - (size_t)o, "%s%s", i ? (i == n - 1 ? " or " : ", ") : "", names[i]);
    pi2_set_error("%s: expected %s, got '%s'", flag, list, v);
    return -1;
}

static int parse_seed(const char *v, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    *out = strtoull(v, &end, 10); /* strtoull takes "-1" as 2^64-1: refuse any sign */
    if (errno || *end || !*v || *v == '-' || *v == '+') {
        pi2_set_error("--seed needs a non-negative integer, got '%s'", v);
        return -1;
    }
    return 0;
}

/* Apply flag row `id` (spelled `a` on the line) with value v. 0 or -1 with an error. */
static int apply(int id, const char *a, const char *v, pi2_options *o) {
    pi2_sparse_config *sc = &o->sparse;
    switch (id) {
    case O_MODEL: o->model = v; return 0;
    case O_FACTS: o->facts = v; return 0;
    case O_PROMPT: o->prompt = v; return 0;
    case O_TOKENS: o->tokens = v; return 0;
    case O_LOGITS_OUT: o->logits_out = v; return 0;
    case O_ALL: o->all_logits = 1; return 0;
    case O_N_PREDICT: return pi2_parse_int_arg(a, v, 0, 1 << 20, &o->n_predict);
    case O_TEMPERATURE: return pi2_parse_float_arg(a, v, &o->temperature);
    case O_TOP_P: return pi2_parse_float_arg(a, v, &o->top_p);
    case O_SEED: return parse_seed(v, &o->seed);
    case O_IGNORE_EOS: o->ignore_eos = 1; return 0;
    case O_EVENTS: o->events = v; return 0;
    case O_THREADS: return pi2_parse_int_arg(a, v, 1, 1024, &o->threads);
    case O_AFFINITY: o->affinity = v; return 0;
    case O_CTX: return pi2_parse_int_arg(a, v, 1, 1 << 22, &o->n_ctx);
    case O_BATCH: return pi2_parse_int_arg(a, v, 1, 1 << 16, &o->n_batch);
    case O_NO_VERIFY_NEURONS: o->verify_neurons = 0; return 0;
    case O_NO_PACK: o->no_pack = 1; return 0;
    case O_PLAN: pi2_set_error("--plan is expanded before parsing"); return -1; /* main() expands it */
    case O_JSON: o->json = 1; return 0;
    case O_VERIFY: o->verify = 1; return 0;
    case O_HOST: o->host = v; return 0;
    case O_PORT: return pi2_parse_int_arg(a, v, 0, 65535, &o->port);
    case O_API_KEY:
        if (!*v) {
            pi2_set_error("--api-key must not be empty");
            return -1;
        }
        o->api_key = v;
        return 0;
    case O_MAX_QUEUE: return pi2_parse_int_arg(a, v, 0, 1024, &o->max_queue);
    case O_MAX_TOKENS: return pi2_parse_int_arg(a, v, 1, 1 << 20, &o->max_tokens);
    case O_READ_TIMEOUT: return pi2_parse_int_arg(a, v, 1, 3600, &o->read_timeout_s);
    case O_REQUEST_TIMEOUT: return pi2_parse_int_arg(a, v, 1, 86400, &o->request_timeout_s);
    case O_CHAT_TEMPLATE: o->chat_template = v; return 0;
    case O_POLICY: {
        for (int i = 0; i <= PI2_POLICY_POWERINFER2; i++)
            if (!strcmp(v, pi2_policy_name((pi2_policy)i))) {
                sc->policy = (pi2_policy)i;
                return 0;
            }
        pi2_set_error("--policy: unknown policy '%s' (dense, bundle, llmflash, cache, powerinfer2)", v);
        return -1;
    }
    case O_MEMORY_BUDGET: return pi2_parse_size(a, v, &sc->memory_budget);
    case O_PREDICTOR: {
        static const char *const names[] = {"model", "oracle"};
        const int i = parse_choice(a, v, names, 2);
        sc->oracle = i == 1;
        return i < 0 ? -1 : 0;
    }
    case O_CHECK_PREDICTOR: sc->check_predictor = 1; return 0;
    case O_PRED_THRESHOLD: return parse_probability(a, v, &sc->pred_threshold);
    case O_LLMFLASH_WINDOW: return pi2_parse_int_arg(a, v, 1, 1 << 20, &sc->llmflash_window);
    case O_HOT_FRACTION: return parse_fraction(a, v, &sc->hot_fraction);
    case O_HOT_SHARE: return parse_fraction(a, v, &sc->hot_share);
    case O_CLUSTER: return pi2_parse_int_arg(a, v, 1, 4096, &sc->cluster);
    case O_TWO_PHASE: sc->two_phase = 1; return 0;
    case O_NO_TWO_PHASE: sc->two_phase = -1; return 0;
    case O_PREFILL_STREAM: {
        static const char *const names[] = {"off", "auto", "on"};
        const int i = parse_choice(a, v, names, 3);
        if (i < 0) return -1;
        sc->prefill_stream = i - 1;
        return 0;
    }
    case O_MISS_THRESHOLD: return parse_probability(a, v, &sc->miss_threshold);
    case O_READ_CAP:
        if (!strcmp(v, "off")) sc->read_cap = 0;
        else if (!strcmp(v, "auto")) sc->read_cap = -1;
        else return pi2_parse_int_arg(a, v, 1, 1 << 30, &sc->read_cap);
        return 0;
    case O_LRU_ONLY: sc->lru_only = 1; return 0;
    case O_LOOKAHEAD: sc->lookahead = 1; return 0;
    case O_NO_WARM: sc->no_warm = 1; return 0;
    case O_NO_IO_SUBMITTER: sc->no_io_submitter = 1; return 0;
    case O_NO_REPACK: sc->no_repack = 1; return 0;
    case O_IO: {
        static const char *const names[] = {"auto", "uring", "pread", "buffered"};
        const int i = parse_choice(a, v, names, 4);
        if (i < 0) return -1;
        sc->io.method = (pi2_io_method)i;
        return 0;
    }
    case O_IO_THREADS: return pi2_parse_int_arg(a, v, 1, 64, &sc->io.n_threads);
    case O_IO_AFFINITY: {
        int32_t cpus[64];
        const int n = pi2_parse_int_list(a, v, 4095, cpus, 64);
        if (n < 0) return -1;
        for (int i = 0; i < n; i++) sc->io_cpus[i] = cpus[i];
        sc->io.n_cpus = n;
        return 0;
    }
    }
    pi2_set_error("internal: no parser for %s", a);
    return -1;
}

int pi2_options_parse(unsigned cmd, int argc, char **argv, pi2_options *o) {
    options_default(o);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int id = 0;
        for (; pi2_flags[id].name; id++)
            if ((pi2_flags[id].cmds & cmd) &&
                (!strcmp(a, pi2_flags[id].name) || (pi2_flags[id].alias && !strcmp(a, pi2_flags[id].alias))))
                break;
        if (!pi2_flags[id].name) {
            pi2_set_error("unknown %s option '%s' (see pi2-engine %s --help)", command_name(cmd), a, command_name(cmd));
            return -1;
        }
        const char *v = NULL;
        if (pi2_flags[id].takes_value) {
            if (i + 1 >= argc) {
                pi2_set_error("option %s needs a value", a);
                return -1;
            }
            v = argv[++i];
        }
        if (apply(id, a, v, o) != 0) return -1;
    }
    if (!o->model && cmd != PI2_CMD_SIZE) { /* size without either checks the flags alone (size_cmd.c) */
        pi2_set_error("missing -m MODEL.pi2");
        return -1;
    }
    if (o->model && o->facts) {
        pi2_set_error("give -m MODEL.pi2 or --facts FILE.json, not both");
        return -1;
    }
    if (o->temperature < 0) { pi2_set_error("--temperature must be >= 0"); return -1; }
    if (!(o->top_p > 0 && o->top_p <= 1)) { pi2_set_error("--top-p must be in (0, 1]"); return -1; }
    return 0;
}

void pi2_options_usage(FILE *out, unsigned cmd, int from, int to) {
    for (int i = from; pi2_flags[i].name && (to < 0 || i < to); i++) {
        const pi2_flag *f = &pi2_flags[i];
        if (!(f->cmds & cmd)) continue;
        char spell[64];
        snprintf(spell, sizeof spell, "%s%s%s%s", f->alias ? f->alias : "", f->alias ? ", " : "", f->name,
                 f->takes_value ? " X" : "");
        fprintf(out, "    %-26s %s\n", spell, f->help);
    }
}

void pi2_options_usage_command(FILE *out, unsigned cmd) {
    fprintf(out, "options:\n");
    pi2_options_usage(out, cmd, 0, pi2_flags_sparse);
    fprintf(out, "  sparse engine (PowerInfer-2; docs/SPARSE.md):\n");
    pi2_options_usage(out, cmd, pi2_flags_sparse, -1);
}
