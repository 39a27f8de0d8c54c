/* Execution plans (docs/PLAN.md): `pi2 plan` measures a device and writes, as one flat JSON object,
 * the settings the engine would otherwise take as flags: policy, budget, threads and cores, the cache
 * split, whole-bundle or two-phase reads, I/O threads and their cores, the predictor threshold.
 *
 * `--plan FILE` on the engine's command line stands for those flags: the plan's settings take its
 * place in argv, so flags after it override the plan and every value goes through the same
 * validation as when typed. */
#ifndef PI2_PLAN_H
#define PI2_PLAN_H

/* Returns a new argv (NULL-terminated, *out_argc entries) in which each "--plan FILE" is replaced by
 * the flags FILE sets; 0, or -1 with pi2_set_error naming the file and the problem. Free the result
 * with pi2_plan_free_args. */
int pi2_plan_expand_args(int argc, char **argv, int *out_argc, char ***out_argv);
void pi2_plan_free_args(int argc, char **argv);
/* The i-th setting key a plan may hold (policy, memory_budget, ...), NULL past the last. */
const char *pi2_plan_key(int i);

#endif
