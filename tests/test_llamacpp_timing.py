"""llama.cpp's token times are the server's own (taken where it runs), never arrivals here.

A stand-in llama-server streams /completion in bursts, as an adb forward delivers them: several tokens
at once, then a pause. Each token carries the slot's timings (timings_per_token), so the recorded
times must be those, and a stream without them must not turn its bursts into token times."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pi2cli.engines.llamacpp.device import DeviceLlamaServer
from pi2cli.engines.llamacpp.server import LlamaServer
from pi2cli.results import schema as S

TBT_MS = 2.0  # the engine's time per token, as the stand-in's timings say
PROMPT_MS = 7.5
N_TOKENS = 12
BURST = 4  # tokens that arrive together


def events(with_timings: bool) -> list[dict]:
    out = []
    for k in range(N_TOKENS):
        event = {"content": f"t{k} ", "tokens": [100 + k], "stop": False}
        if with_timings:
            event["timings"] = {"prompt_n": 5, "prompt_ms": PROMPT_MS, "predicted_n": k + 1,
                                "predicted_ms": k * TBT_MS if k else 0.001}  # fmt: skip
        out.append(event)
    final_timings = {"cache_n": 0, "prompt_n": 5, "prompt_ms": PROMPT_MS, "prompt_per_second": 5 / PROMPT_MS * 1e3,
                     "predicted_n": N_TOKENS, "predicted_ms": (N_TOKENS - 1) * TBT_MS,
                     "predicted_per_token_ms": TBT_MS, "predicted_per_second": 1e3 / TBT_MS}  # fmt: skip
    out.append({"content": "", "tokens": [], "stop": True, "stop_type": "limit", "tokens_evaluated": 5,
                "timings": final_timings})  # fmt: skip
    return out


class Bursty(BaseHTTPRequestHandler):
    with_timings = True
    requests: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i, event in enumerate(events(type(self).with_timings)):
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            if i % BURST == BURST - 1:
                time.sleep(0.03)  # a burst went out; the next comes 30 ms later, all at once

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_in():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Bursty)
    Bursty.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def client(cls, port: int):
    """A LlamaServer (or its device form) that talks to the stand-in: the request path only."""
    server = cls.__new__(cls)
    server.port, server._log, server._lines, server._partial = port, None, [], ""
    return server


@pytest.mark.parametrize("cls", [LlamaServer, DeviceLlamaServer])
def test_bursty_arrivals_are_never_token_times(stand_in, cls):
    Bursty.with_timings = True
    turn = client(cls, stand_in).complete("hello", N_TOKENS)
    assert Bursty.requests[-1]["timings_per_token"] is True
    assert turn.clock == "engine" and len(turn.token_times_s) == N_TOKENS
    # the server's own times: prompt, then one token every TBT_MS
    assert turn.ttft_s == pytest.approx((PROMPT_MS + 0.001) / 1e3)
    assert turn.tbt_s[1:] == pytest.approx([TBT_MS / 1e3] * (N_TOKENS - 2))
    # ...while the arrivals here came in bursts: most gaps near zero, a few of 30 ms
    fields = turn.turn_fields()
    run = {"turns": []}
    S.add_turn(run, **fields)
    samples_ms = [s / 1e6 for s in run["turns"][0]["samples_ns"]]
    assert min(samples_ms) >= TBT_MS * 0.99 and max(samples_ms) <= TBT_MS * 1.01, samples_ms
    assert (
        fields["extra"]["clock"] == "engine"
        and fields["extra"]["engine_timings"]["predicted_per_token_ms"] == 2.0
    )
    assert fields["extra"]["host_ttft_ms"] > 0


def test_a_stream_without_per_token_timings_through_a_forward_keeps_rates_only(stand_in):
    Bursty.with_timings = False
    turn = client(DeviceLlamaServer, stand_in).complete("hello", N_TOKENS)
    assert turn.token_times_s == [] and turn.clock is None  # bursts are not token times
    fields = turn.turn_fields()
    assert fields["samples_ns"] == [] and fields["decode_ts"] == pytest.approx(1e3 / TBT_MS)
    assert fields["extra"]["rates_from"] == "engine" and fields["n_gen"] == N_TOKENS
    # on this machine's loopback the arrivals are the best there is, and say so
    local = client(LlamaServer, stand_in).complete("hello", N_TOKENS)
    assert local.clock == "host" and len(local.token_times_s) == N_TOKENS
