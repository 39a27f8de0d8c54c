"""`pi2 bench` end to end on SmolLM2: llama.cpp and pi2-engine here, pi2-engine through the test adb
daemon, the Ctrl-C and lost-device paths, memory sampling, and the chat protocol's edge cases."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from engine_helpers import alive, needs_engine

from pi2cli.bench.recorder import BenchInterrupted, DeviceVanished
from pi2cli.bench.run import BenchConfig, Reporter, run_bench
from pi2cli.cli import cli
from pi2cli.engines.pi2.chat import common_prefix_extends
from pi2cli.errors import Pi2Error
from pi2cli.hw.cgroup import detect_cgroup
from pi2cli.hw.push import model_remote_name, sha256_file
from pi2cli.model_files import resolve_model
from pi2cli.results import store
from pi2cli.units import parse_size

sys.path.insert(0, str(Path(__file__).parent))
from adbd.harness import private_device  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(smollm2_dir) -> Path:
    """SmolLM2 as DIR/model.pi2 + DIR/model.gguf (the same weights), as `pi2 convert` writes them."""
    return smollm2_dir


def bench_json(args: list[str]) -> dict:
    result = CliRunner().invoke(cli, ["bench", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def check_row(row: dict, engine: str, workload: str, n_turns: int) -> dict:
    assert row["engine"] == engine and row["workload"] == workload and row["status"] == "ok"
    assert row["n_turns"] == n_turns
    for key in ("ttft_ms", "tbt_p50_ms", "tbt_p90_ms", "tbt_p99_ms", "decode_tps"):
        assert row[key] is not None and row[key] > 0, key
    assert row["tbt_p50_ms"] <= row["tbt_p90_ms"] <= row["tbt_p99_ms"]
    assert row["peak_rss_bytes"] > 50 << 20  # the model's weights were resident
    run = store.load_run(row["result_file"])
    assert run["engine"]["name"] == engine and run["workload"]["name"] == workload
    return run


@pytest.mark.slow
@needs_engine
def test_bench_code_both_engines_locally(bench_env, model_dir):
    out = bench_json(["-m", str(model_dir / "model.pi2"), "-e", "pi2", "-e", "llama.cpp", "-w", "code",
                      "--limit", "1", "-n", "8", "--memory-budget", "1G", "--results-dir", str(bench_env)])  # fmt: skip
    assert [r["engine"] for r in out["runs"]] == ["pi2", "llama.cpp"]
    cgroups = detect_cgroup()
    for row in out["runs"]:
        run = check_row(row, row["engine"], "code", 1)
        (turn,) = run["turns"]
        assert turn["prompt_id"] == "humaneval-0#0" and turn["n_gen"] == 8 and len(turn["samples_ns"]) == 7
        assert turn["extra"]["text"]  # the answer is kept
        assert run["counters"]["load_s"] > 0  # model load time, kept out of TTFT
        # the budget binds through a memory cgroup where this machine allows one, and says so either way
        assert run["memory"]["budget_bytes"] == 1 << 30 and run["memory"]["enforced"] == cgroups.usable
        if cgroups.usable:
            assert run["counters"]["budget_peak_bytes"] <= 1 << 30
        # memory was sampled while the engine ran, and the engine's own peak is at least what was seen (less
        # a few pages: the kernel folds per-thread RSS counts into VmHWM lazily; 24 KiB short was seen)
        assert run["memory_samples"] and run["summary"]["peak_rss_bytes"] >= max(
            m["rss_bytes"] for m in run["memory_samples"]
        ) - (1 << 20)
        # ... and it is the kernel's high-water mark, never a poll
        source = {"pi2": "engine VmHWM at exit", "llama.cpp": "VmHWM before stop"}[row["engine"]]
        assert run["counters"]["peak_rss_source"] == row["peak_rss_source"] == source
    assert len(store.list_runs(bench_env)) == 2


@pytest.mark.slow
@needs_engine
def test_multi_turn_keeps_the_kv_cache_and_the_models_own_answers(bench_env, model_dir):
    cfg = BenchConfig(model=str(model_dir / "model.pi2"), engines=["pi2"], workloads=["multi-turn"], limit=1,
                      n_gen=6, results_dir=str(bench_env))  # fmt: skip
    (outcome,) = run_bench(cfg)
    turns = outcome.run["turns"]
    assert len(turns) >= 3 and all(t["status"] == "ok" for t in turns)
    for before, after in zip(turns, turns[1:], strict=False):
        # each turn reuses everything before it: the previous prompt plus its (own) answer
        assert after["extra"]["n_prompt_cached"] >= before["extra"]["n_prompt_total"] + before["n_gen"] - 1
        assert after["n_prompt"] < after["extra"]["n_prompt_total"]


@pytest.mark.slow
@needs_engine
def test_context_full_fails_the_turn_not_the_run(bench_env, model_dir):
    cfg = BenchConfig(model=str(model_dir / "model.pi2"), engines=["pi2"], workloads=["code"], limit=2, n_gen=4,
                      ctx=64, results_dir=str(bench_env))  # fmt: skip
    (outcome,) = run_bench(cfg)
    assert [t["status"] for t in outcome.run["turns"]] == ["failed", "failed"]
    assert outcome.run["status"] == "failed" and "every turn failed" in outcome.run["error"]
    assert store.load_run(outcome.path)["status"] == "failed"  # on record
    assert "context full" in outcome.run["turns"][0]["error"]


class InterruptAfter(Reporter):
    def __init__(self, turns: int, action=None):
        self.left, self.action, self.pids = turns, action, []

    def turn_done(self, label, decode_tps, ttft_ms):
        self.left -= 1
        if self.left == 0:
            if self.action:
                self.action()
            else:
                raise KeyboardInterrupt


@pytest.mark.slow
@needs_engine
def test_ctrl_c_stops_the_engine_and_saves_an_aborted_run(bench_env, model_dir, chat_pids):
    started = chat_pids
    cfg = BenchConfig(model=str(model_dir / "model.pi2"), engines=["pi2", "llama.cpp"], workloads=["code"],
                      limit=3, n_gen=4, results_dir=str(bench_env))  # fmt: skip
    with pytest.raises(BenchInterrupted) as info:
        run_bench(cfg, InterruptAfter(2))
    run = store.load_run(info.value.outcome.path)
    assert run["status"] == "aborted" and "Ctrl-C" in run["error"]
    assert len(run["turns"]) == 2  # the finished turns are kept
    assert started and not alive(started[0])  # no orphan engine
    assert [r["status"] for r in store.list_runs(bench_env)] == ["aborted"]  # llama.cpp never started


@pytest.mark.slow
@needs_engine
def test_sigint_to_the_command_exits_130_and_leaves_no_engine(bench_env, model_dir, tmp_path):
    """A real Ctrl-C (SIGINT to the pi2 process group) while pi2-engine is mid-conversation."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "pi2cli", "bench", "-m", str(model_dir / "model.pi2"),
                             "-w", "multi-turn", "--limit", "3", "-n", "64", "--results-dir", str(bench_env), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    # (the default SIGINT in the child: a suite run in the background by a shell inherits it ignored)
    engine_pid = None
    deadline = time.monotonic() + 60
    while engine_pid is None and time.monotonic() < deadline:
        kids = subprocess.run(
            ["pgrep", "-P", str(proc.pid), "-f", "pi2-engine"], capture_output=True, text=True
        )
        engine_pid = int(kids.stdout.split()[0]) if kids.stdout.split() else None
        time.sleep(0.2)
    assert engine_pid, "pi2-engine never started"
    time.sleep(1.5)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert b"pi2: interrupted" in err and b"Traceback" not in err
    assert not alive(engine_pid)
    (row,) = store.list_runs(bench_env)
    assert row["status"] == "aborted"


