"""`pi2 report`: a markdown report and one self-contained HTML page with plots."""

from pathlib import Path

import click

from pi2cli.commands.compare import select_runs
from pi2cli.commands.results_options import filter_options, index_option, results_dir_option
from pi2cli.errors import Pi2Error
from pi2cli.results import compare


@click.command(name="report")
@click.argument("runs", nargs=-1)
@click.option(
    "--out",
    "-o",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write report.md, plots/*.png and index.html into (created if missing).",
)
@click.option("--title", default="pi2 benchmark report", show_default=True, help="Report title.")
@click.option(
    "--baseline",
    default=compare.DEFAULT_BASELINE,
    show_default=True,
    help="Engine the comparison table is relative to (see `pi2 compare --help`).",
)
@click.option("--seed", type=int, default=compare.DEFAULT_SEED, show_default=True, help="Bootstrap seed.")
@filter_options
@results_dir_option
@index_option
def command(runs, out_dir, title, baseline, seed, model, engine, workload, device, threads, since, results_dir,
            index_path):  # fmt: skip
    """Write DIR/report.md and a self-contained DIR/index.html with plots.

    RUNS are run ids (or unique prefixes, or JSON paths); with none, as `pi2 compare` picks them: per
    engine and group (model, workload, memory budget, device, threads) the newest ok run and any newer
    run that is not ok, narrowed by the filters. Every run is shown in its group with its status.

    \b
    Plots: decode tok/s per engine and workload, TBT distribution (CDF with P50/P90/P99), TTFT,
    memory over time (runs with memory samples), tok/s against memory budget (several budgets) and
    the pi2 ablation ladder (policies dense, bundle, cache, powerinfer2). Synthetic models are
    labelled [synthetic] wherever they appear. index.html embeds its plots, so it can be mailed.

    \b
    Example:
      pi2 report --out results/reports/latest && xdg-open results/reports/latest/index.html
    """
    from rich.console import Console

    from pi2cli.outputs import check_dir_writable
    from pi2cli.results.report import write_report

    check_dir_writable(out_dir, "--out", create=False)  # before reading and bootstrapping any run
    selected = select_runs(runs, results_dir, index_path, model=model, engine=engine, workload=workload,
                           device=device, threads=threads, since=since)  # fmt: skip
    try:
        with Console(stderr=True).status(f"plotting {len(selected)} run(s)"):
            paths = write_report(selected, out_dir, title=title, baseline=baseline, seed=seed)
    except OSError as err:
        raise Pi2Error(f"cannot write the report to {out_dir}: {err.strerror or err}") from None
    click.echo(f"wrote {paths.html} and {paths.markdown} ({len(selected)} runs, {len(paths.figures)} plots)")
