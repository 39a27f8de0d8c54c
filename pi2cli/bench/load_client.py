"""One streamed chat completion against any OpenAI-compatible server, timed on arrival, for `--mode load`.

The stdlib's http.client, as the llama-server and MLC drivers use it, so the load mode needs nothing
more installed and sees exactly what came back: the status line, Retry-After, and every server-sent
event stamped with this machine's monotonic clock as it arrives. Where the chunks carry the engine's own
clock (pi2-engine serve's `pi2_timings`: docs/ENGINE.md), those stamps are kept beside ours.

Every attempt ends as one Attempt with an outcome, never an exception:
  ok        the stream ended with a finish_reason (or [DONE] after text)
  rejected  HTTP 503 or 429: the server's queue is full; `retry_after_s` is its Retry-After
  timeout   no byte within the request timeout, or the server ended it at its own request timeout
  failed    anything else (another HTTP status, an error event, a stream cut short), with the reason
  fatal     the server cannot be used at all (nothing listens, 401/403/404): the load stops
  cancelled the load was stopped (Ctrl-C) while this request was in flight: not counted as a failure
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pi2cli.errors import Pi2Error

FATAL_STATUSES = (401, 403, 404, 405)  # every later request would be answered the same: stop the load
REJECT_STATUSES = (503, 429)  # a full queue: counted as a rejection and retried after Retry-After


@dataclass
class Endpoint:
    """Where the server is: scheme, host, port and the path prefix before /v1/... (a URL given as
    http://host:port, http://host:port/ or http://host:port/v1 all mean the same server)."""

    url: str
    https: bool
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Pi2Error(f"--url {url!r}: give the server's address, e.g. http://127.0.0.1:8080")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise Pi2Error(f"--url {url!r}: the port is not a number from 1 to 65535") from None
        prefix = parts.path.rstrip("/")
        if prefix.endswith("/v1"):
            prefix = prefix[:-3]
        return cls(url.strip(), parts.scheme == "https", parts.hostname, port, prefix)

    @property
    def loopback(self) -> bool:
        return self.host in ("localhost", "::1") or self.host.startswith("127.")

    def connect(self, timeout_s: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout_s)


def headers(api_key: str | None) -> dict:
    out = {"Content-Type": "application/json"}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def get_json(ep: Endpoint, path: str, api_key: str | None, timeout_s: float = 10.0) -> dict:
    """One GET (the probe before any load: /v1/models). Any failure is one Pi2Error line naming the URL."""
    conn = ep.connect(timeout_s)
    try:
        conn.request("GET", ep.prefix + path, headers=headers(api_key))
        resp = conn.getresponse()
        data = resp.read(1 << 20)
    except (OSError, http.client.HTTPException) as err:
        raise Pi2Error(f"nothing answers at {ep.url}: {describe_error(err)}") from None
    finally:
        conn.close()
    if resp.status != 200:
        raise Pi2Error(f"{ep.url}{path} answered HTTP {resp.status}: {error_message(data)}")
    try:
        body = json.loads(data)
    except ValueError:
        raise Pi2Error(f"{ep.url}{path} did not answer JSON: is this an OpenAI-compatible server?") from None
    if not isinstance(body, dict):
        raise Pi2Error(f"{ep.url}{path} answered {type(body).__name__}, not an object")
    return body


def describe_error(err: BaseException) -> str:
    if isinstance(err, ConnectionRefusedError):
        return "connection refused (is the server running?)"
    if isinstance(err, TimeoutError | socket.timeout):
        return "timed out"
    return " ".join(str(err).split()) or type(err).__name__


def error_message(data: bytes) -> str:
    """The message of an OpenAI-shaped error body, else the start of the body, one line."""
    text = data.decode("utf-8", errors="replace")
    try:
        body = json.loads(text)
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            text = str(body["error"].get("message") or body["error"])
        elif isinstance(body, dict) and isinstance(body.get("error"), str):
            text = body["error"]
    except ValueError:
        pass
    return " ".join(text.split())[:200] or "(no body)"


@dataclass
class Attempt:
    """One request as the client saw it. Times are seconds on this machine's monotonic clock."""

    outcome: str = "failed"
    reason: str | None = None
    status: int | None = None
    retry_after_s: float | None = None
    sent_s: float = 0.0
    ended_s: float = 0.0
    arrivals_s: list[float] = field(default_factory=list)  # one per chunk with text
    engine_ns: list[tuple[int, int]] = field(default_factory=list)  # (pi2_timings.t_ns, n_gen) per such chunk
    text: str = ""
    finish_reason: str | None = None
    usage: dict | None = None
    final_timings: dict | None = None  # the last chunk's pi2_timings (the turn's)


class InFlight:
    """The connections open now, so a stop (Ctrl-C, a fatal answer) can shut them and no worker waits out
    its socket timeout on a server that is still generating."""

    def __init__(self):
        self._lock = threading.Lock()
        self._socks: set = set()
        self.stopping = threading.Event()

    def add(self, conn) -> None:
        with self._lock:
            if conn.sock is not None:
                self._socks.add(conn.sock)

    def discard(self, conn) -> None:
        with self._lock:
            self._socks.discard(conn.sock)

    def stop_all(self) -> None:
        self.stopping.set()
        with self._lock:
            for sock in list(self._socks):
                with contextlib.suppress(OSError):  # already closed by its worker
                    sock.shutdown(socket.SHUT_RDWR)


def stream_chat(
    ep: Endpoint, body: dict, api_key: str | None, timeout_s: float, inflight: InFlight
) -> Attempt:
    """POST /v1/chat/completions with stream on; every chunk with text stamped as it arrives."""
    a = Attempt()
    payload = json.dumps(dict(body, stream=True, stream_options={"include_usage": True}))
    conn = ep.connect(timeout_s)
    a.sent_s = time.monotonic()
    deadline = a.sent_s + timeout_s
    try:
        conn.connect()
        inflight.add(conn)
        conn.request("POST", ep.prefix + "/v1/chat/completions", body=payload, headers=headers(api_key))
        resp = conn.getresponse()
        a.status = resp.status
        if resp.status != 200:
            return _refused(a, resp)
        done = False
        while not done:
            line = resp.readline(1 << 20)
            if not line:
                break
            now = time.monotonic()
            if now > deadline:  # a server trickling bytes: the socket timeout alone would never fire
                a.outcome = "timeout"
                a.reason = f"no complete answer within --request-timeout {timeout_s:g} s"
                return a
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                a.reason = f"a stream chunk is not JSON: {data[:80]!r}"
                return a
            done = _take_chunk(a, chunk, now)
            if a.reason:  # an error event
                return a
    except (OSError, http.client.HTTPException) as err:
        a.ended_s = time.monotonic()
        if inflight.stopping.is_set():
            a.outcome, a.reason = "cancelled", "the load was stopped"
        elif isinstance(err, TimeoutError | socket.timeout):
            a.outcome, a.reason = "timeout", f"no byte for --request-timeout {timeout_s:g} s"
        elif isinstance(err, ConnectionRefusedError):
            a.outcome, a.reason = "fatal", f"nothing answers at {ep.url}: {describe_error(err)}"
        else:
            a.reason = f"connection lost: {describe_error(err)}"
        return a
    finally:
        inflight.discard(conn)
        conn.close()
    a.ended_s = time.monotonic()
    if inflight.stopping.is_set() and a.finish_reason is None:
        a.outcome, a.reason = "cancelled", "the load was stopped"
    elif a.finish_reason is None and not (done and a.arrivals_s):
        a.reason = "the stream ended before its last chunk (no finish_reason)"
    elif (a.final_timings or {}).get("timed_out") is True:
        a.outcome = "timeout"
        a.reason = f"the server's request timeout ended it after {len(a.arrivals_s)} chunks"
    else:
        a.outcome = "ok"
    return a


def _refused(a: Attempt, resp) -> Attempt:
    data = resp.read(1 << 16)
    message = error_message(data)
    a.ended_s = time.monotonic()
    if resp.status in REJECT_STATUSES:
        a.outcome = "rejected"
        value = resp.getheader("Retry-After")
        try:
            a.retry_after_s = max(0.0, float(value)) if value is not None else None
        except ValueError:
            a.retry_after_s = None  # an HTTP date or junk: counted, waited as if absent
        a.reason = f"HTTP {resp.status}: {message}"
    else:
        a.outcome = "fatal" if resp.status in FATAL_STATUSES else "failed"
        a.reason = f"HTTP {resp.status}: {message}"
    return a


def _take_chunk(a: Attempt, chunk, now: float) -> bool:
    """Fold one chunk into the attempt; True when it was the last (a finish_reason arrived and, if the
    server sends usage in a chunk of its own after it, that too)."""
    if not isinstance(chunk, dict):
        a.reason = "a stream chunk is not a JSON object"
        return True
    if "error" in chunk:
        err = chunk["error"]
        message = err.get("message") if isinstance(err, dict) else err
        a.reason = "server error: " + " ".join(str(message).split())[:200]
        return True
    timings = chunk.get("pi2_timings") if isinstance(chunk.get("pi2_timings"), dict) else None
    if isinstance(chunk.get("usage"), dict):
        a.usage = chunk["usage"]
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        content = (choice.get("delta") or {}).get("content")
        if content:
            a.text += content
            a.arrivals_s.append(now)
            if timings and isinstance(timings.get("t_ns"), int) and isinstance(timings.get("n_gen"), int):
                a.engine_ns.append((timings["t_ns"], timings["n_gen"]))
        if choice.get("finish_reason"):
            a.finish_reason = choice["finish_reason"]
            if timings:
                a.final_timings = timings
    # OpenAI sends usage in a chunk of its own (empty choices) after the finish_reason; pi2 and
    # llama-server put it in the last chunk. Either way [DONE] (or the end of the stream) follows.
    return False


def get_metrics(ep: Endpoint, api_key: str | None, timeout_s: float = 5.0) -> dict[str, float] | None:
    """The server's counters from GET /metrics (Prometheus text: pi2-engine serve, llama-server with
    --metrics), as {sample with its labels: value}; None when it has no such page or it cannot be read
    (many servers have none: that is no error)."""
    conn = ep.connect(timeout_s)
    try:
        conn.request("GET", ep.prefix + "/metrics", headers=headers(api_key))
        resp = conn.getresponse()
        data = resp.read(1 << 22)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    if resp.status != 200:
        return None
    return parse_counters(data.decode("utf-8", errors="replace")) or None  # not Prometheus text: none


def parse_counters(text: str) -> dict[str, float]:
    """Every sample of the families `# TYPE NAME counter` declares (NAME, or NAME_total as OpenMetrics
    names a counter's sample), keyed by the sample as written before its value (labels included)."""
    counters: set[str] = set()
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[:2] == ["#", "TYPE"] and parts[3] == "counter":
            counters.add(parts[2])
            continue
        if not parts or line.startswith("#"):
            continue
        if "}" in line:  # name{label="v",...} value [timestamp]
            head, _, rest = line.rpartition("}")
            key = head + "}"
        else:  # name value [timestamp]
            key, _, rest = line.partition(" ")
        name = key.split("{", 1)[0]
        if name not in counters and name.removesuffix("_total") not in counters:
            continue
        try:
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            continue
        if value == value and abs(value) != float("inf"):  # a NaN or an infinity is no count
            out[key] = value
    return out


def counter_deltas(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float] | None:
    """What each counter rose by over the load (a series first seen after it started counts from 0)."""
    if before is None or after is None:
        return None
    deltas = {}
    for key, value in after.items():
        d = value - before.get(key, 0.0)
        deltas[key] = int(d) if float(d).is_integer() else round(d, 6)
    return deltas
