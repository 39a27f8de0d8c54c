"""The llama.cpp baseline driver: llama-server on a loopback port, driven through its streaming API.

How it measures (also stored in every result's `how`):
  * The server (llama.cpp's own `llama-server`, built by pi2cli.builds.baselines.llamacpp_build) loads the GGUF
    once with `--load-mode mmap --no-repack`: weights stay file-backed, so a memory budget (cgroup, see
    pi2cli.hw.cgroup) really makes it page from storage. CPU repacking would copy the weights into
    anonymous memory and defeat that; pass repack=True to measure llama.cpp at its fastest instead.
  * One request = POST /completion with stream=true, return_tokens=true, cache_prompt=true and
    timings_per_token=true. Token times are the server's own clock where it runs (device_token_times):
    every streamed token carries the slot's timings as they were when the token was sampled, so
    prompt_ms + predicted_ms is the time from the slot starting the request to that token
    (ggml_time_us, CLOCK_MONOTONIC on the device itself). TTFT = the first token's, TBT = differences of
    consecutive tokens'. Stamping arrivals on the host instead measures the transport: through an adb
    forward tokens arrive in bursts (a run recorded TBT P50 0.01 ms where the engine takes 1.9 ms), so
    host arrival times are kept only as `host_*` figures beside them. A server that streams no per-token
    timings gets host stamps on this machine (clock "host") and none on a device (its rates only).
    Prefill and decode tok/s are the server's final `timings` (prompt_per_second, predicted_per_second).
  * Peak memory = the server process's VmHWM (/proc/PID/status: the kernel's peak resident set,
    including the mmapped weights that were resident), read while it serves and once more right before
    it is stopped; with a budget also the cgroup's peak (page cache included). llama-bench, which runs
    to completion, runs under pi2-rusage instead: its peak is wait4's ru_maxrss (pi2cli.hw.rusage).
  * Multi-turn conversations keep the KV cache: one server slot, and each turn's prompt is the whole
    conversation so far rendered with the model's chat template (by the bench, the same text every
    engine gets). The server reuses the longest common prefix of what it already has in the KV cache
    (cache_prompt), so a turn only prefills what is new; `timings.cache_n` says how many prompt
    tokens came from the cache. `pi2 generate` is one such turn (driver.py, engines/generate.py).
"""

import contextlib
import http.client
import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from pi2cli.engines.base import TurnMetrics
from pi2cli.engines.sse import iter_sse
from pi2cli.errors import Pi2Error
from pi2cli.hw.cgroup import Budget
from pi2cli.results.schema import PEAK_RSS_BEFORE_STOP

HOW = (
    "llama-server (llama.cpp {commit}) on 127.0.0.1, streaming /completion with timings_per_token: TTFT and "
    "per-token times from the server's own clock where it runs (prompt_ms + predicted_ms of each token, "
    "stamped as it is sampled); prefill/decode tok/s from the server's timings; peak RSS = "
    "server VmHWM, last read right before it is stopped; load mode {load_mode}, repack {repack}"
)


