"""`pi2 workloads`: what the four workload sets hold, with their token statistics."""

import json

import click
from rich.console import Console
from rich.table import Table

from pi2cli.workloads import (
    WORKLOADS,
    load_workload,
    read_stats,
    read_workload,
    source_licences,
    summarize,
)


def overview() -> list[dict]:
    """One row per set: name, description, conversations, turns and sources."""
    rows = []
    for name, description in WORKLOADS.items():
        records = read_workload(name)
        sources: dict[str, int] = {}
        for r in records:
            family = r.source.split(":")[0]
            sources[family] = sources.get(family, 0) + 1
        rows.append(
            {
                "name": name,
                "description": description,
                "conversations": len(records),
                "turns": sum(len(r.turns) for r in records),
                "sources": dict(sorted(sources.items())),
            }
        )
    return rows


def show_data(name: str, limit: int | None, seed: int | None, sample: int) -> dict:
    """Summary of a set (or of the --limit/--seed selection of it) plus `sample` records."""
    records = load_workload(name, limit=limit, seed=seed)
    stats = read_stats()
    return {
        "name": name,
        "description": WORKLOADS[name],
        "limit": limit,
        "seed": seed,
        "tokenizers": stats.get("tokenizers", {}),
        "summary": summarize(records, stats),
        "licences": source_licences(sorted({r.source.split(":")[0] for r in records})),
        "sample": [r.to_dict() for r in records[:sample]],
    }


def _console() -> Console:
    return Console(highlight=False, soft_wrap=False, width=120)


@click.group(name="workloads")
def command() -> None:
    """The dialogue, code, math and role-play workloads: list and show statistics.

    The sets are JSONL files in workloads/ (regenerate them with workloads/build_workloads.py); each
    record is one conversation: the user turns and the answer budget (max new tokens) of each turn.
    Token counts come from workloads/stats.json (SmolLM2 and Mistral-7B tokenizers).

    \b
    Examples:
      pi2 workloads list
      pi2 workloads show multi-turn
      pi2 workloads show code --limit 3 --sample 3
      pi2 workloads show role-play --limit 20 --seed 7 --json
    """


@command.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def list_command(as_json: bool) -> None:
    """List the workload sets with their sizes and sources."""
    rows = overview()
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table(title="pi2 workloads")
    for column in ("set", "conversations", "turns", "sources", "what"):
        table.add_column(column, justify="right" if column in ("conversations", "turns") else "left")
    for row in rows:
        sources = ", ".join(f"{k} {v}" for k, v in row["sources"].items())
        table.add_row(row["name"], str(row["conversations"]), str(row["turns"]), sources, row["description"])
    _console().print(table)


@command.command(name="show")
@click.argument("name", type=click.Choice(list(WORKLOADS)))
@click.option("--limit", type=click.IntRange(1), default=None, help="Only this many conversations.")
@click.option("--seed", type=int, default=None, help="Sample --limit conversations at random with this seed.")
@click.option(
    "--sample",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Also print this many of the selected conversations.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def show_command(name: str, limit: int | None, seed: int | None, sample: int, as_json: bool) -> None:
    """Counts, turns per conversation and prompt tokens per turn of one set.

    With --limit/--seed the statistics describe exactly the selection a bench run with the same
    options would use.
    """
    data = show_data(name, limit, seed, sample)
    if as_json:
        click.echo(json.dumps(data, indent=1, ensure_ascii=False))
        return
    summary = data["summary"]
    console = _console()
    picked = f" (--limit {limit}" + (f" --seed {seed}" if seed is not None else "") + ")" if limit else ""
    if seed is not None and not limit:
        picked = f" (all, shuffled with --seed {seed})"
    console.print(f"[bold]{name}[/bold]{picked}: {data['description']}")
    sources = ", ".join(f"{k} {v}" for k, v in summary["sources"].items())
    console.print(
        f"{summary['conversations']} conversations, {summary['turns']} user turns; sources: {sources}"
    )

    table = Table(title="distribution")
    table.add_column("quantity")
    for column in ("min", "mean", "p50", "p90", "p99", "max"):
        table.add_column(column, justify="right")

    def add(label: str, spread: dict) -> None:
        table.add_row(label, *(f"{spread[c]:g}" for c in ("min", "mean", "p50", "p90", "p99", "max")))

    add("turns / conversation", summary["turns_per_conversation"])
    add("max new tokens / turn", summary["max_new_tokens_per_turn"])
    for key in summary["tokens_per_turn"]:
        add(f"prompt tokens / turn ({key})", summary["tokens_per_turn"][key])
        add(f"prompt tokens / conversation ({key})", summary["tokens_per_conversation"][key])
    console.print(table)
    for key, description in data["tokenizers"].items():
        console.print(f"  {key}: {description}")
    console.print("sources and licences (workloads/README.md):")
    for row in data["licences"]:
        package = f" ({row['package']})" if row["package"] else ""
        console.print(f"  {row['source']}{package}: {row['licence'] or 'not recorded'}", markup=False)

    for record in data["sample"]:
        console.print(f"\n[bold]{record['id']}[/bold] ({record['source']})")
        if record["system"]:
            console.print(f"  system: {_clip(record['system'])}", markup=False)
        for index, (turn, budget) in enumerate(zip(record["turns"], record["max_new_tokens"], strict=True)):
            console.print(f"  user {index + 1} (max {budget} new tokens): {_clip(turn)}", markup=False)


def _clip(text: str, width: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."
