"""pi2-engine's events (--events FILE, JSONL), read the one way for `generate` and `chat`.

The engine owns the contract: every event kind's fields (name, JSON type, the commands that write it,
when, what it means) are one table in native/src/engine/event_schema.c, which `pi2-engine capabilities --json`
prints under "events". The host reads that list (`event_fields`) instead of keeping its own, and
docs/ENGINE.md's event section is `schema_markdown` of it (tests/test_event_schema.py checks both).
"""

from __future__ import annotations

import json
from pathlib import Path

from pi2cli.errors import Pi2Error


# ------------------------------------------------------------------------------------------- parsing
def parse_line(line: str | bytes) -> dict | None:
    """One line of the events file: its object, None for a blank line, Pi2Error when it is not JSON."""
    if not line.strip():
        return None
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        raise Pi2Error(f"pi2-engine wrote a malformed event line: {line[:120]!r}") from None
    if not isinstance(event, dict):
        raise Pi2Error(f"pi2-engine wrote an event that is not an object: {line[:120]!r}")
    return event


def parse_lines(lines) -> list[dict]:
    """Every event of these lines, in order."""
    return [e for e in map(parse_line, lines) if e is not None]


def group(events: list[dict]) -> dict:
    """Events by kind: {"token": [every token event], KIND: the last event of every other kind}."""
    out: dict = {"token": []}
    for event in events:
        kind = event.get("event")
        if kind == "token":
            out["token"].append(event)
        elif kind:
            out[kind] = event
    return out


def parse_events(lines) -> dict:
    """A finished run's events file (its lines) grouped: start, token (list), turn, named, summary."""
    return group(parse_lines(lines))


# -------------------------------------------------------------------------------------------- schema
def event_schema(binary: Path | None = None) -> dict[str, list[dict]]:
    """{kind: [{"name", "type", "commands", "when"?, "source", "help"}, ...]} from `capabilities --json`
    of `binary` (the host build by default: host and engine ship at one commit)."""
    from pi2cli.builds.capabilities import capabilities
    from pi2cli.paths import host_build_dir

    binary = Path(binary) if binary else host_build_dir() / "pi2-engine"
    if not binary.is_file():
        raise Pi2Error(f"{binary} is not built (run `make engine`): pi2 asks it which event fields it writes",
                       exit_code=2)  # fmt: skip
    events = capabilities(binary).get("events")
    if not isinstance(events, dict) or not events:
        raise Pi2Error(f"{binary} does not list its events (`capabilities --json`): rebuild it (make engine)")
    return events


def event_fields(kind: str, command: str | None = None, binary: Path | None = None) -> list[dict]:
    """The fields of one event kind (those `command` writes, when given)."""
    return [f for f in event_schema(binary).get(kind, []) if command is None or command in f["commands"]]


# ------------------------------------------------------------------------------------------ counters
def summary_counters(event: dict, fields: list[dict] | None = None) -> dict:
    """The run-level counters of a `summary` event: peak RSS, bytes read, and the sparse engine's scalar
    figures (the summary fields the schema says it writes), plus the schema's own cache_hits /
    cache_misses / io_ns / compute_ns so summaries compute the hit rate and I/O share the same way for
    every engine. `fields`: the summary's schema rows (event_fields("summary") by default)."""
    fields = event_fields("summary") if fields is None else fields
    keep = {"peak_rss_bytes", "bytes_read"} | {f["name"] for f in fields if f.get("source") == "sparse"}
    out = {k: v for k, v in event.items() if k in keep and isinstance(v, int | float | str)}
    hits = [event.get("hits_hot"), event.get("hits_cold")]
    misses = [event.get("misses_hot"), event.get("misses_cold")]
    if all(isinstance(v, int) for v in hits + misses):
        out["cache_hits"], out["cache_misses"] = sum(hits), sum(misses)
    for src, dst in (("io_wait_s", "io_ns"), ("compute_s", "compute_ns")):
        if isinstance(event.get(src), int | float):
            out[dst] = round(event[src] * 1e9)
    return out


def turn_io_sums(tokens: list[dict]) -> dict:
    """Storage and cache figures of one turn, summed over its token events (sparse policies only):
    {"bytes_read", "reads", "hits", "misses", "io_ns", "compute_ns"}; {} when the events carry none."""
    if not tokens or not any("bytes_read" in e for e in tokens):
        return {}
    out = {
        key: sum(int(e.get(key) or 0) for e in tokens) for key in ("bytes_read", "reads", "hits", "misses")
    }
    out["io_ns"] = round(sum(float(e.get("io_wait_s") or 0) for e in tokens) * 1e9)
    out["compute_ns"] = round(sum(float(e.get("compute_s") or 0) for e in tokens) * 1e9)
    return out


# ---------------------------------------------------------------------------------------------- docs
def schema_markdown(events: dict[str, list[dict]]) -> str:
    """docs/ENGINE.md's table of the events, from the schema (`python -m pi2cli.engines.pi2.events`)."""
    lines = ["| event | field | type | written by | when | meaning |", "|---|---|---|---|---|---|"]
    for kind, fields in events.items():
        for f in fields:
            when = f.get("when") or ""
            if f.get("source") == "sparse":
                when = f"sparse engine{': ' + when if when else ''}"
            lines.append(f"| {kind} | `{f['name']}` | {f['type']} | {', '.join(f['commands'])} | {when} | "
                         f"{f['help'].replace('|', '/')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(schema_markdown(event_schema()), end="")
