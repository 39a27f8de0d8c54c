"""Nothing hidden, nothing mixed: every run of every status in its own group (model, workload, budget,
device, threads) in `results list`, `compare` and `report`; filters by device and threads; one decode
statistic; tables that fit 120 columns."""

import json
import re

import pytest
from click.testing import CliRunner
from results_fakes import fake_run

from pi2cli.cli import cli
from pi2cli.results import compare as C
from pi2cli.results import report as R
from pi2cli.results import schema as S
from pi2cli.results import store

DEVICES = (("test-host", "local"), ("127.0.0.1:5555", "adb"))
THREADS = (2, 4)
# (engine, policy, status, tbt_ms) in the order they ran: each failure after the group's last good run
CELLS = (("llama.cpp", None, "ok", 40), ("pi2", "powerinfer2", "ok", 20), ("pi2", "llmflash", "failed", 30),
         ("llama.cpp", None, "invalid", 0.01), ("pi2", "powerinfer2", "aborted", 20), ("mlc-llm", None, "timeout", 50))  # fmt: skip


def _matrix(results_dir) -> list[dict]:
    """ok, failed, aborted, timeout and invalid runs from two devices and two thread counts, saved."""
    runs, minute = [], 0
    for device in DEVICES:
        for threads in THREADS:
            for engine, policy, status, tbt in CELLS:
                minute += 1
                run = fake_run(engine, policy=policy, target=device, threads=threads, tbt_ms=tbt, seed=minute,
                               created_at=f"2026-11-20T10:{minute:02d}:00Z", status=status,
                               error=f"FAKE {status} of {engine} on {device[0]} x{threads}")  # fmt: skip
                store.save_run(run, results_dir)
                runs.append(run)
    return runs


def _title_of(run: dict) -> str:
    return _group_title(
        DEVICES[[d[0] for d in DEVICES].index(run["target"]["name"])], run["settings"]["threads"]
    )


def _group_title(device, threads) -> str:
    name, kind = device
    where = name if name == kind else f"{name} ({kind})"
    return f"fake-model · dialogue · none (in memory) · {where} · {threads} threads"


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    results_dir = tmp_path_factory.mktemp("matrix")
    return results_dir, _matrix(results_dir)


@pytest.mark.parametrize("status", S.RUN_STATUSES)
def test_results_list_shows_a_run_of_every_status(tmp_path, status):
    store.save_run(fake_run(status=status, error=f"FAKE reason {status}"), tmp_path)
    runner = CliRunner()
    for extra in ([], ["--wide"]):
        listed = runner.invoke(cli, ["results", "list", "--results-dir", str(tmp_path), *extra])
        assert listed.exit_code == 0, listed.output
        assert S.status_label(status) in listed.stdout and "o: k" not in listed.stdout
        assert (f"FAKE reason {status}" in listed.stdout) == (status != "ok")
    rows = json.loads(
        runner.invoke(cli, ["results", "list", "--json", "--results-dir", str(tmp_path)]).stdout
    )
    assert [r["status"] for r in rows] == [status]


def test_invalid_is_a_failure_status_with_a_label():
    run = fake_run()
    S.mark_failed(run, "invalid", "TBT 0.01 ms is below the bandwidth floor of 1.9 ms")
    S.validate(run)
    assert S.status_text(run) == "invalid: TBT 0.01 ms is below the bandwidth floor of 1.9 ms"
    assert set(S.STATUS_LABELS) == set(S.RUN_STATUSES)
    with pytest.raises(ValueError):
        S.mark_failed(run, "ok", "x")


@pytest.mark.slow
def test_results_list_groups_every_run_with_its_status(matrix):
    results_dir, runs = matrix
    listed = CliRunner().invoke(cli, ["results", "list", "--results-dir", str(results_dir)])
    assert listed.exit_code == 0, listed.output
    text = listed.stdout
    titles = [_group_title(d, t) for d in sorted(DEVICES) for t in THREADS]
    starts = [text.index(title) for title in titles]  # each group once, in order: device, then threads
    assert starts == sorted(starts) and all(text.count(t) == 1 for t in titles)
    for run in runs:  # every run inside its own group's block, with its status
        title = _title_of(run)
        begin = text.index(title)
        later = [s for s in starts if s > begin]
        block = text[begin : later[0] if later else len(text)]
        line = next(ln for ln in block.splitlines() if S.short_run_id(run["run_id"]) in ln and "│" in ln)
        assert S.status_label(run["status"]) in line
        if run["status"] != "ok":
            assert run["error"] in block
    assert max(len(line) for line in text.splitlines()) <= 120


