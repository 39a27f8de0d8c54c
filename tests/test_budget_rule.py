"""One budget rule on every path: the engine's `pi2-engine size` names the smallest budget, and `pi2
bench` (here and on an adb device), `pi2 plan` (a file, or a shape with a shipped device profile) and
`pi2 farm check` refuse a budget below it in one line with the same minimum, before anything runs;
a budget at the minimum runs every engine."""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from engine_helpers import needs_engine

from pi2cli.cli import cli
from pi2cli.hw.cgroup import peak_over_budget
from pi2cli.paths import host_build_dir
from pi2cli.plan.min_budget import minimums_for_facts, minimums_for_file

sys.path.insert(0, str(Path(__file__).parent))

pytestmark = needs_engine
MINIMUM = re.compile(r"is below the smallest budget pi2-engine runs \S+ in: ([0-9.]+ [MG]iB) \(powerinfer2")


def refused(result) -> str:
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("pi2: error: ") and "Traceback" not in result.output, lines
    found = MINIMUM.search(lines[0])
    assert found, lines[0]
    return found.group(1)


@pytest.mark.slow
def test_every_path_refuses_with_the_same_minimum(tiny_model, tmp_path, make_device):
    from pi2cli.plan.predict import load_device

    threads = 1
    # powerinfer2 stages prefill chunks, llmflash does not: each policy has its own, a comparison the larger
    first = minimums_for_file(tiny_model, ["powerinfer2", "llmflash"], 512, threads, 32 << 20)
    budget = (first["powerinfer2"][0] + first["llmflash"][0]) // 2  # ~1 MiB apart on this model
    answers = minimums_for_file(tiny_model, ["powerinfer2", "llmflash"], 512, threads, budget)
    assert answers["llmflash"][1] and not answers["powerinfer2"][1], answers  # llmflash alone would run
    minimums = {p: least for p, (least, _) in answers.items()}
    budget = str(budget)
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
    at_profile = {
        p: least
        for p, (least, _) in minimums_for_file(tiny_model, ["powerinfer2"], 512, 4, int(budget)).items()
    }
    assert load_device("oneplus-12").threads == 4
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
    least, fits = minimums_for_facts(facts, ["powerinfer2"], 512, 1, 16 << 20)["powerinfer2"]
    assert least > 16 << 20 and not fits


