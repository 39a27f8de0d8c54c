"""`pi2 bench --via server`: pi2 driven through `pi2-engine serve`'s streamed API (engines/pi2/server_chat.py), on
the small synthetic model, on SmolLM2 and through the test adb daemon; a server that dies mid-run is a
failed run with its reason; the stored run says how it was driven."""

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from pi2cli.bench.run import BenchConfig, Reporter, run_bench
from pi2cli.cli import cli
from pi2cli.engines.pi2 import serve as pi2_serve
from pi2cli.engines.pi2.server_chat import metrics_counters, parse_metrics, token_times_ns
from pi2cli.paths import host_build_dir
from pi2cli.results import schema, store

needs_engine = pytest.mark.skipif(
    not (host_build_dir() / "pi2-engine").is_file(), reason="pi2-engine is not built (make engine)"
)


@pytest.fixture
def served(monkeypatch) -> list:
    """Every local `pi2-engine serve` the test starts (pi2_serve.LocalServer), to check none is left."""
    started: list = []
    real = pi2_serve.LocalServer.start

    def spy(self, timeout_s):
        out = real(self, timeout_s)
        started.append(self.proc)
        return out

    monkeypatch.setattr(pi2_serve.LocalServer, "start", spy)
    return started


def bench(model: Path, results: Path, *more: str) -> list[dict]:
    r = CliRunner().invoke(cli, ["bench", "-m", str(model), "-e", "pi2", "--results-dir", str(results), "--json",
                                 *more], catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output
    return [store.load_run(row["result_file"]) for row in json.loads(r.stdout)["runs"]]


def check_turns(run: dict, n_gen: int) -> None:
    schema.validate(run)
    assert run["status"] == "ok" and run["turns"]
    for t in run["turns"]:
        # every token timed on the engine's clock: one chunk per sampled token
        assert t["status"] == "ok" and t["n_gen"] == n_gen and len(t["samples_ns"]) == n_gen - 1
        assert t["ttft_ns"] > 0 and all(s > 0 for s in t["samples_ns"]) and t["extra"]["text"]


@needs_engine
def test_via_server_on_the_synthetic_model_stores_how_it_was_driven(tiny_model, tmp_path, served):
    (server,) = bench(tiny_model, tmp_path, "--via", "server", "-w", "multi-turn", "--limit", "1", "-n", "8",
                      "--memory-budget", "1G")  # fmt: skip
    (pipe,) = bench(tiny_model, tmp_path, "-w", "multi-turn", "--limit", "1", "-n", "8")
    check_turns(server, 8)
    check_turns(pipe, 8)
    assert all(t["extra"]["clock"] == "engine" for t in server["turns"])  # the engine's own stamps
    assert server["settings"]["via"] == "server" and pipe["settings"]["via"] == "pipe"
    assert schema.engine_label(server) == schema.engine_label(pipe) + " via server"
    assert server["measurement"].startswith("pi2-engine serve")
    assert len(server["turns"]) == len(pipe["turns"]) >= 3
    # the server's prompt cache: each later turn reuses at least the previous turn's prompt
    for before, after in zip(server["turns"], server["turns"][1:], strict=False):
        assert after["extra"]["n_prompt_cached"] >= before["extra"]["n_prompt_total"] - 1
    # the same engine settings as the pipe path: the policy, the budget handed to the engine
    assert server["engine"]["policy"] == pipe["engine"]["policy"] == "powerinfer2"
    (proc,) = served
    assert "--memory-budget" in proc.args and str(1 << 30) in proc.args
    assert proc.poll() is not None, "pi2-engine serve left running"
    c = server["counters"]
    assert c["peak_rss_source"] == schema.PEAK_RSS_BEFORE_STOP and c["peak_rss_bytes"] > 10 << 20
    assert c["cache_hits"] > 0 and c["bytes_read"] is not None
    # results show names the way it was driven
    r = CliRunner().invoke(cli, ["results", "show", server["run_id"], "--results-dir", str(tmp_path)])
    assert r.exit_code == 0 and "via server" in r.output, r.output


@needs_engine
@pytest.mark.slow
def test_via_server_on_smollm2_answers_the_first_turn_as_the_pipe_does(tmp_path, smollm2_gguf, served):
    from pi2cli.models.convert import convert_gguf

    d = tmp_path / "smollm2"
    d.mkdir()
    convert_gguf(smollm2_gguf, d / "model.pi2", d / "model.gguf")
    args = ("-w", "code", "--limit", "1", "-n", "12", "-t", "2")
    (server,) = bench(d / "model.pi2", tmp_path / "r", "--via", "server", *args)
    (pipe,) = bench(d / "model.pi2", tmp_path / "r", *args)
    check_turns(server, 12)
    # the same rendered prompt, greedy, a fresh cache: the same tokens, so the same text
    assert server["turns"][0]["extra"]["text"] == pipe["turns"][0]["extra"]["text"]
    assert server["turns"][0]["extra"]["n_prompt_total"] == pipe["turns"][0]["extra"]["n_prompt_total"]
    assert all(p.poll() is not None for p in served)


class KillServerAfter(Reporter):
    """SIGKILL the bench's pi2-engine serve once `turns` turns are done."""

    def __init__(self, turns: int, served: list):
        self.left, self.served = turns, served

    def turn_done(self, label, decode_tps, ttft_ms):
        self.left -= 1
        if self.left == 0:
            os.kill(self.served[-1].pid, signal.SIGKILL)


@needs_engine
def test_a_server_that_dies_mid_run_is_a_failed_run_with_its_reason(tiny_model, tmp_path, served):
    cfg = BenchConfig(model=str(tiny_model), engines=["pi2"], workloads=["multi-turn"], limit=1, n_gen=4,
                      results_dir=str(tmp_path), via="server")  # fmt: skip
    t0 = time.monotonic()
    (outcome,) = run_bench(cfg, KillServerAfter(1, served))
    assert time.monotonic() - t0 < 60  # nothing waited for an answer that could not come
    run = store.load_run(outcome.path)
    assert run["status"] == "failed" and "pi2-engine serve exited" in run["error"]
    assert "SIGKILL" in run["error"] and len(schema.measured_turns(run)) == 1


@needs_engine
@pytest.mark.slow
def test_via_server_through_the_test_adb_daemon(tiny_model, tmp_path, make_device, adb_server):
    phone = make_device()
    (run,) = bench(tiny_model, tmp_path, "--via", "server", "--device", phone.serial, "-w", "code", "--limit",
                   "1", "-n", "6", "--cool-below", "0")  # fmt: skip
    check_turns(run, 6)
    assert run["target"]["kind"] == "adb" and run["settings"]["via"] == "server"
    assert "adb forward" in run["measurement"] and run["memory_samples"]
    # stopped: no engine left on the device, no forward left here
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [""])[0].startswith(str(phone.root)) and "serve" in p.info["cmdline"]]  # fmt: skip
    assert not left
    assert not [ln for ln in adb_server.call("forward", "--list").splitlines() if ln.startswith(phone.serial)]


