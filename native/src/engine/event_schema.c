/* The events' contract: the table of every event kind's fields and the builders that write records by
 * walking it (event_schema.h). */
#include "event_schema.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "kernels.h"
#include "session_options.h"

#define GEN PI2_CMD_GENERATE
#define CHAT PI2_CMD_CHAT
#define BOTH (PI2_CMD_GENERATE | PI2_CMD_CHAT)
#define AT(rec, member) offsetof(rec, member)
#define SPARSE(kind, name, type, when, help) {kind, name, PI2_EV_SPARSE, 0, type, BOTH, when, help}

/* PI2_EV_IDS reads its count from the member after the pointer */
_Static_assert(offsetof(pi2_start_record, n_prompt_ids) ==
                   offsetof(pi2_start_record, prompt_ids) + sizeof(const int32_t *),
               "n_prompt_ids must follow prompt_ids");

const char *const pi2_event_kinds[] = {"start", "token", "turn", "named", "summary", NULL};

const pi2_event_field pi2_event_fields[] = {
    /* start: once, when the model is loaded and the session ready */
    {"start", "t", PI2_EV_TIME, AT(pi2_start_record, t), "number", BOTH, NULL, "when the session was ready (monotonic s)"},
    {"start", "mode", PI2_EV_STR, AT(pi2_start_record, mode), "string", BOTH, NULL, "the command: generate or chat"},
    {"start", "engine", PI2_EV_STR, AT(pi2_start_record, engine), "string", BOTH, NULL, "\"pi2-engine VERSION\""},
    {"start", "threads", PI2_EV_INT, AT(pi2_start_record, threads), "integer", BOTH, NULL, "compute threads"},
    {"start", "kernels", PI2_EV_STR, AT(pi2_start_record, kernels), "string", BOTH, NULL, "the kernel level that runs"},
    {"start", "x4_prefetch", PI2_EV_INT, AT(pi2_start_record, x4_prefetch), "integer", BOTH, NULL, "bytes ahead the decode GEMV over rows interleaved by four asks for (PI2_X4_PREFETCH)"},
    {"start", "x4_streams", PI2_EV_INT, AT(pi2_start_record, x4_streams), "integer", BOTH, NULL, "runs of rows that GEMV reads side by side (PI2_X4_STREAMS)"},
    {"start", "n_ctx", PI2_EV_INT, AT(pi2_start_record, n_ctx), "integer", BOTH, NULL, "KV cache positions"},
    {"start", "n_batch", PI2_EV_INT, AT(pi2_start_record, n_batch), "integer", BOTH, NULL, "most tokens per forward pass (prefill's batch)"},
    {"start", "n_prompt", PI2_EV_INT, AT(pi2_start_record, n_prompt), "integer", GEN, NULL, "prompt tokens"},
    {"start", "load_s", PI2_EV_SEC, AT(pi2_start_record, load_s), "number", BOTH, NULL, "model load and session start (s)"},
    {"start", "prompt_ids", PI2_EV_IDS, AT(pi2_start_record, prompt_ids), "array", GEN, NULL, "the prompt's token ids"},
    /* token: one per generated token, when sampled */
    {"token", "t", PI2_EV_TIME, AT(pi2_token_record, t), "number", BOTH, NULL, "when it was sampled (monotonic s)"},
    {"token", "cpu_s", PI2_EV_SEC, AT(pi2_token_record, cpu_s), "number", BOTH, NULL, "the process's CPU time so far, all threads (s)"},
    {"token", "turn", PI2_EV_INT, AT(pi2_token_record, turn), "integer", BOTH, NULL, "the turn it belongs to (generate: 0)"},
    {"token", "i", PI2_EV_INT, AT(pi2_token_record, i), "integer", BOTH, NULL, "its index in the turn"},
    {"token", "id", PI2_EV_INT, AT(pi2_token_record, id), "integer", BOTH, NULL, "the token id"},
    SPARSE("token", "bytes_read", "integer", "sparse", "storage bytes the forward pass that produced it read"),
    SPARSE("token", "reads", "integer", "sparse", "storage reads of that pass"),
    SPARSE("token", "hits", "integer", "sparse", "neuron cache hits of that pass"),
    SPARSE("token", "misses", "integer", "sparse", "neuron cache misses of that pass"),
    SPARSE("token", "io_wait_s", "number", "sparse", "time blocked on reads with nothing to compute (s)"),
    SPARSE("token", "ffn_s", "number", "sparse", "the FFN's time (s)"),
    SPARSE("token", "compute_s", "number", "sparse", "ffn_s less io_wait_s (s)"),
    /* turn: a turn's record (chat also writes it to stdout after the record separator) */
    {"turn", "turn", PI2_EV_INT, AT(pi2_turn_record, turn), "integer", BOTH, NULL, "the turn's index (generate: 0)"},
    {"turn", "t0", PI2_EV_TIME, AT(pi2_turn_record, t0), "number", BOTH, NULL, "when the turn began (monotonic s)"},
    {"turn", "n_prompt", PI2_EV_INT, AT(pi2_turn_record, n_prompt), "integer", BOTH, NULL, "tokens prefilled this turn"},
    {"turn", "n_cached", PI2_EV_INT, AT(pi2_turn_record, n_cached), "integer", BOTH, NULL, "tokens already in the KV cache"},
    {"turn", "n_gen", PI2_EV_INT, AT(pi2_turn_record, n_gen), "integer", BOTH, NULL, "tokens generated"},
    {"turn", "ttft_s", PI2_EV_SEC, AT(pi2_turn_record, ttft_s), "number", BOTH, NULL, "t0 to the first sampled token (s)"},
    {"turn", "prefill_s", PI2_EV_SEC, AT(pi2_turn_record, prefill_s), "number", BOTH, NULL, "prefill time (s)"},
    {"turn", "prefill_tps", PI2_EV_RATE, AT(pi2_turn_record, prefill_tps), "number", BOTH, NULL, "n_prompt / prefill_s"},
    {"turn", "decode_s", PI2_EV_SEC, AT(pi2_turn_record, decode_s), "number", BOTH, NULL, "first to last token (s)"},
    {"turn", "decode_tps", PI2_EV_RATE, AT(pi2_turn_record, decode_tps), "number", BOTH, NULL, "(n_gen - 1) / decode_s"},
    {"turn", "stop", PI2_EV_STR, AT(pi2_turn_record, stop), "string", BOTH, NULL, "why it ended: length, eog or error"},
    {"turn", "error", PI2_EV_STR, AT(pi2_turn_record, error), "string", CHAT, "error", "why the request failed (nothing was run)"},
    {"turn", "n_past", PI2_EV_INT, AT(pi2_turn_record, n_past), "integer", BOTH, NULL, "positions the conversation holds after it"},
    {"turn", "peak_rss_bytes", PI2_EV_U64, AT(pi2_turn_record, peak_rss_bytes), "integer", BOTH, NULL, "the process's VmHWM so far"},
    {"turn", "cpu_s", PI2_EV_SEC, AT(pi2_turn_record, cpu_s), "number", BOTH, NULL, "the process's CPU time during the turn, all threads (s): over decode_s + prefill_s, the cores it kept busy"},
    /* named: the neurons decode named, just before the summary (the planner's hit-rate curve) */
    SPARSE("named", "decode_steps", "integer", "sparse", "decode steps counted"),
    SPARSE("named", "rank_bins", "integer", "sparse", "bins of hotness rank"),
    SPARSE("named", "by_rank", "array", "sparse", "neurons named per rank bin (the file's order)"),
    SPARSE("named", "by_block", "array", "sparse", "neurons named per block (layer * experts + expert)"),
    /* summary: once, at the end */
    {"summary", "t", PI2_EV_TIME, AT(pi2_summary_record, t), "number", BOTH, NULL, "when the run ended (monotonic s)"},
    {"summary", "turns", PI2_EV_INT, AT(pi2_summary_record, turns), "integer", BOTH, NULL, "turns run (generate: 1)"},
    {"summary", "peak_rss_bytes", PI2_EV_U64, AT(pi2_summary_record, peak_rss_bytes), "integer", BOTH, NULL, "the process's VmHWM"},
    {"summary", "bytes_read", PI2_EV_U64, AT(pi2_summary_record, bytes_read), "integer", BOTH, NULL, "storage reads (/proc/self/io)"},
    {"summary", "model_bytes", PI2_EV_U64, AT(pi2_summary_record, model_bytes), "integer", BOTH, NULL, "the .pi2 file's size"},
    {"summary", "anon_huge_bytes", PI2_EV_U64, AT(pi2_summary_record, anon_huge_bytes), "integer", BOTH, NULL,
     "anonymous memory on 2 MiB pages at the end (smaps_rollup AnonHugePages): whether the kernel gave the weights huge pages"},
    {"summary", "threads", PI2_EV_INT, AT(pi2_summary_record, threads), "integer", BOTH, NULL, "compute threads"},
    {"summary", "decode_profile", PI2_EV_OBJ, AT(pi2_summary_record, decode_profile), "object", BOTH, "decoded",
     "per decoded token: phase times, pool jobs and sleeps, the sparse FFN's parts (docs/ENGINE.md)"},
    {"summary", "prefill_profile", PI2_EV_OBJ, AT(pi2_summary_record, prefill_profile), "object", BOTH, "prefilled",
     "decode_profile's fields per prompt token, over the prompts' forward passes"},
    /* the sparse engine's figures (docs/SPARSE.md#events) */
    SPARSE("summary", "policy", "string", NULL, "the FFN policy"),
    SPARSE("summary", "predictor", "string", NULL, "model or oracle"),
    SPARSE("summary", "memory_budget_bytes", "integer", NULL, "the budget the engine sized itself to (0: none)"),
    SPARSE("summary", "memory_budget_source", "string", NULL, "where that budget came from"),
    SPARSE("summary", "io_method", "string", NULL, "how neurons are read (mmap when dense)"),
    SPARSE("summary", "o_direct", "boolean", NULL, "reads bypass the page cache"),
    SPARSE("summary", "storage_bytes_read", "integer", "sparse", "bytes the neuron store read"),
    SPARSE("summary", "storage_reads", "integer", "sparse", "reads the neuron store issued"),
    SPARSE("summary", "cache_bytes", "integer", "sparse", "the neuron cache"),
    SPARSE("summary", "hot_bytes", "integer", "sparse", "its hot part"),
    SPARSE("summary", "cold_bytes", "integer", "sparse", "its cold part"),
    SPARSE("summary", "fixed_bytes", "integer", "sparse", "the fixed region (weights, KV, scratch)"),
    SPARSE("summary", "hot_neurons_per_block", "integer", "sparse", "hot neurons kept per block"),
    SPARSE("summary", "cluster", "integer", "sparse", "neurons per hot cluster"),
    SPARSE("summary", "two_phase", "boolean", "sparse", "gate first, the rest of active neurons after"),
    SPARSE("summary", "pipeline", "boolean", "sparse", "reads overlap compute"),
    SPARSE("summary", "lookahead", "boolean", "sparse", "next layer's reads issued early"),
    SPARSE("summary", "lookahead_reads", "integer", "sparse", "reads issued by lookahead"),
    SPARSE("summary", "hits_hot", "integer", "sparse", "hot cache hits"),
    SPARSE("summary", "hits_cold", "integer", "sparse", "cold cache hits"),
    SPARSE("summary", "misses_hot", "integer", "sparse", "hot cache misses"),
    SPARSE("summary", "misses_cold", "integer", "sparse", "cold cache misses"),
    SPARSE("summary", "hit_rate", "number", "sparse", "hits / lookups"),
    SPARSE("summary", "io_wait_s", "number", "sparse", "time blocked on reads (s)"),
    SPARSE("summary", "ffn_s", "number", "sparse", "the FFN's time (s)"),
    SPARSE("summary", "compute_s", "number", "sparse", "ffn_s less io_wait_s (s)"),
    SPARSE("summary", "io_share", "number", "sparse", "io_wait_s / (io_wait_s + compute_s)"),
    SPARSE("summary", "active_fraction", "number", "sparse", "neurons computed / visited"),
    SPARSE("summary", "preload_s", "number", "sparse", "time filling the cache at open (s)"),
    SPARSE("summary", "preload_bytes", "integer", "sparse", "bytes read filling it"),
    SPARSE("summary", "bytes_read_after_load", "integer", "sparse", "storage_bytes_read less preload_bytes"),
    SPARSE("summary", "dense_batch_blocks", "integer", "sparse", "prefill blocks run dense from memory"),
    SPARSE("summary", "streamed_blocks", "integer", "sparse", "prefill blocks streamed from storage"),
    SPARSE("summary", "probe_rand_reads_per_s", "number", "sparse", "the storage probe's random reads/s"),
    SPARSE("summary", "probe_gate_reads_per_s", "number", "sparse", "its gate-part reads/s"),
    SPARSE("summary", "probe_rest_reads_per_s", "number", "sparse", "its rest-part reads/s"),
    SPARSE("summary", "probe_seq_bytes_per_s", "number", "sparse", "its sequential bytes/s"),
    SPARSE("summary", "two_phase_source", "string", "sparse", "flag, storage probe or default"),
    SPARSE("summary", "admit_rank", "integer", "sparse", "the cold cache's admission rank limit"),
    SPARSE("summary", "warmed_bundles", "integer", "sparse", "bundles warmed into the cache"),
    SPARSE("summary", "stream_cached_bundles", "integer", "sparse", "bundles streamed prefill left cached"),
    SPARSE("summary", "skipped_misses", "integer", "sparse", "misses left unread (--miss-threshold, --read-cap)"),
    SPARSE("summary", "io_submitter", "boolean", "sparse", "decode's reads issued by a thread of their own"),
    SPARSE("summary", "submitter_reads", "integer", "sparse", "reads that thread issued"),
    SPARSE("summary", "read_cap", "integer", "--read-cap", "the read cap asked for"),
    SPARSE("summary", "capped_misses", "integer", "--read-cap", "misses the cap left unread"),
    SPARSE("summary", "pred_threshold", "number", "--pred-threshold", "the predictor's threshold"),
    SPARSE("summary", "sparsity", "number", "--check-predictor", "share of truly zero (token, neuron) outputs"),
    SPARSE("summary", "predictor_recall", "number", "--check-predictor", "active neurons predicted"),
    SPARSE("summary", "predictor_precision", "number", "--check-predictor", "predicted neurons active"),
    SPARSE("summary", "predictor_layers", "array", "--check-predictor", "{layer, sparsity, recall, precision} per layer"),
    SPARSE("summary", "skipped_active", "integer", "--check-predictor", "truly active neurons left unread"),
    SPARSE("summary", "effective_recall", "number", "--check-predictor", "recall of what was computed"),
    {NULL},
};

