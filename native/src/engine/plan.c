/* Reading a plan file into engine flags (see plan.h and docs/PLAN.md for the format). */
#include "plan.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "json_flat.h"

#define PLAN_MAX_BYTES (1 << 20)

/* A setting: its key in the plan, the engine flag it stands for, and the JSON kind it takes. */
typedef enum { SET_STRING, SET_NUMBER, SET_SIZE /* string or number */, SET_COUNT /* too */, SET_TWO_PHASE, SET_LOOKAHEAD } set_kind;
static const struct {
    const char *key, *flag;
    set_kind kind;
} settings[] = {
    {"policy", "--policy", SET_STRING},         {"memory_budget", "--memory-budget", SET_SIZE},
    {"threads", "--threads", SET_NUMBER},       {"affinity", "--affinity", SET_STRING},
    {"hot_fraction", "--hot-fraction", SET_NUMBER}, {"hot_share", "--hot-share", SET_NUMBER},
    {"cluster", "--cluster", SET_NUMBER},       {"two_phase", "--no-two-phase", SET_TWO_PHASE},
    {"lookahead", "--lookahead", SET_LOOKAHEAD}, {"io", "--io", SET_STRING},
    {"io_threads", "--io-threads", SET_NUMBER}, {"io_affinity", "--io-affinity", SET_STRING},
    {"pred_threshold", "--pred-threshold", SET_NUMBER}, {"prefill_stream", "--prefill-stream", SET_STRING},
    {"miss_threshold", "--miss-threshold", SET_NUMBER}, {"read_cap", "--read-cap", SET_COUNT},
};

const char *pi2_plan_key(int i) {
    return i >= 0 && (size_t)i < sizeof settings / sizeof settings[0] ? settings[i].key : NULL;
}

/* Informational keys: read by people and the host, not by the engine. */
static int informational(const char *key) {
    static const char *names[] = {"model", "device", "why", "created_by"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(key, names[i])) return 1;
    return !strncmp(key, "predicted_", 10) || !strncmp(key, "measured_", 9);
}

typedef struct {
    const char *path;
    char **args; /* flags collected from the plan */
    int n, cap;
    int format_ok, version_ok;
} reader;

static int push(reader *r, const char *s) {
    if (r->n + 1 >= r->cap) {
        int cap = r->cap ? 2 * r->cap : 16;
        char **a = realloc(r->args, (size_t)cap * sizeof *a);
        if (!a) goto oom;
        r->args = a;
        r->cap = cap;
    }
    if (!(r->args[r->n] = strdup(s))) goto oom;
    r->n++;
    return 0;
oom:
    pi2_set_error("plan %s: out of memory", r->path);
    return -1;
}

static const char *kind_name(pi2_json_kind k) {
    return k == PI2_JSON_STRING ? "a string" : k == PI2_JSON_NUMBER ? "a number" : "true/false";
}

static int member(void *user, const char *key, pi2_json_kind kind, const char *v, size_t len) {
    (void)len;
    reader *r = user;
    if (!strcmp(key, "format")) {
        if (kind != PI2_JSON_STRING || strcmp(v, "pi2-plan")) {
            pi2_set_error("plan %s: \"format\" must be \"pi2-plan\"", r->path);
            return -1;
        }
        r->format_ok = 1;
        return 0;
    }
    if (!strcmp(key, "version")) {
        if (kind != PI2_JSON_NUMBER || strcmp(v, "1")) {
            pi2_set_error("plan %s: version %s is not supported (this engine reads version 1)", r->path, v);
            return -1;
        }
        r->version_ok = 1;
        return 0;
    }
    if (informational(key)) return 0;
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
        if (strcmp(key, settings[i].key)) continue;
        const set_kind want = settings[i].kind;
        const int is_bool = kind == PI2_JSON_TRUE || kind == PI2_JSON_FALSE;
        const int ok = want == SET_STRING   ? kind == PI2_JSON_STRING
                       : want == SET_NUMBER ? kind == PI2_JSON_NUMBER
                       : want == SET_SIZE || want == SET_COUNT ? kind == PI2_JSON_STRING || kind == PI2_JSON_NUMBER
                                                               : is_bool;
        if (!ok) {
            pi2_set_error("plan %s: \"%s\" is %s, expected %s", r->path, key, kind_name(kind),
                          want == SET_STRING   ? "a string"
                          : want == SET_NUMBER ? "a number"
                          : want == SET_SIZE   ? "a size (\"2G\" or bytes)"
                          : want == SET_COUNT  ? "a count, \"auto\" or \"off\""
                                               : "true or false");
            return -1;
        }
        if (want == SET_TWO_PHASE) return push(r, kind == PI2_JSON_FALSE ? "--no-two-phase" : "--two-phase");
        if (want == SET_LOOKAHEAD) return kind == PI2_JSON_TRUE ? push(r, settings[i].flag) : 0;
        return push(r, settings[i].flag) || push(r, v) ? -1 : 0;
    }
    pi2_set_error("plan %s: unknown key \"%.40s\" (see docs/PLAN.md)", r->path, key);
    return -1;
}

/* The flags one plan file sets, appended to r->args. */
static int read_plan(reader *r) {
    FILE *f = fopen(r->path, "rb");
    if (!f) {
        pi2_set_error("plan %s: cannot open it (%s)", r->path, strerror(errno));
        return -1;
    }
    char *buf = malloc(PLAN_MAX_BYTES + 1);
    size_t n = buf ? fread(buf, 1, PLAN_MAX_BYTES + 1, f) : 0;
    fclose(f);
    int rc = -1;
    char what[600];
    snprintf(what, sizeof what, "plan %s", r->path);
    if (!buf) pi2_set_error("plan %s: out of memory", r->path);
    else if (n > PLAN_MAX_BYTES) pi2_set_error("plan %s: larger than %d bytes: not a plan", r->path, PLAN_MAX_BYTES);
    else if (pi2_json_flat_parse(what, buf, n, member, r) != 0) {
    } else if (!r->format_ok || !r->version_ok)
        pi2_set_error("plan %s: not a pi2 plan (needs \"format\": \"pi2-plan\" and \"version\": 1)", r->path);
    else rc = 0;
    free(buf);
    return rc;
}

int pi2_plan_expand_args(int argc, char **argv, int *out_argc, char ***out_argv) {
    reader r = {.path = "(command line)"};
    int rc = -1;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--plan") != 0) {
            if (push(&r, argv[i])) goto done;
            continue;
        }
        if (i + 1 >= argc) {
            pi2_set_error("option --plan needs a value (a plan file from `pi2 plan`)");
            goto done;
        }
        r.path = argv[++i];
        r.format_ok = r.version_ok = 0;
        if (read_plan(&r)) goto done;
    }
    if (push(&r, "")) goto done; /* room for the terminator */
    free(r.args[--r.n]);
    r.args[r.n] = NULL;
    *out_argc = r.n;
    *out_argv = r.args;
    return 0;
done:
    pi2_plan_free_args(r.n, r.args);
    return rc;
}

void pi2_plan_free_args(int argc, char **argv) {
    if (!argv) return;
    for (int i = 0; i < argc; i++) free(argv[i]);
    free(argv);
}
