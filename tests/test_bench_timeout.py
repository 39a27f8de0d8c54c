"""`pi2 bench --run-timeout`: a run past its limit is stopped (its engine with it, here and on an adb
device), saved as `timeout` with the reason, the bench goes on with the next run and exits 1, and
`results list`, `compare` and `report` show the run with its status (issue 32: the schema listed the
status and no path produced it)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from engine_helpers import alive, needs_engine

from pi2cli.bench.run import BenchConfig, Reporter, run_bench
from pi2cli.cli import cli
from pi2cli.results import schema as S
from pi2cli.results import store

sys.path.insert(0, str(Path(__file__).parent))
from adbd.harness import private_device  # noqa: E402

# a turn far longer than any limit here: only the limit ends it
ENDLESS = ["-n", "100000", "--ctx", "200000"]


def _engines_matching(pattern: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if int(p) != os.getpid()]


@pytest.mark.slow
@needs_engine
def test_a_run_past_its_limit_is_stopped_and_saved_as_timeout(tiny_model, tmp_path):
    results = tmp_path / "results"
    env = {**os.environ, "PI2_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-c", "from pi2cli.cli import main; main()", "bench", "-m",
                             str(tiny_model), "-w", "multi-turn", "-w", "code", "--limit", "1", *ENDLESS,
                             "--run-timeout", "2", "--results-dir", str(results), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)  # fmt: skip
    engines: set[int] = set()
    try:
        while proc.poll() is None:  # every engine the bench starts (one per run)
            kids = subprocess.run(
                ["pgrep", "-P", str(proc.pid), "-f", "pi2-engine"], capture_output=True, text=True
            )
            engines |= {int(p) for p in kids.stdout.split()}
            time.sleep(0.1)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err.decode()  # as for any run that is not ok
    assert b"Traceback" not in err
    assert engines and not any(alive(pid) for pid in engines)  # nothing left running
    assert out.strip(), err.decode()  # the runs' rows, whatever their status
    rows = json.loads(out)["runs"]
    assert [(r["workload"], r["status"]) for r in rows] == [("multi-turn", "timeout"), ("code", "timeout")]
    for row in rows:  # the second run went ahead after the first timed out
        assert row["error"].startswith("timeout: the run passed its --run-timeout of 2 s (")
        assert "turn 1/" in row["error"] and row["error"].endswith("the engine process was stopped")
        run = store.load_run(row["result_file"])
        assert run["status"] == "timeout" and run["error"] == row["error"]
    runner = CliRunner()
    listed = runner.invoke(cli, ["results", "list", "--results-dir", str(results)])
    assert listed.exit_code == 0, listed.output
    for row in rows:
        line = next(
            ln for ln in listed.stdout.splitlines() if S.short_run_id(row["run_id"]) in ln and "│" in ln
        )
        assert " timeout " in line
        assert f"{S.short_run_id(row['run_id'])}: {row['error'][:60]}" in listed.stdout
    compared = runner.invoke(cli, ["compare", "--format", "json", "--results-dir", str(results)])
    assert compared.exit_code == 0, compared.output
    shown = {r["run_id"]: (r["status"], r["error"]) for r in json.loads(compared.stdout)["rows"]}
    assert shown == {r["run_id"]: ("timeout", r["error"]) for r in rows}
    report = runner.invoke(cli, ["report", "--out", str(tmp_path / "rep"), "--results-dir", str(results)])
    assert report.exit_code == 0, report.output
    md = (tmp_path / "rep" / "report.md").read_text()
    for row in rows:
        line = next(ln for ln in md.splitlines() if row["run_id"] in ln)
        assert row["error"] in line


class SlowFirstRun(Reporter):
    """Holds the first run's first turn far past the limit (the engine is up by then); the rest run."""

    def __init__(self):
        self.slowed = False

    def turn_started(self, label, conversation, turn, n_turns):
        if not self.slowed:
            self.slowed = True
            time.sleep(60)


@pytest.mark.slow
@needs_engine
def test_the_next_run_goes_ahead_and_the_alarm_is_put_back(tiny_model, tmp_path, monkeypatch, chat_pids):
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    started = chat_pids
    before = signal.getsignal(signal.SIGALRM)
    cfg = BenchConfig(model=str(tiny_model), engines=["pi2"], workloads=["code", "math"], limit=1, n_gen=4,
                      results_dir=str(tmp_path / "results"), run_timeout_s=1.5)  # fmt: skip
    t0 = time.monotonic()
    first, second = run_bench(cfg, SlowFirstRun())
    assert time.monotonic() - t0 < 30  # the limit cut the 60 s wait short
    assert first.run["status"] == "timeout" and "in humaneval-0 turn 1/1" in first.run["error"]
    assert second.run["status"] == "ok" and second.workload == "math"
    assert len(started) == 2 and not alive(started[0])
    assert signal.getsignal(signal.SIGALRM) == before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_limit_that_cannot_work_is_one_clear_error(tiny_model, tmp_path):
    runner = CliRunner()
    for bad in ("0", "-1", "soon"):
        result = runner.invoke(cli, ["bench", "-m", str(tiny_model), "--run-timeout", bad,
                                     "--results-dir", str(tmp_path)])  # fmt: skip
        assert result.exit_code == 2 and "--run-timeout" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@needs_engine
def test_a_device_run_past_its_limit_is_stopped_on_the_device(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    with private_device(tmp_path, monkeypatch) as phone:
        on_device = f"{phone.root}/pi2/bin/pi2-engine"
        cfg = BenchConfig(model=str(tiny_model), engines=["pi2"], workloads=["code"], limit=1, n_gen=100000,
                          ctx=200000, device=phone.serial, results_dir=str(tmp_path / "results"),
                          run_timeout_s=3)  # fmt: skip
        seen = []

        class Watch(Reporter):
            def turn_started(self, label, conversation, turn, n_turns):
                time.sleep(0.5)
                seen.extend(_engines_matching(on_device))

        (outcome,) = run_bench(cfg, Watch())
        assert seen, "the engine never ran on the device: the check below proves nothing"
        deadline = time.monotonic() + 10
        while _engines_matching(on_device) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _engines_matching(on_device) == []  # killed there, not left running
        assert outcome.run["status"] == "timeout" and outcome.run["target"]["kind"] == "adb"
        assert outcome.run["error"].startswith("timeout: the run passed its --run-timeout of 3 s")


@pytest.mark.slow
@needs_engine
def test_a_pp_tg_cell_past_its_limit_is_a_timeout_and_the_sweep_goes_on(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(cli, ["bench", "-m", str(tiny_model), "--mode", "pp-tg", "-e", "pi2", "-p", "8",
                                      "-n", "100000,4", "--repeat", "1", "--warmup", "0", "--run-timeout", "2",
                                      "--results-dir", str(tmp_path / "results"), "--json"])  # fmt: skip
    assert result.exit_code == 1, result.output
    rows = {r["workload"]: r for r in json.loads(result.stdout)["runs"]}
    assert rows["pp8-tg100000"]["status"] == "timeout" and rows["pp8-tg4"]["status"] == "ok"
    assert "in the pp8-tg100000 cell" in rows["pp8-tg100000"]["error"]
    assert _engines_matching(str(tiny_model)) == []  # its process group was killed: no engine on the model
