"""`pi2 repro`: one subcommand per experiment of the paper (benchmarks/paper/, one file each)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

from pi2cli import safe_write
from pi2cli.errors import Pi2Error
from pi2cli.paths import REPO_ROOT

# subcommand -> (module under benchmarks/paper, one-line help)
EXPERIMENTS = {
    "memory-sweep": ("memory_sweep", "Fig. 10: 47B shape at four budgets, pi2 vs llmflash vs llama.cpp."),
    "offload-sweep": ("offload_sweep", "7B shape with 0/25/50/75% of the FFN off memory, pi2 vs llama.cpp."),
    "ablation": ("ablation", "Fig. 14: dense -> bundle -> cache -> +pipeline -> +plan at 50% offload."),
    "tbt": ("tbt", "Table 5 (TBT percentiles) and Table 4 (compute / I-O share), 47B shape."),
    "io-share": ("tbt", "Table 4 (compute / I-O share): the same runs as tbt."),
    "in-memory": ("in_memory", "Decode and prefill with the whole model resident, pi2 vs llama.cpp."),
    "planner": ("planner", "Predicted vs measured here, predicted vs the paper's OnePlus 12."),
}
ALL_ORDER = ("memory-sweep", "offload-sweep", "ablation", "tbt", "in-memory", "planner")


def load(name: str):
    paper = REPO_ROOT / "benchmarks" / "paper"
    if not paper.is_dir():
        raise Pi2Error(f"{paper} is missing: pi2 repro runs from a checkout of the repository")
    if str(paper) not in sys.path:
        sys.path.insert(0, str(paper))
    return importlib.import_module(EXPERIMENTS[name][0])


def options(f):
    f = click.option(
        "--small", is_flag=True, help="Scaled-down synthetic models: every experiment in seconds (CI)."
    )(f)
    f = click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="Report directory: NAME.json and NAME.png per experiment [default: build/repro].")(f)  # fmt: skip
    f = click.option("-n", "n_tokens", type=click.IntRange(2), default=None,
                     help="pi2 tokens per run [default: 16, --small 8].")(f)  # fmt: skip
    f = click.option("--seeds", "n_seeds", type=click.IntRange(1), default=None,
                     help="pi2 runs per point of the sweeps, the ablation and in-memory, each sampling with its own seed; "
                          "the run with the median decode rate is reported (the TBT table and the planner's "
                          "validation time one seed's steady state). On a synthetic model a token's reads follow the text, and the text "
                          "follows the seed (and the policy: powerinfer2's prefill is dense), so one seed's reads "
                          "a token can differ by half [default: 3, --small 1].")(f)  # fmt: skip
    f = click.option("--llama-tokens", type=click.IntRange(1), default=None,
                     help="llama.cpp tokens per run [default: 8, --small 4].")(f)  # fmt: skip
    f = click.option("--llama-timeout", type=click.FloatRange(1), default=600.0, show_default=True,
                     help="Seconds a llama.cpp run may take; past it the run reports '< N/T tok/s'.")(f)  # fmt: skip
    return f


def make_ctx(small, out, n_tokens, llama_tokens, llama_timeout, n_seeds=None):
    from common import Ctx  # benchmarks/paper/common.py, on the path after load()

    out = out or REPO_ROOT / "build" / "repro" / ("small" if small else "full")
    from pi2cli.outputs import check_dir_writable

    check_dir_writable(out, "--out")
    seeds = tuple(range(1, 1 + (n_seeds or (1 if small else 3))))
    return Ctx(out=out, small=small, n_tokens=n_tokens or (8 if small else 16), seeds=seeds,
               llama_tokens=llama_tokens or (4 if small else 8), llama_timeout_s=llama_timeout,
               profile_seconds=0.2 if small else 1.0, log=lambda m: click.echo(m, err=False))  # fmt: skip


@click.group(name="repro")
def command() -> None:
    """Reproduce the paper's experiments on this machine.

    Each subcommand prints this machine's table beside the paper's, states the shape to look for and
    whether it holds here, and writes NAME.json (+ NAME.png) into the report directory, with the
    memory bandwidth and storage curve measured in the same run. Models come from the local store
    (`pi2 models synth --like NAME`; synthetic, labelled so); --small makes scaled-down ones.

    \b
    Examples:
      pi2 repro memory-sweep
      pi2 repro all --small --out build/repro-ci
    """


def _sub(name: str):
    @options
    def run(small, out, n_tokens, n_seeds, llama_tokens, llama_timeout):
        mod = load(name)
        ctx = make_ctx(small, out, n_tokens, llama_tokens, llama_timeout, n_seeds)
        mod.run(ctx)
        click.echo(f"wrote {ctx.out}")

    run.__doc__ = EXPERIMENTS[name][1]
    return click.command(name=name, help=EXPERIMENTS[name][1])(run)


for _name in EXPERIMENTS:
    command.add_command(_sub(_name))


@command.command(name="all")
@options
def all_cmd(small, out, n_tokens, n_seeds, llama_tokens, llama_timeout) -> None:
    """Every experiment in turn (the planner last: its own run at every sweep point, and the sweeps'
    results), then a summary."""
    mods = {name: load(name) for name in ALL_ORDER}
    ctx = make_ctx(small, out, n_tokens, llama_tokens, llama_timeout, n_seeds)
    verdicts = []
    for name in ALL_ORDER:
        result = mods[name].run(ctx)
        verdicts.append(
            f"{name}: {'holds' if result.get('holds') else 'does NOT hold'} ({result.get('verdict')})"
        )
        click.echo("")
    summary = "\n".join(verdicts)
    safe_write.write_text(ctx.out / "summary.txt", summary + "\n")
    click.echo(summary + f"\nwrote {ctx.out}")
