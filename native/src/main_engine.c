/* pi2-engine: the command-line front of the engine.
 *   generate  prompt -> text on stdout (streamed), JSONL events for the host
 *   eval      token ids -> raw float32 logits (tests compare them with the numpy reference)
 *   info      header summary of a .pi2 file (--json, --verify) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat.h"
#include "common.h"
#include "events.h"
#include "forward.h"
#include "kernels.h"
#include "model.h"
#include "plan.h"
#include "sampler.h"
#include "sparse.h"
#include "sparse_predict.h"
#include "threadpool.h"
#include "tokenizer.h"
#include "vocab_blob.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: pi2-engine COMMAND [OPTIONS]\n"
            "commands:\n"
            "  generate -m MODEL.pi2 (-p TEXT | --tokens IDS) [-n N] [--temperature T] [--top-p P] [--seed S]\n"
            "           [--threads T] [--affinity 0,1,..] [--events FILE] [--ctx N] [--batch N]\n"
            "           [--ignore-eos] [--no-verify-neurons] [--no-pack-ffn] [--plan PLAN.json]\n"
            "           generate text; only the generated text goes to stdout, as tokens come\n"
            "           --plan: the settings of a plan from `pi2 plan` (docs/PLAN.md); later flags override it\n"
            "%s"
            "  eval -m MODEL.pi2 --tokens 1,2,3 --logits-out FILE [--all] [--batch N] [--threads T]\n"
            "           [--no-pack-ffn]   (--no-pack-ffn: compute straight from the bundles)\n"
            "           write float32 logits of the last (or --all) positions, row-major\n"
            "  chat -m MODEL.pi2 [...]  multi-turn: JSON requests on stdin, KV cache kept (chat --help)\n"
            "  info -m MODEL.pi2 [--json] [--verify]   header summary (--verify: neuron-region checksum)\n"
            "  --version  print the engine version\n",
            pi2_sparse_usage());
}

typedef struct {
    const char *model, *prompt, *events, *tokens, *logits_out, *affinity;
    int n_predict, threads, n_ctx, n_batch, ignore_eos, verify_neurons, all_logits, json, verify, no_pack;
    float temperature, top_p;
    uint64_t seed;
    pi2_sparse_config sparse;
} options;

static int parse_options(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 64;
    o->top_p = 1.0f;
    o->verify_neurons = 1;
    pi2_sparse_config_default(&o->sparse);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int taken = pi2_sparse_parse_flag(a, v, &o->sparse);
        if (taken < 0) return -1;
        if (taken) {
            i += taken - 1;
            continue;
        }
#define TAKES_VALUE                                                   \
    do {                                                              \
        if (!v) {                                                     \
            pi2_set_error("option %s needs a value", a);              \
            return -1;                                                \
        }                                                             \
        i++;                                                          \
    } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { TAKES_VALUE; o->model = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { TAKES_VALUE; o->prompt = v; }
        else if (!strcmp(a, "--events")) { TAKES_VALUE; o->events = v; }
        else if (!strcmp(a, "--tokens")) { TAKES_VALUE; o->tokens = v; }
        else if (!strcmp(a, "--logits-out")) { TAKES_VALUE; o->logits_out = v; }
        else if (!strcmp(a, "--affinity")) { TAKES_VALUE; o->affinity = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) { TAKES_VALUE; if (pi2_parse_int_arg(a, v, 0, 1 << 20, &o->n_predict)) return -1; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { TAKES_VALUE; if (pi2_parse_int_arg(a, v, 1, 1024, &o->threads)) return -1; }
        else if (!strcmp(a, "--ctx")) { TAKES_VALUE; if (pi2_parse_int_arg(a, v, 1, 1 << 22, &o->n_ctx)) return -1; }
        else if (!strcmp(a, "--batch")) { TAKES_VALUE; if (pi2_parse_int_arg(a, v, 1, 1 << 16, &o->n_batch)) return -1; }
        else if (!strcmp(a, "--temperature") || !strcmp(a, "--temp")) { TAKES_VALUE; if (pi2_parse_float_arg(a, v, &o->temperature)) return -1; }
        else if (!strcmp(a, "--top-p")) { TAKES_VALUE; if (pi2_parse_float_arg(a, v, &o->top_p)) return -1; }
        else if (!strcmp(a, "--seed")) {
            TAKES_VALUE;
            char *end = NULL;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || *end || !*v) { pi2_set_error("--seed needs a non-negative integer, got '%s'", v); return -1; }
        }
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (!strcmp(a, "--no-verify-neurons")) o->verify_neurons = 0;
        else if (!strcmp(a, "--no-pack-ffn")) o->no_pack = 1;
        else if (!strcmp(a, "--all")) o->all_logits = 1;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--verify")) o->verify = 1;
        else { pi2_set_error("unknown option '%s' (see pi2-engine --help)", a); return -1; }
#undef TAKES_VALUE
    }
    if (!o->model) { pi2_set_error("missing -m MODEL.pi2"); return -1; }
    if (o->temperature < 0) { pi2_set_error("--temperature must be >= 0"); return -1; }
    if (!(o->top_p > 0 && o->top_p <= 1)) { pi2_set_error("--top-p must be in (0, 1]"); return -1; }
    return 0;
}

static int die(void) {
    fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
    return 1;
}

/* ---- info ------------------------------------------------------------------------------------ */

