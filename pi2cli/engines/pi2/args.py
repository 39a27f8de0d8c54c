"""pi2-engine's command line, built in one place for every caller: the pi2 and llmflash drivers
(`pi2 generate`, `pi2 bench`) and benchmarks/sparse_decode.py.

The order carries meaning, because `--plan FILE` splices the plan's settings into the command line
where it stands (native/src/engine/plan.c) and a later flag wins over an earlier one:
    COMMAND -m MODEL [run flags] --events FILE  --policy P [--llmflash-window K]  [--plan FILE]
    [--threads N] [more...]  [--memory-budget BYTES]
so a plan overrides the policy's defaults, the caller's --threads overrides the plan's, and the budget
of the run (the one the host also enforces) comes last and overrides a plan made for another budget.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def sparse_flags(
    *,
    policy: str | None = None,
    llmflash_window: int | None = None,
    plan: str | Path | None = None,
    threads: int | None = None,
    memory_budget: int | None = None,
    more: Iterable[str] = (),
) -> list[str]:
    """The tail of the command line: policy, plan, threads, further flags, budget."""
    args: list[str] = []
    if policy:
        args += ["--policy", policy]
    if llmflash_window is not None:
        args += ["--llmflash-window", str(int(llmflash_window))]
    if plan is not None:
        args += ["--plan", str(plan)]
    if threads:
        args += ["--threads", str(int(threads))]
    args += list(more)
    if memory_budget:
        args += ["--memory-budget", str(int(memory_budget))]
    return args


def engine_argv(
    binary: str | Path,
    command: str,
    model: str | Path,
    *,
    events: str | Path,
    seed: int = 0,
    n_ctx: int | None = None,
    prompt: str | None = None,
    n_predict: int | None = None,
    temperature: float | None = None,
    ignore_eos: bool = False,
    **sparse,
) -> list[str]:
    """`pi2-engine COMMAND` (generate or chat) for MODEL with its events file; `sparse`: the keywords
    of sparse_flags (policy, llmflash_window, plan, threads, memory_budget, more)."""
    argv = [str(binary), command, "-m", str(model)]
    if prompt is not None:
        argv += ["-p", prompt]
    if n_predict is not None:
        argv += ["-n", str(int(n_predict))]
    if temperature is not None:
        argv += ["--temperature", str(temperature)]
    argv += ["--seed", str(int(seed))]
    if ignore_eos:
        argv.append("--ignore-eos")
    if n_ctx:
        argv += ["--ctx", str(int(n_ctx))]
    return argv + ["--events", str(events)] + sparse_flags(**sparse)
