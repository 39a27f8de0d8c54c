"""`pi2 bench` with the baselines: llama.cpp's llama-bench mode, the llmflash policy, MLC-LLM through a
user runner (a fake one here, printing MLC's documented stats), and the pi2 driver's policy and budget
flags. Tests that run pi2-engine need it built (engine_helpers.built says what happens when it is not)."""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from engine_helpers import needs_engine

from pi2cli.bench.run import BenchConfig, run_bench
from pi2cli.builds.capabilities import capabilities
from pi2cli.cli import cli
from pi2cli.engines import get_driver
from pi2cli.engines.llmflash.driver import LlmFlashDriver
from pi2cli.engines.pi2.args import engine_argv, sparse_flags
from pi2cli.engines.pi2.driver import Pi2Driver
from pi2cli.engines.pi2.events import summary_counters, turn_io_sums
from pi2cli.errors import Pi2Error
from pi2cli.hw.cgroup import detect_cgroup
from pi2cli.results import store
from pi2cli.targets import get_target


def bench(args: list[str], ok: bool = True) -> dict:
    """`pi2 bench ... --json`; with ok=False it must fail, and the result has its output (and the runs'
    rows when runs were made)."""
    result = CliRunner().invoke(cli, ["bench", *args, "--json"], catch_exceptions=False)
    assert (result.exit_code == 0) == ok, result.output
    if ok:
        return json.loads(result.stdout)
    start = result.stdout.find("{")
    return {"output": result.output, **(json.loads(result.stdout[start:]) if start >= 0 else {})}


@pytest.fixture(scope="module")
def synth_dir(tiny_model) -> Path:
    """A tiny synthetic sparse model WITH activation predictors (model.pi2 + its GGUF twin)."""
    return tiny_model.parent


@pytest.fixture(scope="module")
def dense_pi2(smollm2_pi2) -> Path:
    """SmolLM2 as .pi2: a real model without predictors."""
    return smollm2_pi2


# ------------------------------------------------------------------------------------- llama-bench mode
@pytest.mark.slow
def test_llama_bench_mode_keeps_its_json_fields_under_a_budget(tmp_path, smollm2_gguf, llamacpp_bindir,
                                                               monkeypatch):  # fmt: skip
    monkeypatch.setenv("PI2_LLAMACPP_BIN_DIR", str(llamacpp_bindir))
    budget = 160 << 20  # more than the 96 MB model: the cgroup binds, the run stays quick
    out = bench(["-m", str(smollm2_gguf), "-e", "llama.cpp", "--mode", "llama-bench", "-p", "16", "-n", "4",
                 "--repeat", "2", "-t", "1", "--memory-budget", "160M", "--results-dir", str(tmp_path)])  # fmt: skip
    (row,) = out["runs"]
    assert (
        row["engine"] == "llama.cpp" and row["status"] == "ok" and row["workload"] == "llama-bench-pp16-tg4"
    )
    run = store.load_run(row["result_file"])
    records = run["llama_bench"]
    pp = next(r for r in records if r["n_gen"] == 0)
    tg = next(r for r in records if r["n_prompt"] == 0)
    # llama-bench's own fields, unchanged
    assert pp["n_prompt"] == 16 and tg["n_gen"] == 4 and tg["load_mode"] == "mmap" and tg["repack"] is False
    assert len(tg["samples_ts"]) == 2 and tg["avg_ts"] > 0 and tg["n_threads"] == 1
    # one turn per test and repetition, the rates llama-bench measured
    assert [t["prompt_id"] for t in run["turns"]] == ["pp16", "pp16", "tg4", "tg4"]
    assert [t["decode_ts"] for t in run["turns"][2:]] == pytest.approx(tg["samples_ts"])
    assert run["summary"]["avg_ts"] == pytest.approx(tg["avg_ts"], rel=1e-3)
    assert run["summary"]["prefill_avg_ts"] == pytest.approx(pp["avg_ts"], rel=1e-3)
    # THE decode statistic (schema.decode_rate): all tokens over all time, so the repetitions' rates pool as
    # a harmonic mean (their plain mean, llama-bench's avg_ts, weighs a fast repetition more than its time)
    pooled = len(tg["samples_ts"]) / sum(1 / ts for ts in tg["samples_ts"])
    assert row["decode_tps"] == pytest.approx(pooled, rel=1e-3) and row["ttft_ms"] is None
    assert run["settings"]["mode"] == "llama-bench" and run["settings"]["repetitions"] == 2
    usable = detect_cgroup().usable
    assert run["memory"]["budget_bytes"] == budget and run["memory"]["enforced"] == usable
    if usable:
        assert 0 < run["counters"]["budget_peak_bytes"] <= budget
    # The run takes well under a second: its peak is the kernel's ru_maxrss (pi2-rusage), never a poll,
    # and llama-bench maps and reads every weight of the model. The curve is sampled from llama-bench.
    assert run["counters"]["peak_rss_source"] == row["peak_rss_source"] == "rusage maxrss via wrapper"
    assert run["summary"]["peak_rss_bytes"] > 0.9 * smollm2_gguf.stat().st_size
    assert run["memory_samples"]


