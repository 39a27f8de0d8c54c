"""`pi2-engine serve`'s GET /metrics: Prometheus text (0.0.4) read by prometheus_client's own parser, after
requests made through the `openai` package, agrees with what the clients counted: requests by route and
status class, prompt and generated tokens (usage), time-to-first-token and time-between-tokens histograms
(one TTFT per request, tokens - 1 gaps, sums equal to the engine's own pi2_timings), queue rejections and
cancellations, and the sparse engine's counters. /metrics needs the API key when the server has one."""

import json
import math
import socket
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_serve import CHAT, HOST, _wait, parse, serve

openai = pytest.importorskip("openai")

HISTOGRAMS = ("pi2_time_to_first_token_seconds", "pi2_time_between_tokens_seconds", "pi2_queue_wait_seconds")


def scrape(srv, key: str | None = None) -> dict:
    """GET /metrics: {(sample name, sorted labels): value}, after checking the format's rules."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    resp = srv.raw(f"GET /metrics HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode(), shut=False)
    head, _, body = resp.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert b"\r\nContent-Type: text/plain; version=0.0.4" in head
    text = body.decode()
    lines = text.splitlines()
    for i, line in enumerate(lines):  # every family: # HELP then # TYPE, then its samples
        if line.startswith("# TYPE "):
            name = line.split()[2]
            assert name.startswith("pi2_") and lines[i - 1].startswith(f"# HELP {name} "), line
    samples = {}
    for fam in text_string_to_metric_families(text):
        assert fam.documentation and fam.type in ("counter", "gauge", "histogram"), fam.name
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    for h in HISTOGRAMS:  # cumulative buckets ending at +Inf == _count
        buckets = sorted((float(k[1][0][1]), v) for k, v in samples.items() if k[0] == h + "_bucket")
        assert buckets and buckets[-1][0] == math.inf and buckets[-1][1] == samples[(h + "_count", ())]
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:], strict=False))
    return samples


def val(m: dict, name: str, **labels) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)  # an absent series is zero


def delta(a: dict, b: dict, name: str, **labels) -> float:
    return val(b, name, **labels) - val(a, name, **labels)


def test_metrics_agree_with_the_clients_counts(tiny_model):
    with serve(
        tiny_model, "--chat-template", "chatml", "--policy", "powerinfer2", "--memory-budget", "64M"
    ) as srv:
        c = srv.client()
        before = scrape(srv)
        usages, timings = [], []  # per generation request: usage and the engine's pi2_timings
        for i, n in enumerate((8, 5)):
            msgs = [{"role": "user", "content": f"Count to {i + 3}."}]
            r = c.chat.completions.create(model="m", messages=msgs, max_tokens=n, temperature=0)
            usages.append(r.usage)
            timings.append(r.model_extra["pi2_timings"])
        for n in (6, 9):
            chunks = list(c.chat.completions.create(model="m", messages=CHAT, max_tokens=n, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}))  # fmt: skip
            usages.append(chunks[-1].usage)
            timings.append(chunks[-1].model_extra["pi2_timings"])
        r = c.completions.create(
            model="m", prompt="The quick brown fox", max_tokens=7, temperature=0.8, seed=3
        )
        usages.append(r.usage)
        timings.append(r.model_extra["pi2_timings"])
        chunks = list(
            c.completions.create(model="m", prompt="Once upon", max_tokens=4, temperature=0, stream=True)
        )
        usages.append(chunks[-1].usage)
        timings.append(chunks[-1].model_extra["pi2_timings"])
        assert srv.post("/v1/chat/completions", json.dumps({"messages": CHAT, "frobnicate": 1}))[0] == 400
        assert srv.get("/v1/embeddings")[0] == 404
        after = scrape(srv)

    def d(name, **labels):
        return delta(before, after, name, **labels)

    assert d("pi2_requests_total", endpoint="/v1/chat/completions", code="2xx") == 4
    assert d("pi2_requests_total", endpoint="/v1/chat/completions", code="4xx") == 1
    assert d("pi2_requests_total", endpoint="/v1/completions", code="2xx") == 2
    assert d("pi2_requests_total", endpoint="other", code="4xx") == 1
    # `before` (a scrape is counted after its text is written, so not in its own text)
    assert d("pi2_requests_total", endpoint="/metrics", code="2xx") == 1
    assert d("pi2_prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert d("pi2_generated_tokens_total") == sum(u.completion_tokens for u in usages) > 0
    assert d("pi2_prompt_tokens_cached_total") == sum(t["n_cached"] for t in timings) > 0  # CHAT repeated
    assert all(u.completion_tokens > 0 for u in usages)
    assert d("pi2_time_to_first_token_seconds_count") == len(usages)
    assert d("pi2_time_between_tokens_seconds_count") == sum(u.completion_tokens - 1 for u in usages)
    assert d("pi2_queue_wait_seconds_count") == len(usages)
    # the same clock as the replies' timings: TTFT, and the gaps of a request add up to its decode time
    assert d("pi2_time_to_first_token_seconds_sum") == pytest.approx(
        sum(t["ttft_ms"] for t in timings) / 1e3, abs=1e-5
    )
    assert d("pi2_time_between_tokens_seconds_sum") == pytest.approx(
        sum(t["decode_ms"] for t in timings) / 1e3, abs=1e-5
    )
    for name in (
        "pi2_requests_rejected_total",
        "pi2_requests_cancelled_total",
        "pi2_requests_timed_out_total",
    ):
        assert sum(v for k, v in after.items() if k[0] == name) == 0
    assert val(after, "pi2_requests_computing") == 0 and val(after, "pi2_queue_length") == 0
    assert val(after, "pi2_requests_in_flight") >= 1  # the scrape itself
    assert val(after, "pi2_peak_rss_bytes") >= max(t["peak_rss_bytes"] for t in timings) > 0
    # the sparse engine's counters, as its summary reports them
    lookups = {
        (k[1][0][1], k[1][1][1]): v for k, v in after.items() if k[0] == "pi2_sparse_cache_lookups_total"
    }
    assert len(lookups) == 4
    assert sum(d("pi2_sparse_cache_lookups_total", region=r, result="hit") for r in ("hot", "cold")) > 0
    hits = sum(v for (_, result), v in lookups.items() if result == "hit")
    assert val(after, "pi2_sparse_cache_hit_rate") == pytest.approx(hits / sum(lookups.values()))
    assert (
        val(after, "pi2_sparse_storage_bytes_read_total") > 0
        and val(after, "pi2_sparse_storage_reads_total") > 0
    )


@pytest.mark.slow
def test_metrics_count_rejections_and_cancellations(tiny_model):
    """20 ms a token (PI2_TEST_DELAY_US), one waiting place: a client that leaves mid-stream, one that
    leaves the queue, and one refused 503, each counted; tokens and time gaps still tally."""
    with serve(tiny_model, "--max-queue", "1", env={"PI2_TEST_DELAY_US": "20000"}) as srv:
        before = scrape(srv)
        body = json.dumps(
            {"prompt": "Tell me a long story", "max_tokens": 200, "temperature": 0, "stream": True}
        )
        head = f"POST /v1/completions HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        with socket.create_connection((HOST, srv.port), timeout=20) as s:
            s.sendall(head + body.encode())
            got = b""
            while got.count(b"data: ") < 3:  # the role chunk and two tokens, then leave
                got += s.recv(4096)
        _wait(lambda: srv.get("/health")[1]["busy"] == 0)

        results = {}
        long = json.dumps({"prompt": "x", "max_tokens": 40, "temperature": 0})

        def run(i):
            results[i] = srv.post("/v1/completions", long)

        first = threading.Thread(target=run, args=(0,))
        first.start()
        _wait(lambda: srv.get("/health")[1]["busy"] == 1)
        with socket.create_connection((HOST, srv.port), timeout=20) as s:  # waits, then gives up
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nContent-Length: {len(long)}\r\n\r\n{long}".encode())
            _wait(lambda: srv.get("/health")[1]["waiting"] == 1)
        _wait(lambda: srv.get("/health")[1]["waiting"] == 0)
        second = threading.Thread(target=run, args=(1,))
        second.start()
        _wait(lambda: srv.get("/health")[1]["waiting"] == 1)
        refused = srv.raw(f"POST /v1/completions HTTP/1.1\r\nContent-Length: {len(long)}\r\n\r\n{long}".encode(),
                          shut=False)  # fmt: skip
        assert parse(refused)[0] == 503
        first.join(60)
        second.join(60)
        assert results[0][0] == 200 and results[1][0] == 200
        after = scrape(srv)

    def d(name, **labels):
        return delta(before, after, name, **labels)

    assert d("pi2_requests_cancelled_total", stage="generating") == 1
    assert d("pi2_requests_cancelled_total", stage="waiting") == 1
    assert d("pi2_requests_rejected_total", reason="queue_full") == 1
    # the cancelled stream's head said 200
    assert d("pi2_requests_total", endpoint="/v1/completions", code="2xx") == 3
    assert d("pi2_requests_total", endpoint="/v1/completions", code="5xx") == 1
    assert d("pi2_requests_total", endpoint="/v1/completions", code="none") == 1
    completed = sum(r[1]["usage"]["completion_tokens"] for r in results.values())
    generated = d("pi2_generated_tokens_total")
    assert generated >= completed + 2  # the cancelled stream's tokens count too
    assert generated < completed + 200  # ... and it stopped at the next token, not at max_tokens
    assert d("pi2_time_to_first_token_seconds_count") == 3
    assert d("pi2_time_between_tokens_seconds_count") == generated - 3
    assert d("pi2_queue_wait_seconds_count") == 3
    assert d("pi2_time_between_tokens_seconds_sum") >= 0.02 * (generated - 3) * 0.9  # 20 ms a token
    assert not any(k[0].startswith("pi2_sparse_") for k in after)  # the dense policy has no neuron cache


def test_metrics_need_the_api_key(tiny_model):
    with serve(tiny_model, "--api-key", "sekrit") as srv:
        status, err = srv.get("/metrics")
        assert status == 401 and "API key" in err["error"]["message"]
        assert srv.healthy()  # /health still needs none
        m = scrape(srv, key="sekrit")
        assert val(m, "pi2_requests_total", endpoint="/metrics", code="4xx") == 1
        assert val(scrape(srv, key="sekrit"), "pi2_requests_total", endpoint="/metrics", code="2xx") == 1


@pytest.mark.slow
def test_time_between_tokens_counts_the_end_of_generation_token(smollm2_pi2):
    """SmolLM2 ends these answers with its end-of-turn token, which has no text (the session never hands
    it to emit): the counters still see every token sampled, tokens - 1 gaps a request."""
    with serve(smollm2_pi2, "--chat-template", "chatml", "--ctx", "512") as srv:
        c = srv.client()
        tokens = []
        for q in ("Name a colour.", "Reply with the word yes."):
            msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": q}]
            r = c.chat.completions.create(model="smollm2", messages=msgs, max_tokens=40, temperature=0)
            assert r.choices[0].finish_reason == "stop"  # no stop strings: the end-of-generation token
            tokens.append(r.usage.completion_tokens)
        m = scrape(srv)
    assert val(m, "pi2_generated_tokens_total") == sum(tokens)
    assert val(m, "pi2_time_between_tokens_seconds_count") == sum(tokens) - len(tokens)
