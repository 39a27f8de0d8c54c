"""pi2cli.results.columns: the four run tables (bench, report, results list, compare) write a column alike."""

from pathlib import Path

from click.testing import CliRunner
from results_fakes import fake_run

from pi2cli.bench.run import TABLE_COLUMNS, RunOutcome, table_reasons, table_rows
from pi2cli.cli import cli
from pi2cli.results import columns, compare, report, store
from pi2cli.results import schema as S


def _outcome(run: dict) -> RunOutcome:
    return RunOutcome(
        S.engine_label(run), run["workload"]["name"], run["memory"]["budget_bytes"], run, Path("x")
    )


def _steady(**kw) -> dict:
    """Every token 20 ms, every TTFT 100 ms: exact figures to read back from each table."""
    run = fake_run("llama.cpp", jitter=0, budget_bytes=300 << 20, **kw)
    if run["summary"] is None:
        run["summary"] = S.summarize(run)
    return run


def test_every_column_is_declared_once():
    assert len(columns._COLUMNS) == len(
        columns.COLUMNS
    )  # a second declaration of a name would hide the first
    assert [c.header for c in TABLE_COLUMNS][:5] == ["engine", "workload", "budget", "threads", "status"]
    assert columns.headers(compare.TABLE_COLUMNS) == compare.HEADERS
    assert columns.headers(report.RUN_COLUMNS) == report.RUN_HEADERS


def test_bench_table_cells():
    (row,) = table_rows([_outcome(_steady())])
    assert row == [
        "llama.cpp",
        "dialogue",
        "300 MiB",
        "default",
        "ok",
        "3",
        "100.0",
        "20.00",
        "20.00",
        "20.00",
        "50.00",
        "-",
    ]


def test_failed_status_is_cut_in_the_bench_table_but_whole_in_the_report():
    run = _steady()
    run["status"], run["error"] = "failed", "x" * 300
    (cells,) = table_rows([_outcome(run)])
    assert cells[4] == "failed"  # the reason follows the table, on a line of its own, cut to 200
    (why,) = table_reasons([_outcome(run)])
    assert why.startswith("llama.cpp / dialogue: failed: xxx") and why.endswith("x…") and len(why) < 240
    (rep,) = report.run_rows([run])
    assert rep[report.RUN_HEADERS.index("status")] == "failed: " + "x" * 300


def test_report_and_compare_write_decode_and_ttft_alike():
    a, b = _steady(seed=1), _steady(seed=2)
    (rep, _) = report.run_rows([a, b])
    cmp_rows = compare.table_rows(compare.compare_runs([a, b]))
    col = compare.HEADERS.index("decode tok/s")
    # no spread over 3 turns reads "±0.00" in both tables (a one-turn run has no ±)
    assert rep[report.RUN_HEADERS.index("decode tok/s")] == cmp_rows[0][col] == "50.00 ±0.00"
    assert (
        rep[report.RUN_HEADERS.index("TTFT ms")] == cmp_rows[0][compare.HEADERS.index("TTFT ms")] == "100.0"
    )
    assert rep[report.RUN_HEADERS.index("TBT P50/P90/P99 ms")] == "20.0/20.0/20.0"
    assert cmp_rows[0][compare.HEADERS.index("TBT P50 ms")] == "20.00"


def test_results_list_uses_the_shared_columns(tmp_path):
    store.save_run(_steady(), tmp_path)
    listed = CliRunner().invoke(cli, ["results", "list", "--results-dir", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    for header in ("TBT P50 ms", "TTFT P50 ms", "decode tok/s", "300 MiB"):
        assert header in listed.stdout
    assert " 20.00 " in listed.stdout and " 100.0 " in listed.stdout