@pytest.mark.slow
def test_bad_input_is_one_clear_error(bench_env, model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("PI2_MLC_RUNNER", raising=False)
    runner = CliRunner()
    lone = tmp_path / "lone.pi2"
    shutil.copy(model_dir / "model.pi2", lone)
    cases = [
        (["-m", str(tmp_path / "nope.pi2")], "no such file"),
        (["-m", str(lone)], "no GGUF twin"),
        (["-m", str(model_dir / "model.pi2"), "-e", "mlc-llm"], "needs a runner and none is configured"),
        (
            ["-m", str(model_dir / "model.pi2"), "-e", "mlc-llm", "--mlc-runner", str(tmp_path / "none")],
            "the MLC runner command does not exist",
        ),
        # SmolLM2 has no predictors (and a build before the sparse engine has no --policy): either way
        (["-m", str(model_dir / "model.pi2"), "-e", "llmflash"], "engine 'llmflash' needs a"),
        (
            ["-m", str(model_dir / "model.pi2"), "-e", "llmflash", "--llmflash-window", "0"],
            "--llmflash-window",
        ),
        (["-m", str(model_dir / "model.pi2"), "-e", "pi2", "--mode", "llama-bench"], "has no such mode"),
        (
            [
                "-m",
                str(model_dir / "model.pi2"),
                "-e",
                "llama.cpp",
                "--mode",
                "llama-bench",
                "-p",
                "0",
                "-n",
                "0",
            ],
            "needs --n-prompt or --n-gen above 0",
        ),
        (["-m", str(model_dir / "model.pi2"), "-e", "vllm"], "unknown engine"),
        (["-m", str(model_dir / "model.pi2"), "--memory-budget", "lots"], "not a size"),
        (["-m", str(model_dir / "model.pi2"), "--limit", "0"], "--limit must be at least 1"),
    ]
    for args, needle in cases:
        result = runner.invoke(cli, ["bench", *args, "--results-dir", str(bench_env)])
        assert result.exit_code != 0 and needle in result.output, (args, result.output)
    assert not bench_env.exists()  # nothing half-written


def test_parse_size_and_prompt_extension():
    assert parse_size("8G") == 8 << 30 and parse_size("512MiB") == 512 << 20 and parse_size("1.5g") == 3 << 29
    with pytest.raises(Pi2Error):
        parse_size("12")
    assert common_prefix_extends("<a>hi", "<a>hi<b>more") == "<b>more"
    assert common_prefix_extends("<a>hi", "<a>hi") is None  # nothing new: start over
    assert common_prefix_extends("<a>hi", "<a>ho<b>") is None
    assert common_prefix_extends("", "<a>") is None


@pytest.mark.slow
def test_gguf_model_is_converted_for_pi2(model_dir, tmp_path):
    gguf = tmp_path / "m.gguf"
    os.link(model_dir / "model.gguf", gguf) if os.stat(model_dir).st_dev == os.stat(
        tmp_path
    ).st_dev else shutil.copy(model_dir / "model.gguf", gguf)
    files = resolve_model(str(gguf))
    assert files.pi2 == tmp_path / "m.pi2" and files.pi2.stat().st_size > 0 and files.gguf == gguf
    assert "<|im_start|>" in files.template.render([{"role": "user", "content": "hi"}])


# --------------------------------------------------------------------------------------------- adb
@pytest.fixture
def phone(tmp_path, monkeypatch):
    with private_device(tmp_path, monkeypatch) as device:
        yield device


@pytest.mark.slow
@needs_engine
def test_pi2_through_the_test_adb_daemon(bench_env, model_dir, phone):
    out = bench_json(["-m", str(model_dir / "model.pi2"), "-e", "pi2", "-w", "code", "--limit", "1", "-n", "8",
                      "--device", phone.serial, "--memory-budget", "1G", "--results-dir", str(bench_env)])  # fmt: skip
    run = check_row(out["runs"][0], "pi2", "code", 1)
    assert run["target"]["kind"] == "adb" and run["target"]["model"] == "pi2_test_adbd"
    assert run["memory"]["budget_bytes"] == 1 << 30 and run["memory"]["enforced"] is False
    assert run["memory"]["how"].startswith("not enforced on adb devices (no cgroup control)")
    assert run["memory_samples"] and all(m["pss_bytes"] for m in run["memory_samples"][1:])
    pushed = phone.root / "pi2"
    on_device = model_remote_name(model_dir / "model.pi2", sha256_file(model_dir / "model.pi2"))
    assert (pushed / "bin" / "pi2-engine").is_file() and (pushed / "models" / on_device).is_file()
    assert not list((pushed / "runs").glob("*.events.jsonl"))  # the session cleaned up after itself


@pytest.mark.slow
@needs_engine
def test_device_that_vanishes_mid_run_is_a_failure_record(bench_env, model_dir, phone):
    cfg = BenchConfig(model=str(model_dir / "model.pi2"), engines=["pi2"], workloads=["code"], limit=3, n_gen=4,
                      device=phone.serial, results_dir=str(bench_env))  # fmt: skip
    with pytest.raises(DeviceVanished) as info:
        run_bench(cfg, InterruptAfter(1, action=phone.stop))
    run = store.load_run(info.value.outcome.path)
    assert run["status"] == "device_vanished" and len(run["turns"]) == 1
    assert "lost the device" in str(info.value) or "does not answer" in str(info.value)


@pytest.mark.slow
@needs_engine
def test_engine_that_cannot_load_the_model_is_a_failed_run(bench_env, model_dir, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(model_dir / "model.gguf", bad / "model.gguf")
    (bad / "model.pi2").write_bytes((model_dir / "model.pi2").read_bytes()[:100_000])  # cut short
    result = CliRunner().invoke(cli, ["bench", "-m", str(bad / "model.pi2"), "-w", "code", "--limit", "1", "-n", "4",
                                      "--results-dir", str(bench_env), "--json"])  # fmt: skip
    assert result.exit_code == 1 and "Traceback" not in result.output
    (row,) = json.loads(result.stdout)["runs"]
    assert row["status"] == "failed" and "pi2-engine exited" in row["error"] and "truncated" in row["error"]
    assert store.load_run(row["result_file"])["status"] == "failed"


def test_synthetic_weights_are_recorded_as_synthetic(tmp_path, smollm2_gguf):
    import gguf

    from pi2cli.bench.recorder import model_facts
    from pi2cli.model_files import ModelFiles

    twin = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(twin), "llama")
    writer.add_bool("pi2.synthetic", True)
    writer.add_tensor("x", np.zeros(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    synthetic = model_facts(ModelFiles(name="m", pi2=None, gguf=twin, template=None))
    assert synthetic["synthetic"] is True and synthetic["arch"] == "llama"
    real = model_facts(ModelFiles(name="smollm2", pi2=None, gguf=smollm2_gguf, template=None))
    assert real == {"quant": "Q4_1", "arch": "llama", "synthetic": False}
