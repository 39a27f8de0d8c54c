"""`pi2 bench --mode load`: concurrent conversations against a local `pi2-engine serve` on the tiny
synthetic model (started as tests/test_serve.py starts it). Every request ends completed or rejected
with its reason, nothing hangs, the stored run agrees with what the server said (its usage blocks, its
/health afterwards); a full queue's 503s are counted as rejections, not failures; a URL where nothing
listens is one error line; Ctrl-C keeps what was measured. Each load lasts a few seconds."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from engine_helpers import needs_engine
from test_serve import serve

from pi2cli.paths import REPO_ROOT
from pi2cli.results import store


def pi2(*args: str, timeout: float = 120, **kw):
    """The CLI in a child process (a load that hangs fails the test instead of hanging it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "pi2cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL, **kw)  # fmt: skip


def load(srv, results, *flags: str, duration: str = "3"):
    done = pi2("bench", "--mode", "load", "--url", srv.url, "--duration", duration, "--results-dir", str(results),
               "--json", "--limit", "4", *flags)  # fmt: skip
    return done, json.loads(done.stdout)["runs"][0] if done.stdout.startswith("{") else None


@pytest.mark.slow
@needs_engine
def test_four_clients_complete_or_are_rejected_and_agree_with_the_server(tiny_model, tmp_path):
    with serve(tiny_model, "--chat-template", "chatml") as srv:
        t0 = time.monotonic()
        done, row = load(srv, tmp_path, "-c", "4", "--max-tokens", "8")
        took = time.monotonic() - t0
        assert done.returncode == 0, done.stderr
        status, health = srv.get("/health")
        assert status == 200 and health["busy"] == 0 and health["waiting"] == 0  # nothing left in flight
    assert took < 30  # 3 s of load and 8-token answers: nothing waited out a timeout
    run = store.load_run(row["result_file"])
    lo = run["load"]
    r = lo["requests"]
    assert run["status"] == "ok" and r["completed"] > 0
    assert r["failed"] == r["timed_out"] == r["cancelled"] == 0, lo["reasons"]
    # every non-success has its reason, and here the only ones are the queue's (--max-queue 4 default)
    assert all(x["outcome"] == "rejected" and "HTTP 503" in x["reason"] for x in lo["reasons"]), lo["reasons"]
    assert sum(x["count"] for x in lo["reasons"]) == r["rejected"]
    turns = run["turns"]
    assert len(turns) == r["completed"] and all(t["status"] == "ok" for t in turns)
    # the server's view: its usage blocks, summed, are the tokens the run counts, turn by turn too
    assert lo["server_usage"]["completion_tokens"] == lo["tokens"] == sum(t["n_gen"] for t in turns)
    assert all(0 < t["n_gen"] <= 8 for t in turns)
    assert lo["server_usage"]["prompt_tokens"] == sum(t["n_prompt"] for t in turns)
    assert lo["tokens_per_s"] == pytest.approx(lo["tokens"] / lo["window_s"], rel=1e-3)
    metrics = lo["server_metrics"]
    if metrics is not None:  # a pi2-engine with GET /metrics: its own counters agree with the clients'
        assert metrics["pi2_generated_tokens_total"] == lo["tokens"]
        assert metrics["pi2_prompt_tokens_total"] == lo["server_usage"]["prompt_tokens"]
        assert metrics['pi2_requests_total{endpoint="/v1/chat/completions",code="2xx"}'] == r["completed"]
        assert metrics.get('pi2_requests_rejected_total{reason="queue_full"}', 0) == r["rejected"]
    assert lo["window_s"] >= 3.0 and lo["concurrency"] == 4
    for clock in ("client", "engine"):  # pi2-engine's chunks carry pi2_timings: both clocks measured
        for name in ("ttft_ms", "tbt_ms"):
            p = lo[clock][name]
            assert 0 <= p["p50"] <= p["p90"] <= p["p99"], (clock, name, p)
    # conversations go on: later turns resend the history, which the server's prompt cache partly reuses
    assert any(t["extra"]["turn"] > 0 for t in turns)
    assert run["memory_samples"] and run["counters"]["peak_rss_source"] == "server VmHWM after load"
    # the kernel's peak covers the curve (up to the page or so its per-CPU RSS counters may lag a read)
    assert run["summary"]["peak_rss_bytes"] >= 0.99 * max(m["rss_bytes"] for m in run["memory_samples"])
    assert run["workload"]["name"] == "load-c4-multi-turn" and run["engine"]["name"] == "pi2"
    assert run["model"]["synthetic"]  # the server's own -m file, read from its command line
    listed = pi2("results", "list", "--results-dir", str(tmp_path), "--json")
    assert listed.returncode == 0 and run["run_id"] in listed.stdout
    shown = pi2("results", "show", run["run_id"], "--results-dir", str(tmp_path))
    assert f"requests: {r['completed']} completed, {r['rejected']} rejected, 0 failed" in shown.stdout


@pytest.mark.slow
@needs_engine
def test_a_full_queue_gives_counted_rejections_not_failures(tiny_model, tmp_path):
    # 20 ms a token, one computing and one waiting: of 4 clients two are always turned away with 503
    with serve(tiny_model, "--chat-template", "chatml", "--max-queue", "1",
               env={"PI2_TEST_DELAY_US": "20000"}) as srv:  # fmt: skip
        done, row = load(srv, tmp_path, "-c", "4", "--max-tokens", "6")
        assert done.returncode == 0, done.stderr
        assert srv.healthy()
    run = store.load_run(row["result_file"])
    lo = run["load"]
    assert lo["requests"]["rejected"] > 0 and lo["requests"]["completed"] > 0
    assert lo["requests"]["failed"] == lo["requests"]["timed_out"] == 0, lo["reasons"]
    assert run["summary"]["n_failed_turns"] == 0  # a rejection is not a failed turn
    assert lo["retry_after"]["given"] == lo["requests"]["rejected"]  # pi2-engine serve says Retry-After: 1
    # honoured: a client waits 1 s after a 503, so no client was turned away more than ~once a second
    assert lo["requests"]["rejected"] <= 4 * (lo["window_s"] + 1)


def test_a_url_where_nothing_listens_is_one_error_line(tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago and that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = pi2("bench", "--mode", "load", "--url", f"http://127.0.0.1:{port}", "-c", "2", "--duration", "2",
               "--results-dir", str(tmp_path))  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"pi2: error: nothing answers at http://127.0.0.1:{port}: connection refused")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags, message",
    [(["--mode", "load", "-c", "2", "--duration", "1"], "--mode load needs --url"),
     (["--mode", "load", "--url", "http://127.0.0.1:9", "-c", "0", "--duration", "1"], "at least 1"),
     (["--mode", "load", "--url", "http://127.0.0.1:9", "-c", "1", "--duration", "inf"], "--duration must be"),
     (["--mode", "load", "--url", "ftp://127.0.0.1:9", "-c", "1", "--duration", "1"], "give the server's address"),
     (["--mode", "load", "--url", "http://127.0.0.1:9", "-c", "2", "--duration", "1", "--device", "x"],
      "--device does not go with --mode load"),
     (["-m", "x.pi2", "--url", "http://127.0.0.1:9"], "--url goes with --mode load")],
)  # fmt: skip
def test_bad_load_options_are_one_line(tmp_path, flags, message):
    done = pi2("bench", *flags, "--results-dir", str(tmp_path))
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and message in lines[0], done.stderr