def test_llama_bench_mode_rejects_other_engines_and_devices(tmp_path, smollm2_gguf):
    cfg = BenchConfig(model=str(smollm2_gguf), engines=["llama.cpp", "pi2"], mode="llama-bench",
                      results_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(Pi2Error, match="engine 'pi2' has no such mode"):
        run_bench(cfg)
    cfg = BenchConfig(model=str(smollm2_gguf), engines=["llama.cpp"], mode="llama-bench", device="qemu-arm64",
                      results_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(Pi2Error, match="this machine only"):
        run_bench(cfg)
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------ MLC-LLM
FAKE_RUNNER = r"""
import json, os, sys
req = json.load(sys.stdin)
with open(os.environ["FAKE_MLC_LOG"], "a") as log:
    log.write(json.dumps({"request": req, "cgroup": open("/proc/self/cgroup").read()}) + "\n")
n = req["max_tokens"]
print(" ".join(["word"] * n))
if os.environ.get("FAKE_MLC_FORMAT") == "usage":
    print(json.dumps({"usage": {"prompt_tokens": 40 + len(req["messages"]), "completion_tokens": n,
                                "extra": {"prefill_tokens_per_s": 120.5, "decode_tokens_per_s": 9.75,
                                          "ttft_s": 0.25, "inter_token_latency_s": 0.1026}}}))
else:
    print("prefill: 41.2 tok/s, decode: 9.8 tok/s")
"""


@pytest.fixture
def fake_mlc(tmp_path, monkeypatch):
    script = tmp_path / "fake_mlc.py"
    script.write_text(FAKE_RUNNER)
    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("FAKE_MLC_LOG", str(log))
    monkeypatch.delenv("PI2_MLC_RUNNER", raising=False)
    monkeypatch.delenv("PI2_MLC_MODEL", raising=False)
    return f"{sys.executable} {script}", log


@pytest.mark.slow
def test_mlc_bench_with_a_command_runner_printing_the_stats_line(tmp_path, smollm2_gguf, fake_mlc):
    runner, log = fake_mlc
    out = bench(["-m", str(smollm2_gguf), "-e", "mlc-llm", "--mlc-runner", runner, "-w", "multi-turn",
                 "--limit", "1", "-n", "6", "--memory-budget", "256M", "--results-dir", str(tmp_path / "r")])  # fmt: skip
    (row,) = out["runs"]
    assert row["engine"] == "mlc-llm" and row["status"] == "ok"
    assert row["decode_tps"] == pytest.approx(9.8) and row["prefill_tps"] == pytest.approx(41.2)
    run = store.load_run(row["result_file"])
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(run["turns"]) == len(requests) >= 2
    for k, (turn, sent) in enumerate(zip(run["turns"], requests, strict=True)):
        assert turn["n_gen"] == 6 and turn["decode_ts"] == pytest.approx(9.8) and turn["ttft_ns"] is None
        assert turn["extra"]["rates_from"] == "engine" and turn["extra"]["text"] == " ".join(["word"] * 6)
        req = sent["request"]
        assert req["max_tokens"] == 6 and req["ignore_eos"] is True and req["temperature"] == 0.0
        # the whole conversation so far, with the runner's own earlier answers
        assert [m["role"] for m in req["messages"] if m["role"] != "system"] == ["user", "assistant"] * k + [
            "user"
        ]
        assert all(m["content"] == turn["extra"]["text"] for m in req["messages"] if m["role"] == "assistant")
        assert req["model"] == str(smollm2_gguf)  # a command runner gets the GGUF when no --mlc-model
    assert run["settings"]["mlc_runner"] == runner and "command runner" in run["measurement"]
    assert run["counters"]["peak_rss_bytes"] > 1 << 20  # the runner's ru_maxrss (pi2-rusage)
    assert run["counters"]["peak_rss_source"] == "rusage maxrss via wrapper"
    if detect_cgroup().usable:  # every turn ran inside the budget's cgroup
        assert run["memory"]["enforced"] and all("pi2-budget" in r["cgroup"] for r in requests)


@needs_engine
def test_mlc_bench_with_usage_json_records_ttft_and_token_counts(
    tmp_path, smollm2_gguf, fake_mlc, monkeypatch
):
    runner, _ = fake_mlc
    monkeypatch.setenv("FAKE_MLC_FORMAT", "usage")
    monkeypatch.setenv("PI2_MLC_RUNNER", runner)  # the environment works as well as --mlc-runner
    cfg = BenchConfig(model=str(smollm2_gguf), engines=["mlc-llm"], workloads=["code"], limit=1, n_gen=5,
                      results_dir=str(tmp_path), mlc_model="SmolLM2-q4f16_1-MLC")  # fmt: skip
    (outcome,) = run_bench(cfg)
    (turn,) = outcome.run["turns"]
    assert turn["ttft_ns"] == 250_000_000 and turn["n_gen"] == 5 and turn["decode_ts"] == pytest.approx(9.75)
    assert turn["n_prompt"] > 40 and turn["prefill_ts"] == pytest.approx(turn["n_prompt"] / 0.25)
    assert outcome.run["settings"]["mlc_model"] == "SmolLM2-q4f16_1-MLC"


class _FakeMlcServe(BaseHTTPRequestHandler):
    """/v1/chat/completions streamed as `mlc_llm serve` does, usage in the last chunk."""

    requests: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = body["max_tokens"]
        for i in range(n):
            chunk = {"choices": [{"index": 0, "delta": {"content": f" w{i}"},
                                  "finish_reason": "length" if i == n - 1 else None}]}  # fmt: skip
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.005)
        usage = {"prompt_tokens": 30, "completion_tokens": n, "extra": {"prefill_tokens_per_s": 100.0,
                 "decode_tokens_per_s": 50.0, "ttft_s": 0.01, "inter_token_latency_s": 0.02}}  # fmt: skip
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())

    def log_message(self, *args):
        pass


