"""`pi2 compare`: engines x workloads side by side with speedups and bootstrap confidence intervals."""

import click

from pi2cli.errors import Pi2Error
from pi2cli.results import compare, schema, store
from pi2cli.results.options import filter_options, index_option, parse_since, results_dir_option


def select_runs(runs_args, results_dir, index_path, *, model=None, engine=None, workload=None, since=None):
    """Named runs as given, else the newest finished run of each (engine, model, workload, budget)."""
    if runs_args:
        return store.load_runs(runs_args, results_dir, index=index_path)
    runs = store.load_runs((), results_dir, index=index_path, model=model, engine=engine, workload=workload,
                           since=parse_since(since), status="ok")  # fmt: skip
    if not runs:
        raise Pi2Error(
            f"no finished runs to use in {store.runs_dir(results_dir)} (record some with `pi2 bench`)"
        )
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
@filter_options
@results_dir_option
@index_option
def command(runs, baseline, fmt, resamples, seed, model, engine, workload, since, results_dir, index_path):  # fmt: skip
    """Compare runs: engines x workloads with speedups and 95% confidence intervals.

    RUNS are run ids (or unique prefixes, or JSON paths). With none, the newest finished run of each
    (engine, model, workload, memory budget) is used, narrowed by the filters. Runs are grouped by
    model, workload and budget; in each group every run is compared with the baseline run. Naming two
    runs of one engine compares them with each other: the first named is the baseline.

    \b
    Speedups (above 1: faster than the baseline), each with a 95% percentile-bootstrap interval
    over the per-token time-between-tokens samples (per-turn TTFT for TTFT):
      decode speedup   mean TBT(baseline) / mean TBT(engine), i.e. the decode tok/s ratio
      TBT P50 speedup  median TBT(baseline) / median TBT(engine)
      TTFT speedup     mean TTFT(baseline) / mean TTFT(engine)

    \b
    Examples:
      pi2 compare                                  latest run of every engine x workload
      pi2 compare --baseline pi2:dense --format md
      pi2 compare RUN_A RUN_B --format json
    """
    selected = select_runs(runs, results_dir, index_path, model=model, engine=engine, workload=workload,
                           since=since)  # fmt: skip
    from rich.console import Console

    with Console(stderr=True).status(f"bootstrapping {len(selected)} run(s), {resamples} resamples"):
        result = compare.compare_runs(selected, baseline=baseline, resamples=resamples, seed=seed)
    if fmt == "table":
        from pi2cli.commands.results import console

        compare.render_rich(result, console())
    else:
        click.echo(compare.render(result, fmt))
