/* Plan files: "--plan FILE" becomes the flags the plan sets, in place, so later flags override it;
 * informational keys are skipped; every malformed plan fails with one line naming the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "plan.h"

static char path[256];

static void write_plan(const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

/* argv joined with spaces after expansion, or "ERROR: <message>" */
static const char *expand(const char *const *argv_in, int argc) {
    static char out[2048];
    int n = 0;
    char **args = NULL;
    if (pi2_plan_expand_args(argc, (char **)argv_in, &n, &args) != 0) {
        snprintf(out, sizeof out, "ERROR: %s", pi2_last_error());
        return out;
    }
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (i) strcat(out, " ");
        strcat(out, args[i]);
    }
    CHECK(args[n] == NULL);
    pi2_plan_free_args(n, args);
    return out;
}

static int fails_with(const char *plan_text, const char *needle) {
    write_plan(plan_text);
    const char *argv[] = {"pi2-engine", "generate", "--plan", path};
    const char *r = expand(argv, 4);
    int ok = !strncmp(r, "ERROR: ", 7) && strstr(r, needle) && strstr(r, path);
    if (!ok) fprintf(stderr, "expected an error with '%s', got: %s\n", needle, r);
    return ok;
}

int main(void) {
    snprintf(path, sizeof path, "/tmp/pi2-test-plan-%d.json", (int)getpid());
    write_plan("{\"format\": \"pi2-plan\", \"version\": 1, \"model\": \"m.pi2\", \"why\": \"because\",\n"
               " \"measured_iops\": 70000, \"predicted_tbt_ms\": 12.5,\n"
               " \"policy\": \"powerinfer2\", \"memory_budget\": \"2G\", \"threads\": 4, \"affinity\": \"4,5,6,7\",\n"
               " \"hot_fraction\": 0.25, \"hot_share\": 0.5, \"cluster\": 16, \"two_phase\": false, \"lookahead\": true,\n"
               " \"io\": \"uring\", \"io_threads\": 2, \"io_affinity\": \"0,1\", \"pred_threshold\": 0.45}");
    const char *argv[] = {"pi2-engine", "generate", "-m", "x.pi2", "--plan", path, "--threads", "2"};
    CHECK(!strcmp(expand(argv, 8),
                  "pi2-engine generate -m x.pi2 --policy powerinfer2 --memory-budget 2G --threads 4 --affinity 4,5,6,7 "
                  "--hot-fraction 0.25 --hot-share 0.5 --cluster 16 --no-two-phase --lookahead --io uring "
                  "--io-threads 2 --io-affinity 0,1 --pred-threshold 0.45 --threads 2"));
    /* true two_phase forces it on (absent: the engine's storage probe decides); false lookahead is the
     * default: no flag; a byte count for the budget; a prefill-stream mode */
    write_plan("{\"format\": \"pi2-plan\", \"version\": 1, \"two_phase\": true, \"lookahead\": false, "
               "\"memory_budget\": 1073741824, \"prefill_stream\": \"off\"}");
    const char *argv2[] = {"pi2-engine", "chat", "--plan", path};
    CHECK(!strcmp(expand(argv2, 4), "pi2-engine chat --two-phase --memory-budget 1073741824 --prefill-stream off"));
    /* no plan: argv unchanged */
    const char *argv3[] = {"pi2-engine", "info", "-m", "x.pi2"};
    CHECK(!strcmp(expand(argv3, 4), "pi2-engine info -m x.pi2"));

    CHECK(fails_with("{\"format\": \"pi2-plan\", \"version\": 1, \"hot_fractoin\": 0.2}", "unknown key \"hot_fractoin\""));
    CHECK(fails_with("{\"format\": \"pi2-plan\", \"version\": 1, \"threads\": \"4\"}", "\"threads\" is a string, expected a number"));
    CHECK(fails_with("{\"format\": \"pi2-plan\", \"version\": 1, \"two_phase\": 0}", "expected true or false"));
    CHECK(fails_with("{\"format\": \"pi2-plan\", \"version\": 2}", "version 2 is not supported"));
    CHECK(fails_with("{\"version\": 1, \"policy\": \"dense\"}", "not a pi2 plan"));
    CHECK(fails_with("{\"format\": \"llama\", \"version\": 1}", "\"format\" must be \"pi2-plan\""));
    CHECK(fails_with("{\"format\": \"pi2-plan\", \"version\": 1, \"cache\": {\"hot\": 1}}", "only strings, numbers"));
    CHECK(fails_with("{\"format\": \"pi2-plan\", \"version\": 1,", "expected '\"'"));
    CHECK(fails_with("", "expected '{'"));
    unlink(path);
    const char *argv4[] = {"pi2-engine", "generate", "--plan", "/nonexistent/plan.json"};
    CHECK(strstr(expand(argv4, 4), "ERROR: plan /nonexistent/plan.json: cannot open it") != NULL);
    const char *argv5[] = {"pi2-engine", "generate", "--plan"};
    CHECK(strstr(expand(argv5, 3), "--plan needs a value") != NULL);
    return pi2_test_summary("test_plan");
}
