"""pi2-engine driven over its OpenAI-compatible server, for `pi2 bench --via server`: the same streamed API
llama.cpp is benched through (llama-server), so both engines are measured the same way.

The driver starts `pi2-engine serve` on the target as `pi2 serve` does (pi2/serve.py: here inside the
run's memory cgroup; on a phone over adb under its watchdog, reached through `adb forward`) with the
settings the pipe path gives `pi2-engine chat` (policy, plan, threads, --memory-budget, context), and
each turn is one streamed POST /v1/completions of the whole conversation so far. The prompt is the one
the bench rendered with the model's chat template -- the very text every other engine gets -- rather
than chat messages the server would render with its own template kind (which leaves out a template's
extras, such as SmolLM2's default system line); the server reuses the longest token prefix it holds
(its prompt cache: the previous prompt and answer), so a turn prefills the new message.

Timing comes from the stream's `pi2_timings` (docs/ENGINE.md, serve), taken on the engine's monotonic
clock, never from when chunks arrive here: every sampled token has a chunk with its `t_ns` and the count
`n_gen` so far (a chunk that carries several tokens, from a build before that, spreads its gap evenly
over them, as `pi2 bench --mode load` does); TTFT, the rates and the prompt cache's hit are the last
chunk's. Run-level counters (peak RSS, bytes read, the sparse cache's hits) are read from GET /metrics
right before the server is stopped.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time

from pi2cli.engines.base import TurnFailed, TurnMetrics
from pi2cli.engines.llmflash.driver import LlmFlashDriver
from pi2cli.engines.pi2.driver import Pi2Driver
from pi2cli.engines.pi2.serve import LOOPBACK, DeviceServer, LocalServer
from pi2cli.engines.sse import iter_sse
from pi2cli.errors import Pi2Error
from pi2cli.results.schema import PEAK_RSS_BEFORE_STOP
from pi2cli.targets.base import TargetError

HOW = (
    "pi2-engine serve (streamed POST /v1/completions of the whole conversation, rendered by the host as for "
    "every engine; the server reuses its cached token prefix): TTFT from the request taking the compute "
    "slot to its first sampled token, TBT = differences of the per-token pi2_timings.t_ns (monotonic "
    "clock where the engine runs); peak RSS = the engine's VmHWM from GET /metrics right before stop"
)
DEVICE_HOW = (
    "; on the device: pi2-engine serve on its 127.0.0.1 (adb shell, watchdog), reached through adb forward"
)
START_TIMEOUT_S = 600.0  # loading a large model on a phone
TURN_TIMEOUT_S = 3600.0  # as the pipe's: an engine that hangs fails the run, nothing waits forever


def token_times_ns(stamps: list[tuple[int, int]]) -> list[float]:
    """Each token's time on the engine's clock from the chunks' (t_ns, n_gen): a chunk that carries k > 1
    new tokens spreads its gap evenly over them; chunks with no new token are skipped."""
    out: list[float] = []
    prev: tuple[int, int] | None = None
    for t, n in stamps:
        if prev is None:
            out.append(float(t))
            prev = (t, n)
            continue
        k = n - prev[1]
        if k <= 0 or t < prev[0]:
            continue
        out += [prev[0] + (t - prev[0]) * i / k for i in range(1, k + 1)]
        prev = (t, n)
    return out


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample as written (name{labels}): value}; comments and junk skipped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "}" in line:  # name{label="v",...} value
            head, _, rest = line.rpartition("}")
            key = head + "}"
        else:  # name value
            key, _, rest = line.partition(" ")
        with contextlib.suppress(ValueError, IndexError):
            out[key.strip()] = float(rest.split()[0])
    return out


def metrics_counters(samples: dict[str, float]) -> dict:
    """The run's counters, as the pipe's summary names them (pi2/events.py summary_counters), from /metrics."""

    def total(prefix: str, *labels: str) -> float | None:
        vals = [v for k, v in samples.items() if k.split("{")[0] == prefix and all(lb in k for lb in labels)]
        return sum(vals) if vals else None

    out: dict = {}
    for name, key in (("pi2_peak_rss_bytes", "peak_rss_bytes"), ("pi2_process_read_bytes_total", "bytes_read"),
                      ("pi2_sparse_storage_bytes_read_total", "storage_bytes_read"),
                      ("pi2_sparse_storage_reads_total", "storage_reads")):  # fmt: skip
        v = total(name)
        if v is not None:
            out[key] = int(v)
    hits = total("pi2_sparse_cache_lookups_total", 'result="hit"')
    misses = total("pi2_sparse_cache_lookups_total", 'result="miss"')
    if hits is not None and misses is not None:
        out["cache_hits"], out["cache_misses"] = int(hits), int(misses)
    for name, key in (
        ("pi2_sparse_cache_hit_rate", "hit_rate"),
        ("pi2_sparse_io_wait_seconds_total", "io_wait_s"),
    ):
        v = total(name)
        if v is not None:
            out[key] = v
    return out


class ServerChatSession:
    """A running `pi2-engine serve` (pi2/serve.py's LocalServer or DeviceServer) that the bench sends turns to."""

    def __init__(self, server, port: int, pid: int | None, *, seed: int = 0, temperature: float = 0.0,
                 turn_timeout_s: float = TURN_TIMEOUT_S):  # fmt: skip
        self.server, self.port, self.pid = server, port, pid
        self.seed, self.temperature, self.turn_timeout_s = seed, temperature, turn_timeout_s
        self.turn_peak = 0

    # -- what went wrong
    def _down(self, wait_s: float = 0.0) -> Exception | None:
        """Why the server cannot answer (TargetError: the device is gone), None while it is up. A broken
        stream can come a moment before the process's exit is seen: wait_s gives it that moment."""
        deadline = time.monotonic() + wait_s
        while True:
            lost = getattr(self.server.proc, "error", None)
            if lost:
                return TargetError(lost)
            why = self.server.down()
            if why:
                return Pi2Error(why)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _broken(self, what: str) -> Exception:
        down = self._down(wait_s=3.0)
        if down is not None:
            return down
        return Pi2Error(f"pi2-engine serve (still running): {what}")

    def _request(self, method: str, path: str, body: dict | None = None, timeout: float = 30.0):
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=timeout)
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=data, headers=headers)
        return conn, conn.getresponse()

    # -- the bench's session interface (pi2cli.engines.base.ChatSession)
    def turn(self, prompt: str, n_predict: int, *, ignore_eos: bool = True, on_text=None,
             messages: list[dict] | None = None) -> TurnMetrics:  # fmt: skip
        """One streamed completion of the whole conversation; `messages` is unused (the prompt is the
        bench's own rendering of them)."""
        down = self._down()
        if down is not None:
            raise down
        body = {"prompt": prompt, "max_tokens": int(n_predict), "temperature": self.temperature,
                "seed": int(self.seed), "stream": True}  # fmt: skip
        if ignore_eos:  # llama-server's extension, which pi2-engine serve takes too
            body["ignore_eos"] = True
        sent = time.monotonic()
        conn = None
        try:
            conn, resp = self._request("POST", "/v1/completions", body, timeout=self.turn_timeout_s)
            if resp.status != 200:
                raise TurnFailed(f"pi2-engine serve answered {resp.status}: {error_text(resp.read(1 << 16))}")
            return self._read_stream(resp, sent, on_text)
        except TimeoutError:
            raise Pi2Error(f"pi2-engine serve gave no answer within {self.turn_timeout_s:.0f} s") from None
        except (OSError, http.client.HTTPException) as exc:
            raise self._broken(f"the request failed: {exc}") from None
        finally:
            if conn is not None:
                conn.close()

    def _read_stream(self, resp, sent: float, on_text) -> TurnMetrics:
        pieces: list[str] = []
        stamps: list[tuple[int, int]] = []
        first_arrival = None
        final = usage = finish = None
        try:
            for chunk in iter_sse(resp):
                if "error" in chunk:  # a pass failed part-way: the server said so and serves on
                    err = chunk["error"]
                    raise TurnFailed(
                        f"pi2-engine serve: {err.get('message') if isinstance(err, dict) else err}"
                    )
                choice = (chunk.get("choices") or [{}])[0]
                timings = chunk.get("pi2_timings")
                text = choice.get("text") or ""
                if text:
                    pieces.append(text)
                    if on_text:
                        on_text(text)
                if choice.get("finish_reason"):
                    final, usage, finish = timings or {}, chunk.get("usage") or {}, choice["finish_reason"]
                elif isinstance(timings, dict) and isinstance(timings.get("t_ns"), int):
                    stamps.append((timings["t_ns"], int(timings.get("n_gen") or 0)))
                    if first_arrival is None:
                        first_arrival = time.monotonic()
        except (ValueError, AttributeError) as exc:  # not JSON, not the shape of a chunk
            raise Pi2Error(f"pi2-engine serve sent a malformed stream chunk: {exc}") from None
        if final is None:
            raise self._broken("the stream ended before the turn's last chunk")
        ttft_s = float(final.get("ttft_ms") or 0) / 1e3
        times = token_times_ns(stamps)
        n_prompt, n_cached = int(usage.get("prompt_tokens") or 0), int(final.get("n_cached") or 0)
        peak = int(final.get("peak_rss_bytes") or 0)
        self.turn_peak = max(self.turn_peak, peak)
        timings = {"prefill_s": float(final.get("prefill_ms") or 0) / 1e3,
                   "decode_s": float(final.get("decode_ms") or 0) / 1e3,
                   "queue_ms": final.get("queue_ms"), "peak_rss_bytes": peak or None}  # fmt: skip
        return TurnMetrics(
            text="".join(pieces),
            token_ids=[],  # the API streams text; the count is usage's
            n_prompt=n_prompt,
            n_prompt_cached=n_cached,
            n_prompt_processed=n_prompt - n_cached,
            ttft_s=ttft_s,
            token_times_s=[(t - times[0]) / 1e9 + ttft_s for t in times],
            prefill_tps=float(final.get("prefill_tps") or 0),
            decode_tps=float(final.get("decode_tps") or 0),
            host_decode_tps=0.0,
            stop_type=str(finish),
            timings=timings,
            n_gen=int(usage.get("completion_tokens") or len(times)),
            clock="engine",
            host_ttft_s=None if first_arrival is None else first_arrival - sent,
        )

    def metrics(self) -> dict:
        """The server's run-level counters from GET /metrics ({} when it cannot be read)."""
        conn = None
        try:
            conn, resp = self._request("GET", "/metrics", timeout=30.0)
            if resp.status != 200:
                return {}
            return metrics_counters(parse_metrics(resp.read(1 << 22).decode("utf-8", errors="replace")))
        except (OSError, http.client.HTTPException):
            return {}
        finally:
            if conn is not None:
                conn.close()

    def close(self) -> dict:
        """Read the counters, then stop the server (on a device: the forward removed, the pid checked gone)."""
        down = self._down()
        counters = {} if down else self.metrics()
        self.server.stop()
        if down is not None:
            raise down
        peak = max(int(counters.get("peak_rss_bytes") or 0), self.turn_peak)
        counters["peak_rss_bytes"] = peak or None
        counters["peak_rss_source"] = PEAK_RSS_BEFORE_STOP if peak else None
        return counters

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.server.stop()


