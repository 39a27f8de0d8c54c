"""`pi2 results`: list, show and re-index recorded runs."""

import json

import click

from pi2cli.errors import Pi2Error
from pi2cli.results import columns, schema, store
from pi2cli.results.options import filter_options, index_option, parse_since, results_dir_option


@click.group(name="results")
def command() -> None:
    """List and inspect recorded runs.

    Every `pi2 bench` run is one JSON file in RESULTS_DIR/runs/ plus a row in the SQLite index
    RESULTS_DIR/pi2.sqlite, which is rebuilt from the JSON files whenever it is missing or stale.
    docs/RESULTS.md describes the fields.

    \b
    Examples:
      pi2 results list --engine llama.cpp --since 7d
      pi2 results show 20261121T2318   (a unique prefix of the run id is enough)
      pi2 results list --json | jq '.[].avg_ts'
    """


def console():
    """A rich console; when stdout is not a terminal, wide enough that tables do not fold."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=240)


def _ms(ns) -> str:
    return "-" if ns is None else f"{ns / 1e6:.1f}"


def _to_ms(ns) -> float | None:
    return None if ns is None else ns / 1e6


@command.command(name="list")
@filter_options
@click.option(
    "--status", type=click.Choice(schema.RUN_STATUSES), default=None, help="Only runs with this outcome."
)
@click.option("--limit", type=click.IntRange(1), default=None, help="At most this many (newest first).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of index rows instead of a table.")
@results_dir_option
@index_option
def list_command(model, engine, workload, since, status, limit, as_json, results_dir, index_path):
    """List runs, newest first, optionally filtered."""
    rows = store.list_runs(results_dir, index=index_path, model=model, engine=engine, workload=workload,
                           since=parse_since(since), status=status, limit=limit)  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        click.echo(f"no runs match in {store.runs_dir(results_dir)}", err=True)
        return
    from rich.table import Table
    from rich.text import Text

    # index rows hold derived values (model with [synthetic], ns times): read here, written by the columns
    cols = columns.select("run_id", "created_at", "engine", "model", "workload", "budget_bytes", "status",
                          "n_turns", "avg_ts", "tbt_p50_ms", "ttft_p50_ms")  # fmt: skip
    table = Table(title=f"{len(rows)} run(s) in {store.resolve_results_dir(results_dir)}")
    for col in cols:
        table.add_column(col.header, overflow="fold")
    for row in rows:
        values = [row["run_id"], row["created_at"], row["engine_label"],
                  row["model"] + (" [synthetic]" if row["synthetic"] else ""), row["workload"], row["budget_bytes"],
                  row["status"], row["n_turns"], row["avg_ts"], _to_ms(row["tbt_p50_ns"]), _to_ms(row["ttft_p50_ns"])]  # fmt: skip
        # Text: "[synthetic]" is not rich markup
        table.add_row(*(Text(col.text(v)) for col, v in zip(cols, values, strict=True)))
    console().print(table)


@command.command(name="show")
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Print the whole run JSON (with its summary).")
@results_dir_option
@index_option
def show_command(run, as_json, results_dir, index_path):
    """Show one run: RUN is a run id, a unique prefix of one, or a path to a run JSON file."""
    data = store.load_run(run, results_dir, index=index_path)
    if as_json:
        click.echo(json.dumps(data, indent=1))
        return
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    out = console()
    s = data["summary"]
    e, m, mem = data["engine"], data["model"], data["memory"]
    facts = {
        "run": data["run_id"],
        "created": data["created_at"],
        "status": data["status"] + (f": {data['error']}" if data["error"] else ""),
        "pi2 commit": f"{data['pi2']['commit']}{' (dirty)' if data['pi2']['dirty'] else ''}",
        "engine": f"{schema.engine_label(data)} version={e['version']} commit={e['commit']} flags={e['build_flags']}",
        "model": f"{schema.model_label(data)} quant={m['quant']} sha256={m['sha256']}",
        "workload": data["workload"]["name"],
        "target": ", ".join(f"{k}={v}" for k, v in data["target"].items()),
        "memory budget": f"{schema.budget_label(mem['budget_bytes'])}, "
        + (f"enforced ({mem['how']})" if mem["enforced"] else "not enforced"),
        "plan": "none" if data["plan"] is None else json.dumps(data["plan"])[:200],
        "measured": data["measurement"] or "not stated",
    }
    for key, value in facts.items():
        out.print(f"[bold]{key:>14}[/bold]  {escape(str(value))}", highlight=False)
    out.print()
    for key, value in s.items():
        if value is not None:
            out.print(
                f"{key:>16}  {value:.4g}" if isinstance(value, float) else f"{key:>16}  {value}",
                highlight=False,
            )
    if data["turns"]:
        table = Table(title="turns")
        for header in ["#", "prompt", "rep", "status", "n_prompt", "n_gen", "TTFT ms", "prefill tok/s",
                       "decode tok/s", "TBT P50 ms"]:  # fmt: skip
            table.add_column(header)
        for t in data["turns"]:
            p50 = None
            if t["samples_ns"]:
                p50 = sorted(t["samples_ns"])[len(t["samples_ns"]) // 2]
            table.add_row(str(t["index"]), Text(t["prompt_id"] or "-"), str(t["rep"]),
                          "warm-up" if t["warmup"] else t["status"], str(t["n_prompt"]), str(t["n_gen"]),
                          _ms(t["ttft_ns"]), "-" if t["prefill_ts"] is None else f"{t['prefill_ts']:.1f}",
                          "-" if t["decode_ts"] is None else f"{t['decode_ts']:.2f}", _ms(p50))  # fmt: skip
        out.print(table)


@command.command(name="reindex")
@results_dir_option
@index_option
def reindex_command(results_dir, index_path):
    """Rebuild the SQLite index from RESULTS_DIR/runs/*.json (bad files are reported and skipped)."""
    count, warnings = store.rebuild_index(results_dir, index_path)
    for warning in warnings:
        click.echo(f"pi2: warning: skipped {warning}", err=True)
    click.echo(f"indexed {count} run(s) into {store.index_path(results_dir, index_path)}")
    if warnings:
        raise Pi2Error(f"{len(warnings)} run file(s) could not be indexed")
