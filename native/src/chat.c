/* `pi2-engine chat` (see chat.h): one model load, many turns over one KV cache. */
#include "chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_request.h"
#include "common.h"
#include "events.h"
#include "forward.h"
#include "kernels.h"
#include "model.h"
#include "sampler.h"
#include "sparse.h"
#include "threadpool.h"
#include "tokenizer.h"
#include "vocab_blob.h"

#define RECORD_SEPARATOR '\x1e'
#define DEFAULT_CTX 4096

typedef struct {
    const char *model, *events, *affinity;
    int n_predict, threads, n_ctx, n_batch, ignore_eos, verify_neurons, no_pack;
    float temperature, top_p;
    uint64_t seed;
    pi2_sparse_config sparse;
} chat_options;

static void chat_usage(FILE *out) {
    fprintf(out,
            "usage: pi2-engine chat -m MODEL.pi2 [-n N] [--ctx N] [--batch N] [--threads T] [--affinity 0,1,..]\n"
            "                       [--events FILE] [--temperature T] [--top-p P] [--seed S] [--ignore-eos]\n"
            "                       [--no-verify-neurons] [--no-pack-ffn]\n"
            "  Reads one JSON request per stdin line:\n"
            "    {\"prompt\": \"text appended to the context\", \"n_predict\": N, \"ignore_eos\": false, \"reset\": false}\n"
            "  and answers each with the generated text on stdout, then a line \"\\x1e{turn record}\".\n"
            "  The KV cache is kept between requests (only new tokens are prefilled); \"reset\": true starts a\n"
            "  new conversation. -n and --ignore-eos are the defaults for requests that do not say.\n"
            "  --ctx: KV cache positions for the whole conversation (default min(model's, %d)).\n%s",
            DEFAULT_CTX, pi2_sparse_usage());
}

static int parse_chat_options(int argc, char **argv, chat_options *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 64;
    o->top_p = 1.0f;
    o->verify_neurons = 1;
    pi2_sparse_config_default(&o->sparse);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int taken = pi2_sparse_parse_flag(a, i + 1 < argc ? argv[i + 1] : NULL, &o->sparse);
        if (taken < 0) return -1;
        if (taken) {
            i += taken - 1;
            continue;
        }
        int flag = !strcmp(a, "--ignore-eos") || !strcmp(a, "--no-verify-neurons") || !strcmp(a, "--no-pack-ffn");
        if (!flag && i + 1 >= argc) {
            pi2_set_error("option %s needs a value", a);
            return -1;
        }
        const char *v = flag ? NULL : argv[++i];
        int rc = 0;
        if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (!strcmp(a, "--no-verify-neurons")) o->verify_neurons = 0;
        else if (!strcmp(a, "--no-pack-ffn")) o->no_pack = 1;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--events")) o->events = v;
        else if (!strcmp(a, "--affinity")) o->affinity = v;
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) rc = pi2_parse_int_arg(a, v, 0, 1 << 20, &o->n_predict);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) rc = pi2_parse_int_arg(a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "--ctx")) rc = pi2_parse_int_arg(a, v, 1, 1 << 22, &o->n_ctx);
        else if (!strcmp(a, "--batch")) rc = pi2_parse_int_arg(a, v, 1, 1 << 16, &o->n_batch);
        else if (!strcmp(a, "--temperature") || !strcmp(a, "--temp")) rc = pi2_parse_float_arg(a, v, &o->temperature);
        else if (!strcmp(a, "--top-p")) rc = pi2_parse_float_arg(a, v, &o->top_p);
        else if (!strcmp(a, "--seed")) {
            char *end = NULL;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || *end || !*v || *v == '-') {
                pi2_set_error("--seed needs a non-negative integer, got '%s'", v);
                rc = -1;
            }
        } else {
            pi2_set_error("unknown chat option '%s' (see pi2-engine chat --help)", a);
            rc = -1;
        }
        if (rc) return -1;
    }
    if (!o->model) { pi2_set_error("missing -m MODEL.pi2"); return -1; }
    if (o->temperature < 0) { pi2_set_error("--temperature must be >= 0"); return -1; }
    if (!(o->top_p > 0 && o->top_p <= 1)) { pi2_set_error("--top-p must be in (0, 1]"); return -1; }
    return 0;
}

