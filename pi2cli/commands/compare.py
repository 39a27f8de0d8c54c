"""`pi2 compare`: engines x workloads side by side with speedups and bootstrap confidence intervals."""

import click

from pi2cli.commands.results_options import (
    filter_options,
    index_option,
    parse_since,
    results_dir_option,
    wide_option,
)
from pi2cli.errors import Pi2Error
from pi2cli.results import compare, schema, store


def select_runs(runs_args, results_dir, index_path, *, model=None, engine=None, workload=None, device=None,
                threads=None, since=None):  # fmt: skip
    """Named runs as given, else per engine and group (model, workload, budget, device, threads) the newest
    ok run and any newer run that is not ok (store.latest_per_group)."""
    if runs_args:
        return store.load_runs(runs_args, results_dir, index=index_path)
    runs = store.load_runs((), results_dir, index=index_path, model=model, engine=engine, workload=workload,
                           device=device, threads=threads, since=parse_since(since))  # fmt: skip
    if not runs:
        raise Pi2Error(f"no runs to use in {store.runs_dir(results_dir)} (record some with `pi2 bench`)")
    # Oldest first, so a group without the baseline engine is compared with its oldest run.
    return sorted(
        store.latest_per_group(runs), key=lambda r: (schema.parse_time(r["created_at"]), r["run_id"])
    )


@click.command(name="compare")
@click.argument("runs", nargs=-1)
@click.option(
    "--baseline",
    default=compare.DEFAULT_BASELINE,
    show_default=True,
    help="Engine name or label the others are compared with; a group without it uses its oldest run.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "md", "csv", "json"]),
    default="table",
    show_default=True,
    help="table: rich, for a terminal; md/csv: tabulate/CSV; json: for machines.",
)
@click.option(
    "--resamples",
    type=click.IntRange(100),
    default=compare.DEFAULT_RESAMPLES,
    show_default=True,
    help="Bootstrap resamples per confidence interval.",
)
@click.option(
    "--seed",
    type=int,
    default=compare.DEFAULT_SEED,
    show_default=True,
    help="Seed of the bootstrap (numpy default_rng): same runs + seed = same intervals.",
)
@wide_option
@filter_options
@results_dir_option
@index_option
def command(runs, baseline, fmt, resamples, seed, wide, model, engine, workload, device, threads, since, results_dir,
            index_path):  # fmt: skip
    """Compare runs: engines x workloads with speedups and 95% confidence intervals.

    RUNS are run ids (or unique prefixes, or JSON paths). With none, per engine and group the newest ok
    run is used, with any newer run that failed, was aborted, timed out or is invalid (shown with its
    reason, not compared), narrowed by the filters. Runs are grouped by model, workload, memory budget,
    device and threads: runs from two devices or thread counts are never compared. In each group every
    ok run is compared with the baseline run. Naming two runs of one engine compares them with each
    other: the first named is the baseline. The table is one per group and fits 120 columns; --wide
    shows every column (device, threads, TBT P50 speedup, TTFT speedup, quality, run id) in one table.

    \b
    Speedups (above 1: faster than the baseline), each with a 95% percentile-bootstrap interval
    over the per-token time-between-tokens samples (per-turn TTFT for TTFT):
      decode speedup   mean TBT(baseline) / mean TBT(engine), i.e. the decode tok/s ratio
      TBT P50 speedup  median TBT(baseline) / median TBT(engine)
      TTFT speedup     mean TTFT(baseline) / mean TTFT(engine)

    \b
    Examples:
      pi2 compare                                  latest run of every engine x workload
      pi2 compare --device 127.0.0.1:5555 --threads 4
      pi2 compare --baseline pi2:dense --format md
      pi2 compare RUN_A RUN_B --format json
    """
    selected = select_runs(runs, results_dir, index_path, model=model, engine=engine, workload=workload,
                           device=device, threads=threads, since=since)  # fmt: skip
    from rich.console import Console

    with Console(stderr=True).status(f"bootstrapping {len(selected)} run(s), {resamples} resamples"):
        result = compare.compare_runs(selected, baseline=baseline, resamples=resamples, seed=seed)
    if fmt == "table":
        from pi2cli.commands.results import console

        compare.render_rich(result, console(wide), wide=wide)
    else:
        click.echo(compare.render(result, fmt, wide=wide))
