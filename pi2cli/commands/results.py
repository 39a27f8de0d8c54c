"""`pi2 results`: list, show and re-index recorded runs."""

import json

import click

from pi2cli.commands.results_options import (
    filter_options,
    index_option,
    parse_since,
    results_dir_option,
    wide_option,
)
from pi2cli.errors import Pi2Error
from pi2cli.results import columns, schema, store


@click.group(name="results")
def command() -> None:
    """List and inspect recorded runs.

    Every `pi2 bench` run is one JSON file in RESULTS_DIR/runs/ plus a row in the SQLite index
    RESULTS_DIR/pi2.sqlite, which is rebuilt from the JSON files whenever it is missing or stale.
    docs/RESULTS.md describes the fields.

    \b
    Examples:
      pi2 results list --engine llama.cpp --since 7d
      pi2 results list --device 127.0.0.1:5555 --threads 4 --wide
      pi2 results show 20261121T2318   (a unique prefix of the run id is enough)
      pi2 results list --json | jq '.[].decode_ts'
    """


def console(wide: bool = False):
    """A rich console. On a terminal its own width; piped, 120 columns (the default tables are drawn to
    fit them), or wide enough for --wide tables not to fold."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=320 if wide else 120)


def _ms(ns) -> str:
    return "-" if ns is None else f"{ns / 1e6:.1f}"


def _to_ms(ns) -> float | None:
    return None if ns is None else ns / 1e6


# The default list: one table per group (its title: model, workload, budget, device, threads) of the
# columns that fit 120 columns, a run named by its short id (time and random suffix, which `results show`
# takes); reasons follow each table.
LIST_COLUMNS = columns.select(
    "run_id", "engine", "status_label", "decode_ts", "tbt_p50_ms", "ttft_p50_ms", "commit"
)
WIDE_LIST_COLUMNS = columns.select("run_id", "created_at", "engine", "model", "workload", "budget_held", "target",
                                   "threads", "status", "n_turns", "decode_ts", "avg_ts", "tbt_p50_ms",
                                   "ttft_p50_ms", "commit")  # fmt: skip


def row_group(row: dict) -> schema.GroupKey:
    """schema.group_key of an index row."""
    model = row["model"] + (" [synthetic]" if row["synthetic"] else "")
    return schema.GroupKey.of(model=model, workload=row["workload"], budget_bytes=row["budget_bytes"],
                              enforced=row["budget_enforced"], target=row["device"], threads=row["threads"])  # fmt: skip


def _row_values(row: dict, run_name: str) -> dict:
    # index rows hold derived values (ns times, flags): read here, written by the columns
    group = row_group(row)
    return {"run_id": run_name, "created_at": row["created_at"], "engine": row["engine_label"],
            "model": group.model, "workload": row["workload"], "budget_held": group.budget,
            "target": row["device"], "threads": row["threads"], "status": (row["status"], row["error"]),
            "status_label": (row["status"], row["error"]), "n_turns": row["n_turns"], "decode_ts": row["decode_ts"],
            "avg_ts": row["avg_ts"], "tbt_p50_ms": _to_ms(row["tbt_p50_ns"]), "ttft_p50_ms": _to_ms(row["ttft_p50_ns"]),
            "commit": row["commit_label"]}  # fmt: skip


@command.command(name="list")
@filter_options
@click.option(
    "--status", type=click.Choice(schema.RUN_STATUSES), default=None, help="Only runs with this outcome."
)
@click.option("--limit", type=click.IntRange(1), default=None, help="At most this many (newest first).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of index rows instead of a table.")
@wide_option
@results_dir_option
@index_option
def list_command(model, engine, workload, device, threads, since, status, limit, as_json, wide, results_dir,
                 index_path):  # fmt: skip
    """List runs by group (model, workload, budget, device, threads), newest first in each, with every
    run's status: failed, aborted, timed-out and invalid runs with their reason."""
    rows = store.list_runs(results_dir, index=index_path, model=model, engine=engine, workload=workload,
                           device=device, threads=threads, since=parse_since(since), status=status, limit=limit)  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        click.echo(f"no runs match in {store.runs_dir(results_dir)}", err=True)
        return
    from rich.table import Table
    from rich.text import Text

    out = console(wide)
    groups: dict[schema.GroupKey, list[dict]] = {}
    for row in rows:  # newest first within each group, as the index gives them
        groups.setdefault(row_group(row), []).append(row)
    ordered = sorted(groups, key=schema.group_sort_key)
    out.print(f"{len(rows)} run(s) in {len(groups)} group(s) in {store.resolve_results_dir(results_dir)}",
              highlight=False)  # fmt: skip
    if wide:
        table = Table()
        for col in WIDE_LIST_COLUMNS:
            table.add_column(col.header, overflow="fold")
        for key in ordered:
            for i, row in enumerate(groups[key]):
                values = _row_values(row, row["run_id"])
                table.add_row(*(Text(col.text(values[col.name])) for col in WIDE_LIST_COLUMNS),
                              end_section=i == len(groups[key]) - 1)  # fmt: skip
        out.print(table)
        return
    names = {r["run_id"]: schema.short_run_id(r["run_id"]) for r in rows}
    for key in ordered:
        table = Table(title=Text(schema.group_label(key), style="bold"), title_justify="left")
        for col in LIST_COLUMNS:
            table.add_column(col.header, overflow="fold")
        for row in groups[key]:
            values = _row_values(row, names[row["run_id"]])
            table.add_row(
                *(Text(col.text(values[col.name])) for col in LIST_COLUMNS)
            )  # Text: not rich markup
        out.print(table)
        for row in groups[key]:
            if row["status"] != schema.STATUS_OK:
                reason = columns.status_cell(row["status"], row["error"], width=200)
                out.print(Text(f"  {names[row['run_id']]}: {reason}", style="yellow"))


