"""pi2 compare: bootstrap speedups with confidence intervals, grouping, baselines and output formats."""

import csv
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from results_fakes import fake_run

from pi2cli.cli import cli
from pi2cli.results import compare as C
from pi2cli.results import schema as S
from pi2cli.results import store


def _tbt(n=500, seed=0, ms=20.0):
    return ms * 1e6 * np.exp(0.1 * np.random.default_rng(seed).standard_normal(n))


def test_identical_samples_give_ratio_one_with_a_tight_interval():
    samples = _tbt()
    for stat in (np.mean, np.median):
        r = C.bootstrap_speedup(samples, samples, stat)
        assert r.ratio == 1.0
        assert r.ci_low < 1.0 < r.ci_high
        assert r.ci_high - r.ci_low < 0.05


def test_twice_as_slow_gives_about_two_inside_the_interval():
    fast, slow = _tbt(seed=1), 2 * _tbt(seed=2)
    r = C.bootstrap_speedup(slow, fast)
    assert r.ratio == pytest.approx(2.0, rel=0.03)
    assert r.ci_low <= 2.0 <= r.ci_high
    assert r.ci_high - r.ci_low < 0.1
    back = C.bootstrap_speedup(fast, slow, np.median)  # the other way round: half the speed
    assert back.ci_low <= 0.5 <= back.ci_high


def test_bootstrap_is_seeded_and_deterministic():
    a, b = _tbt(seed=3), _tbt(seed=4, ms=25)
    first = C.bootstrap_speedup(a, b, resamples=500, seed=7)
    assert C.bootstrap_speedup(a, b, resamples=500, seed=7) == first
    assert C.bootstrap_speedup(a, b, resamples=500, seed=8) != first
    batched = C.bootstrap_speedup(np.tile(a, 10), b, resamples=300)  # several batches internally
    assert batched.ci_low < batched.ratio < batched.ci_high


def test_degenerate_samples():
    constant = np.full(50, 10e6)
    r = C.bootstrap_speedup(constant, constant / 2)
    assert (r.ratio, r.ci_low, r.ci_high) == (2.0, 2.0, 2.0)
    single = C.bootstrap_speedup([10e6], [5e6])
    assert single.ratio == 2.0 and single.ci_low is None
    assert C.bootstrap_speedup([], [1.0]) is None
    assert C.bootstrap_speedup([0.0, 0.0], [1.0, 2.0]) is None


def _runs():
    syn = {"workload": "code", "model": "syn-7b", "synthetic": True}
    return [
        fake_run("pi2", policy="powerinfer2", tbt_ms=20, ttft_ms=100, seed=2),
        fake_run("llama.cpp", tbt_ms=40, ttft_ms=400, seed=1),
        fake_run("pi2", policy="dense", tbt_ms=40, seed=3),
        fake_run("pi2", policy="dense", tbt_ms=30, seed=5, **syn),
        fake_run("pi2", policy="powerinfer2", tbt_ms=10, seed=4, **syn),
    ]


def test_compare_groups_and_baselines():
    runs = _runs()
    failed = fake_run("mlc-llm")
    S.mark_failed(failed, "device_vanished", "adb: device gone")
    for run in runs + [failed]:
        S.summarize(run)
    cmp = C.compare_runs(runs + [failed], resamples=500)
    rows = {(r.model, r.workload, r.engine): r for r in cmp.rows}
    assert len(rows) == 6  # the failed run too: a row of its group with its status, no figures
    gone = rows[("fake-model", "dialogue", "mlc-llm")]
    assert (gone.status, gone.error, gone.decode_ts, gone.decode_speedup) == ("device_vanished", "adb: device gone",
                                                                              None, None)  # fmt: skip
    assert not gone.is_baseline and gone.baseline == "llama.cpp"
    base = rows[("fake-model", "dialogue", "llama.cpp")]
    assert base.is_baseline and base.decode_speedup is None
    pi2 = rows[("fake-model", "dialogue", "pi2:powerinfer2")]
    assert pi2.baseline == "llama.cpp"
    assert pi2.decode_speedup.ci_low <= 2.0 <= pi2.decode_speedup.ci_high
    assert pi2.tbt_p50_speedup.ratio == pytest.approx(2.0, rel=0.06)
    assert pi2.ttft_speedup.ratio == pytest.approx(4.0, rel=0.2)
    dense = rows[("fake-model", "dialogue", "pi2:dense")]
    assert dense.decode_speedup.ci_low <= 1.0 <= dense.decode_speedup.ci_high
    # The synthetic group has no llama.cpp: its first run is the baseline, and a note says so.
    syn = rows[("syn-7b [synthetic]", "code", "pi2:powerinfer2")]
    assert syn.synthetic and syn.baseline == "pi2:dense"
    assert syn.decode_speedup.ratio == pytest.approx(3.0, rel=0.05)
    assert any("no llama.cpp run" in n for n in cmp.notes)
    md = C.render(cmp, "md")
    assert "mlc-llm: device vanished: adb: device gone" in md
    explicit = C.compare_runs(runs, baseline="pi2:dense", resamples=200)
    row = next(r for r in explicit.rows if r.engine == "llama.cpp")
    assert row.baseline == "pi2:dense" and row.decode_speedup.ratio == pytest.approx(1.0, rel=0.05)