/* The session: everything that lives from the model load to the end of input. */
typedef struct {
    pi2_model m;
    int model_loaded;
    pi2_vocab_desc desc;
    pi2_tokenizer *tok;
    pi2_pool *pool;
    pi2_ctx *ctx;
    pi2_sparse *sparse; /* NULL under --policy dense */
    pi2_sampler sampler;
    pi2_events ev;
    int n_threads, n_ctx, n_batch;
    int32_t *ids;
    int ids_cap;
    int has_pending;  /* the last generated token is not in the KV cache yet */
    int32_t pending;
} chat_session;

static int ensure_ids(chat_session *s, int n) {
    if (n <= s->ids_cap) return 0;
    int32_t *more = realloc(s->ids, sizeof(int32_t) * (size_t)n);
    if (!more) { pi2_set_error("out of memory for %d token ids", n); return -1; }
    s->ids = more;
    s->ids_cap = n;
    return 0;
}

/* Write generated bytes to stdout without the record separator (it ends a turn). */
static void emit_text(const char *p, int n) {
    for (int i = 0; i < n; i++)
        if (p[i] != RECORD_SEPARATOR) fputc(p[i], stdout);
    fflush(stdout);
}

/* The turn record: to the events file and, after the separator, to stdout. */
static void emit_record(chat_session *s, const char *json) {
    pi2_events_emit(&s->ev, "%s", json);
    fputc(RECORD_SEPARATOR, stdout);
    fputs(json, stdout);
    fputc('\n', stdout);
    fflush(stdout);
}

static void emit_error_record(chat_session *s, int turn, const char *message) {
    char msg[600], rec[800];
    pi2_json_string(msg, sizeof msg, message);
    snprintf(rec, sizeof rec, "{\"event\": \"turn\", \"turn\": %d, \"stop\": \"error\", \"error\": %s, \"n_past\": %d}",
             turn, msg, pi2_ctx_n_past(s->ctx) + s->has_pending);
    emit_record(s, rec);
}

/* One request: append its tokens (plus a pending token from the last turn), prefill them, generate.
 * Returns 0 when a record was written (also for a request-level error); -1 on an engine failure. */