def test_filters_by_device_and_threads(matrix):
    results_dir, runs = matrix
    runner = CliRunner()
    rows = json.loads(runner.invoke(cli, ["results", "list", "--json", "--device", "adb", "--threads", "4",
                                          "--results-dir", str(results_dir)]).stdout)  # fmt: skip
    assert len(rows) == len(CELLS) and {(r["target"], r["threads"]) for r in rows} == {("127.0.0.1:5555", 4)}
    out = runner.invoke(cli, ["compare", "--format", "json", "--device", "test-host", "--threads", "2",
                              "--resamples", "100", "--results-dir", str(results_dir)])  # fmt: skip
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert {(r["target"], r["threads"]) for r in data["rows"]} == {("test-host (local)", 2)}
    bad = runner.invoke(cli, ["results", "list", "--threads", "many", "--results-dir", str(results_dir)])
    assert bad.exit_code == 2 and "thread count" in bad.output


def test_compare_shows_every_run_in_its_own_group(matrix):
    results_dir, runs = matrix
    out = CliRunner().invoke(
        cli, ["compare", "--format", "json", "--resamples", "100", "--results-dir", str(results_dir)]
    )
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)["rows"]
    assert sorted(r["run_id"] for r in rows) == sorted(r["run_id"] for r in runs)  # nothing hidden
    by_id = {r["run_id"]: r for r in rows}
    for run in runs:
        row = by_id[run["run_id"]]
        assert (row["status"], row["target"], row["threads"]) == (
            run["status"], S.target_label(run), run["settings"]["threads"])  # fmt: skip
        if run["status"] == "ok":
            assert row["decode_ts"] == pytest.approx(S.decode_rate(run))
            assert row["baseline_run_id"] in by_id
            base = by_id[row["baseline_run_id"]]  # compared only within its own group
            assert (base["target"], base["threads"], base["status"]) == (row["target"], row["threads"], "ok")
        else:
            assert row["error"] == run["error"] and row["decode_ts"] is None and row["decode_speedup"] is None
    table = CliRunner().invoke(cli, ["compare", "--resamples", "100", "--results-dir", str(results_dir)])
    assert table.exit_code == 0, table.output
    for run in runs:
        if run["status"] != "ok":
            assert f"{S.status_label(run['status'])}: {run['error']}" in table.stdout


def test_a_local_and_a_device_run_of_one_engine_never_mix(tmp_path):
    """The newest run used to win silently: (model, workload, budget) was the whole group."""
    local = fake_run("llama.cpp", tbt_ms=40, created_at="2026-11-20T10:00:00Z")
    phone = fake_run("llama.cpp", tbt_ms=80, created_at="2026-11-20T11:00:00Z", target=DEVICES[1])
    for run in (local, phone):
        store.save_run(run, tmp_path)
    rows = json.loads(
        CliRunner().invoke(cli, ["compare", "--format", "json", "--results-dir", str(tmp_path)]).stdout
    )["rows"]
    assert {r["run_id"] for r in rows} == {local["run_id"], phone["run_id"]}
    assert all(r["is_baseline"] for r in rows)  # each alone in its group: nothing to compare it with