def test_mlc_bench_with_a_server_url(tmp_path, smollm2_gguf, monkeypatch):
    monkeypatch.delenv("PI2_MLC_MODEL", raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeMlcServe)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = BenchConfig(model=str(smollm2_gguf), engines=["mlc-llm"], workloads=["code"], limit=1, n_gen=6,
                          budgets=[256 << 20], results_dir=str(tmp_path),
                          mlc_runner=f"http://127.0.0.1:{server.server_address[1]}")  # fmt: skip
        (outcome,) = run_bench(cfg)
    finally:
        server.shutdown()
    run = outcome.run
    (turn,) = run["turns"]
    # host-stamped: TTFT and the time between every streamed chunk
    assert turn["n_gen"] == 6 and len(turn["samples_ns"]) == 5 and turn["ttft_ns"] > 0
    # The server sends its 6 chunks 5 ms apart: on the host's clock the last one cannot come sooner than
    # 25 ms after the request. (Single gaps can: a stalled host reads two chunks at once, which a
    # per-gap check failed on in CI.) The server's own report, 20 ms per token, must not be used.
    assert turn["ttft_ns"] + sum(turn["samples_ns"]) >= 25_000_000
    assert turn["samples_ns"] != [20_000_000] * 5
    path, body = _FakeMlcServe.requests[-1]
    assert path == "/v1/chat/completions" and body["debug_config"] == {"ignore_eos": True}
    assert "model" not in body and body["messages"][-1]["role"] == "user"  # the server's only model
    # a server pi2 did not start cannot be held to the budget, and the result says so
    assert run["memory"]["budget_bytes"] == 256 << 20 and run["memory"]["enforced"] is False
    assert "outside pi2" in run["memory"]["how"]


