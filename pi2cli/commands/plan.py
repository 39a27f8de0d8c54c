"""`pi2 plan`: the click front of pi2cli.plan.plan."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pi2cli.outputs import check_file_writable
from pi2cli.units import format_size, parse_size


def print_plan(console, plan, out: Path | None) -> None:
    from rich.table import Table

    table = Table(title=f"plan for {plan.model} on {plan.device}", header_style="bold")
    table.add_column("setting")
    table.add_column("value", justify="right")
    table.add_column("engine flag")
    for key, value in plan.to_json().items():
        if key in ("format", "version", "created_by", "model", "device", "why"):
            continue
        shown = str(value).lower() if isinstance(value, bool) else str(value)
        if key == "memory_budget":
            shown = format_size(parse_size(value, what="memory_budget"))
        flag = "" if key.startswith(("predicted_", "measured_")) else f"--{key.replace('_', '-')}"
        if key == "two_phase":
            flag = "--two-phase" if value else "--no-two-phase"
        table.add_row(key, shown, flag, style="dim" if not flag else None)
    console.print(table)
    console.print("[bold]why[/bold]")
    for line in plan.why:
        console.print(f"  - {line}", highlight=False)
    if out:
        console.print(
            f"wrote {out} (pi2-engine generate --plan {out} ...; pi2 bench --plan {out})", highlight=False
        )


def format_prediction(d: dict) -> str:
    mem = ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in d["memory_bytes_per_token"].items())
    return (f"{d['model']}{' (synthetic shape)' if d['synthetic'] else ''} on {d['device']} at "
            f"{d['memory_budget_bytes'] / 2**30:.1f} GiB: predicted {d['tok_s']} tok/s "
            f"(TBT {d['tbt_ms']:.0f} ms from {d['tbt_source']}; the device model: memory {d['memory_ms']:.0f} ms + "
            f"storage {d['storage_ms']:.0f} ms, {d['overlap_ms']:.0f} ms of them overlapped = {d['model_tbt_ms']:.0f} ms)\n"
            f"  cache {d['cache_bytes'] / 2**30:.2f} GiB after a fixed region of {d['fixed_bytes'] / 2**30:.2f} GiB, "
            f"{100 * d['cached_fraction']:.0f}% of the FFN cached, hit rate {100 * d['hit_rate']:.1f}% ({d['named_source']})\n"
            f"  compute from {d['compute_source']}: {d['compute_bytes_per_s'] / 1e9:.1f} GB a second\n"
            f"  per token: {mem}; {d['misses_per_token']} cache misses, {d['storage_reads_per_token']} storage reads "
            f"({'two-phase' if d['two_phase'] else 'whole bundles'}, {d['storage_bytes_per_token'] / 2**20:.0f} MiB)\n"
            f"  {d['assumptions']}")  # fmt: skip


@click.command(name="plan")
@click.option("--model", "-m", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The .pi2 model (its header and the activation statistics in its metadata are read), or a "
                   "registry name (with a shipped --profile: a prediction, no file needed).")  # fmt: skip
@click.option("--memory-budget", "-b", "budget", required=True,
              help="The whole process's memory budget, e.g. 2651M or 8G (what pi2-engine --memory-budget takes).")  # fmt: skip
@click.option("--profile", "-P", "profile_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Hardware profile from `pi2 profile` [default: probe this machine now, reading the model "
                   "file for the storage curve and decoding 40 tokens of it for the compute side].")  # fmt: skip
@click.option("--threads", "-t", type=click.IntRange(1), default=None,
              help="Compute threads [default: every core when the cores are alike, else all but the slowest "
                   "cluster].")  # fmt: skip
@click.option("--ctx", type=click.IntRange(1), default=None,
              help="Context the engine will run with (its KV cache comes out of the budget) [default: the "
                   "engine's, `pi2-engine capabilities --json`].")  # fmt: skip
@click.option("--pred-threshold", type=float, default=None,
              help="Predictor probability threshold in (0, 1) overriding the model's per-layer ones "
                   "[default: leave the model's].")  # fmt: skip
@click.option("--seconds", type=click.FloatRange(0.05, 60), default=1.0, show_default=True,
              help="Without --profile: length of each storage probe.")  # fmt: skip
@click.option("--out", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the plan file here (written whole or not at all).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the plan object (the file's content) on stdout.")
def command(model, budget, profile_path, threads, ctx, pred_threshold, seconds, out, as_json):
    """Choose the sparse engine's settings for a model, a device and a memory budget.

    From the model (predictors, dimensions, measured predictor precision and hot-set coverage) and the
    device's profile (memory bandwidth, the storage curve, big and little cores) it decides, and says why:
    the policy (powerinfer2 with predictors, else dense); whole-bundle or two-phase cold reads (whichever
    the storage curve makes cheaper per miss); the neuron cache left after the fixed region and its
    hot/cold split; compute threads on the fastest cores and I/O threads on the others. It also predicts
    the time per token (pi2cli/plan/predict.py: memory traffic + cold reads - their overlap, the same
    prediction a shipped --profile gets; predicted_tok_s in the text and in --json).

    The plan file is one flat JSON object whose settings are pi2-engine flags (docs/PLAN.md); flags given
    after `--plan FILE` on the engine's command line override it.

    \b
    Examples:
      pi2 plan --model models/tsm7b/model.pi2 --memory-budget 2651M
      pi2 profile --file models/tsm7b/model.pi2 && pi2 plan -m models/tsm7b/model.pi2 -b 4G -P profile.json -o plan.json
      pi2-engine generate -m models/tsm7b/model.pi2 --plan plan.json -p "Hello" -n 32
    """
    from rich.console import Console

    from pi2cli.plan.facts import model_facts
    from pi2cli.plan.plan import make_plan
    from pi2cli.plan.profile import load_profile, profile_target, write_json_atomic

    budget_bytes = parse_size(budget)
    if out is not None:
        check_file_writable(out, "--out")  # before the probe and the planning, not after
    from pi2cli.plan.predict import prediction_wanted, run_prediction

    if prediction_wanted(str(model), profile_path):
        # a device profile shipped as data (or a model known only by name): predict tok/s, no file needed
        data = run_prediction(str(model), str(profile_path or ""), budget_bytes, ctx=ctx)
        if out is not None:
            write_json_atomic(out, data)
        click.echo(json.dumps(data, indent=1) if as_json else format_prediction(data))
        return
    from pi2cli.models.store import model_arg

    model = Path(model_arg(str(model)))  # a registry name: its stored file (or the how-to-get-it line)
    facts = model_facts(model)
    if profile_path is not None:
        profile = load_profile(profile_path)
    else:
        console = Console(stderr=True)
        with console.status("probing this machine (memory bandwidth, storage over the model file, a 40-token "
                            "decode of it)..."):  # fmt: skip
            profile = profile_target("local", str(model), seconds=seconds)
        failed = profile.pop("decode_error", None)
        if failed:
            console.print(f"pi2: warning: {failed}: predicting from the bandwidth probe", highlight=False)
    plan = make_plan(facts, profile, budget_bytes, threads=threads, ctx=ctx, pred_threshold=pred_threshold,
                     model_path=str(model))  # fmt: skip
    data = plan.to_json()
    if out is not None:
        write_json_atomic(out, data)
    if as_json:
        click.echo(json.dumps(data, indent=1))
    else:
        print_plan(Console(), plan, out)