@command.command(name="show")
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Print the whole run JSON (with its summary).")
@results_dir_option
@index_option
def show_command(run, as_json, results_dir, index_path):
    """Show one run: RUN is a run id, a unique prefix of one, its short id (TIME-HEX, as `results list`
    prints it), or a path to a run JSON file."""
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
        "status": schema.status_text(data),
        "device": f"{schema.target_label(data)}, {schema.threads_label(schema.run_threads(data))} threads",
        "pi2 commit": f"{data['pi2']['commit']}{' (dirty)' if data['pi2']['dirty'] else ''}",
        "engine": f"{schema.engine_label(data)} version={e['version']} commit={e['commit']} flags={e['build_flags']}",
        "model": f"{schema.model_label(data)} quant={m['quant']} sha256={m['sha256']}",
        "workload": data["workload"]["name"],
        "target": ", ".join(f"{k}={v}" for k, v in data["target"].items()),
        "memory budget": f"{schema.budget_label(mem['budget_bytes'])}, "
        + (f"enforced ({mem['how']})" if mem["enforced"] else "not enforced")
        + (f"; {data['counters']['peak_over_budget']}" if data["counters"].get("peak_over_budget") else ""),
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
    if "load" in data:  # pi2 bench --mode load: what no turn holds (rejections, throughput, both clocks)
        from pi2cli.bench.load import load_lines

        out.print()
        for line in load_lines(data):
            out.print(f"{'load':>16}  {escape(line)}", highlight=False)
    if data["turns"]:
        table = Table(title="turns")
        # a turn's own rate: another statistic than the run's decode tok/s, so named apart
        for header in ["#", "prompt", "rep", "status", "n_prompt", "n_gen", "TTFT ms", "prefill tok/s",
                       "turn tok/s", "TBT P50 ms"]:  # fmt: skip
            table.add_column(header)
        for t in data["turns"]:
            p50 = None
            if t["samples_ns"]:
                p50 = sorted(t["samples_ns"])[len(t["samples_ns"]) // 2]
            table.add_row(str(t["index"]), Text(t["prompt_id"] or "-"), str(t["rep"]),
                          "warm-up" if t["warmup"] else schema.status_label(t["status"]), str(t["n_prompt"]), str(t["n_gen"]),
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
