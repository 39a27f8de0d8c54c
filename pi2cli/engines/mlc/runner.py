"""The MLC-LLM baseline driver, against a runner the user provides (see docs/MLC.md).

MLC-LLM compiles each model into a device-specific library with TVM; pi2 cannot build that for you.
So the driver (driver.py) talks to a runner you set up, named by $PI2_MLC_RUNNER (or --mlc-runner):

  * a URL, e.g. http://127.0.0.1:8000: a running `mlc_llm serve MODEL --model-lib LIB` (on this
    machine, or a phone's port forwarded with `adb forward tcp:8000 tcp:8000`). The driver streams
    POST /v1/chat/completions with stream_options.include_usage, stamps every streamed chunk on the
    host, and reads MLC's own figures from the final chunk's usage.extra: prefill_tokens_per_s,
    decode_tokens_per_s, ttft_s, inter_token_latency_s (and prompt/completion token counts).
  * a command, e.g. "adb shell /data/local/tmp/mlc-run" or "python my_mlc_runner.py": run once per
    request with the request as one JSON object on stdin ({"model", "messages", "max_tokens",
    "temperature", "seed"}). It prints the generated text, then its stats in one of the formats
    MLC's tools print: a JSON object with a "usage" key (the OpenAI usage object with "extra"), a
    bare usage.extra object, or MLC chat's stats line "prefill: X tok/s, decode: Y tok/s".

The figures are MLC's own (the runner measures them); the result's `how` says which format they came
from and, in URL mode, that TTFT and per-token times were also stamped on the host.
"""

import contextlib
import errno
import http.client
import json
import os
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from pi2cli.engines.sse import iter_sse
from pi2cli.errors import Pi2Error

RUNNER_ENV = "PI2_MLC_RUNNER"
STATS_LINE = re.compile(
    r"prefill:\s*(?P<prefill>[0-9.]+)\s*tok/s,\s*decode:\s*(?P<decode>[0-9.]+)\s*tok/s", re.IGNORECASE
)
EXTRA_KEYS = ("prefill_tokens_per_s", "decode_tokens_per_s", "ttft_s", "inter_token_latency_s")


@dataclass
class MlcStats:
    """MLC's figures for one request, however the runner reported them."""

    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    ttft_s: float | None = None
    inter_token_latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    source: str = ""  # "usage.extra" or "stats line"
    raw: dict = field(default_factory=dict)


def stats_from_usage(usage: dict) -> MlcStats:
    """From an OpenAI usage object with MLC's `extra` (or a bare extra object)."""
    extra = usage.get("extra") if isinstance(usage.get("extra"), dict) else usage
    if not any(k in extra for k in EXTRA_KEYS):
        raise Pi2Error(f"MLC usage has none of {', '.join(EXTRA_KEYS)}: {json.dumps(usage)[:200]}")

    def num(key):
        value = extra.get(key)
        return float(value) if isinstance(value, int | float) else None

    def count(key):
        value = usage.get(key, extra.get(key))
        return int(value) if isinstance(value, int | float) else None

    return MlcStats(
        prefill_tps=num("prefill_tokens_per_s") or 0.0,
        decode_tps=num("decode_tokens_per_s") or 0.0,
        ttft_s=num("ttft_s"),
        inter_token_latency_s=num("inter_token_latency_s"),
        prompt_tokens=count("prompt_tokens"),
        completion_tokens=count("completion_tokens"),
        source="usage.extra",
        raw=usage,
    )


def parse_runner_output(stdout: str) -> tuple[str, MlcStats]:
    """Split a command runner's stdout into (generated text, stats).

    Stats are the last line that is a JSON object with a usage (or usage.extra) in it, or the last
    "prefill: X tok/s, decode: Y tok/s" line; those lines are not part of the text.
    """
    text_lines: list[str] = []
    stats: MlcStats | None = None
    for line in stdout.splitlines():
        stripped = line.strip()
        if stripped.startswith("{") and stripped.endswith("}"):
            try:
                obj = json.loads(stripped)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else obj
                if isinstance(usage.get("extra"), dict) or any(k in usage for k in EXTRA_KEYS):
                    stats = stats_from_usage(usage)
                    continue
        if m := STATS_LINE.search(stripped):
            stats = MlcStats(
                prefill_tps=float(m.group("prefill")),
                decode_tps=float(m.group("decode")),
                source="stats line",
                raw={"line": stripped},
            )
            continue
        text_lines.append(line)
    if stats is None:
        raise Pi2Error(
            "the MLC runner printed no stats: expected a usage JSON line or "
            "'prefill: X tok/s, decode: Y tok/s' (see docs/MLC.md)"
        )
    return "\n".join(text_lines).strip("\n"), stats


@dataclass
class StreamOutcome:
    text: str
    chunk_times_s: list[float]  # host arrival time of every chunk carrying text, from request sent
    stats: MlcStats
    finish_reason: str


