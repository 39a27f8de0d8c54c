/* The engine's command-line options: one table of every flag (its name, whether it takes a value,
 * which commands take it, one line of help), one parser over it for every command, and the option
 * struct the front ends share. `pi2-engine capabilities --json` and the usage text are printed from
 * the same table, so what the engine says it takes is what it parses. */
#ifndef PI2_SESSION_OPTIONS_H
#define PI2_SESSION_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

#include "sparse.h"

/* Commands, as bits of a flag's `cmds`. */
typedef enum {
    PI2_CMD_GENERATE = 1 << 0,
    PI2_CMD_EVAL = 1 << 1,
    PI2_CMD_INFO = 1 << 2,
    PI2_CMD_CHAT = 1 << 3,
    PI2_CMD_SIZE = 1 << 4,
    PI2_CMD_SERVE = 1 << 5,
} pi2_command;

typedef struct {
    const char *name, *alias; /* alias: a short form ("-m") or NULL */
    int takes_value;
    unsigned cmds;            /* pi2_command bits */
    const char *help;
} pi2_flag;

/* The table, ending with a {NULL} entry; pi2_flags_sparse marks where the sparse engine's flags
 * start (they are printed as their own usage section). */
extern const pi2_flag pi2_flags[];
extern const int pi2_flags_sparse;

/* The KV cache positions a session takes without --ctx (at most the model's training context). */
#define PI2_DEFAULT_CTX 4096

/* The engine's defaults the host plans with, by name (`capabilities --json`: "defaults"), ending with
 * a {NULL} entry. The values are the macros the engine itself uses (sparse.h), so they cannot differ. */
typedef struct {
    const char *name;
    double value;
    const char *help;
} pi2_default;
extern const pi2_default pi2_defaults[];

/* Command names in bit order (PI2_CMD_GENERATE first). */
extern const char *const pi2_command_names[];
int pi2_command_count(void);

typedef struct {
    const char *model, *prompt, *events, *tokens, *logits_out, *affinity, *facts;
    int n_predict, threads, n_ctx, n_batch, ignore_eos, verify_neurons, all_logits, json, verify, no_pack;
    float temperature, top_p;
    uint64_t seed;
    pi2_sparse_config sparse;
    /* serve (server/serve.h) */
    const char *host, *api_key, *chat_template;
    int port, max_queue, max_tokens, read_timeout_s, request_timeout_s;
} pi2_options;

/* Parse argv[2..argc) for `cmd` (one pi2_command bit) into o (defaults first). A flag the command does
 * not take is "unknown"; 0, or -1 with one error line. */
int pi2_options_parse(unsigned cmd, int argc, char **argv, pi2_options *o);
/* Usage lines of the flags `cmd` takes from index `from` to `to` of the table (-1: the end). */
void pi2_options_usage(FILE *out, unsigned cmd, int from, int to);
/* A command's own --help sections: "options:" with its plain flags, then the sparse engine's. */
void pi2_options_usage_command(FILE *out, unsigned cmd);

#endif
