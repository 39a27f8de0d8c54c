"""One budget rule on every path: the engine's `pi2-engine size` names the smallest budget, and `pi2
bench` (here and on an adb device), `pi2 plan` (a file, or a shape with a shipped device profile) and
`pi2 farm check` refuse a budget below it in one line with the same minimum, before anything runs;
a budget at the minimum runs every engine."""

import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pi2cli.cli import cli
from pi2cli.paths import host_build_dir
from pi2cli.plan.budget import peak_over_budget
from pi2cli.plan.min_budget import minimums_for_facts, minimums_for_file

sys.path.insert(0, str(Path(__file__).parent))

pytestmark = pytest.mark.skipif(
    not (host_build_dir() / "pi2-engine").is_file(), reason="pi2-engine not built"
)
MINIMUM = re.compile(r"is below the smallest budget pi2-engine runs \S+ in: ([0-9.]+ [MG]iB) \(powerinfer2")


def refused(result) -> str:
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("pi2: error: ") and "Traceback" not in result.output, lines
    found = MINIMUM.search(lines[0])
    assert found, lines[0]
    return found.group(1)


def test_every_path_refuses_with_the_same_minimum(tiny_model, tmp_path, make_device):
    from pi2cli.plan.predict import load_device

    threads = 1
    minimums = minimums_for_file(tiny_model, ["powerinfer2", "llmflash"], 512, threads)
    # powerinfer2 stages prefill chunks, llmflash does not: each policy has its own, a comparison the larger
    assert minimums["powerinfer2"] > minimums["llmflash"]
    budget = str((minimums["llmflash"] + minimums["powerinfer2"]) // 2)  # llmflash alone would run
    phone = make_device()
    common = ["-m", str(tiny_model), "-e", "pi2", "-e", "llmflash", "-e", "llama.cpp", "-w", "code", "--limit", "1",
              "-n", "4", "--ctx", "512", "-t", str(threads), "--memory-budget", budget]  # fmt: skip
    seen = {}
    for where in ("local", phone.serial):
        r = CliRunner().invoke(
            cli, ["bench", *common, "--device", where, "--results-dir", str(tmp_path / "r")]
        )
        seen[where] = refused(r)
    assert not (phone.root / "pi2" / "models").exists()  # refused before anything was pushed
    r = CliRunner().invoke(
        cli, ["plan", "-m", str(tiny_model), "-b", budget, "--ctx", "512", "-t", str(threads)]
    )
    seen["plan"] = refused(r)
    assert len(set(seen.values())) == 1, seen
    assert seen["plan"] == f"{-(-minimums['powerinfer2'] * 10 // (1 << 20)) / 10:.1f} MiB"
    # a shipped device profile: the same rule on the same file, at the profile's thread count
    r = CliRunner().invoke(
        cli, ["plan", "-m", str(tiny_model), "-b", budget, "--ctx", "512", "-P", "oneplus-12"]
    )
    at_profile = minimums_for_file(tiny_model, ["powerinfer2"], 512, load_device("oneplus-12").threads)
    assert refused(r) == f"{-(-at_profile['powerinfer2'] * 10 // (1 << 20)) / 10:.1f} MiB"
    farm = tmp_path / "farm.toml"
    farm.write_text(f'name = "f"\nresults_dir = "{tmp_path / "fr"}"\n[[device]]\nname = "local"\n[matrix]\n'
                    f'models = ["{tiny_model}"]\nengines = ["pi2", "llmflash"]\nworkloads = ["code"]\n'
                    f'budgets = ["{budget}"]\n[limits]\nconversations = 1\nn_gen = 4\nthreads = {threads}\n')  # fmt: skip
    r = CliRunner().invoke(cli, ["farm", "check", str(farm)])
    assert r.exit_code != 0 and "is below the smallest budget" in r.output, r.output


def test_a_shape_without_a_file_gets_the_engines_estimate(tiny_model):
    """A registry shape has no file to open: the engine estimates its fixed region (`size --facts`)."""
    r = CliRunner().invoke(cli, ["plan", "-m", "turbosparse-mixtral-47b", "-b", "2G", "-P", "oneplus-12"])
    assert (
        r.exit_code == 1
        and "is below the smallest budget pi2-engine runs turbosparse-mixtral-47b" in r.output
    )
    r = CliRunner().invoke(cli, ["plan", "-m", "turbosparse-mixtral-47b", "-b", "19GB", "-P", "oneplus-12"])
    assert r.exit_code == 0 and "at 17.7 GiB" in r.output, r.output  # 19 GB = 19e9 bytes, said in GiB
    facts = {
        "n_embd": 256,
        "n_layer": 2,
        "n_ff": 512,
        "n_head": 2,
        "n_head_kv": 1,
        "head_dim": 128,
        "n_vocab": 49152,
    }
    assert minimums_for_facts(facts, ["powerinfer2"], 512, 1)["powerinfer2"] > 4 << 20


def test_a_budget_at_the_minimum_runs_every_sparse_engine(tiny_model, tmp_path):
    minimums = minimums_for_file(tiny_model, ["powerinfer2", "llmflash"], 512, 1)
    budget = str(max(minimums.values()))
    r = CliRunner().invoke(cli, ["bench", "-m", str(tiny_model), "-e", "pi2", "-e", "llmflash", "-w", "code",
                                 "--limit", "1", "-n", "4", "--ctx", "512", "-t", "1", "--memory-budget", budget,
                                 "--results-dir", str(tmp_path / "r"), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output


def test_a_peak_above_the_budget_says_why():
    memory = {"budget_bytes": 32 << 20, "enforced": True, "how": "cgroup v2 memory.max"}
    why = peak_over_budget(34 << 20, memory, 31 << 20)
    assert "34 MiB is above the 32 MiB budget" in why and "cgroup's own peak was 31 MiB" in why
    assert peak_over_budget(30 << 20, memory, 30 << 20) is None
    device = {"budget_bytes": 32 << 20, "enforced": False, "how": "not enforced on adb devices"}
    assert "not enforced on adb devices" in peak_over_budget(40 << 20, device, None)