static int cmd_info(const options *o) {
    pi2_model m;
    if (pi2_model_load(&m, o->model, o->verify) != 0) return die();
    const pi2_header *h = &m.h;
    if (h->flags & PI2_FLAG_PREDICTOR) { /* bind them as a sparse run would: "info ok" means they load */
        pi2_predictors p;
        const int bad = pi2_predictors_bind(&p, &m, 1, 0);
        pi2_predictors_free(&p);
        if (bad) {
            pi2_model_free(&m);
            return die();
        }
    }
    char path[1100];
    pi2_json_string(path, sizeof path, o->model);
    if (o->json) {
        printf("{\"path\": %s, \"format_version\": %u, \"arch\": \"%s\", \"ffn_act\": \"%s\", \"n_vocab\": %u, "
               "\"n_embd\": %u, \"n_layer\": %u, \"n_head\": %u, \"n_head_kv\": %u, \"head_dim\": %u, "
               "\"n_ff\": %u, \"n_expert\": %u, \"n_expert_used\": %u, \"n_ctx_train\": %u, "
               "\"rope_theta\": %g, \"rms_eps\": %g, \"tied_embeddings\": %s, \"dense_down\": %s, "
               "\"has_predictor\": %s, \"neuron_type\": \"%s\", \"bundle_align\": %u, \"bundle_stride\": %llu, "
               "\"n_tensors\": %u, \"file_bytes\": %llu, \"resident_bytes\": %llu, \"neuron_bytes\": %llu, "
               "\"tokenizer_bytes\": %llu, \"neurons_verified\": %s, \"metadata\": %.*s}\n",
               path, h->version, pi2_arch_name(h->arch), pi2_act_name(h->ffn_act), h->n_vocab, h->n_embd,
               h->n_layer, h->n_head, h->n_head_kv, h->head_dim, h->n_ff, h->n_expert, h->n_expert_used,
               h->n_ctx_train, h->rope_theta, h->rms_eps, h->flags & PI2_FLAG_TIED ? "true" : "false",
               h->flags & PI2_FLAG_DENSE_DOWN ? "true" : "false", h->flags & PI2_FLAG_PREDICTOR ? "true" : "false",
               pi2_type_name((pi2_type)h->neuron_type), h->bundle_align, (unsigned long long)h->bundle_stride,
               h->n_tensors, (unsigned long long)h->file_bytes,
               (unsigned long long)h->sections[PI2_SEC_RESIDENT].size,
               (unsigned long long)h->sections[PI2_SEC_NEURONS].size,
               (unsigned long long)h->sections[PI2_SEC_TOKENIZER].size, o->verify ? "true" : "false",
               m.file.metadata_len ? (int)m.file.metadata_len : 2, m.file.metadata_len ? m.file.metadata : "{}");
    } else {
        printf("%s: .pi2 format %u, %s, FFN %s\n", o->model, h->version, pi2_arch_name(h->arch), pi2_act_name(h->ffn_act));
        printf("  vocab %u, embd %u, layers %u, heads %u (kv %u, dim %u), ffn %u", h->n_vocab, h->n_embd,
               h->n_layer, h->n_head, h->n_head_kv, h->head_dim, h->n_ff);
        if (h->arch == PI2_ARCH_MOE) printf(", experts %u (top %u)", h->n_expert, h->n_expert_used);
        printf("\n  rope theta %g, rms eps %g, ctx %u, tied embeddings %s, dense down copy %s, predictors %s\n",
               h->rope_theta, h->rms_eps, h->n_ctx_train, h->flags & PI2_FLAG_TIED ? "yes" : "no",
               h->flags & PI2_FLAG_DENSE_DOWN ? "yes" : "no", h->flags & PI2_FLAG_PREDICTOR ? "yes" : "no");
        printf("  neuron bundles %s, stride %llu B (align %u); resident %.1f MiB, neurons %.1f MiB, %u tensors\n",
               pi2_type_name((pi2_type)h->neuron_type), (unsigned long long)h->bundle_stride, h->bundle_align,
               h->sections[PI2_SEC_RESIDENT].size / 1048576.0, h->sections[PI2_SEC_NEURONS].size / 1048576.0,
               h->n_tensors);
        printf("  checksums: header, table, tokenizer, metadata, resident ok%s\n",
               o->verify ? ", neuron region ok" : " (neuron region: --verify)");
    }
    pi2_model_free(&m);
    return 0;
}

