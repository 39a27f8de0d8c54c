/* pi2-engine: the command-line front of the engine.
 *   generate  prompt -> text on stdout (streamed), JSONL events for the host
 *   eval      token ids -> raw float32 logits (tests compare them with the numpy reference)
 *   info      header summary of a .pi2 file (--json, --verify)
 *   size      the sparse engine's sizing of a model under a budget (size_cmd.c)
 *   capabilities  what this build takes, as JSON, from the tables it parses with */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat.h"
#include "common.h"
#include "event_schema.h"
#include "events.h"
#include "forward.h"
#include "kernels.h"
#include "model.h"
#include "plan.h"
#include "safe_write.h"
#include "sampler.h"
#include "serve.h"
#include "session.h"
#include "session_options.h"
#include "size_cmd.h"
#include "sparse.h"
#include "sparse_predict.h"
#include "threadpool.h"
#include "tokenizer.h"
#include "vocab_blob.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: pi2-engine COMMAND [OPTIONS]\n"
            "commands:\n"
            "  generate -m MODEL.pi2 (-p TEXT | --tokens IDS) [...]   generate text; only the generated text goes\n"
            "           to stdout, as tokens come\n"
            "  eval -m MODEL.pi2 --tokens 1,2,3 --logits-out FILE [--all] [...]   write float32 logits of the last\n"
            "           (or --all) positions, row-major\n"
            "  chat -m MODEL.pi2 [...]  multi-turn: JSON requests on stdin, KV cache kept (chat --help)\n"
            "  serve -m MODEL.pi2 [--host H] [--port P] [...]   an OpenAI-compatible HTTP server (serve --help)\n"
            "  info -m MODEL.pi2 [--json] [--verify]   header summary (--verify: neuron-region checksum)\n"
            "  size (-m MODEL.pi2 | --facts FACTS.json) [--memory-budget B] [--json] [...]   the sparse engine's\n"
            "           sizing: budget, fixed region, neuron cache and its split, the smallest budget\n"
            "  size --plan FILE [--json]   without -m or --facts: check a plan's settings (and any flags) alone\n"
            "  capabilities --json   commands, flags, policies, plan keys, defaults, events and kernel levels\n"
            "  --version  print the engine version\n");
    for (int c = 0; c < pi2_command_count(); c++) {
        if (!strcmp(pi2_command_names[c], "chat")) continue; /* chat --help says more */
        fprintf(out, "%s options:\n", pi2_command_names[c]);
        pi2_options_usage(out, 1u << c, 0, pi2_flags_sparse);
    }
    fprintf(out, "sparse engine options (generate, eval, chat, size; docs/SPARSE.md):\n");
    pi2_options_usage(out, PI2_CMD_GENERATE, pi2_flags_sparse, -1);
}

static int die(void) {
    fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
    return 1;
}

/* ---- info ------------------------------------------------------------------------------------ */

