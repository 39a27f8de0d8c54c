"""Issue 20, results half: sizes parsed once with a bound, a schema that refuses absurd values before a run
is stored, and a results directory that keeps listing when one of its files is bad."""

import json

import pytest
from click.testing import CliRunner
from results_fakes import fake_run

from pi2cli.cli import cli
from pi2cli.errors import Pi2Error
from pi2cli.results import schema as S
from pi2cli.results import store
from pi2cli.units import MAX_MEMORY_BYTES, describe_size, format_size, parse_size


# ------------------------------------------------------------------------------------------- item 1: sizes
@pytest.mark.parametrize(("text", "expected"), [("8G", 8 << 30), ("512MiB", 512 << 20), ("1.5g", 3 << 29),
                                                ("96M", 96 << 20), (" 2 GiB ", 2 << 30), ("16T", MAX_MEMORY_BYTES),
                                                (1 << 30, 1 << 30), ("19GB", 19 * 10**9), ("19GiB", 19 << 30),
                                                ("19G", 19 << 30), ("1536mb", 1536 * 10**6), ("8000kB", 8 * 10**6),
                                                ("0.5 TB", 5 * 10**11)])  # fmt: skip
def test_sizes_parse(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text", ["99999999999999T", "17T", "1e3", "0x1p30", "-1G", "12", "", "G", "8 X", True, "8iB"]
)
def test_bad_sizes_are_one_line(text):
    with pytest.raises(Pi2Error) as err:
        parse_size(text)
    assert "\n" not in str(err.value) and "--memory-budget" in str(err.value)


def test_sizes_print_in_the_unit_that_reads():
    assert format_size(96 << 20) == "96 MiB"
    assert format_size(3 << 29) == "1.5 GiB"
    assert format_size(2651 << 20) == "2.59 GiB"
    assert format_size(512) == "512 B"
    assert format_size(None) == "unlimited"
    assert S.budget_label(96 << 20) == "96 MiB"
    # a decimal budget says both readings, so "19GB" is never mistaken for 19 GiB
    assert describe_size(19 * 10**9) == "19 GB = 17.7 GiB" and describe_size(8 << 30) == "8 GiB"


def test_bench_refuses_an_absurd_budget_before_running(tmp_path, monkeypatch):
    import pi2cli.bench.run as bench

    def must_not_run(*args, **kwargs):
        raise AssertionError("the bench started although its budget was absurd")

    monkeypatch.setattr(bench, "run_bench", must_not_run)
    result = CliRunner().invoke(cli, ["bench", "-m", str(tmp_path / "x.pi2"), "-e", "pi2", "--memory-budget",
                                      "99999999999999T", "--results-dir", str(tmp_path / "r")])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("pi2: error: --memory-budget")
    assert "too large" in result.stderr
    assert not (tmp_path / "r").exists()


def test_plan_refuses_an_absurd_budget_and_plan_files_with_one(tmp_path):
    from pi2cli.plan.plan import load_plan

    result = CliRunner().invoke(cli, ["plan", "-m", str(tmp_path / "x.pi2"), "-b", "99999999999999T"])
    assert result.exit_code == 1 and result.stderr.startswith("pi2: error: --memory-budget")
    for budget in (10**40, "1e40", "99999T"):
        plan = tmp_path / "p.json"
        plan.write_text(json.dumps({"format": "pi2-plan", "version": 1, "memory_budget": budget}))
        with pytest.raises(Pi2Error, match="memory-budget"):
            load_plan(plan)
    plan = tmp_path / "latin1.json"
    plan.write_bytes(b'{"format": "pi2-plan", "version": 1, "why": "caf\xe9"}')
    with pytest.raises(Pi2Error, match="not UTF-8"):
        load_plan(plan)