@needs_engine
def test_mlc_runner_errors_are_one_line(tmp_path, smollm2_gguf, fake_mlc, monkeypatch):
    out = bench(["-m", str(smollm2_gguf), "-e", "mlc-llm", "--results-dir", str(tmp_path)], ok=False)
    assert "needs a runner and none is configured" in out["output"] and "Traceback" not in out["output"]
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/sh\necho 'no stats here'\n")
    bad.chmod(0o755)
    out = bench(["-m", str(smollm2_gguf), "-e", "mlc-llm", "--mlc-runner", str(bad), "-w", "code", "--limit", "1",
                 "-n", "4", "--results-dir", str(tmp_path)], ok=False)  # fmt: skip
    (row,) = out["runs"]  # the run is on record as failed, with the driver's one-line reason
    assert row["status"] == "failed" and "printed no stats" in row["error"] and "\n" not in row["error"]
    assert store.load_run(row["result_file"])["status"] == "failed"


# ------------------------------------------------------------------------------- pi2 policy and budget
def test_a_build_that_does_not_answer_capabilities_is_refused_in_one_line(tmp_path):
    # host and engine ship at one commit: every build answers `capabilities --json`, so one that does
    # not (not an engine, or not runnable here) is an error, never read some other way
    for name, body in (("refuses", "#!/bin/sh\necho \"pi2-engine: error: unknown command '$1'\" >&2; exit 1\n"),
                       ("other-arch", None)):  # fmt: skip
        path = tmp_path / name
        if body is None:
            path.write_bytes(b"\x7fELF...usage: pi2-engine COMMAND\0--policy\0--plan\0")
        else:
            path.write_text(body)
        path.chmod(0o755)
        with pytest.raises(Pi2Error, match="does not answer `capabilities --json`: rebuild it") as err:
            capabilities(path)
        assert "\n" not in str(err.value) and err.value.exit_code == 2


@pytest.mark.slow
def test_pi2_driver_policy_follows_the_models_predictors(tmp_path, synth_dir, dense_pi2):
    local = get_target("local")
    driver = Pi2Driver()
    driver.configure(local, synth_dir / "model.pi2")
    assert driver.policy == "powerinfer2"
    assert sparse_flags(**driver.engine_options(1 << 30)) == [
        "--policy",
        "powerinfer2",
        "--memory-budget",
        str(1 << 30),
    ]
    assert sparse_flags(**driver.engine_options(None)) == ["--policy", "powerinfer2"]
    driver.configure(local, dense_pi2)
    assert driver.policy == "dense" and sparse_flags(**driver.engine_options(None)) == ["--policy", "dense"]


@pytest.mark.slow
def test_llmflash_driver_window_and_requirements(synth_dir, dense_pi2):
    local = get_target("local")
    driver = get_driver("llmflash")
    assert isinstance(driver, LlmFlashDriver) and driver.window == 5 and driver.name == "llmflash"
    assert driver.supports(local) is None
    driver.window = 3
    driver.configure(local, synth_dir / "model.pi2")
    assert sparse_flags(**driver.engine_options(256 << 20)) == ["--policy", "llmflash", "--llmflash-window", "3", "--memory-budget",
                                             str(256 << 20)]  # fmt: skip
    assert driver.extra_settings == {"llmflash_window": 3}  # stored in each run's settings
    with pytest.raises(Pi2Error, match="needs a model with activation predictors"):
        driver.configure(local, dense_pi2)
    with pytest.raises(Pi2Error, match="positive"):
        driver.window = 0


