"""The MLC-LLM driver: parsing the formats MLC reports in, both runner kinds, and a missing runner."""

import json
import stat
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner
from engine_helpers import needs_engine

from pi2cli.cli import cli
from pi2cli.engines import get_driver
from pi2cli.engines.base import GenerateRequest
from pi2cli.engines.generate import generate
from pi2cli.engines.mlc.driver import MlcDriver
from pi2cli.engines.mlc.runner import (
    parse_chat_stream,
    parse_runner_output,
    resolve_runner,
    stats_from_usage,
)
from pi2cli.errors import Pi2Error

# usage as mlc_llm serve / MLCEngine report it (RequestMetrics::AsJSON under "extra")
USAGE = {
    "prompt_tokens": 27,
    "completion_tokens": 32,
    "total_tokens": 59,
    "extra": {
        "prompt_tokens": 27,
        "completion_tokens": 32,
        "prefill_tokens": 27,
        "decode_tokens": 31,
        "jump_forward_tokens": 0,
        "prefill_tokens_per_s": 143.61,
        "decode_tokens_per_s": 11.87,
        "end_to_end_latency_s": 2.8,
        "ttft_s": 0.188,
        "inter_token_latency_s": 0.0875,
    },
}

# a recorded-format stream of /v1/chat/completions with stream_options.include_usage
SSE_CHUNKS = [
    {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": "The"}, "finish_reason": None}]},
    {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": " capital"}, "finish_reason": None}]},
    {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": " is Paris."}, "finish_reason": "length"}]},
    {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": USAGE},
]  # fmt: skip


def test_usage_extra_maps_to_stats():
    s = stats_from_usage(USAGE)
    assert (s.prefill_tps, s.decode_tps, s.ttft_s, s.inter_token_latency_s) == (143.61, 11.87, 0.188, 0.0875)
    assert (s.prompt_tokens, s.completion_tokens, s.source) == (27, 32, "usage.extra")
    bare = stats_from_usage(USAGE["extra"])
    assert bare.decode_tps == 11.87 and bare.prompt_tokens == 27
    with pytest.raises(Pi2Error, match="none of"):
        stats_from_usage({"prompt_tokens": 3, "completion_tokens": 4})


def test_runner_output_with_the_chat_stats_line():
    out = "Paris is the capital of France.\nIt lies on the Seine.\nprefill: 41.2 tok/s, decode: 9.8 tok/s\n"
    text, s = parse_runner_output(out)
    assert text == "Paris is the capital of France.\nIt lies on the Seine."
    assert (s.prefill_tps, s.decode_tps, s.source) == (41.2, 9.8, "stats line")
    assert s.ttft_s is None


def test_runner_output_with_a_usage_json_line():
    out = "Hello there!\n" + json.dumps({"usage": USAGE}) + "\n"
    text, s = parse_runner_output(out)
    assert text == "Hello there!" and s.decode_tps == 11.87 and s.ttft_s == 0.188
    text, s = parse_runner_output('{"not": "stats"}\n' + json.dumps(USAGE["extra"]))
    assert text == '{"not": "stats"}' and s.prefill_tps == 143.61


def test_runner_output_without_stats_is_an_error():
    with pytest.raises(Pi2Error, match="no stats"):
        parse_runner_output("just some text\n")


def test_chat_stream_folds_text_times_and_usage():
    events = [(0.2 + 0.1 * i, chunk) for i, chunk in enumerate(SSE_CHUNKS)]
    out = parse_chat_stream(events)
    assert out.text == "The capital is Paris."
    assert out.chunk_times_s == pytest.approx([0.2, 0.3, 0.4])
    assert out.finish_reason == "length" and out.stats.decode_tps == 11.87
    with pytest.raises(Pi2Error, match="no usage"):
        parse_chat_stream(events[:-1])
    with pytest.raises(Pi2Error, match="MLC server error"):
        parse_chat_stream([(0.1, {"error": {"message": "model not found"}})])


def test_missing_runner_is_one_clear_error(monkeypatch):
    monkeypatch.delenv("PI2_MLC_RUNNER", raising=False)
    with pytest.raises(Pi2Error, match="PI2_MLC_RUNNER"):
        resolve_runner()
    result = CliRunner().invoke(cli, ["generate", "--engine", "mlc-llm", "-m", "llama2-7b-MLC", "-p", "Hi"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "PI2_MLC_RUNNER" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@needs_engine
def test_command_runner_gets_the_request_on_stdin(tmp_path, monkeypatch):
    runner = tmp_path / "fake_mlc_runner.py"
    runner.write_text(
        "import json, sys\n"
        "req = json.load(sys.stdin)\n"
        "print('echo: ' + req['messages'][0]['content'] + ' max=' + str(req['max_tokens']))\n"
        f"print(json.dumps({{'usage': {USAGE!r}}}))\n"
    )
    runner.chmod(runner.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PI2_MLC_RUNNER", f"{sys.executable} {runner}")
    result = generate(get_driver("mlc-llm"), GenerateRequest(model="m", prompt="Hi", n_predict=5))
    assert result.text == "echo: Hi max=5"
    assert (result.prefill_tps, result.decode_tps, result.ttft_s, result.n_prompt) == (
        143.61,
        11.87,
        0.188,
        27,
    )
    assert (
        result.extra["mlc_stats"] == "usage.extra"
        and result.extra["mlc_runner"] == f"{sys.executable} {runner}"
    )


@needs_engine
def test_failing_command_runner_is_reported(tmp_path):
    driver = MlcDriver(runner=f"{sys.executable} -c \"import sys; sys.exit('no model lib for android')\"")
    with pytest.raises(Pi2Error, match="no model lib for android"):
        generate(driver, GenerateRequest(model="m", prompt="Hi"))


class _FakeMlcServer(BaseHTTPRequestHandler):
    requests: list = []

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _FakeMlcServer.requests.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in SSE_CHUNKS:
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


def test_url_runner_streams_chat_completions():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeMlcServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        driver = MlcDriver(runner=f"http://127.0.0.1:{server.server_address[1]}")
        result = generate(driver, GenerateRequest(model="llama2-MLC", prompt="Capital?", n_predict=32))
    finally:
        server.shutdown()
    path, body = _FakeMlcServer.requests[-1]
    assert path == "/v1/chat/completions"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 32 and body["messages"][0]["content"] == "Capital?"
    assert result.text == "The capital is Paris."
    assert len(result.token_times_s) == 3 and result.ttft_s == result.token_times_s[0] > 0
    assert result.decode_tps == 11.87 and result.extra["timings"]["mlc_ttft_s"] == 0.188
    assert body["model"] == "llama2-MLC"  # `pi2 generate -m` names the model the runner serves