def parse_chat_stream(events: list[tuple[float, dict]]) -> StreamOutcome:
    """Fold (arrival time, chunk) pairs of a streamed /v1/chat/completions into text, times, stats."""
    pieces: list[str] = []
    times: list[float] = []
    usage: dict | None = None
    finish = ""
    for at, chunk in events:
        if "error" in chunk:
            raise Pi2Error(f"MLC server error: {json.dumps(chunk['error'])[:300]}")
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                pieces.append(content)
                times.append(at)
            finish = choice.get("finish_reason") or finish
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
    if usage is None:
        raise Pi2Error(
            "the MLC server sent no usage: it must support stream_options.include_usage (mlc_llm serve)"
        )
    return StreamOutcome("".join(pieces), times, stats_from_usage(usage), finish)


def stream_chat(url: str, body: dict, timeout_s: float) -> StreamOutcome:
    """One streamed POST /v1/chat/completions to an `mlc_llm serve` URL; every chunk stamped on arrival."""
    parsed = urlparse(url)
    conn_cls = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parsed.hostname, parsed.port, timeout=timeout_s)
    payload = dict(body, stream=True, stream_options={"include_usage": True})
    events: list[tuple[float, dict]] = []
    try:
        sent = time.monotonic()
        conn.request(
            "POST",
            parsed.path.rstrip("/") + "/v1/chat/completions",
            body=json.dumps(payload),
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        if resp.status != 200:
            raise Pi2Error(f"MLC server answered {resp.status}: {resp.read().decode(errors='replace')[:300]}")
        for chunk in iter_sse(resp):
            events.append((time.monotonic() - sent, chunk))
    except (OSError, http.client.HTTPException) as err:
        raise Pi2Error(f"cannot reach the MLC server at {url}: {err}") from err
    finally:
        conn.close()
    return parse_chat_stream(events)


def resolve_runner(runner: str | None = None) -> str:
    value = runner or os.environ.get(RUNNER_ENV, "")
    if not value.strip():
        raise Pi2Error(
            f"MLC-LLM needs a runner and none is configured: set {RUNNER_ENV} to the URL of a running "
            "`mlc_llm serve MODEL --model-lib LIB` (e.g. http://127.0.0.1:8000) or to a command that "
            "takes a JSON request on stdin and prints text plus MLC stats (see docs/MLC.md)"
        )
    return value.strip()


@dataclass
class RunnerRun:
    stdout: str
    wall_s: float
    # the runner's peak RSS, the kernel's ru_maxrss through pi2-rusage (pi2cli.hw.rusage): the runner's own
    # or that of any child it waited for, whichever was higher
    peak_rss_bytes: int


def run_command_runner(runner: str, body: dict, timeout_s: float, popen=None) -> RunnerRun:
    """Run a command runner once: the request as one JSON object on stdin, its stdout back.
    popen: how to start it (pi2cli.hw.cgroup.Budget.popen to run it inside a memory budget). It runs
    under pi2-rusage, so its peak RSS is the kernel's figure however short the run."""
    from pi2cli.hw.rusage import Measured

    cmd = shlex.split(runner)
    if not cmd or (os.sep in cmd[0] and not Path(cmd[0]).exists()):
        raise Pi2Error(f"the MLC runner command does not exist: {cmd[0] if cmd else runner!r}")
    with Measured(cmd) as measured:
        started = time.monotonic()
        proc = (popen or subprocess.Popen)(measured.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        out: list[str] = []
        err: list[str] = []
        threads = [threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True),
                   threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)]  # fmt: skip
        for t in threads:
            t.start()
        try:
            with contextlib.suppress(BrokenPipeError):  # a runner may exit without reading its request
                proc.stdin.write(json.dumps(body))
                proc.stdin.close()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                raise Pi2Error(f"the MLC runner took longer than {timeout_s:.0f} s") from None
        except BaseException:  # timeout, Ctrl-C: never leave the runner behind (pi2-rusage's group)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)
            with contextlib.suppress(ChildProcessError):
                proc.wait()
            raise
        for t in threads:
            t.join(10)
        wall = time.monotonic() - started
        usage = measured.usage()
    if usage.exec_errno == errno.ENOENT:
        raise Pi2Error(f"the MLC runner command was not found: {cmd[0]}")
    if usage.exec_errno:
        raise Pi2Error(f"the MLC runner command cannot be run: {cmd[0]} ({os.strerror(usage.exec_errno)})")
    if usage.returncode != 0:
        tail = " | ".join("".join(err).strip().splitlines()[-3:])[-300:]
        raise Pi2Error(f"the MLC runner failed with code {usage.returncode}: {tail}")
    return RunnerRun("".join(out), wall, usage.maxrss_bytes)