def test_token_times_spread_a_chunk_of_several_tokens_over_them():
    assert token_times_ns([(100, 1), (200, 2), (200, 2), (500, 5)]) == [100, 200, 300, 400, 500]
    assert token_times_ns([]) == []


def test_counters_from_metrics_text():
    text = """# TYPE pi2_peak_rss_bytes gauge
pi2_peak_rss_bytes 123456
pi2_process_read_bytes_total 42
pi2_sparse_cache_lookups_total{region="hot",result="hit"} 5
pi2_sparse_cache_lookups_total{region="cold",result="hit"} 3
pi2_sparse_cache_lookups_total{region="cold",result="miss"} 2
pi2_sparse_cache_lookups_total{region="hot",result="miss"} 0
pi2_sparse_cache_hit_rate 0.8
"""
    c = metrics_counters(parse_metrics(text))
    assert c == {
        "peak_rss_bytes": 123456,
        "bytes_read": 42,
        "cache_hits": 8,
        "cache_misses": 2,
        "hit_rate": 0.8,
    }


def test_via_is_validated_and_refused_outside_chat_mode(tmp_path):
    run = schema.new_run(engine=schema.engine_info("pi2"), model=schema.model_info("m"),
                         workload=schema.workload_info("w"), target=schema.target_info("local", "local"),
                         memory=schema.memory_info(None), settings=schema.settings_info(via="carrier-pigeon"),
                         measurement="x")  # fmt: skip
    run["status"], run["error"] = "failed", "nothing ran"
    with pytest.raises(schema.ResultSchemaError, match="settings.via"):
        schema.validate(run)
    r = CliRunner().invoke(cli, ["bench", "--mode", "load", "--via", "server", "--url", "http://127.0.0.1:9"])
    assert r.exit_code != 0 and "--via goes with --mode chat" in r.output


@needs_engine
def test_serve_takes_ignore_eos_and_streams_a_chunk_for_every_token(tiny_model):
    """What the bench's timing rests on: `ignore_eos` (llama-server's extension) generates exactly
    max_tokens, and every sampled token -- one without text, or text held back, too -- has a chunk with
    its own t_ns and n_gen, so no gap between chunks spans two tokens."""
    openai = pytest.importorskip("openai")
    from test_serve import serve

    with serve(tiny_model) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=60)
        chunks = list(client.completions.create(model="m", prompt="Once upon a time", max_tokens=40, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True}))  # fmt: skip
        timed = [c.model_extra["pi2_timings"] for c in chunks[1:-1]]  # not the role chunk, not the last
        assert [t["n_gen"] for t in timed] == list(range(1, 41))
        assert all(a["t_ns"] < b["t_ns"] for a, b in zip(timed, timed[1:], strict=False))
        last = chunks[-1]
        assert last.usage.completion_tokens == 40 and last.choices[0].finish_reason == "length"
        status, body = srv.post("/v1/completions", '{"prompt": "x", "ignore_eos": 1}')
        assert status == 400 and "ignore_eos" in body["error"]["message"]