@pytest.mark.slow
@needs_engine
def test_ctrl_c_stops_the_load_and_keeps_what_was_measured(tiny_model, tmp_path):
    with serve(tiny_model, "--chat-template", "chatml", env={"PI2_TEST_DELAY_US": "5000"}) as srv:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        proc = subprocess.Popen([sys.executable, "-m", "pi2cli", "bench", "--mode", "load", "--url", srv.url, "-c",
                                 "2", "--duration", "600", "--max-tokens", "40", "--limit", "2", "--results-dir",
                                 str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                stdin=subprocess.DEVNULL, text=True,
                                # Ctrl-C's signal at its default even when the suite runs in the background
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while not srv.get("/health")[1]["busy"] and time.monotonic() < deadline:  # the load has begun
                time.sleep(0.05)
            time.sleep(1.5)  # 40 tokens at 5 ms: several answers finished, and one always in flight
            os.kill(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130, err
        assert "pi2: interrupted (the run is saved as aborted: " in err and "Traceback" not in err
        deadline = time.monotonic() + 5  # the cancelled requests end at their next token
        while srv.get("/health")[1]["busy"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.get("/health")[1]["busy"] == 0
    (path,) = (tmp_path / "runs").glob("*.json")
    run = json.loads(path.read_text())
    assert run["status"] == "aborted" and run["error"].startswith("aborted: SIGINT (Ctrl-C) after ")
    assert run["load"]["requests"]["completed"] >= 1 and run["turns"]  # what finished before is kept
    assert run["load"]["window_s"] < 60


class OtherServer(BaseHTTPRequestHandler):
    """Not pi2: OpenAI's own stream shape (usage in a chunk of its own, no pi2_timings), owned by
    "llamacpp"; its first answer is whole, every later one sends one token and then nothing."""

    answered = 0

    def log_message(self, *args):  # quiet
        pass

    def send(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self):
        self.send(json.dumps({"data": [{"id": "other-model", "owned_by": "llamacpp"}]}).encode())

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        first = OtherServer.answered == 0
        OtherServer.answered += 1
        chunks = [{"choices": [{"delta": {"content": "Hel"}, "finish_reason": None}]}]
        if first:
            chunks += [{"choices": [{"delta": {"content": "lo"}, "finish_reason": None}]},
                       {"choices": [{"delta": {}, "finish_reason": "stop"}]},
                       {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}]  # fmt: skip
        self.send(b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
                  + (b"data: [DONE]\n\n" if first else b""), "text/event-stream")  # fmt: skip
        if not first:
            time.sleep(6)  # a stalled generation: the client's --request-timeout must end it


@pytest.mark.slow
def test_another_server_and_a_stalled_answer_times_out_with_its_reason(tmp_path):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), OtherServer)
    httpd.block_on_close = False
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"  # the /v1 suffix is taken as the server too
        t0 = time.monotonic()
        done = pi2("bench", "--mode", "load", "--url", url, "-c", "1", "--duration", "1", "--request-timeout",
                   "1", "--limit", "1", "--results-dir", str(tmp_path), "--json")  # fmt: skip
        took = time.monotonic() - t0
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert done.returncode == 0, done.stderr
    assert took < 15  # the stalled answer was cut at 1 s, not waited out
    run = store.load_run(json.loads(done.stdout)["runs"][0]["result_file"])
    lo = run["load"]
    assert run["engine"]["name"] == "llama.cpp" and run["settings"]["model_id"] == "other-model"
    assert run["target"]["kind"] == "local"  # this process listens here, so its memory was followed
    assert lo["requests"]["completed"] == 1 and lo["requests"]["timed_out"] >= 1
    (reason,) = lo["reasons"]
    assert reason["outcome"] == "timed_out" and "--request-timeout 1 s" in reason["reason"]
    late = [t for t in run["turns"] if t["status"] == "timeout"]
    assert late and all("--request-timeout 1 s" in t["error"] for t in late)
    assert lo["engine"] is None and lo["client"]["ttft_ms"] is not None  # no pi2_timings: one clock
    assert lo["server_metrics"] is None  # this server has no /metrics: not an error
    assert lo["tokens"] == 2 + len(late) and lo["server_usage"]["completion_tokens"] == 2


def _load_run(tmp_path) -> dict:
    """A stored load run to break (the one real server in this file is not needed for the schema)."""
    from pi2cli.bench.load import LoadConfig, Record, Tally, fill_run
    from pi2cli.bench.load_client import Attempt
    from pi2cli.results import schema as S

    run = S.new_run(engine=S.engine_info("pi2"), model=S.model_info("m"),
                    workload=S.workload_info("load-c1-multi-turn"), target=S.target_info("h:1", "http"))  # fmt: skip
    tally = Tally()
    tally.add(Record(0, "c", 0, Attempt("ok", None, 200, None, 0.0, 0.3, [0.1, 0.2], text="ab",
                                        finish_reason="stop", usage={"completion_tokens": 2}), 0))  # fmt: skip
    tally.add(Record(0, "c", 1, Attempt("rejected", "HTTP 503: busy", 503, 1.0), 0))
    fill_run(run, LoadConfig(url="http://h:1", concurrency=1, duration_s=1.0), tally, 1.0, [], None, 0.0)
    return run


def test_the_load_block_is_validated(tmp_path):
    from pi2cli.results import schema as S

    run = _load_run(tmp_path)
    S.validate(run)
    assert run["load"]["requests"] == {
        "completed": 1,
        "failed": 0,
        "rejected": 1,
        "timed_out": 0,
        "cancelled": 0,
    }
    for breaking, where in [(lambda lo: lo["requests"].update(rejected=-1), "run.load.requests.rejected"),
                            (lambda lo: lo["requests"].pop("failed"), "run.load.requests.failed"),
                            (lambda lo: lo["reasons"].append({"outcome": "x"}), "run.load.reasons[1]"),
                            (lambda lo: lo["client"]["tbt_ms"].update(p90="fast"), "run.load.client.tbt_ms.p90"),
                            (lambda lo: lo.update(tokens_per_s=float("inf")), "run.load.tokens_per_s"),
                            (lambda lo: lo.update(extra=1), "run.load")]:  # fmt: skip
        bad = json.loads(json.dumps(run))
        breaking(bad["load"])
        with pytest.raises(S.ResultSchemaError, match=f"^{re.escape(where)}"):
            S.validate(bad)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_llama_server_is_loaded_the_same_way(llamacpp_bindir, tiny_model, tmp_path):
    """Another engine's server, unchanged: llama-server on the tiny model's GGUF twin."""
    port = _free_port()
    proc = subprocess.Popen([str(llamacpp_bindir / "llama-server"), "-m", str(tiny_model.with_suffix(".gguf")),
                             "--host", "127.0.0.1", "--port", str(port), "-t", "1", "-np", "2", "--metrics"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # llama-server answers 503 while it loads the model
            with socket.socket() as s:
                s.settimeout(1)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if s.recv(64).startswith(b"HTTP/1.1 200"):
                        break
            time.sleep(0.2)
        done = pi2("bench", "--mode", "load", "--url", f"http://127.0.0.1:{port}", "-c", "2", "--duration", "2",
                   "--max-tokens", "8", "--limit", "2", "--results-dir", str(tmp_path), "--json")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(30)
    assert done.returncode == 0, done.stderr
    run = store.load_run(json.loads(done.stdout)["runs"][0]["result_file"])
    lo = run["load"]
    assert run["engine"]["name"] == "llama.cpp" and run["model"]["synthetic"]  # owned_by, and its -m file
    assert lo["requests"]["completed"] > 0 and lo["requests"]["failed"] == lo["requests"]["timed_out"] == 0
    assert lo["engine"] is None and lo["client"]["tbt_ms"]["p50"] > 0  # no pi2_timings: the client's clock
    assert lo["server_usage"]["completion_tokens"] == lo["tokens"] == sum(t["n_gen"] for t in run["turns"])
    # the server's own counters (--metrics), read before and after the load, agree with the client's
    assert lo["server_metrics"]["llamacpp:tokens_predicted_total"] == lo["tokens"]
    assert lo["server_metrics"]["llamacpp:prompt_tokens_total"] <= lo["server_usage"]["prompt_tokens"]
