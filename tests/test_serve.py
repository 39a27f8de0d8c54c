"""`pi2-engine serve`: a client nobody here wrote (the `openai` package, curl) against the engine's
OpenAI-compatible server, on the tiny synthetic model and on SmolLM2's real weights: the same text as
`pi2-engine generate`; hostile clients each answered 4xx with the server still serving; a client that
leaves mid-stream frees the compute slot; 503 when the queue is full. Servers listen on 127.0.0.1 only,
every test bounds its time, and the server is killed at the end (the fixture)."""

import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from engine_helpers import engine_bin, run_engine

openai = pytest.importorskip("openai")

HOST = "127.0.0.1"


class Server:
    def __init__(self, proc: subprocess.Popen, port: int):
        self.proc, self.port = proc, port
        self.url = f"http://{HOST}:{port}"

    def client(self, **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0,
                             timeout=60, **kw)  # fmt: skip

    def raw(self, data: bytes, timeout: float = 10, shut: bool = True) -> bytes:
        """Send bytes as they are; return everything the server answers before it closes."""
        with socket.create_connection((HOST, self.port), timeout=timeout) as s:
            s.sendall(data)
            if shut:
                s.shutdown(socket.SHUT_WR)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            return out

    def post(self, path: str, body: bytes | str, headers: str = "") -> tuple[int, dict]:
        body = body.encode() if isinstance(body, str) else body
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n{headers}\r\n").encode()  # fmt: skip
        return parse(self.raw(head + body, shut=False))

    def get(self, path: str) -> tuple[int, dict]:
        return parse(self.raw(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), shut=False))

    def healthy(self) -> bool:
        status, body = self.get("/health")
        return status == 200 and body["status"] == "ok"


def parse(resp: bytes) -> tuple[int, dict]:
    head, _, body = resp.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body.startswith(b"{") else {"raw": body.decode(errors="replace")}


@contextmanager
def serve(model: Path, *flags: str, env: dict | None = None):
    proc = subprocess.Popen([str(engine_bin()), "serve", "-m", str(model), "--host", HOST, "--port", "0",
                             "-t", "2", *flags], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})  # fmt: skip
    try:
        line = proc.stderr.readline()  # the first line names the port (or is the error)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        assert m, f"serve did not start: {line}{proc.stderr.read() if proc.poll() is not None else ''}"
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining its log
        yield Server(proc, int(m.group(1)))
        assert proc.poll() is None, "the server died during the test"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"serve exited {proc.returncode} on SIGTERM"


def generate_text(model: Path, prompt: str, n: int, *flags: str) -> str:
    return run_engine("generate", "-m", model, "-p", prompt, "-n", str(n), "-t", "2", *flags).stdout


CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]


def chatml(messages: list[dict]) -> str:
    return (
        "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        + "<|im_start|>assistant\n"
    )


def converse(srv: Server, model: Path, turns: int = 3, answers_reused: bool = False) -> None:
    """A conversation that resends its history: each turn prefills only what is new (the KV prefix of the
    last prompt and of its answer, as far as the answer's text tokenizes to the ids it was sampled as, is
    reused) and still answers what `generate` answers for the whole conversation. answers_reused: some
    turn must have reused answer tokens too (a real model's answers retokenize as sampled)."""
    msgs, n_prev, n_answer, reused = [{"role": "user", "content": "Name a colour."}], 0, 0, 0
    for i in range(turns):
        r = srv.client().chat.completions.create(model="m", messages=msgs, max_tokens=12, temperature=0)
        text = r.choices[0].message.content
        assert text == generate_text(model, chatml(msgs), 12)
        n_cached = r.model_extra["pi2_timings"]["n_cached"]
        if i:  # the whole previous prompt, and at most its answer's tokens after it
            assert n_prev <= n_cached <= n_prev + n_answer, (n_prev, n_cached, n_answer)
            reused += n_cached - n_prev
        n_prev, n_answer = r.usage.prompt_tokens, r.usage.completion_tokens
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "And another?"}]
    assert reused > 0 or not answers_reused


@pytest.fixture(scope="module")
def tiny(tiny_model):
    with serve(tiny_model, "--chat-template", "chatml", "--read-timeout", "2", "--max-tokens", "256") as srv:
        yield srv