def test_formats():
    runs = _runs()
    for run in runs:
        S.summarize(run)
    cmp = C.compare_runs(runs, resamples=300)
    md = C.render(cmp, "md")
    assert md.startswith(
        "### fake-model · dialogue · none (in memory) · test-host (local) · default threads\n"
    )
    assert "### syn-7b [synthetic] · code" in md and "300 resamples" in md
    assert C.render(cmp, "md", wide=True).startswith("| model")
    assert "baseline" in md and "2.0" in md
    rows = list(csv.DictReader(io.StringIO(C.render(cmp, "csv"))))
    assert len(rows) == 5 and set(C.CSV_HEADERS) == set(rows[0])
    pi2 = next(r for r in rows if r["engine"] == "pi2:powerinfer2" and r["workload"] == "dialogue")
    assert float(pi2["decode_ci_low"]) <= 2.0 <= float(pi2["decode_ci_high"])
    data = json.loads(C.render(cmp, "json"))
    assert data["resamples"] == 300 and data["seed"] == 0 and data["confidence"] == 0.95
    speed = next(r for r in data["rows"] if r["engine"] == "pi2:powerinfer2" and r["workload"] == "dialogue")
    assert set(speed["decode_speedup"]) == {"ratio", "ci_low", "ci_high"}
    with pytest.raises(ValueError):
        C.render(cmp, "xml")


def test_compare_command(tmp_path):
    runner = CliRunner()
    empty = runner.invoke(cli, ["compare", "--results-dir", str(tmp_path)])
    assert empty.exit_code == 1 and empty.stdout == "" and "no runs to use" in empty.stderr
    old = fake_run("pi2", policy="powerinfer2", tbt_ms=80, created_at="2026-01-01T00:00:00Z")
    for run in [fake_run("llama.cpp", tbt_ms=40), fake_run("pi2", policy="powerinfer2", tbt_ms=20), old]:
        store.save_run(run, tmp_path)
    args = ["compare", "--results-dir", str(tmp_path), "--resamples", "300"]
    out = runner.invoke(cli, args + ["--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert len(data["rows"]) == 2  # the older pi2 run is superseded by the latest of its group
    pi2 = next(r for r in data["rows"] if r["engine"] == "pi2:powerinfer2")
    assert pi2["decode_speedup"]["ci_low"] <= 2.0 <= pi2["decode_speedup"]["ci_high"]
    named = runner.invoke(cli, args + ["--format", "json", old["run_id"], pi2["baseline_run_id"]])
    assert json.loads(named.stdout)["rows"][1]["decode_speedup"]["ratio"] == pytest.approx(0.5, rel=0.05)
    twice = runner.invoke(
        cli, args + ["--format", "json", old["run_id"], pi2["run_id"]]
    )  # one engine, two runs
    rows = json.loads(twice.stdout)["rows"]
    assert [r["is_baseline"] for r in rows if r["run_id"] == old["run_id"]] == [True]
    assert next(r for r in rows if not r["is_baseline"])["decode_speedup"]["ratio"] == pytest.approx(
        4.0, rel=0.05
    )
    table = runner.invoke(cli, args)
    assert table.exit_code == 0 and "pi2:powerinfer2" in table.stdout and "baseline" in table.stdout
    assert "decode speedup" in table.stdout
    md = runner.invoke(cli, args + ["--format", "md", "--engine", "pi2"])
    assert md.stdout.count("pi2:powerinfer2") == 1 and "llama.cpp |" not in md.stdout


@pytest.mark.parametrize("n", [1, 2, 7, 8, 101])
def test_median_shortcut_equals_numpy_median_of_the_same_resamples(n):
    values = np.random.default_rng(n).standard_normal(n)
    fast = C._batched_stat(values, np.median, np.random.default_rng(5), 40)
    picks = np.random.default_rng(5).integers(0, n, size=(40, n), dtype=np.int32)
    assert np.allclose(fast, np.median(np.sort(values)[picks], axis=1))