def error_text(data: bytes) -> str:
    """The message of an OpenAI-shaped error body, one line."""
    text = data.decode("utf-8", errors="replace")
    with contextlib.suppress(ValueError, AttributeError):
        text = str(json.loads(text)["error"]["message"])
    return " ".join(text.split())[:300] or "(no body)"


# ------------------------------------------------------------------------------------------ drivers
class ServerVia:
    """What makes a pi2-engine driver (pi2, llmflash) run its engine as `pi2-engine serve`: the same
    policy, plan, threads, budget and context as its pipe twin, one HTTP request per turn. Mixed in
    before the driver class, so everything else (configure, engine_info, push) is the driver's own."""

    via = "server"

    def configure(self, target, model_local) -> None:
        super().configure(target, model_local)
        self.how = HOW + ("" if target.on_this_machine else DEVICE_HOW)

    def open_chat(self, target, model: str, *, binary_dir: str | None, threads: int | None, n_ctx: int | None,
                  cgroup=None, budget_bytes: int | None = None, seed: int = 0,
                  temperature: float = 0.0) -> ServerChatSession:  # fmt: skip
        from pi2cli.engines.pi2.args import sparse_flags

        binary = f"{binary_dir}/pi2-engine" if binary_dir else str(self.local_binary(target))
        argv = [binary, "serve", "-m", model, "--host", LOOPBACK, "--port", "0",
                "--request-timeout", str(int(TURN_TIMEOUT_S))]  # fmt: skip
        if n_ctx:  # the turn's max_tokens is at most the context, so the server's cap never refuses one
            argv += ["--ctx", str(int(n_ctx)), "--max-tokens", str(int(n_ctx))]
        argv += sparse_flags(threads=threads, **self.engine_options(budget_bytes, binary_dir))

        def quiet(_line: str) -> None:  # the engine's stderr: kept in the log's tail for errors only
            return None

        if target.on_this_machine:
            server = LocalServer(
                list(target.command_prefix()) + argv, None, quiet, target.name, cgroup=cgroup
            )
        else:
            server = DeviceServer(target, argv, budget_bytes, 0, quiet)
        try:
            pid, port = server.start(START_TIMEOUT_S)
        except BaseException:
            with contextlib.suppress(Exception):
                server.stop()
            raise
        host_port = port if target.on_this_machine else server.host_port
        return ServerChatSession(server, host_port, pid, seed=seed, temperature=temperature)


class Pi2ServerDriver(ServerVia, Pi2Driver):
    """pi2 through `pi2-engine serve` (`pi2 bench --via server`)."""


class LlmFlashServerDriver(ServerVia, LlmFlashDriver):
    """The llmflash baseline through `pi2-engine serve` (`pi2 bench --via server`)."""