def test_tables_fit_120_columns_and_wide_shows_all(matrix):
    results_dir, _ = matrix
    runner = CliRunner()
    base = ["--resamples", "100", "--results-dir", str(results_dir)]
    narrow = runner.invoke(cli, ["compare", *base])
    assert narrow.exit_code == 0
    lines = narrow.stdout.splitlines()
    assert max(len(line) for line in lines) <= 120
    # no cell folded: the header and a whole speedup with its interval stand on one line each
    assert any("decode speedup" in line and "decode tok/s" in line for line in lines)
    assert any(re.search(r"\d\.\d\dx \[\d\.\d\d, \d\.\d\d\]", line) for line in lines)
    wide = runner.invoke(cli, ["compare", "--wide", *base])
    assert wide.exit_code == 0 and max(len(line) for line in wide.stdout.splitlines()) > 120
    header = next(line for line in wide.stdout.splitlines() if "TTFT speedup" in line)
    for name in ("device", "threads", "commit", "TBT P50 speedup", "quality vs dense", "run"):
        assert name in header
    listed = runner.invoke(cli, ["results", "list", "--wide", "--results-dir", str(results_dir)])
    header = next(line for line in listed.stdout.splitlines() if "created (UTC)" in line)
    for name in ("device", "threads", "commit", "mean turn tok/s", "decode tok/s"):
        assert name in header


def _uneven_run() -> dict:
    """Two turns whose pooled rate and mean of rates differ: 30 tokens at 10 ms, 3 at 50 ms."""
    run = fake_run("llama.cpp", turns=0)
    S.add_turn(run, n_prompt=5, n_gen=31, ttft_ns=50_000_000, samples_ns=[10_000_000] * 30)
    S.add_turn(run, n_prompt=5, n_gen=4, ttft_ns=50_000_000, samples_ns=[50_000_000] * 3)
    S.summarize(run)
    return run


def test_one_decode_statistic_everywhere(tmp_path):
    run = _uneven_run()
    pooled = 33 / 0.45  # 33 token times, 0.45 s of decoding
    mean = (100 + 20) / 2
    assert S.decode_rate(run) == pytest.approx(pooled) and run["summary"]["avg_ts"] == pytest.approx(mean)
    store.save_run(run, tmp_path)
    text = f"{pooled:.2f}"
    from pi2cli.bench.run import TABLE_COLUMNS, RunOutcome, table_rows

    (bench,) = table_rows([RunOutcome("llama.cpp", "dialogue", None, run, tmp_path)])
    assert bench[[c.header for c in TABLE_COLUMNS].index(S.DECODE_LABEL)] == text
    listed = CliRunner().invoke(cli, ["results", "list", "--results-dir", str(tmp_path)])
    assert f" {text} " in listed.stdout and f"{mean:.2f}" not in listed.stdout
    wide = CliRunner().invoke(cli, ["results", "list", "--wide", "--results-dir", str(tmp_path)])
    assert f" {text} " in wide.stdout and f" {mean:.2f} " in wide.stdout  # the mean, under its own name
    (cmp_row,) = C.table_rows(C.compare_runs([run]))
    assert cmp_row[C.HEADERS.index(S.DECODE_LABEL)].startswith(text)
    (rep_row,) = R.run_rows([run])
    assert rep_row[R.RUN_HEADERS.index(S.DECODE_LABEL)].startswith(text)
    assert f"{pooled:.3g}" in R.plot_decode([run]).text  # the bar's label: the same figure


def test_a_rate_only_run_pools_its_rates_by_tokens():
    run = fake_run("mlc-llm", turns=0)
    for n_gen, rate in ((100, 50.0), (10, 5.0)):  # 2 s and 2 s: 110 tokens in 4 s
        S.add_turn(run, n_prompt=5, n_gen=n_gen, ttft_ns=None, decode_ts=rate, extra={"rates_from": "engine"})
    S.summarize(run)
    assert run["summary"]["pooled_ts"] is None and run["summary"]["avg_ts"] == pytest.approx(27.5)
    assert S.decode_rate(run) == pytest.approx(110 / 4)


def test_the_progress_bar_names_its_figure_apart():
    from rich.console import Console

    from pi2cli.commands.bench import RichReporter

    reporter = RichReporter(Console(file=open("/dev/null", "w")))  # noqa: SIM115
    reporter.run_started("pi2", 2)
    reporter.turn_done("pi2", 41.0, 12.0)
    speed = reporter.progress.tasks[0].fields["speed"]
    assert speed.startswith("last turn 41.0 tok/s") and S.DECODE_LABEL not in speed