/* ---- eval ------------------------------------------------------------------------------------ */

static int cmd_eval(const options *o) {
    if (!o->tokens || !o->logits_out) {
        pi2_set_error("eval needs --tokens and --logits-out");
        return die();
    }
    int32_t *ids = malloc(sizeof(int32_t) * 65536);
    if (!ids) return die();
    int n = pi2_parse_int_list("--tokens", o->tokens, 0x7fffffff, ids, 65536);
    if (n < 0) { free(ids); return die(); }
    pi2_model m;
    if (pi2_model_load_for(&m, o->model, o->verify_neurons, o->no_pack, &o->sparse) != 0) { free(ids); return die(); }
    int n_threads = 1, rc = 1;
    pi2_pool *pool = pi2_pool_from_flags(o->threads, o->affinity, &n_threads);
    int batch = o->n_batch ? o->n_batch : n;
    pi2_ctx *c = pool ? pi2_ctx_create(&m, o->n_ctx ? o->n_ctx : n, batch, pool) : NULL;
    pi2_sparse *sp = NULL;
    size_t V = m.h.n_vocab;
    float *out = NULL;
    if (!c || (o->sparse.policy != PI2_POLICY_DENSE && !(sp = pi2_sparse_open(&m, c, pool, &o->sparse)))) goto done;
    if (!(out = malloc(sizeof(float) * V * (size_t)(o->all_logits ? n : 1)))) goto done;
    for (int t = 0; t < n; t += batch) {
        int nb = n - t < batch ? n - t : batch;
        if (pi2_forward(c, ids + t, nb, o->all_logits ? out + (size_t)t * V : NULL) != 0) goto done;
    }
    if (!o->all_logits) memcpy(out, pi2_ctx_logits(c), V * sizeof(float));
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.partial", o->logits_out);
    FILE *f = fopen(tmp, "wb");
    size_t rows = o->all_logits ? (size_t)n : 1;
    if (!f || fwrite(out, sizeof(float), V * rows, f) != V * rows || fclose(f) != 0 || rename(tmp, o->logits_out) != 0) {
        pi2_set_error("cannot write %s", o->logits_out);
        goto done;
    }
    rc = 0;
done:
    if (rc) die();
    free(out);
    pi2_sparse_close(sp);
    pi2_ctx_free(c);
    pi2_pool_free(pool);
    pi2_model_free(&m);
    free(ids);
    return rc;
}

/* ---- generate -------------------------------------------------------------------------------- */

