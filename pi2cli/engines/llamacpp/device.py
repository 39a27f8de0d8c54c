"""llama-server on an adb device, driven from the host exactly as on this machine.

How (also in every result's `measurement`):
  * The binary and the GGUF are pushed by `pi2 bench` (pi2cli.hw.push: content hashes, skipped when
    already there). The server starts through one `adb shell` (protocol v2) with the same arguments as
    locally (pi2cli.engines.llamacpp.server.server_args: -lm mmap --no-repack, one slot, --ctx, --threads)
    except `--port 0`: it binds a free port on the device's loopback and prints it
    ("listening on http://127.0.0.1:PORT"), so two runs never collide over a port.
  * `adb forward tcp:0 tcp:PORT` gives a free port here; every HTTP request goes through it. Token
    times are the server's own, taken on the device as each token is sampled (timings_per_token:
    pi2cli.engines.llamacpp.server.engine_time_s), never arrivals here: the forward delivers tokens in bursts
    (a run stamped here recorded TBT P50 0.01 ms, 1002 tok/s, where the engine takes 1.9 ms a token).
    A server that streams no per-token timings gets its rates only (host_clock_ok = False).
  * Peak memory: VmHWM from /proc/PID/status on the device (PSS from smaps_rollup is sampled by the
    bench where the kernel has it, as on Android).
  * Lifetime: the shell line holds the server and a watchdog. The watchdog reads the shell's stdin,
    which only the host's adb connection feeds: when that connection goes away (Ctrl-C, a crash here,
    an unplugged cable) stdin ends and the watchdog kills the server, so no orphan keeps running on
    the phone. A normal stop sends SIGTERM (then SIGKILL) and removes the forward.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import threading
import time
from collections import deque

from pi2cli.engines.llamacpp.server import LlamaServer, server_args
from pi2cli.errors import Pi2Error
from pi2cli.results.schema import PEAK_RSS_DEVICE
from pi2cli.targets.base import TargetError

LISTENING = re.compile(r"listening on https?://[^\s:]+:(\d+)")


def watched_command(argv: list[str], cwd: str) -> str:
    """A shell line: run argv in the background, report ITS pid (the pi2 pid marker, on stderr),
    kill it when our stdin ends, and exit with its exit status.

    The pid is printed by the background child itself just before it becomes the server, so it comes
    before anything the server writes. A background job's stdin is /dev/null in a non-interactive
    shell, so the shell's stdin is kept as fd 3 for the watchdog; the server gets neither."""
    command = " ".join(shlex.quote(a) for a in argv)
    become = shlex.quote('echo __PI2_PID__=$$ >&2; exec "$@"')
    return (
        f"cd {shlex.quote(cwd)} || exit 127; exec 3<&0; "
        f"sh -c {become} sh {command} </dev/null 3<&- & pid=$!; "
        f"(read -r _ <&3; kill $pid 2>/dev/null) & watchdog=$!; "
        f"wait $pid; code=$?; kill $watchdog 2>/dev/null; exit $code"
    )