@needs_engine
def test_sparse_summary_fields_become_counters():
    # a summary event as docs/SPARSE.md describes it (its fields: capabilities --json)
    event = {"event": "summary", "peak_rss_bytes": 90 << 20, "bytes_read": 5 << 20, "policy": "powerinfer2",
             "predictor": "model", "memory_budget_bytes": 256 << 20, "io_method": "io_uring", "o_direct": True,
             "storage_bytes_read": 123456789, "storage_reads": 4000, "cache_bytes": 64 << 20, "hot_bytes": 32 << 20,
             "cold_bytes": 32 << 20, "fixed_bytes": 20 << 20, "hits_hot": 700, "hits_cold": 200, "misses_hot": 10,
             "misses_cold": 90, "hit_rate": 0.9, "io_wait_s": 0.25, "compute_s": 0.75, "io_share": 0.25,
             "active_fraction": 0.12, "predictor_layers": [{"layer": 0, "recall": 0.9, "precision": 0.5}]}  # fmt: skip
    c = summary_counters(event)
    assert (
        c["policy"] == "powerinfer2" and c["io_method"] == "io_uring" and c["storage_bytes_read"] == 123456789
    )
    assert c["hit_rate"] == 0.9 and c["io_share"] == 0.25 and c["memory_budget_bytes"] == 256 << 20
    assert (c["cache_hits"], c["cache_misses"], c["io_ns"], c["compute_ns"]) == (
        900,
        100,
        250_000_000,
        750_000_000,
    )
    assert "predictor_layers" not in c  # a list: not a counter
    # a dense engine's summary: only what it reports
    assert summary_counters({"event": "summary", "peak_rss_bytes": 1, "bytes_read": 2}) == {
        "peak_rss_bytes": 1, "bytes_read": 2}  # fmt: skip
    tokens = [{"event": "token", "bytes_read": 4096, "reads": 2, "hits": 10, "misses": 2, "io_wait_s": 0.001,
               "compute_s": 0.004}, {"event": "token", "bytes_read": 0, "reads": 0, "hits": 12, "misses": 0,
                                     "io_wait_s": 0.0, "compute_s": 0.003}]  # fmt: skip
    assert turn_io_sums(tokens) == {"bytes_read": 4096, "reads": 2, "hits": 22, "misses": 2, "io_ns": 1_000_000,
                                    "compute_ns": 7_000_000}  # fmt: skip
    assert turn_io_sums([{"event": "token", "t": 1.0, "id": 5}]) == {}


@pytest.mark.slow
@needs_engine
def test_pi2_run_records_its_policy(tmp_path, dense_pi2):
    cfg = BenchConfig(model=str(dense_pi2), engines=["pi2"], workloads=["code"], limit=1, n_gen=4,
                      budgets=[512 << 20], results_dir=str(tmp_path))  # fmt: skip
    (outcome,) = run_bench(cfg)
    run = outcome.run
    assert run["status"] == "ok" and run["engine"]["policy"] == "dense"  # SmolLM2 has no predictors
    assert outcome.row()["policy"] == "dense"
    # the engine reports what it ran
    assert run["counters"]["policy"] == "dense" and run["counters"]["memory_budget_bytes"] == 512 << 20