static int cmd_generate(const options *o) {
    if (!o->prompt == !o->tokens) {
        pi2_set_error("generate needs -p TEXT or --tokens IDS (one of them)");
        return die();
    }
    uint64_t t_load0 = pi2_now_ns();
    pi2_model m;
    if (pi2_model_load_for(&m, o->model, o->verify_neurons, o->no_pack, &o->sparse) != 0) return die();
    int rc = 1, n_threads = 1;
    pi2_sparse *sp = NULL;
    pi2_sparse_stats st_prev = {0}, st_cur = {0};
    char tok_json[400];
    pi2_vocab_desc desc;
    memset(&desc, 0, sizeof desc);
    pi2_tokenizer *tok = NULL;
    pi2_pool *pool = NULL;
    pi2_ctx *c = NULL;
    int32_t *ids = NULL;
    pi2_sampler sampler = {0};
    pi2_events ev = {0};
    if (!m.file.tokenizer_len) {
        pi2_set_error("%s: the model has no tokenizer section (use eval with token ids)", o->model);
        goto done;
    }
    if (pi2_vocab_blob_parse(m.file.tokenizer, m.file.tokenizer_len, &desc) != 0) {
        pi2_set_error("%s: tokenizer section: %s", o->model, pi2_last_error());
        goto done;
    }
    if (!(tok = pi2_tokenizer_create(&desc))) goto done;
    if (pi2_tokenizer_n_vocab(tok) > (int32_t)m.h.n_vocab) {
        pi2_set_error("%s: tokenizer has %d tokens, the model %u", o->model, pi2_tokenizer_n_vocab(tok), m.h.n_vocab);
        goto done;
    }
    int n_prompt;
    if (o->tokens) { /* token ids given directly (benchmarks use fixed-length prompts) */
        ids = malloc(sizeof(int32_t) * 65536);
        if (!ids) goto done;
        if ((n_prompt = pi2_parse_int_list("--tokens", o->tokens, 0x7fffffff, ids, 65536)) < 0) goto done;
        goto tokenized;
    }
    size_t plen = strlen(o->prompt);
    int cap = (int)plen + 8;
    ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!ids) goto done;
    /* As llama.cpp: BOS only when the vocabulary asks for it; special tokens in the text are parsed. */
    n_prompt = pi2_tokenize(tok, o->prompt, plen, desc.add_bos, 1, ids, cap);
    if (n_prompt < 0) {
        cap = -n_prompt;
        int32_t *more = realloc(ids, sizeof(int32_t) * (size_t)cap);
        if (!more) goto done;
        ids = more;
        n_prompt = pi2_tokenize(tok, o->prompt, plen, desc.add_bos, 1, ids, cap);
    }
tokenized:
    if (n_prompt <= 0) {
        pi2_set_error("the prompt tokenizes to nothing");
        goto done;
    }
    int n_ctx = o->n_ctx ? o->n_ctx : n_prompt + o->n_predict;
    if (n_ctx < n_prompt + o->n_predict) {
        pi2_set_error("--ctx %d is too small for %d prompt + %d generated tokens", n_ctx, n_prompt, o->n_predict);
        goto done;
    }
    const int max_batch = o->sparse.memory_budget ? 64 : 256; /* as chat's (chat.c) */
    int batch = o->n_batch ? o->n_batch : (n_prompt < max_batch ? n_prompt : max_batch);
    if (!(pool = pi2_pool_from_flags(o->threads, o->affinity, &n_threads))) goto done;
    if (!(c = pi2_ctx_create(&m, n_ctx, batch, pool))) goto done;
    if (o->sparse.policy != PI2_POLICY_DENSE && !(sp = pi2_sparse_open(&m, c, pool, &o->sparse))) goto done;
    pi2_sparse_snapshot(sp, &st_prev); /* token events count from here: the preload is part of the load */
    if (pi2_sampler_init(&sampler, (int32_t)m.h.n_vocab, o->temperature, o->top_p, o->seed) != 0) goto done;
    if (pi2_events_open(&ev, o->events) != 0) goto done;
    uint64_t t0 = pi2_now_ns();
    if (ev.f) {
        fprintf(ev.f,
                "{\"event\": \"start\", \"t\": %.9f, \"engine\": \"pi2-engine %s\", \"threads\": %d, "
                "\"kernels\": \"%s\", \"n_prompt\": %d, \"load_s\": %.6f, \"prompt_ids\": [",
                pi2_seconds(t0), PI2_VERSION, n_threads, pi2_kernel_level_name(pi2_kernels_current()), n_prompt,
                pi2_seconds(t0 - t_load0));
        for (int i = 0; i < n_prompt; i++) fprintf(ev.f, i ? ", %d" : "%d", ids[i]);
        pi2_events_emit(&ev, "]}");
    }
    for (int t = 0; t < n_prompt; t += batch) {
        int nb = n_prompt - t < batch ? n_prompt - t : batch;
        if (pi2_forward(c, ids + t, nb, NULL) != 0) goto done;
    }
    pi2_sparse_snapshot(sp, &st_cur);
    uint64_t t_prefill = pi2_now_ns(), t_first = 0, t_last = 0;
    int n_gen = 0;
    char piece[256];
    for (; n_gen < o->n_predict; n_gen++) {
        int32_t next = pi2_sample(&sampler, pi2_ctx_logits(c));
        uint64_t now = pi2_now_ns();
        if (!n_gen) t_first = now;
        t_last = now;
        /* with the sparse engine: what the forward pass that produced this token's logits cost */
        pi2_sparse_token_json(sp, &st_prev, &st_cur, tok_json, sizeof tok_json);
        pi2_events_emit(&ev, "{\"event\": \"token\", \"t\": %.9f, \"cpu_s\": %.6f, \"i\": %d, \"id\": %d%s}",
                        pi2_seconds(now), pi2_cpu_ns() / 1e9, n_gen, next, tok_json);
        if (!o->ignore_eos && pi2_token_is_eog(tok, next)) {
            n_gen++;
            break;
        }
        int np = pi2_token_to_piece(tok, next, piece, sizeof piece);
        if (np > 0) {
            fwrite(piece, 1, (size_t)np, stdout);
            fflush(stdout);
        }
        if (n_gen + 1 < o->n_predict) {
            st_prev = st_cur;
            if (pi2_forward(c, &next, 1, NULL) != 0) goto done;
            pi2_sparse_snapshot(sp, &st_cur);
        }
    }
    double prefill_s = pi2_seconds(t_prefill - t0);
    double ttft = t_first ? pi2_seconds(t_first - t0) : 0;
    double decode_s = pi2_seconds(t_last - t_first);
    double decode_tps = n_gen > 1 && decode_s > 0 ? (n_gen - 1) / decode_s : 0;
    double prefill_tps = prefill_s > 0 ? n_prompt / prefill_s : 0;
    pi2_events_emit(&ev,
                    "{\"event\": \"turn\", \"turn\": 0, \"n_prompt\": %d, \"n_gen\": %d, \"ttft_s\": %.6f, "
                    "\"prefill_s\": %.6f, \"prefill_tps\": %.3f, \"decode_s\": %.6f, \"decode_tps\": %.3f}",
                    n_prompt, n_gen, ttft, prefill_s, prefill_tps, decode_s, decode_tps);
    char sparse_json[4096], sparse_line[400];
    pi2_sparse_summary_json(sp, &o->sparse, sparse_json, sizeof sparse_json);
    pi2_sparse_summary_line(sp, &o->sparse, sparse_line, sizeof sparse_line);
    const uint64_t peak = pi2_peak_rss_bytes();
    pi2_events_emit(&ev,
                    "{\"event\": \"summary\", \"t\": %.9f, \"peak_rss_bytes\": %llu, \"bytes_read\": %llu, "
                    "\"model_bytes\": %llu, \"threads\": %d%s}",
                    pi2_seconds(pi2_now_ns()), (unsigned long long)peak, (unsigned long long)pi2_io_read_bytes(),
                    (unsigned long long)m.file.size, n_threads, sparse_json);
    fflush(stdout);
    fprintf(stderr,
            "\npi2-engine: %d prompt + %d generated tokens, TTFT %.1f ms, prefill %.1f tok/s, decode %.1f tok/s, "
            "%d threads (%s), peak RSS %.0f MiB\npi2-engine: %s\n",
            n_prompt, n_gen, ttft * 1e3, prefill_tps, decode_tps, n_threads,
            pi2_kernel_level_name(pi2_kernels_current()), peak / 1048576.0, sparse_line);
    if (sp && o->sparse.memory_budget && peak > o->sparse.memory_budget)
        fprintf(stderr, "pi2-engine: warning: peak RSS %.1f MiB exceeded the budget of %.1f MiB\n", peak / 1048576.0,
                o->sparse.memory_budget / 1048576.0);
    rc = 0;