class DeviceLlamaServer(LlamaServer):
    """A llama-server process on an adb target, reachable at 127.0.0.1:self.port here (a forward).

    Same interface as LlamaServer (start/stop, complete, apply_template, current_peak_rss, log_tail,
    proc with poll()/returncode/pid), so the driver's session uses either."""

    health_timeout_s = 5.0  # the /health request crosses adb's forward
    host_clock_ok = False  # arrivals through the forward come in bursts: never token times
    peak_rss_source = PEAK_RSS_DEVICE  # VmHWM read through the device's shell, last right before stop

    @property
    def where(self) -> str:
        return f"llama-server on {self.target.name}"

    def __init__(self, target, binary: str, model: str, *, threads: int | None = None, ctx_size: int = 4096,
                 load_mode: str = "mmap", repack: bool = False, extra_args: list[str] | None = None,
                 start_timeout_s: float = 600.0):  # fmt: skip
        if "shell_v2" not in getattr(target, "features", set()):
            raise Pi2Error(f"device {target.name} has no adb shell v2: cannot run llama-server on it")
        self.target = target
        self.binary = binary
        self.model = model
        self.args = server_args(model, 0, ctx_size=ctx_size, load_mode=load_mode, repack=repack,
                                threads=threads, extra_args=extra_args)  # fmt: skip
        self.cgroup = None
        self.start_timeout_s = start_timeout_s
        self.proc = None  # pi2cli.targets.adb.AdbProcess
        self.port: int | None = None  # the forwarded port on this machine
        self.remote_port: int | None = None  # where the server listens on the device
        self.load_s = 0.0
        self.peak_rss_bytes = 0
        self._lines: deque[str] = deque(maxlen=200)
        self._partial = ""
        self._listening = threading.Event()

    # --------------------------------------------------------------------------------- output
    def _on_output(self, _name: str, data: bytes) -> None:
        text = self._partial + data.decode(errors="replace")
        *lines, self._partial = text.split("\n")
        for line in lines:
            self._lines.append(line.rstrip())
            m = LISTENING.search(line)
            if m and self.remote_port is None:
                self.remote_port = int(m.group(1))
                self._listening.set()

    def log_tail(self, n: int = 3) -> str:
        lines = [ln for ln in [*self._lines, self._partial] if ln.strip()]
        return " | ".join(lines[-n:])[-400:]

    # ------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        from pi2cli.targets.adb import AdbProcess, adb_errors

        started = time.monotonic()
        try:
            self.proc = AdbProcess(self.target, watched_command([self.binary, *self.args], self.target.workdir),
                                   self._on_output)  # fmt: skip
        except adb_errors() as exc:  # the shell could not even be opened: the device is gone
            raise TargetError(
                f"lost the device {self.target.name}: cannot start llama-server: {exc}"
            ) from None
        try:
            while not self._listening.wait(0.1):
                self.raise_if_down()
                if time.monotonic() - started > self.start_timeout_s:
                    raise Pi2Error(f"llama-server on {self.target.name} did not listen within "
                                   f"{self.start_timeout_s:.0f} s: {self.log_tail()}")  # fmt: skip
            try:
                self.port = self.target.forward(self.remote_port)
            except TargetError as exc:
                raise self.down_reason(wait_s=3.0) or exc from None  # a device going away says so
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.load_s = time.monotonic() - started

    def down_reason(self, wait_s: float = 0.0) -> Exception | None:
        """Why the server cannot answer, or None when it is up: a TargetError when the device is gone
        (bench records device_vanished), a Pi2Error when the server exited. wait_s: how long to give
        the shell stream to report an end that is under way (after a failed request)."""
        proc = self.proc
        if proc is None:
            return Pi2Error("llama-server is not running")
        if wait_s and proc.poll() is None:
            with contextlib.suppress(TimeoutError, TargetError):
                proc.wait(wait_s)
        if proc.poll() is not None:
            if proc.error:
                return TargetError(proc.error)
            return Pi2Error(f"llama-server on {self.target.name} exited with code {proc.returncode}: "
                            f"{self.log_tail()}")  # fmt: skip
        if wait_s:
            try:
                self.target.sh("true", timeout=10)
            except TargetError as exc:
                return TargetError(f"lost the device {self.target.name}: {exc}")
        return None

    def raise_if_down(self, wait_s: float = 0.0) -> None:
        reason = self.down_reason(wait_s)
        if reason is not None:
            raise reason

    def current_peak_rss(self) -> int:
        """VmHWM on the device (the peak so far); the last value read once the server is gone."""
        if self.proc is not None and self.proc.poll() is None and self.proc.pid:
            usage = self.target.read_memory(self.proc.pid)
            if usage is not None:
                self.peak_rss_bytes = max(self.peak_rss_bytes, usage.hwm_bytes)
        return self.peak_rss_bytes

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; remove the forward. Never raises: a vanished device has
        already lost the server (the watchdog) and the adb server drops its forwards itself."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(TargetError):
                self.current_peak_rss()
            if proc.pid:
                with contextlib.suppress(TargetError):
                    self.target.sh(f"kill {int(proc.pid)} 2>/dev/null; true", timeout=10)
            with contextlib.suppress(TimeoutError, TargetError):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()
        if self.port is not None:
            with contextlib.suppress(TargetError):
                self.target.remove_forward(self.port)
            self.port = None
