"""`pi2 repro --small`: every experiment of the paper end to end on scaled-down synthetic models, in
under 3 minutes in all (the CI budget for it), each writing its JSON with a table and a verdict."""

import json
import time

import pytest
from click.testing import CliRunner

from pi2cli.cli import cli

EXPERIMENTS = ("memory-sweep", "offload-sweep", "ablation", "tbt", "in-memory", "planner")


@pytest.mark.slow
def test_repro_all_small_runs_every_experiment_within_three_minutes(tmp_path):
    out = tmp_path / "report"
    t0 = time.monotonic()
    result = CliRunner().invoke(cli, ["repro", "all", "--small", "--out", str(out)])
    elapsed = time.monotonic() - t0
    assert result.exit_code == 0, result.output + str(result.exception)
    assert elapsed < 180, f"repro all --small took {elapsed:.0f} s"
    for name in EXPERIMENTS:
        data = json.loads((out / f"{name}.json").read_text())
        assert data["small"] is True and data["synthetic"] is True
        assert isinstance(data["holds"], bool) and data["verdict"] and data["expect"], (name, data["holds"])
    sweep = json.loads((out / "memory-sweep.json").read_text())
    assert len(sweep["points"]) == 4
    for p in sweep["points"]:
        assert p["pi2"]["decode_tps"] > 0 and p["pi2"]["peak_rss_bytes"] < p["budget_bytes"]
        # the storage rate each budgeted run started on
        assert p["pi2"]["storage_iops_before"] > 0 and p["llmflash"]["storage_iops_before"] > 0
        assert "decode_tps" in p["llama.cpp"] or p["llama.cpp"].get("bounded")
    assert sweep["curves"]["storage_random_read"] and sweep["curves"]["membw_gb_per_s"]
    planner = json.loads((out / "planner.json").read_text())
    assert len(planner["here"]["rows"]) == 8 and len(planner["paper"]["rows"]) == 4
    # every point is predicted from its model's named curve, summed over the calibration runs
    for p in planner["here"]["points"]:
        assert len(p["named"]["seeds"]) == 2 and 1 not in p["named"]["seeds"]
        assert p["predicted"]["named_source"].startswith("measured")
    summary = (out / "summary.txt").read_text()
    assert all(name in summary for name in EXPERIMENTS)
    assert "paper" in result.output and "expected:" in result.output


@pytest.mark.slow
def test_repro_single_experiment_prints_the_paper_beside_this_machine(tmp_path):
    result = CliRunner().invoke(
        cli, ["repro", "ablation", "--small", "--out", str(tmp_path / "r"), "-n", "6", "--seeds", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "0.4" in result.output and "11.07" in result.output  # the paper's ladder beside ours
    assert (tmp_path / "r" / "ablation.png").is_file()
    # every rung ran once per seed, and reports the median run's figures
    runs = json.loads((tmp_path / "r" / "ablation.json").read_text())["runs"]
    for run in runs:
        rates = run["decode_tps_per_seed"]
        assert len(rates) == 2 and run["decode_tps"] in rates


@pytest.mark.slow
def test_every_experiment_loads_on_its_own():
    # `pi2 repro NAME` imports one module in a fresh interpreter: one that needed another experiment
    # imported first (in-memory read benchmarks/ before common had put it on the path) failed alone
    import subprocess
    import sys

    from pi2cli.commands.repro import EXPERIMENTS as ALL

    for name in ALL:
        code = f"from pi2cli.commands.repro import load; load({name!r})"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, (name, done.stderr[-500:])
