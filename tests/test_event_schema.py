"""The events' contract has one owner: native/src/engine/event_schema.c's table, printed by `pi2-engine
capabilities --json`. The real engine, run as generate and as chat on a tiny synthetic model, dense and
sparse, must write exactly the fields that table lists for that command and those conditions (none
missing, none unlisted, each of its JSON type); the host's parser and docs/ENGINE.md follow the table.
"""

import json
import re
import subprocess
from pathlib import Path

import pytest
from engine_helpers import engine_bin, needs_engine, run_engine

from pi2cli.engines.pi2.events import parse_events, parse_lines, schema_markdown, summary_counters

DOCS = Path(__file__).resolve().parents[1] / "docs" / "ENGINE.md"
TYPES = {"integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
         "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
         "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
         "array": lambda v: isinstance(v, list), "object": lambda v: isinstance(v, dict)}  # fmt: skip
# The runs: engine flags, and the `when` conditions under which the table's conditional fields appear.
SPARSE = ["--policy", "powerinfer2", "--check-predictor", "--read-cap", "4", "--pred-threshold", "0.1"]
RUNS = {
    "dense": ([], {None, "decoded", "prefilled"}),
    "sparse": (
        SPARSE,
        {None, "decoded", "prefilled", "sparse", "--check-predictor", "--read-cap", "--pred-threshold"},
    ),
}


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(run_engine("capabilities", "--json").stdout)["events"]


def _generate(model: Path, tmp: Path, flags: list[str]) -> list[dict]:
    events = tmp / "generate.jsonl"
    run_engine(
        "generate", "-m", model, "--tokens", "1,2,3,4", "-n", 4, "--threads", 2, "--events", events, *flags
    )
    return parse_lines(events.read_text().splitlines())


def _chat(model: Path, tmp: Path, flags: list[str]) -> list[dict]:
    events = tmp / "chat.jsonl"
    # two turns and, between them, a request that fails (its record carries "error")
    requests = (
        '{"prompt": "Hello there", "n_predict": 3}\nnot json\n{"prompt": " and more", "n_predict": 2}\n'
    )
    done = subprocess.run([str(engine_bin()), "chat", "-m", str(model), "--ctx", "64", "--threads", "2",
                           "--events", str(events), *flags], input=requests, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return parse_lines(events.read_text().splitlines())


@pytest.mark.parametrize("run", sorted(RUNS))
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_the_engine_writes_exactly_the_fields_its_schema_lists(tiny_model, tmp_path, schema, command, run):
    flags, conditions = RUNS[run]
    events = (_generate if command == "generate" else _chat)(tiny_model, tmp_path, flags)
    seen: dict[str, set] = {}
    for event in events:
        kind = event["event"]
        assert kind in schema, f"{command} wrote a {kind!r} event the schema does not list"
        rows = {f["name"]: f for f in schema[kind] if command in f["commands"]}
        fields = set(event) - {"event"}
        assert fields <= set(rows), f"{command} {kind}: fields the schema does not list: {fields - set(rows)}"
        for name in fields:
            assert TYPES[rows[name]["type"]](event[name]), (
                f"{kind}.{name} = {event[name]!r} is not {rows[name]['type']}"
            )
        if kind == "turn" and event.get("stop") == "error":
            want = {n for n, f in rows.items() if f.get("when") in (None, "error")}
            assert fields == want, f"{command}'s failed turn: {fields ^ want}"
            continue
        seen.setdefault(kind, set()).update(fields)
    for kind, rows in schema.items():
        want = {f["name"] for f in rows if command in f["commands"] and f.get("when") in conditions}
        got = seen.get(kind, set())
        assert got == want, (
            f"{command} ({run}) {kind}: listed, not written {want - got}; written, not listed {got - want}"
        )
    if command == "chat":
        assert any(e.get("stop") == "error" for e in events)  # the failed request was recorded


def test_summary_counters_are_the_fields_the_schema_lists(tiny_model, tmp_path, schema):
    """The host keeps the sparse engine's scalar summary fields because the table lists them (no host
    list): every one the run wrote is a counter, and one the table would not list is not."""
    summary = parse_events(map(json.dumps, _generate(tiny_model, tmp_path, SPARSE)))["summary"]
    sparse = {f["name"] for f in schema["summary"] if f["source"] == "sparse"}
    scalars = {k for k, v in summary.items() if k in sparse and not isinstance(v, list)}
    counters = summary_counters(summary)
    assert scalars and scalars <= set(counters)
    assert {"two_phase", "admit_rank", "effective_recall"} <= set(counters)
    rows = [f for f in schema["summary"] if f["name"] != "hit_rate"]
    assert "hit_rate" not in summary_counters(summary, rows)


@needs_engine
def test_events_from_before_the_table_still_parse():
    """An events file generate wrote before (turn without t0 / n_cached / stop, token without turn)."""
    old = ['{"event": "start", "t": 1.5, "engine": "pi2-engine 0.1.0", "threads": 2, "kernels": "avx2", '
           '"n_prompt": 2, "load_s": 0.1, "prompt_ids": [1, 2]}',
           '{"event": "token", "t": 1.6, "cpu_s": 0.2, "i": 0, "id": 7}', "",
           '{"event": "turn", "turn": 0, "n_prompt": 2, "n_gen": 1, "ttft_s": 0.1, "prefill_s": 0.1, '
           '"prefill_tps": 20.0, "decode_s": 0.0, "decode_tps": 0.0}',
           '{"event": "summary", "t": 1.7, "peak_rss_bytes": 100, "bytes_read": 0, "model_bytes": 5, "threads": 2}']  # fmt: skip
    ev = parse_events(old)
    assert (
        [t["id"] for t in ev["token"]] == [7]
        and ev["turn"]["n_gen"] == 1
        and ev["start"]["prompt_ids"] == [1, 2]
    )
    assert summary_counters(ev["summary"]) == {"peak_rss_bytes": 100, "bytes_read": 0}


def test_engine_md_event_table_is_the_schema(schema):
    text = DOCS.read_text()
    found = re.search(r"<!-- events: .*? -->\n(.*?)<!-- /events -->", text, re.S)
    assert found, "docs/ENGINE.md lost its generated event table markers"
    assert found.group(1) == schema_markdown(schema), (
        "docs/ENGINE.md's event table differs from `pi2-engine capabilities --json`: regenerate it with "
        "`python -m pi2cli.engines.pi2.events`"
    )


def test_every_turn_field_the_schema_lists_reaches_the_stored_turn(tiny_model, schema):
    # the host takes the turn record's fields by what the engine writes, not by a list of its own: a row
    # added to the engine's table lands in the run's turn (extra.engine_turn) with nothing edited here
    from pi2cli.engines.pi2.chat import TURN_METRICS_FIELDS, open_chat_session
    from pi2cli.targets import get_target

    session = open_chat_session(get_target("local"), str(engine_bin()), str(tiny_model), n_ctx=64, threads=2)
    try:
        turn = session.turn("Hello there", 3)
    finally:
        session.close()
    listed = {f["name"] for f in schema["turn"] if "chat" in f["commands"] and not f.get("when")}
    assert set(turn.engine_turn) == listed - TURN_METRICS_FIELDS
    assert turn.turn_fields()["extra"]["engine_turn"] == turn.engine_turn
    assert turn.engine_turn["peak_rss_bytes"] > 0 and turn.engine_turn["cpu_s"] > 0