/* ---- the builders ------------------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    for (int pass = 0; pass < 2 && !b->oom; pass++) {
        va_list ap;
        va_start(ap, fmt);
        const int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 256;
        while (cap <= b->len + (size_t)n) cap *= 2;
        char *more = realloc(b->p, cap);
        if (!more) b->oom = 1;
        else {
            b->p = more;
            b->cap = cap;
        }
    }
}

static void put_value(sbuf *b, const pi2_event_field *f, const char *rec) {
    const void *at = rec + f->off;
    switch (f->how) {
    case PI2_EV_INT: put(b, "%d", *(const int *)at); break;
    case PI2_EV_U64: put(b, "%llu", (unsigned long long)*(const uint64_t *)at); break;
    case PI2_EV_TIME: put(b, "%.9f", *(const double *)at); break;
    case PI2_EV_SEC: put(b, "%.6f", *(const double *)at); break;
    case PI2_EV_RATE: put(b, "%.3f", *(const double *)at); break;
    case PI2_EV_STR: {
        const char *s = *(const char *const *)at;
        char q[1100];
        pi2_json_string(q, sizeof q, s ? s : "");
        put(b, "%s", q);
        break;
    }
    case PI2_EV_IDS: {
        const int32_t *ids = *(const int32_t *const *)at;
        const int n = *(const int *)(rec + f->off + sizeof(const int32_t *));
        put(b, "[");
        for (int i = 0; i < n; i++) put(b, i ? ", %d" : "%d", ids[i]);
        put(b, "]");
        break;
    }
    case PI2_EV_OBJ: put(b, "%s", *(const char *const *)at); break;
    case PI2_EV_SPARSE: break;
    }
}

char *pi2_event_json(const char *kind, unsigned cmd, const void *record, const char *sparse) {
    sbuf b = {0};
    put(&b, "{\"event\": \"%s\"", kind);
    for (const pi2_event_field *f = pi2_event_fields; f->event; f++) {
        if (strcmp(f->event, kind) || !(f->cmds & cmd) || f->how == PI2_EV_SPARSE) continue;
        /* a conditional string is there only when it has a value (a failed turn's error) */
        if (f->when && (f->how == PI2_EV_STR || f->how == PI2_EV_OBJ) &&
            !*(const char *const *)((const char *)record + f->off))
            continue;
        put(&b, ", \"%s\": ", f->name);
        put_value(&b, f, record);
    }
    if (sparse) put(&b, "%s", sparse);
    put(&b, "}");
    if (b.oom) {
        free(b.p);
        pi2_set_error("out of memory for a %s event", kind);
        return NULL;
    }
    return b.p;
}