@pytest.mark.slow
def test_report_shows_every_run_in_its_group(matrix, tmp_path):
    results_dir, runs = matrix
    out = tmp_path / "rep"
    result = CliRunner().invoke(cli, ["report", "--out", str(out), "--results-dir", str(results_dir)])
    assert result.exit_code == 0, result.output
    md = (out / "report.md").read_text()
    html = (out / "index.html").read_text()
    for device in DEVICES:
        for threads in THREADS:
            assert md.count(f"### {_group_title(device, threads)}") == 2  # Runs and Comparison
    for run in runs:
        section = md[md.index(f"### {_title_of(run)}") :]
        line = next(ln for ln in section.splitlines() if run["run_id"] in ln)
        assert S.status_text(run) in line
        assert run["run_id"] in html and S.status_text(run) in html


@pytest.mark.slow
def test_report_groups_render_in_headless_chromium(matrix, tmp_path):
    from test_results_report import _chromium, _render

    browser = _chromium()
    if browser is None:
        pytest.skip("needs chromium (apt-get install -y chromium)")
    results_dir, runs = matrix
    out = tmp_path / "rep"
    assert (
        CliRunner().invoke(cli, ["report", "--out", str(out), "--results-dir", str(results_dir)]).exit_code
        == 0
    )
    dom = _render(browser, out / "index.html", tmp_path / "profile", "--dump-dom", "--window-size=1400,1000")
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout).group(1)
    assert 'data-render-check="done"' in body and 'data-script-errors="0"' in body
    assert 'data-run-groups="4"' in body and 'data-runs-overflow="0"' in body, body
    runs_part = dom.stdout[dom.stdout.index("<h2>Runs</h2>") : dom.stdout.index("<h2>Comparison</h2>")]
    sections = {}
    for chunk in runs_part.split('<h3 class="group">')[1:]:
        title, rest = chunk.split("</h3>", 1)
        sections[title.replace("&amp;", "&")] = rest
    assert len(sections) == 4
    for run in runs:  # in the rendered page, each run sits in its own group's table with its status
        table = sections[_title_of(run)]
        row = next(r for r in table.split("<tr>") if run["run_id"] in r)
        assert f"<td>{S.status_text(run)}</td>" in row