def default_bin_dir(target: str = "host") -> Path:
    """$PI2_LLAMACPP_BIN_DIR, else the cached build (built now if missing)."""
    override = os.environ.get("PI2_LLAMACPP_BIN_DIR")
    if override:
        return Path(override)
    from pi2cli.builds.baselines.llamacpp_build import ensure_built

    return ensure_built(target)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vm_hwm_bytes(pid: int) -> int:
    """Peak resident set size of a live process (VmHWM), 0 when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def server_args(model: str, port: int, *, ctx_size: int = 4096, load_mode: str = "mmap", repack: bool = False,
                threads: int | None = None, extra_args: list[str] | None = None) -> list[str]:  # fmt: skip
    """llama-server's arguments, the same on this machine and on a device: loopback only, one slot (so
    the KV cache of a conversation stays put), no prompt cache in RAM beyond the slot, weights
    file-backed (-lm mmap --no-repack) unless asked otherwise. port 0: the server picks a free one
    and prints it ("listening on http://127.0.0.1:PORT")."""
    args = [
        "-m", model, "--host", "127.0.0.1", "--port", str(port),
        "-c", str(ctx_size), "-np", "1", "--cache-ram", "0", "--no-webui",
        "-lm", load_mode, "--repack" if repack else "--no-repack",
    ]  # fmt: skip
    if threads:
        args += ["-t", str(threads)]
    return args + list(extra_args or [])


class LlamaServer:
    """A llama-server process on a free loopback port; a context manager that always stops it.

    Its peak RSS is VmHWM, read while it serves (current_peak_rss) and once more right before stop()
    ends it: the kernel's high-water mark up to then, not a poll."""

    peak_rss_source = PEAK_RSS_BEFORE_STOP  # what counters.peak_rss_source says for its peak

    def __init__(
        self,
        bin_dir: Path,
        model: Path,
        *,
        threads: int | None = None,
        ctx_size: int = 4096,
        load_mode: str = "mmap",
        repack: bool = False,
        cgroup: Budget | None = None,
        extra_args: list[str] | None = None,
        start_timeout_s: float = 180.0,
    ):
        self.binary = Path(bin_dir) / "llama-server"
        if not self.binary.exists():
            raise Pi2Error(f"llama-server not found in {bin_dir} (run `pi2 build --engine llama.cpp`)")
        self.model = Path(model)
        if not self.model.is_file():
            raise Pi2Error(f"model file not found: {model}")
        self.port = _free_port()
        self.args = server_args(str(self.model), self.port, ctx_size=ctx_size, load_mode=load_mode,
                                repack=repack, threads=threads, extra_args=extra_args)  # fmt: skip
        self.cgroup = cgroup
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.load_s = 0.0
        self.peak_rss_bytes = 0
        self._log = None

    # --------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> "LlamaServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._log = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115 (lives until stop() closes it)
        cmd = [str(self.binary), *self.args]
        popen = self.cgroup.popen if self.cgroup is not None else subprocess.Popen
        started = time.monotonic()
        self.proc = popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.load_s = time.monotonic() - started

    where = "llama-server"  # how messages name the server
    health_timeout_s = 2.0  # per /health request

    def raise_if_down(self, wait_s: float = 0.0) -> None:
        """Raise (one Pi2Error line) if the server is gone while it should be loading or serving."""
        if self.proc.poll() is not None:
            raise Pi2Error(
                f"llama-server exited with code {self.proc.returncode} while loading: {self.log_tail()}"
            )

    def _wait_healthy(self, started: float) -> None:
        while time.monotonic() - started < self.start_timeout_s:
            self.raise_if_down()
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.health_timeout_s)
                try:
                    conn.request("GET", "/health")
                    if conn.getresponse().status == 200:
                        return
                finally:
                    conn.close()
            time.sleep(0.05)
        raise Pi2Error(f"{self.where} did not become ready within {self.start_timeout_s:.0f} s")

    def log_tail(self, n: int = 3) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        lines = self._log.read().decode(errors="replace").strip().splitlines()
        return " | ".join(lines[-n:])[-400:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.peak_rss_bytes = max(self.peak_rss_bytes, vm_hwm_bytes(self.proc.pid))
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def current_peak_rss(self) -> int:
        if self.proc is not None and self.proc.poll() is None:
            self.peak_rss_bytes = max(self.peak_rss_bytes, vm_hwm_bytes(self.proc.pid))
        return self.peak_rss_bytes

    # ------------------------------------------------------------------------------- requests
    def post_json(self, path: str, body: dict, timeout: float = 600) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as err:
            raise Pi2Error(f"llama-server {path} failed: {err} ({self.log_tail()})") from err
        finally:
            conn.close()
        if resp.status != 200:
            raise Pi2Error(
                f"llama-server {path} answered {resp.status}: {data.decode(errors='replace')[:300]}"
            )
        return json.loads(data)

    def apply_template(self, messages: list[dict]) -> str:
        return self.post_json("/apply-template", {"messages": messages})["prompt"]

    def complete(
        self,
        prompt: str,
        n_predict: int,
        *,
        temperature: float = 0.0,
        seed: int = 0,
        ignore_eos: bool = False,
        timeout: float = 3600,
    ) -> TurnMetrics:
        """One streamed /completion; every token stamped on arrival."""
        body = {
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": temperature,
            "seed": seed,
            "ignore_eos": ignore_eos,
            "stream": True,
            "return_tokens": True,
            "cache_prompt": True,
            "timings_per_token": True,  # every token carries the server's own clock (device_token_times)
            "id_slot": 0,
        }
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        token_ids: list[int] = []
        times: list[float] = []  # arrivals here
        stamps: list[float | None] = []  # the server's own time of each token (device_token_times)
        pieces: list[str] = []
        final: dict | None = None
        try:
            sent = time.monotonic()
            conn.request(
                "POST", "/completion", body=json.dumps(body), headers={"Content-Type": "application/json"}
            )
            resp = conn.getresponse()
            if resp.status != 200:
                raise Pi2Error(
                    f"llama-server /completion answered {resp.status}: {resp.read().decode(errors='replace')[:300]}"
                )
            for event in iter_sse(resp):
                now = time.monotonic() - sent
                if "error" in event:
                    raise Pi2Error(f"llama-server error: {json.dumps(event['error'])[:300]}")
                stamp = engine_time_s(event)
                for tok in event.get("tokens") or []:
                    token_ids.append(int(tok))
                    times.append(now)
                    stamps.append(stamp)
                pieces.append(event.get("content", ""))
                if event.get("stop"):
                    final = event
                    break
        except (OSError, http.client.HTTPException) as err:
            raise Pi2Error(f"llama-server /completion failed: {err} ({self.log_tail()})") from err
        finally:
            conn.close()
        if final is None:
            raise Pi2Error(f"llama-server stream ended without a final event ({self.log_tail()})")
        return turn_metrics(
            final, "".join(pieces), token_ids, times, stamps, host_clock_ok=self.host_clock_ok
        )

    # Arrival times here are token times only when nothing but loopback lies between (not an adb forward).
    host_clock_ok = True


def engine_time_s(event: dict) -> float | None:
    """When the server sampled this event's token, on its own clock, in seconds from the slot starting
    the request: prompt_ms (start -> end of the prompt) + predicted_ms (end of the prompt -> this token),
    as timings_per_token streams them with every token. None when the event carries no timings."""
    timings = event.get("timings")
    if not isinstance(timings, dict):
        return None
    try:
        prompt_ms, predicted_ms = float(timings["prompt_ms"]), float(timings["predicted_ms"])
    except (KeyError, TypeError, ValueError):
        return None
    return (prompt_ms + predicted_ms) / 1e3


def device_token_times(stamps: list[float | None]) -> list[float] | None:
    """The engine's own token times when every token has one and they never go back, else None."""
    if not stamps or any(s is None for s in stamps):
        return None
    if any(b < a for a, b in zip(stamps, stamps[1:], strict=False)):
        return None
    return list(stamps)


def turn_metrics(final: dict, text: str, token_ids: list[int], times: list[float],
                 stamps: list[float | None] | None = None, *, host_clock_ok: bool = True) -> TurnMetrics:  # fmt: skip
    """Combine the final stream event (server timings) with the token times: the server's own per-token
    stamps when it streamed them (clock "engine"); else the arrivals here when they are trustworthy
    (host_clock_ok: a server on this machine, clock "host"); else none, and the turn keeps the server's
    rates only (arrivals through a forward come in bursts: never token times)."""
    timings = final.get("timings") or {}
    n_cached = int(timings.get("cache_n", 0))
    n_processed = int(timings.get("prompt_n", 0))
    host_decode = (
        (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0
    )
    engine = device_token_times(stamps or [])
    if engine is not None:
        token_times, ttft, clock = engine, engine[0], "engine"
    elif host_clock_ok:
        token_times, ttft, clock = times, (times[0] if times else 0.0), "host"
    else:  # the server's own prefill time stands for the TTFT; no per-token times
        prompt_ms = timings.get("prompt_ms")
        token_times, ttft, clock = [], (float(prompt_ms) / 1e3 if prompt_ms is not None else None), None
    return TurnMetrics(
        text=text,
        token_ids=token_ids,
        n_prompt=int(final.get("tokens_evaluated") or n_cached + n_processed),
        n_prompt_cached=n_cached,
        n_prompt_processed=n_processed,
        ttft_s=ttft,
        token_times_s=token_times,
        prefill_tps=float(timings.get("prompt_per_second") or 0.0),
        decode_tps=float(timings.get("predicted_per_second") or 0.0),
        host_decode_tps=host_decode,
        stop_type=str(final.get("stop_type", "")),
        timings=timings,
        n_gen=len(token_ids),
        clock=clock,
        host_ttft_s=times[0] if times else None,
    )


# ------------------------------------------------------------------------------ llama-bench mode
LLAMA_BENCH_HOW = (
    "llama-bench -o json (llama.cpp's own pp/tg timing: one untimed warm-up run, then each repetition "
    "timed around llama_decode; pp = prompt tokens / time, tg = generated tokens / time; no TTFT or "
    "per-token times); load mode mmap, repack 0; peak RSS = llama-bench's ru_maxrss (run under pi2-rusage)"
)


def llama_bench_command(model: Path, *, bin_dir: Path | None = None, n_prompt: int = 512, n_gen: int = 128,
                        threads: int | None = None, repetitions: int = 3, load_mode: str = "mmap",
                        repack: bool = False, extra_args: list[str] | None = None) -> list[str]:  # fmt: skip
    """The llama-bench command line: `-lm mmap --repack 0` by default, so the weights stay file-backed
    and a memory budget makes them page from storage, as for the llama-server driver."""
    model = Path(model)
    if not model.is_file():
        raise Pi2Error(f"model file not found: {model}")
    binary = Path(bin_dir or default_bin_dir()) / "llama-bench"
    if not binary.exists():
        raise Pi2Error(f"llama-bench not found in {binary.parent} (run `pi2 build --engine llama.cpp`)")
    cmd = [
        str(binary), "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen), "-r", str(repetitions),
        "-lm", load_mode, "--repack", "1" if repack else "0", "-o", "json",
    ]  # fmt: skip
    if threads:
        cmd += ["-t", str(threads)]
    return cmd + list(extra_args or [])


def check_llama_bench_exit(returncode: int, stderr: str) -> None:
    if returncode != 0:
        tail = " | ".join(stderr.strip().splitlines()[-3:])[-400:]
        killed = " (killed: over the memory budget?)" if returncode in (-9, 137) else ""
        raise Pi2Error(f"llama-bench failed with code {returncode}{killed}: {tail}")


def parse_llama_bench_json(text: str) -> list[dict]:
    """llama-bench's `-o json` output (a JSON array) as a list of dicts, fields kept as they are."""
    start = text.find("[")
    if start < 0:
        raise Pi2Error("llama-bench printed no JSON array")
    try:
        records = json.loads(text[start:])
    except ValueError as err:
        raise Pi2Error(f"llama-bench JSON could not be parsed: {err}") from err
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise Pi2Error("llama-bench JSON is not a list of objects")
    return records