done:
    if (rc) die();
    pi2_events_close(&ev);
    pi2_sampler_free(&sampler);
    pi2_sparse_close(sp);
    pi2_ctx_free(c);
    pi2_pool_free(pool);
    free(ids);
    pi2_tokenizer_free(tok);
    pi2_vocab_desc_release(&desc);
    pi2_model_free(&m);
    return rc;
}

static int run_command(int argc, char **argv) {
    const char *cmd = argv[1];
    if (!strcmp(cmd, "chat")) return pi2_chat_main(argc, argv); /* multi-turn, KV kept: chat.c */
    if (strcmp(cmd, "generate") && strcmp(cmd, "eval") && strcmp(cmd, "info")) {
        fprintf(stderr, "pi2-engine: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
    options o;
    if (parse_options(argc, argv, &o) != 0) {
        fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
        return 2;
    }
    if (!strcmp(cmd, "info")) return cmd_info(&o);
    if (!strcmp(cmd, "eval")) return cmd_eval(&o);
    return cmd_generate(&o);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("pi2-engine %s\n", PI2_VERSION);
        return 0;
    }
    /* "--plan FILE" stands for the flags the plan sets (plan.h); flags after it override them */
    int n = 0;
    char **args = NULL;
    if (pi2_plan_expand_args(argc, argv, &n, &args) != 0) {
        fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
        return 2;
    }
    const int rc = run_command(n, args);
    pi2_plan_free_args(n, args);
    return rc;
}