def test_the_bench_table_fits_120_columns_with_threads_and_unenforced_budgets(matrix):
    """`pi2 bench`'s own table in a 120-column terminal: no cell folded (engine names whole), the threads
    of each run, "(not enforced)" on a budget nothing held the run to, the status in its cell and each
    failure's reason once on a line after it."""
    from rich.console import Console

    from pi2cli.bench.run import RunOutcome
    from pi2cli.commands.bench import print_table

    _, runs = matrix
    held = fake_run("pi2", policy="powerinfer2", budget_bytes=32 << 20, threads=2)
    free = fake_run("llama.cpp", budget_bytes=32 << 20, target=("127.0.0.1:5555", "adb"), threads=4)
    free["memory"] = S.memory_info(32 << 20, enforced=False, how="not enforced on adb devices")
    aborted = fake_run("pi2", policy="llmflash", status="aborted", error="aborted: SIGINT (Ctrl-C)")
    for run in (held, free, aborted):
        S.summarize(run)
    runs = [*runs, held, free, aborted]
    outcomes = [RunOutcome(r["engine"]["name"], r["workload"]["name"], None, r, "x.json") for r in runs]
    console = Console(width=120, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    print_table(console, outcomes)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 120
    reasons = [ln for ln in lines if re.match(r"  \S+ / \S+: ", ln)]
    labels = {S.engine_label(r) for r in runs}
    table = [ln for ln in lines if ln.split()[:1] and ln.split()[0] in labels and ln.split()[1] != "/"]
    rows = [ln.split() for ln in table]
    assert len(rows) == len(runs)
    for run, row in zip(runs, rows, strict=True):
        assert row[0] == S.engine_label(run) and S.threads_label(S.run_threads(run)) in row
        assert S.status_label(run["status"]) in row
    assert "32 MiB (not enforced)" in table[-2] and "not enforced" not in table[-3]
    assert len(reasons) == sum(r["status"] != "ok" for r in runs)
    assert reasons[-1].endswith("aborted: SIGINT (Ctrl-C)") and "aborted: aborted" not in reasons[-1]


def _held_and_free(tmp_path) -> tuple[dict, dict]:
    """One engine at one 32 MiB budget twice: held to it by a cgroup, and only told it (an adb device)."""
    held = fake_run(
        "pi2", policy="powerinfer2", budget_bytes=32 << 20, tbt_ms=30, created_at="2026-11-20T10:00:00Z"
    )
    free = fake_run(
        "pi2", policy="powerinfer2", budget_bytes=32 << 20, tbt_ms=20, created_at="2026-11-20T11:00:00Z"
    )
    free["memory"] = S.memory_info(32 << 20, enforced=False, how="not enforced: FAKE no cgroup control")
    for run in (held, free):
        store.save_run(run, tmp_path)
    return held, free


HELD_TITLE = "fake-model · dialogue · 32 MiB · test-host (local) · default threads"
FREE_TITLE = "fake-model · dialogue · 32 MiB (not enforced) · test-host (local) · default threads"


def _blocks(text: str, titles: list[str], prefix: str = "") -> dict[str, str]:
    """The lines under each title (a line of its own, once) up to the next title."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    starts = {t: [i for i, ln in enumerate(lines) if ln == prefix + t] for t in titles}
    assert all(len(at) == 1 for at in starts.values()), starts
    ends = sorted(at[0] for at in starts.values()) + [len(lines)]
    return {t: "\n".join(lines[at[0] : ends[ends.index(at[0]) + 1]]) for t, at in starts.items()}


@pytest.mark.slow
def test_an_enforced_and_a_not_enforced_budget_of_one_size_never_mix(tmp_path):
    """The budget's bytes were the whole budget part of the group: a run held to 32 MiB and one only told
    32 MiB fell into one group, the newest silently won in compare and report, and no title said which."""
    held, free = _held_and_free(tmp_path)
    runner = CliRunner()
    assert S.group_label(S.group_key(held)) == HELD_TITLE and S.group_label(S.group_key(free)) == FREE_TITLE
    listed = runner.invoke(cli, ["results", "list", "--results-dir", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    assert "2 run(s) in 2 group(s)" in listed.stdout
    blocks = _blocks(listed.stdout, [HELD_TITLE, FREE_TITLE])
    for run, title in ((held, HELD_TITLE), (free, FREE_TITLE)):
        assert S.short_run_id(run["run_id"]) in blocks[title]
    wide = runner.invoke(cli, ["results", "list", "--wide", "--results-dir", str(tmp_path)])
    line = next(ln for ln in wide.stdout.splitlines() if free["run_id"][:15] in ln)
    assert "(not enforced)" in line
    out = runner.invoke(cli, ["compare", "--format", "json", "--results-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    rows = {r["run_id"]: r for r in json.loads(out.stdout)["rows"]}
    assert set(rows) == {held["run_id"], free["run_id"]}  # nothing hidden
    assert (
        rows[held["run_id"]]["budget_enforced"] is True and rows[free["run_id"]]["budget_enforced"] is False
    )
    assert all(r["is_baseline"] for r in rows.values())  # never compared with each other
    table = runner.invoke(cli, ["compare", "--results-dir", str(tmp_path)])
    assert table.exit_code == 0, table.output
    assert HELD_TITLE in table.stdout and FREE_TITLE in table.stdout
    csv_text = runner.invoke(cli, ["compare", "--format", "csv", "--results-dir", str(tmp_path)]).stdout
    header, *lines = csv_text.splitlines()
    column = header.split(",").index("budget_enforced")
    assert sorted(line.split(",")[column] for line in lines) == ["0", "1"]
    rep = tmp_path / "rep"
    result = runner.invoke(cli, ["report", "--out", str(rep), "--results-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    md = (rep / "report.md").read_text()
    runs_part = md[md.index("## Runs") : md.index("## Comparison")]
    blocks = _blocks(runs_part, [HELD_TITLE, FREE_TITLE], prefix="### ")
    for run, title in ((held, HELD_TITLE), (free, FREE_TITLE)):
        assert run["run_id"] in blocks[title]
    assert md.count(f"### {FREE_TITLE}") == 2  # Runs and Comparison
    html = (rep / "index.html").read_text()
    assert held["run_id"] in html and free["run_id"] in html