@pytest.mark.slow
def test_a_budget_just_above_the_minimum_runs_every_sparse_engine(tiny_model, tmp_path):
    """Accepted means it runs: 1 MiB above the largest minimum (more than the ~0.1 MiB by which two
    opens' RSS differ), the bench's check lets it through and every sparse engine opens and finishes."""
    answers = minimums_for_file(tiny_model, ["powerinfer2", "llmflash"], 512, 1, 32 << 20)
    budget = str(max(least for least, _ in answers.values()) + (1 << 20))
    r = CliRunner().invoke(cli, ["bench", "-m", str(tiny_model), "-e", "pi2", "-e", "llmflash", "-w", "code",
                                 "--limit", "1", "-n", "4", "--ctx", "512", "-t", "1", "--memory-budget", budget,
                                 "--results-dir", str(tmp_path / "r"), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert all(row["status"] == "ok" for row in json.loads(r.stdout)["runs"])


def test_a_peak_above_the_budget_says_why():
    memory = {"budget_bytes": 32 << 20, "enforced": True, "how": "cgroup v2 memory.max"}
    why = peak_over_budget(34 << 20, memory, 31 << 20)
    assert "34 MiB is above the 32 MiB budget" in why and "cgroup's own peak was 31 MiB" in why
    assert peak_over_budget(30 << 20, memory, 30 << 20) is None
    device = {"budget_bytes": 32 << 20, "enforced": False, "how": "not enforced on adb devices"}
    assert "not enforced on adb devices" in peak_over_budget(40 << 20, device, None)


ARM64_ENGINE = host_build_dir().parent / "linux-arm64" / "pi2-engine"


@pytest.mark.skipif(not ARM64_ENGINE.is_file() or shutil.which("qemu-aarch64") is None,
                    reason="no linux-arm64 engine build or no qemu-aarch64")  # fmt: skip
def test_a_device_on_another_build_is_asked_through_its_own_engine(tiny_model, tmp_path):
    """Under qemu the emulator's own pages count in the engine's VmRSS: its fixed region is larger than
    this machine's. The bench asks the engine that will run, there, and refuses in one line naming the
    device, instead of a run that fails when the engine opens (40 MiB ran here and failed there)."""
    here = minimums_for_file(tiny_model, ["powerinfer2"], 512, 1, 40 << 20)["powerinfer2"]
    assert here[1]  # this machine's engine takes 40 MiB
    r = CliRunner().invoke(cli, ["bench", "-m", str(tiny_model), "-e", "pi2", "-w", "code", "--limit", "1", "-n",
                                 "4", "--ctx", "512", "-t", "1", "--memory-budget", "40M", "--device", "qemu-arm64",
                                 "--results-dir", str(tmp_path / "r")])  # fmt: skip
    assert r.exit_code == 1 and re.search(r"runs \S+ on qemu-arm64 in: [0-9.]+ MiB", r.output), r.output
    assert not (tmp_path / "r" / "runs").is_dir() or not list((tmp_path / "r" / "runs").iterdir())


def test_the_minimum_cache_is_never_written_through_a_planted_link(tiny_model, tmp_path, monkeypatch):
    """min-budgets.json goes through safe_write: a link planted at the pid-named temp pi2 once used
    (anyone can guess a pid) is never written through."""
    import os

    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / "cache" / f"min-budgets.{os.getpid()}.tmp").symlink_to(victim)
    minimums_for_file(tiny_model, ["powerinfer2"], 512, 1, 32 << 20)
    assert victim.read_text() == "keep me\n"
    assert len(json.loads((tmp_path / "cache" / "min-budgets.json").read_text())) == 1


@pytest.mark.slow
def test_a_run_killed_at_its_budget_says_so_and_records_the_budget_as_enforced(tiny_model, tmp_path,
                                                                                llamacpp_bindir, monkeypatch):  # fmt: skip
    """llama.cpp (which `pi2-engine size` does not size) started under a cgroup far below its weights is
    killed there: the run is failed with the budget as its reason, and its memory record says the budget
    was enforced (a failed run once read "20 MiB (not enforced)" beside a llama-server log line)."""
    from pi2cli.hw.cgroup import detect_cgroup

    support = detect_cgroup()
    if not support.usable:
        pytest.skip(f"memory cgroups not writable here: {support.reason}")
    # the session's build, not one of its own in the cache dir this module's adb tests point elsewhere
    monkeypatch.setenv("PI2_LLAMACPP_BIN_DIR", str(llamacpp_bindir))
    r = CliRunner().invoke(cli, ["bench", "-m", str(tiny_model), "-e", "llama.cpp", "-w", "math", "--limit", "1",
                                 "-n", "4", "-t", "1", "--memory-budget", "12M",
                                 "--results-dir", str(tmp_path / "r"), "--json"])  # fmt: skip
    assert r.exit_code == 1, r.output
    (row,) = json.loads(r.stdout)["runs"]
    run = json.loads(Path(row["result_file"]).read_text())
    assert run["status"] == "failed" and run["memory"]["enforced"] is True, (run["memory"], run["error"])
    why = run["error"]
    assert re.match(r"(killed by the out-of-memory killer|stopped) at the 12 MiB budget", why), why


def test_a_peak_above_the_budget_is_explained_in_the_report_and_results_show(tmp_path):
    """The reason bench stores beside a peak above the budget (counters.peak_over_budget) is shown where
    the peak is read: the report's run row and `results show`, not only in bench's progress output."""
    from results_fakes import fake_run

    from pi2cli.hw.cgroup import peak_over_budget
    from pi2cli.results import report, store
    from pi2cli.results import schema as S

    run = fake_run("llama.cpp", budget_bytes=32 << 20)
    S.set_counters(run, peak_rss_bytes=41 << 20, budget_peak_bytes=32 << 20)
    why = peak_over_budget(41 << 20, run["memory"], 32 << 20)
    S.set_counters(run, peak_over_budget=why)
    run["summary"] = S.summarize(run)
    (row,) = report.run_rows([run])
    assert row[report.RUN_HEADERS.index("peak RSS MiB")] == f"41 ({why})"
    store.save_run(run, tmp_path)
    shown = CliRunner().invoke(cli, ["results", "show", run["run_id"], "--results-dir", str(tmp_path)])
    assert shown.exit_code == 0 and "cgroup's own peak was 32 MiB" in " ".join(shown.output.split()), (
        shown.output
    )