# ------------------------------------------------------------------------------ item 2: schema and index
@pytest.mark.parametrize(("path", "value"), [
    (("memory", "budget_bytes"), 99999999999999 << 40),  # what --memory-budget 99999999999999T was stored as
    (("memory", "budget_bytes"), 1 << 63),
    (("counters", "peak_rss_bytes"), "big"),
    (("counters", "peak_rss_bytes"), 10**26),
    (("counters", "bytes_read"), -1),
    (("counters", "whatever"), 10**30),
    (("model", "size_bytes"), 10**26),
])  # fmt: skip
def test_the_schema_refuses_absurd_values_before_a_run_is_stored(tmp_path, path, value):
    run = fake_run()
    run[path[0]][path[1]] = value
    with pytest.raises(S.ResultSchemaError) as err:
        store.save_run(run, tmp_path)
    assert ".".join(path) in str(err.value)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").glob("*.json"))


def test_absurd_token_times_are_refused():
    run = fake_run()
    run["turns"][0]["samples_ns"][0] = 1 << 63
    with pytest.raises(S.ResultSchemaError, match="samples_ns"):
        S.validate(run)


def _bad_files(runs_dir, good_text):
    """Run files as a crash, a hand edit or an old bug leaves them: name -> bytes."""
    absurd = json.loads(good_text)
    absurd["memory"]["budget_bytes"] = 99999999999999 << 40
    big = json.loads(good_text)
    big["counters"]["peak_rss_bytes"] = "big"
    bad = {
        "truncated.json": good_text[: len(good_text) // 2].encode(),
        "empty.json": b"",
        "invalid.json": b"{not json",
        "deep.json": b"[" * 100000 + b"]" * 100000,
        "absurd.json": json.dumps(absurd).encode(),
        "float-budget.json": good_text.replace('"budget_bytes": null', '"budget_bytes": 1e26').encode(),
        "big.json": json.dumps(big).encode(),
        "latin1.json": b'{"run_id": "caf\xe9"}',
        "digits.json": b'{"n": ' + b"9" * 5000 + b"}",
    }
    for name, data in bad.items():
        (runs_dir / name).write_bytes(data)
    return bad


@pytest.mark.slow
def test_bad_run_files_are_warnings_and_the_rest_still_lists(tmp_path):
    good, path = fake_run(engine="llama.cpp"), None
    path = store.save_run(good, tmp_path)
    bad = _bad_files(tmp_path / "runs", path.read_text())
    runner = CliRunner()
    for _ in range(2):  # the second time the index exists: bad files must still be reported, not vanish
        listed = runner.invoke(cli, ["results", "list", "--json", "--results-dir", str(tmp_path)])
        assert listed.exit_code == 0, listed.output
        assert [r["run_id"] for r in json.loads(listed.stdout)] == [good["run_id"]]
        warnings = listed.stderr.splitlines()
        assert len(warnings) == len(bad), listed.stderr
        assert all(w.startswith("pi2: warning: skipped ") for w in warnings)
        for name in bad:
            assert sum(name in w for w in warnings) == 1, (name, listed.stderr)
    assert "truncated" in listed.stderr and "nested too deeply" in listed.stderr
    table = runner.invoke(cli, ["results", "list", "--results-dir", str(tmp_path)])
    assert table.exit_code == 0 and S.short_run_id(good["run_id"]) in table.stdout
    compared = runner.invoke(cli, ["compare", "--results-dir", str(tmp_path), "--format", "json"])
    assert compared.exit_code == 0, compared.output
    assert compared.stderr.count("pi2: warning: skipped") == len(bad)
    report = runner.invoke(cli, ["report", "--results-dir", str(tmp_path), "--out", str(tmp_path / "rep")])
    assert report.exit_code == 0, report.output
    assert report.stderr.count("pi2: warning: skipped") == len(bad)


def test_a_value_the_index_cannot_hold_is_a_warning_even_past_the_schema(tmp_path, monkeypatch):
    """The last guard: should a value ever slip past the schema, the index still skips just that file."""
    store.save_run(fake_run(), tmp_path)
    other = fake_run(seed=2)
    monkeypatch.setattr(S, "validate", lambda run: None)
    other["memory"]["budget_bytes"] = 1 << 70
    (tmp_path / "runs" / "huge.json").write_text(json.dumps(other))
    warned = []
    rows = store.list_runs(tmp_path, on_bad_file=warned.append)
    assert len(rows) == 1 and len(warned) == 1 and "does not fit the index" in warned[0]