static int run_turn(chat_session *s, const chat_options *o, const pi2_chat_request *req, int turn) {
    uint64_t t0 = pi2_now_ns();
    int n_predict = req->n_predict >= 0 ? req->n_predict : o->n_predict;
    int ignore_eos = req->ignore_eos >= 0 ? req->ignore_eos : o->ignore_eos;
    if (req->reset) {
        pi2_ctx_reset(s->ctx);
        s->has_pending = 0;
    }
    int fresh = pi2_ctx_n_past(s->ctx) == 0 && !s->has_pending;
    /* BOS only at the start of a conversation, and only when the vocabulary asks for it. */
    int cap = (int)req->prompt_len + 8;
    if (ensure_ids(s, cap + 1)) return -1;
    int off = s->has_pending ? 1 : 0;
    int n_text = pi2_tokenize(s->tok, req->prompt, req->prompt_len, fresh ? s->desc.add_bos : 0, 1, s->ids + off, cap);
    if (n_text < 0) {
        if (n_text == -1 || ensure_ids(s, -n_text + 1)) return -1;
        n_text = pi2_tokenize(s->tok, req->prompt, req->prompt_len, fresh ? s->desc.add_bos : 0, 1, s->ids + off, -n_text);
        if (n_text < 0) return -1;
    }
    if (s->has_pending) s->ids[0] = s->pending;
    int n_new = n_text + off;
    int n_past = pi2_ctx_n_past(s->ctx);
    if (n_new == 0) {
        emit_error_record(s, turn, "the prompt tokenizes to nothing");
        return 0;
    }
    if (n_past + n_new + n_predict > s->n_ctx) {
        char msg[200];
        snprintf(msg, sizeof msg, "context full: %d cached + %d new + %d to generate > --ctx %d (send \"reset\": true)",
                 n_past, n_new, n_predict, s->n_ctx);
        emit_error_record(s, turn, msg);
        return 0;
    }
    s->has_pending = 0;
    pi2_sparse_stats st_prev = {0}, st_cur = {0};
    char tok_json[400];
    pi2_sparse_snapshot(s->sparse, &st_prev);
    for (int t = 0; t < n_new; t += s->n_batch) {
        int nb = n_new - t < s->n_batch ? n_new - t : s->n_batch;
        if (pi2_forward(s->ctx, s->ids + t, nb, NULL) != 0) return -1;
    }
    pi2_sparse_snapshot(s->sparse, &st_cur);
    uint64_t t_prefill = pi2_now_ns(), t_first = 0, t_last = 0;
    int n_gen = 0;
    const char *stop = "length";
    char piece[256];
    while (n_gen < n_predict) {
        int32_t next = pi2_sample(&s->sampler, pi2_ctx_logits(s->ctx));
        uint64_t now = pi2_now_ns();
        if (!n_gen) t_first = now;
        t_last = now;
        pi2_sparse_token_json(s->sparse, &st_prev, &st_cur, tok_json, sizeof tok_json);
        pi2_events_emit(&s->ev, "{\"event\": \"token\", \"t\": %.9f, \"cpu_s\": %.6f, \"turn\": %d, \"i\": %d, \"id\": %d%s}",
                        pi2_seconds(now), pi2_cpu_ns() / 1e9, turn, n_gen, next, tok_json);
        n_gen++;
        if (!ignore_eos && pi2_token_is_eog(s->tok, next)) {
            /* Not kept in the cache: the host's chat template writes the end-of-turn text itself. */
            stop = "eog";
            break;
        }
        int np = pi2_token_to_piece(s->tok, next, piece, sizeof piece);
        if (np > 0) emit_text(piece, np);
        if (n_gen < n_predict) {
            st_prev = st_cur;
            if (pi2_forward(s->ctx, &next, 1, NULL) != 0) return -1;
            pi2_sparse_snapshot(s->sparse, &st_cur);
        } else {
            /* The answer's last token joins the cache with the next request's prefill. */
            s->has_pending = 1;
            s->pending = next;
        }
    }
    double prefill_s = pi2_seconds(t_prefill - t0);
    double ttft = t_first ? pi2_seconds(t_first - t0) : 0;
    double decode_s = t_first ? pi2_seconds(t_last - t_first) : 0;
    double decode_tps = n_gen > 1 && decode_s > 0 ? (n_gen - 1) / decode_s : 0;
    double prefill_tps = prefill_s > 0 ? n_new / prefill_s : 0;
    char rec[640];
    snprintf(rec, sizeof rec,
             "{\"event\": \"turn\", \"turn\": %d, \"t0\": %.9f, \"n_prompt\": %d, \"n_cached\": %d, \"n_gen\": %d, "
             "\"ttft_s\": %.6f, \"prefill_s\": %.6f, \"prefill_tps\": %.3f, \"decode_s\": %.6f, \"decode_tps\": %.3f, "
             "\"stop\": \"%s\", \"n_past\": %d, \"peak_rss_bytes\": %llu}",
             turn, pi2_seconds(t0), n_new, n_past, n_gen, ttft, prefill_s, prefill_tps, decode_s, decode_tps, stop,
             pi2_ctx_n_past(s->ctx) + s->has_pending, (unsigned long long)pi2_peak_rss_bytes());
    emit_record(s, rec);
    return 0;
}

static int open_session(chat_session *s, const chat_options *o) {
    if (pi2_model_load_for(&s->m, o->model, o->verify_neurons, o->no_pack, &o->sparse) != 0) return -1;
    s->model_loaded = 1;
    if (!s->m.file.tokenizer_len) {
        pi2_set_error("%s: the model has no tokenizer section", o->model);
        return -1;
    }
    if (pi2_vocab_blob_parse(s->m.file.tokenizer, s->m.file.tokenizer_len, &s->desc) != 0) {
        pi2_set_error("%s: tokenizer section: %s", o->model, pi2_last_error());
        return -1;
    }
    if (!(s->tok = pi2_tokenizer_create(&s->desc))) return -1;
    if (pi2_tokenizer_n_vocab(s->tok) > (int32_t)s->m.h.n_vocab) {
        pi2_set_error("%s: tokenizer has %d tokens, the model %u", o->model, pi2_tokenizer_n_vocab(s->tok), s->m.h.n_vocab);
        return -1;
    }
    s->n_ctx = o->n_ctx;
    if (!s->n_ctx) {
        s->n_ctx = DEFAULT_CTX;
        if (s->m.h.n_ctx_train && s->m.h.n_ctx_train < (uint32_t)s->n_ctx) s->n_ctx = (int)s->m.h.n_ctx_train;
    }
    /* A batch's scratch grows with its tokens (~10 bytes per FFN neuron and ~4 per activation each):
     * under a budget 64 keeps it a small share, and prefill batches still stream a block per 64 tokens. */
    s->n_batch = o->n_batch ? o->n_batch : o->sparse.memory_budget ? 64 : 256;
    if (s->n_batch > s->n_ctx) s->n_batch = s->n_ctx;
    if (!(s->pool = pi2_pool_from_flags(o->threads, o->affinity, &s->n_threads))) return -1;
    if (!(s->ctx = pi2_ctx_create(&s->m, s->n_ctx, s->n_batch, s->pool))) return -1;
    if (o->sparse.policy != PI2_POLICY_DENSE && !(s->sparse = pi2_sparse_open(&s->m, s->ctx, s->pool, &o->sparse)))
        return -1;
    if (pi2_sampler_init(&s->sampler, (int32_t)s->m.h.n_vocab, o->temperature, o->top_p, o->seed) != 0) return -1;
    if (pi2_events_open(&s->ev, o->events) != 0) return -1;
    return 0;
}