static int emit(pi2_events *ev, const char *kind, unsigned cmd, const void *record, const char *sparse, char **keep) {
    if (!ev->f && !keep) return 0;
    char *json = pi2_event_json(kind, cmd, record, sparse);
    if (!json) return -1;
    const int rc = pi2_events_line(ev, json, strcmp(kind, "token") != 0);
    if (keep) *keep = json;
    else free(json);
    return rc;
}

int pi2_event_start(pi2_events *ev, unsigned cmd, const pi2_start_record *r) {
    pi2_start_record k = *r; /* the kernels are the process's: filled here for every command */
    k.kernels = pi2_kernel_level_name(pi2_kernels_current());
    k.x4_prefetch = pi2_kernels_x4_prefetch(), k.x4_streams = pi2_kernels_x4_streams();
    return emit(ev, "start", cmd, &k, NULL, NULL);
}
int pi2_event_token(pi2_events *ev, unsigned cmd, const pi2_token_record *r, const char *sparse) {
    return emit(ev, "token", cmd, r, sparse, NULL);
}
int pi2_event_turn(pi2_events *ev, unsigned cmd, const pi2_turn_record *r, char **json) {
    if (json) *json = NULL;
    return emit(ev, "turn", cmd, r, NULL, json);
}
int pi2_event_summary(pi2_events *ev, unsigned cmd, const pi2_summary_record *r, const char *sparse) {
    return emit(ev, "summary", cmd, r, sparse, NULL);
}