static int cmd_info(const pi2_options *o) {
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
    if (m.file.tokenizer_len) { /* a tokenizer generate would refuse fails info too (vocab_blob.h) */
        pi2_vocab_desc desc;
        pi2_tokenizer *tok = pi2_tokenizer_from_section(o->model, m.file.tokenizer, m.file.tokenizer_len, h->n_vocab, &desc);
        pi2_tokenizer_free(tok);
        pi2_vocab_desc_release(&desc);
        if (!tok) {
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

static int cmd_eval(const pi2_options *o) {
    if (!o->tokens || !o->logits_out) {
        pi2_set_error("eval needs --tokens and --logits-out");
        return die();
    }
    pi2_session ss;
    float *out = NULL;
    int rc = 1, n;
    /* refused before the model loads: a bad target costs nothing */
    if (pi2_check_output_target(o->logits_out, "--logits-out") != 0) return die();
    if (pi2_session_load(&ss, o, PI2_TOKENIZER_NONE) != 0 || pi2_session_reserve(&ss, 65536) != 0) goto done;
    if ((n = pi2_parse_int_list("--tokens", o->tokens, 0x7fffffff, ss.ids, 65536)) < 0) goto done;
    const int batch = o->n_batch ? o->n_batch : n;
    if (pi2_session_start(&ss, o, o->n_ctx ? o->n_ctx : n, batch, NULL, NULL) != 0) goto done;
    const size_t V = ss.m.h.n_vocab, rows = o->all_logits ? (size_t)n : 1;
    if (!(out = malloc(sizeof(float) * V * rows))) goto done;
    for (int t = 0; t < n; t += batch) {
        int nb = n - t < batch ? n - t : batch;
        if (pi2_forward(ss.ctx, ss.ids + t, nb, o->all_logits ? out + (size_t)t * V : NULL) != 0) goto done;
    }
    if (!o->all_logits) memcpy(out, pi2_ctx_logits(ss.ctx), V * sizeof(float));
    /* temp beside it, fsync, rename: never through a link, never over a device, nothing left on failure */
    if (pi2_safe_write(o->logits_out, out, sizeof(float) * V * rows, "--logits-out") != 0) goto done;
    rc = 0;
done:
    if (rc) die();
    free(out);
    pi2_session_close(&ss);
    return rc;
}

/* ---- generate -------------------------------------------------------------------------------- */

/* generate's text goes to stdout as it comes. */
static void emit_stdout(const char *piece, int n) {
    fwrite(piece, 1, (size_t)n, stdout);
    fflush(stdout);
}

static int cmd_generate(const pi2_options *o) {
    if (!o->prompt == !o->tokens) {
        pi2_set_error("generate needs -p TEXT or --tokens IDS (one of them)");
        return die();
    }
    pi2_session ss;
    int rc = 1;
    if (pi2_session_load(&ss, o, PI2_TOKENIZER_NEEDED) != 0) goto done;
    const pi2_model *mp = &ss.m;
    int n_prompt;
    if (o->tokens) { /* token ids given directly (benchmarks use fixed-length prompts) */
        if (pi2_session_reserve(&ss, 65536) != 0) goto done;
        if ((n_prompt = pi2_parse_int_list("--tokens", o->tokens, 0x7fffffff, ss.ids, 65536)) < 0) goto done;
    } else if ((n_prompt = pi2_session_tokenize(&ss, o->prompt, strlen(o->prompt), ss.desc.add_bos, 0)) < 0) {
        goto done;
    }
    if (n_prompt <= 0) {
        pi2_set_error("the prompt tokenizes to nothing");
        goto done;
    }
    int n_ctx = o->n_ctx ? o->n_ctx : n_prompt + o->n_predict;
    if (n_ctx < n_prompt + o->n_predict) {
        pi2_set_error("--ctx %d is too small for %d prompt + %d generated tokens", n_ctx, n_prompt, o->n_predict);
        goto done;
    }
    const int max_batch = pi2_session_max_batch(o);
    if (pi2_session_start(&ss, o, n_ctx, o->n_batch ? o->n_batch : (n_prompt < max_batch ? n_prompt : max_batch),
                          NULL, NULL) != 0)
        goto done;
    const int n_threads = ss.n_threads;
    const uint64_t t_load0 = ss.t_load0;
    pi2_sparse *sp = ss.sparse;
    pi2_events *ev = &ss.ev;
    const int32_t *ids = ss.ids;
    uint64_t t0 = pi2_now_ns();
    const pi2_start_record start = {.t = pi2_seconds(t0), .mode = "generate", .engine = "pi2-engine " PI2_VERSION,
                                    .threads = n_threads,
                                    .n_ctx = n_ctx, .n_batch = ss.n_batch, .n_prompt = n_prompt, .load_s = pi2_seconds(t0 - t_load0),
                                    .prompt_ids = ids, .n_prompt_ids = n_prompt};
    if (pi2_event_start(ev, PI2_CMD_GENERATE, &start) != 0) goto done;
    pi2_turn_record turn;
    if (pi2_session_turn(&ss, n_prompt, o->n_predict, o->ignore_eos, 0, t0, emit_stdout, &turn) != 0) goto done;
    (void)pi2_event_turn(ev, PI2_CMD_GENERATE, &turn, NULL); /* a failure sticks: pi2_events_close reports it */
    pi2_sparse_named_json(sp, ev->f);
    char sparse_json[4096], sparse_line[400], prof_json[800], prefill_json[800];
    pi2_sparse_summary_json(sp, &o->sparse, sparse_json, sizeof sparse_json);
    pi2_prof_json(&ss.prof, sp != NULL, prof_json, sizeof prof_json);
    pi2_prof_json(&ss.prefill_prof, sp != NULL, prefill_json, sizeof prefill_json);
    pi2_sparse_summary_line(sp, &o->sparse, sparse_line, sizeof sparse_line);
    const uint64_t peak = pi2_peak_rss_bytes();
    const pi2_summary_record summary = {.t = pi2_seconds(pi2_now_ns()), .turns = 1, .peak_rss_bytes = peak,
                                        .bytes_read = pi2_io_read_bytes(), .model_bytes = mp->file.size,
                                        .anon_huge_bytes = pi2_anon_huge_bytes(),
                                        .threads = n_threads, .decode_profile = prof_json[0] ? prof_json : NULL,
                                        .prefill_profile = prefill_json[0] ? prefill_json : NULL};
    (void)pi2_event_summary(ev, PI2_CMD_GENERATE, &summary, sparse_json);
    if (pi2_events_close(ev) != 0) goto done; /* the events are the run's record: lost, it failed */
    fflush(stdout);
    fprintf(stderr,
            "\npi2-engine: %d prompt + %d generated tokens, TTFT %.1f ms, prefill %.1f tok/s, decode %.1f tok/s, "
            "%d threads (%s), peak RSS %.0f MiB\npi2-engine: %s\n",
            n_prompt, turn.n_gen, turn.ttft_s * 1e3, turn.prefill_tps, turn.decode_tps, n_threads,
            pi2_kernel_level_name(pi2_kernels_current()), peak / 1048576.0, sparse_line);
    if (sp && o->sparse.memory_budget && peak > o->sparse.memory_budget)
        fprintf(stderr, "pi2-engine: warning: peak RSS %.1f MiB exceeded the budget of %.1f MiB\n", peak / 1048576.0,
                o->sparse.memory_budget / 1048576.0);
    rc = 0;
done:
    if (rc) die();
    pi2_session_close(&ss);
    return rc;
}

/* ---- capabilities ------------------------------------------------------------------------------ */

/* What this build takes and writes, printed from the tables the engine parses and writes with
 * (session_options.c, plan.c, event_schema.c, kernels_dispatch.c), for the host to read instead of probing flag by flag. */
static int cmd_capabilities(void) {
    char s[400];
    printf("{\"schema\": 1, \"version\": \"%s\", \"commands\": [", PI2_VERSION);
    for (int c = 0; c < pi2_command_count(); c++) printf("\"%s\", ", pi2_command_names[c]);
    printf("\"capabilities\"], \"flags\": {");
    for (int c = 0; c < pi2_command_count(); c++) {
        printf("%s\"%s\": [", c ? ", " : "", pi2_command_names[c]);
        int n = 0;
        for (const pi2_flag *f = pi2_flags; f->name; f++) {
            if (!(f->cmds & (1u << c))) continue;
            pi2_json_string(s, sizeof s, f->help);
            printf("%s{\"name\": \"%s\", ", n++ ? ", " : "", f->name);
            if (f->alias) printf("\"alias\": \"%s\", ", f->alias);
            printf("\"takes_value\": %s, \"sparse\": %s, \"help\": %s}", f->takes_value ? "true" : "false",
                   f - pi2_flags >= pi2_flags_sparse ? "true" : "false", s);
        }
        printf("]");
    }
    printf(", \"capabilities\": [{\"name\": \"--json\", \"takes_value\": false, \"sparse\": false, "
           "\"help\": \"print JSON (the only form)\"}]}, \"policies\": [");
    for (int p = 0; p <= PI2_POLICY_POWERINFER2; p++) printf("%s\"%s\"", p ? ", " : "", pi2_policy_name((pi2_policy)p));
    printf("], \"plan_keys\": [");
    for (int i = 0; pi2_plan_key(i); i++) printf("%s\"%s\"", i ? ", " : "", pi2_plan_key(i));
    printf("], \"defaults\": {");
    for (int i = 0; pi2_defaults[i].name; i++) printf("%s\"%s\": %g", i ? ", " : "", pi2_defaults[i].name, pi2_defaults[i].value);
    printf("}, ");
    pi2_event_schema_json(stdout); /* event_schema.c: every event kind's fields */
    printf(", \"kernel_levels\": {\"compiled\": [");
    for (int l = 0, n = 0; l < PI2_KERNEL_LEVELS; l++)
        if (pi2_kernels_compiled((pi2_kernel_level)l))
            printf("%s\"%s\"", n++ ? ", " : "", pi2_kernel_level_name((pi2_kernel_level)l));
    printf("], \"runnable\": [");
    for (int l = 0, n = 0; l < PI2_KERNEL_LEVELS; l++)
        if (pi2_kernels_runnable((pi2_kernel_level)l))
            printf("%s\"%s\"", n++ ? ", " : "", pi2_kernel_level_name((pi2_kernel_level)l));
    printf("], \"selected\": \"%s\"}}\n", pi2_kernel_level_name(pi2_kernels_current()));
    return 0;
}

static int run_command(int argc, char **argv) {
    const char *cmd = argv[1];
    if (!strcmp(cmd, "chat")) return pi2_chat_main(argc, argv); /* multi-turn, KV kept: chat.c */
    if (!strcmp(cmd, "serve")) return pi2_serve_main(argc, argv); /* HTTP, OpenAI's API: server/serve.c */
    unsigned bit = 0;
    for (int c = 0; c < pi2_command_count(); c++)
        if (!strcmp(cmd, pi2_command_names[c])) bit = 1u << c;
    if (!bit && strcmp(cmd, "capabilities")) {
        fprintf(stderr, "pi2-engine: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
    if (!bit) { /* capabilities: JSON is its only form; --json is accepted for symmetry */
        for (int i = 2; i < argc; i++)
            if (strcmp(argv[i], "--json")) {
                fprintf(stderr, "pi2-engine: error: unknown capabilities option '%s' (it takes only --json)\n", argv[i]);
                return 2;
            }
        return cmd_capabilities();
    }
    pi2_options o;
    if (pi2_options_parse(bit, argc, argv, &o) != 0) {
        fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
        return 2;
    }
    if (bit == PI2_CMD_INFO) return cmd_info(&o);
    if (bit == PI2_CMD_EVAL) return cmd_eval(&o);
    if (bit == PI2_CMD_SIZE) return pi2_size_main(&o);
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