static void close_session(chat_session *s) {
    pi2_events_close(&s->ev);
    pi2_sampler_free(&s->sampler);
    pi2_sparse_close(s->sparse);
    pi2_ctx_free(s->ctx);
    pi2_pool_free(s->pool);
    free(s->ids);
    pi2_tokenizer_free(s->tok);
    pi2_vocab_desc_release(&s->desc);
    if (s->model_loaded) pi2_model_free(&s->m);
}

int pi2_chat_main(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            chat_usage(stdout);
            return 0;
        }
    chat_options o;
    if (parse_chat_options(argc, argv, &o) != 0) {
        fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
        return 2;
    }
    uint64_t t_load0 = pi2_now_ns();
    chat_session s;
    memset(&s, 0, sizeof s);
    int rc = 1, turn = 0;
    char *line = NULL;
    size_t line_cap = 0;
    if (open_session(&s, &o) != 0) goto done;
    uint64_t t_ready = pi2_now_ns();
    pi2_events_emit(&s.ev,
                    "{\"event\": \"start\", \"t\": %.9f, \"mode\": \"chat\", \"engine\": \"pi2-engine %s\", "
                    "\"threads\": %d, \"kernels\": \"%s\", \"n_ctx\": %d, \"load_s\": %.6f}",
                    pi2_seconds(t_ready), PI2_VERSION, s.n_threads, pi2_kernel_level_name(pi2_kernels_current()),
                    s.n_ctx, pi2_seconds(t_ready - t_load0));
    ssize_t len;
    while ((len = getline(&line, &line_cap, stdin)) >= 0) {
        size_t n = (size_t)len;
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
        if (!n) continue; /* blank lines are not requests */
        pi2_chat_request req;
        if (pi2_chat_request_parse(line, n, &req) != 0) {
            emit_error_record(&s, turn++, pi2_last_error());
            continue;
        }
        int turn_rc = run_turn(&s, &o, &req, turn++);
        pi2_chat_request_free(&req);
        if (turn_rc != 0) goto done;
    }
    char sparse_json[4096], sparse_line[400];
    pi2_sparse_summary_json(s.sparse, &o.sparse, sparse_json, sizeof sparse_json);
    pi2_sparse_summary_line(s.sparse, &o.sparse, sparse_line, sizeof sparse_line);
    pi2_events_emit(&s.ev,
                    "{\"event\": \"summary\", \"t\": %.9f, \"turns\": %d, \"peak_rss_bytes\": %llu, \"bytes_read\": %llu, "
                    "\"model_bytes\": %llu, \"threads\": %d%s}",
                    pi2_seconds(pi2_now_ns()), turn, (unsigned long long)pi2_peak_rss_bytes(),
                    (unsigned long long)pi2_io_read_bytes(), (unsigned long long)s.m.file.size, s.n_threads, sparse_json);
    fprintf(stderr, "pi2-engine chat: %d turns, peak RSS %.0f MiB; %s\n", turn, pi2_peak_rss_bytes() / 1048576.0,
            sparse_line);
    rc = 0;
done:
    if (rc) fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
    free(line);
    close_session(&s);
    return rc;
}