def test_openai_client_chat_and_completions_match_generate(tiny, tiny_model):
    c = tiny.client()
    want = generate_text(tiny_model, chatml(CHAT), 12)
    assert want.strip()
    whole = c.chat.completions.create(model="m", messages=CHAT, max_tokens=12, temperature=0)
    assert whole.choices[0].message.content == want
    chunks = list(
        c.chat.completions.create(model="m", messages=CHAT, max_tokens=12, temperature=0, stream=True)
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
    timed = [ch.model_extra["pi2_timings"] for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert timed and all(t["t_ns"] > 0 for t in timed)
    assert [t["t_ns"] for t in timed] == sorted(t["t_ns"] for t in timed)
    last = chunks[-1].model_extra["pi2_timings"]
    assert last["n_gen"] == whole.usage.completion_tokens and last["n_cached"] > 0  # the prefix was reused
    # completions: any prompt, sampled at a temperature with a seed, as generate samples it
    prompt = "The quick brown fox"
    want = generate_text(tiny_model, prompt, 10, "--temperature", "0.8", "--seed", "7")
    got = c.completions.create(model="m", prompt=prompt, max_tokens=10, temperature=0.8, seed=7)
    assert got.choices[0].text == want
    streamed = c.completions.create(
        model="m", prompt=prompt, max_tokens=10, temperature=0.8, seed=7, stream=True
    )
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == want


def test_a_conversation_reuses_its_prefix(tiny_model):
    with serve(tiny_model, "--chat-template", "chatml") as srv:
        converse(srv, tiny_model)


def test_stop_strings_cut_the_text(tiny, tiny_model):
    full = generate_text(tiny_model, "Once upon", 16)
    stop = full[5:9]
    assert stop.strip() and full.find(stop) == 5
    c = tiny.client()
    got = c.completions.create(
        model="m", prompt="Once upon", max_tokens=16, temperature=0, stop=[stop, "zzzz"]
    )
    assert got.choices[0].text == full[:5] and got.choices[0].finish_reason == "stop"
    streamed = c.completions.create(
        model="m", prompt="Once upon", max_tokens=16, temperature=0, stop=stop, stream=True
    )
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == full[:5]


def test_curl(tiny):
    if not shutil.which("curl"):
        pytest.skip("no curl")
    out = subprocess.run(["curl", "-sS", "--max-time", "30", "-N", f"{tiny.url}/v1/chat/completions", "-d",
                          json.dumps({"messages": CHAT, "max_tokens": 4, "temperature": 0, "stream": True})],
                         capture_output=True, text=True, timeout=40)  # fmt: skip
    assert out.returncode == 0, out.stderr
    events = [line[6:] for line in out.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    models = json.loads(subprocess.run(["curl", "-sS", "--max-time", "10", f"{tiny.url}/v1/models"],
                                       capture_output=True, text=True, timeout=20).stdout)  # fmt: skip
    assert models["data"][0]["id"] == "model.pi2"


HOSTILE = [
    ("malformed json", "/v1/completions", b'{"prompt": "x", ', 400),
    ("not an object", "/v1/completions", b'["x"]', 400),
    ("wrong type", "/v1/completions", b'{"prompt": "x", "max_tokens": "8"}', 400),
    ("unknown field", "/v1/completions", b'{"prompt": "x", "frobnicate": 1}', 400),
    ("huge max_tokens", "/v1/completions", b'{"prompt": "x", "max_tokens": 100000000000}', 400),
    ("invalid utf-8", "/v1/completions", b'{"prompt": "x\xff\xfe"}', 400),
    ("raw NUL", "/v1/completions", b'{"prompt": "a\x00b"}', 400),
    ("escaped NUL", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\u0000b"}]}', 400),
    ("lone surrogate", "/v1/completions", b'{"prompt": "\\ud800"}', 400),
    ("deep nesting", "/v1/completions", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400),
    ("bad role", "/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "x"}]}', 400),
    ("n > 1", "/v1/completions", b'{"prompt": "x", "n": 2}', 400),
    ("unknown route", "/v1/embeddings", b'{"input": "x"}', 404),
]


@pytest.mark.parametrize("name,path,body,status", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_bodies_get_4xx_and_the_server_goes_on(tiny, name, path, body, status):
    got, err = tiny.post(path, body)
    assert got == status, (name, err)
    assert set(err["error"]) >= {"message", "type", "param", "code"} and err["error"]["message"]
    assert tiny.healthy()


RAW = [
    ("bare LF", b"GET /health HTTP/1.1\nHost: x\n\n", 400),
    ("header too large", b"GET /health HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431),
    ("body too large", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n{", 413),
    ("chunked", b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
    ("no length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", 411),
    (
        "two lengths",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        400,
    ),
    ("NUL in head", b"GET /health HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400),
    ("HTTP/2", b"GET /health HTTP/2.0\r\n\r\n", 505),
    ("wrong method", b"GET /v1/completions HTTP/1.1\r\n\r\n", 405),
    ("folded header", b"GET /health HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400),
]


@pytest.mark.parametrize("name,data,status", RAW, ids=[r[0] for r in RAW])
def test_hostile_heads_get_4xx_and_the_server_goes_on(tiny, name, data, status):
    got, err = parse(tiny.raw(data, shut=False))
    assert got == status, (name, err)
    assert tiny.healthy()


@pytest.mark.slow
def test_slow_loris_gets_408_and_the_socket_closed(tiny):
    t0 = time.monotonic()
    with socket.create_connection((HOST, tiny.port), timeout=20) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never the blank line
        for _ in range(3):
            time.sleep(0.3)
            s.sendall(b"X-Slow: 1\r\n")
        # meanwhile the server answers others
        assert tiny.healthy()
        out = b""
        while chunk := s.recv(4096):
            out += chunk
    took = time.monotonic() - t0
    assert parse(out)[0] == 408 and took < 10  # --read-timeout 2: the whole request, not per byte
    assert tiny.healthy()


@pytest.fixture(scope="module")
def slow(tiny_model):
    """A server whose tokens take 20 ms each (PI2_TEST_DELAY_US), so a request holds the slot for seconds."""
    with serve(tiny_model, "--max-queue", "1", env={"PI2_TEST_DELAY_US": "20000"}) as srv:
        yield srv


def test_disconnect_mid_stream_frees_the_slot(slow):
    body = json.dumps({"prompt": "Tell me a long story", "max_tokens": 200, "temperature": 0, "stream": True})
    head = f"POST /v1/completions HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    with socket.create_connection((HOST, slow.port), timeout=20) as s:
        s.sendall(head + body.encode())
        got = b""
        while got.count(b"data: ") < 3:  # the role chunk and two tokens
            got += s.recv(4096)
    t_closed = time.monotonic()
    _wait(lambda: slow.get("/health")[1]["busy"] == 0)
    # 200 tokens at 20 ms would hold the slot 4 s; cancelled at the next token, it is free at once
    assert time.monotonic() - t_closed < 1.5
    status, r = slow.post("/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 3, "temperature": 0}))
    assert status == 200 and r["usage"]["completion_tokens"] == 3


@pytest.mark.slow
def test_full_queue_answers_503_with_retry_after(slow):
    results = {}

    def run(i):
        results[i] = slow.post(
            "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 40, "temperature": 0})
        )

    first = threading.Thread(target=run, args=(0,))
    first.start()
    _wait(lambda: slow.get("/health")[1]["busy"] == 1)
    second = threading.Thread(target=run, args=(1,))
    second.start()
    _wait(lambda: slow.get("/health")[1]["waiting"] == 1)
    body = json.dumps({"prompt": "x", "max_tokens": 4}).encode()
    raw = slow.raw(
        f"POST /v1/completions HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body, shut=False
    )
    assert parse(raw)[0] == 503 and b"\r\nRetry-After: 1\r\n" in raw
    first.join(60)
    second.join(60)
    assert results[0][0] == 200 and results[1][0] == 200  # the queued one ran after the first
    assert results[1][1]["pi2_timings"]["queue_ms"] > 0


@pytest.mark.slow
def test_request_timeout_ends_a_long_generation(tiny_model):
    with serve(tiny_model, "--request-timeout", "1", env={"PI2_TEST_DELAY_US": "20000"}) as srv:
        t0 = time.monotonic()
        status, r = srv.post(
            "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 1000, "temperature": 0})
        )
        assert (
            status == 200 and r["choices"][0]["finish_reason"] == "length" and r["pi2_timings"]["timed_out"]
        )
        assert r["usage"]["completion_tokens"] < 200 and time.monotonic() - t0 < 10  # 1000 tokens: 20 s
        assert srv.healthy()


def _wait(cond, seconds: float = 20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


def test_api_key(tiny_model):
    with serve(tiny_model, "--api-key", "sekrit") as srv:
        with pytest.raises(openai.AuthenticationError):
            srv.client(api_key="wrong").models.list()
        assert srv.client(api_key="sekrit").models.list().data[0].id == "model.pi2"
        assert srv.healthy()  # /health needs no key


def test_chat_without_a_template_is_a_clear_400(tiny_model):
    with serve(tiny_model) as srv:  # the synthetic model's metadata keeps no chat template
        status, err = srv.post("/v1/chat/completions", json.dumps({"messages": CHAT}))
        assert status == 400 and "--chat-template" in err["error"]["message"]
        r = srv.client().completions.create(model="m", prompt="Hi", max_tokens=2, temperature=0)
        assert r.usage.completion_tokens == 2


def test_serve_refuses_bad_flags_in_one_line(tiny_model):
    for flags, msg in ((["--host", "example.com"], "IPv4"), (["--chat-template", "jinja"], "chatml"),
                       (["--port", "70000"], "--port")):  # fmt: skip
        done = subprocess.run([str(engine_bin()), "serve", "-m", str(tiny_model), *flags], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
        assert done.returncode != 0 and msg in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_smollm2_chat_matches_generate(smollm2_pi2):
    want = generate_text(smollm2_pi2, chatml(CHAT), 24)
    assert want.strip()
    with serve(smollm2_pi2, "--chat-template", "chatml", "--ctx", "512") as srv:
        c = srv.client()
        whole = c.chat.completions.create(model="smollm2", messages=CHAT, max_tokens=24, temperature=0)
        assert whole.choices[0].message.content == want
        chunks = c.chat.completions.create(model="smollm2", messages=CHAT, max_tokens=24, temperature=0,
                                           stream=True)  # fmt: skip
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
        prompt = "The capital of France is"
        got = c.completions.create(model="smollm2", prompt=prompt, max_tokens=16, temperature=0)
        assert got.choices[0].text == generate_text(smollm2_pi2, prompt, 16)
        converse(srv, smollm2_pi2, answers_reused=True)