/* ---- capabilities ------------------------------------------------------------------------------ */

void pi2_event_schema_json(FILE *out) {
    char s[400];
    fprintf(out, "\"events\": {");
    for (int k = 0; pi2_event_kinds[k]; k++) {
        fprintf(out, "%s\"%s\": [", k ? ", " : "", pi2_event_kinds[k]);
        int n = 0;
        for (const pi2_event_field *f = pi2_event_fields; f->event; f++) {
            if (strcmp(f->event, pi2_event_kinds[k])) continue;
            fprintf(out, "%s{\"name\": \"%s\", \"type\": \"%s\", \"commands\": [", n++ ? ", " : "", f->name, f->type);
            for (int c = 0, m = 0; c < pi2_command_count(); c++)
                if (f->cmds & (1u << c)) fprintf(out, "%s\"%s\"", m++ ? ", " : "", pi2_command_names[c]);
            fprintf(out, "], ");
            if (f->when) fprintf(out, "\"when\": \"%s\", ", f->when);
            pi2_json_string(s, sizeof s, f->help);
            fprintf(out, "\"source\": \"%s\", \"help\": %s}", f->how == PI2_EV_SPARSE ? "sparse" : "session", s);
        }
        fprintf(out, "]");
    }
    fprintf(out, "}");
}