@pytest.mark.slow
@needs_engine
def test_pi2_and_llmflash_on_a_sparse_model_under_a_budget(tmp_path, synth_dir):
    budget = 64 << 20
    out = bench(["-m", str(synth_dir / "model.pi2"), "-e", "pi2", "-e", "llmflash", "--llmflash-window", "3",
                 "-w", "code", "--limit", "1", "-n", "8", "--memory-budget", "64M",
                 "--results-dir", str(tmp_path)])  # fmt: skip
    by_engine = {row["engine"]: row for row in out["runs"]}
    assert set(by_engine) == {"pi2", "llmflash"}
    for name, policy in (("pi2", "powerinfer2"), ("llmflash", "llmflash")):
        row = by_engine[name]
        assert row["status"] == "ok" and row["policy"] == policy, row
        run = store.load_run(row["result_file"])
        c = run["counters"]
        assert run["engine"]["policy"] == policy and c["policy"] == policy
        assert c["memory_budget_bytes"] == budget and c["io_method"] in ("io_uring", "pread", "buffered")
        assert c["storage_bytes_read"] > 0 and 0 <= c["hit_rate"] <= 1 and 0 <= c["io_share"] <= 1
        assert run["summary"]["cache_hit_rate"] == pytest.approx(c["hit_rate"], abs=1e-3)
        assert run["turns"][0]["bytes_read"] is not None  # per-turn storage reads from the token events
        assert c["peak_rss_bytes"] <= budget  # the engine keeps itself inside its budget
    llmflash = store.load_run(by_engine["llmflash"]["result_file"])
    assert llmflash["settings"]["llmflash_window"] == 3 and "llmflash_window" not in store.load_run(
        by_engine["pi2"]["result_file"])["settings"]  # fmt: skip


@needs_engine
def test_generate_with_llmflash(synth_dir):
    result = CliRunner().invoke(cli, ["generate", "--engine", "llmflash", "-m", str(synth_dir / "model.pi2"),
                                      "-p", "Hello", "-n", "4", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["engine"] == "llmflash" and out["extra"]["llmflash_window"] == 5 and len(out["token_ids"]) == 4
    sparse = out["extra"]["sparse"]  # the engine's summary: what it ran and what it read
    assert (
        sparse["policy"] == "llmflash" and sparse["storage_bytes_read"] > 0 and 0 <= sparse["hit_rate"] <= 1
    )


@pytest.mark.slow
@needs_engine
def test_generate_with_pi2_keeps_the_engines_default_policy(synth_dir):
    # `pi2 generate` is one turn of the bench's chat session, but on a model with predictors it runs
    # dense as `pi2-engine generate` does; only the bench picks powerinfer2 for such a model
    result = CliRunner().invoke(cli, ["generate", "-m", str(synth_dir / "model.pi2"), "-p", "Hello", "-n", "3",
                                      "--temperature", "0.5", "--seed", "7", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (
        out["engine"] == "pi2" and out["extra"]["sparse"]["policy"] == "dense" and len(out["token_ids"]) == 3
    )
    assert out["extra"]["stop_type"] and out["extra"]["budget"]["enforced"] is False
    # the context holds the prompt and every token asked for, as pi2-engine generate's did: more than
    # the chat's default context (4096) still runs
    long = CliRunner().invoke(cli, ["generate", "-m", str(synth_dir / "model.pi2"), "-p", "Hello", "-n", "4200",
                                    "--json"])  # fmt: skip
    assert long.exit_code == 0, long.output


def test_engine_argv_orders_plan_threads_and_budget_so_the_right_one_wins():
    # --plan splices the plan's settings where it stands and later flags win: the caller's --threads
    # after the plan, the run's budget last
    argv = engine_argv("bin/pi2-engine", "chat", "m.pi2", events="e.jsonl", n_ctx=512, seed=3, threads=2,
                       policy="cache", plan="p.json", memory_budget=1 << 30, more=["--no-two-phase"])  # fmt: skip
    assert argv == ["bin/pi2-engine", "chat", "-m", "m.pi2", "--seed", "3", "--ctx", "512", "--events", "e.jsonl",
                    "--policy", "cache", "--plan", "p.json", "--threads", "2", "--no-two-phase",
                    "--memory-budget", str(1 << 30)]  # fmt: skip
    gen = engine_argv(
        "e", "generate", "m", events="ev", prompt="Hi", n_predict=4, temperature=0.0, ignore_eos=True
    )
    assert gen == ["e", "generate", "-m", "m", "-p", "Hi", "-n", "4", "--temperature", "0.0", "--seed", "0",
                   "--ignore-eos", "--events", "ev"]  # fmt: skip
