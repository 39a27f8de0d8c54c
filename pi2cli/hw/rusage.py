"""Peak memory of a command run to completion, as the kernel counted it: through pi2-rusage.

A peak read by polling /proc/PID/status misses whatever happened between two reads, and a run shorter
than the polling interval is not measured at all. The kernel keeps the true figure (ru_maxrss), but
wait4() straight from Python reports Python's own resident set as its floor: at exec the kernel
carries the old address space's high-water mark into the new program's ru_maxrss. So the command runs
under pi2-rusage (native/src/programs/main_rusage.c), a small static program that forks and execs it, wait4()s
it and writes its ru_maxrss, exit status and CPU times as one JSON line. The command inherits only
pi2-rusage's few hundred KiB.

    with Measured(cmd) as m:
        proc = subprocess.Popen(m.cmd, ...)      # or Budget.popen: pi2-rusage joins the cgroup, and so
        proc.wait()                              # does the command it starts
        usage = m.usage()                        # ChildUsage: maxrss_bytes, returncode, ...

`engine_pid(proc.pid)` is the command's own pid (for the memory sampler's curve) once it has started.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.paths import host_build_dir


def wrapper_binary() -> Path:
    path = host_build_dir() / "pi2-rusage"
    if not path.is_file():
        raise Pi2Error(f"{path} is not built (run `make engine`): it measures the peak memory of llama-bench "
                       f"and of command runners")  # fmt: skip
    return path


@dataclass
class ChildUsage:
    """What pi2-rusage reported for the command. exit_code is None when a signal killed it."""

    pid: int
    exit_code: int | None
    signal: int | None
    exec_errno: int
    maxrss_bytes: int
    utime_s: float
    stime_s: float
    wall_s: float

    @property
    def returncode(self) -> int:
        """As subprocess has it: the exit code, or -N when signal N killed the command."""
        return -self.signal if self.signal else int(self.exit_code or 0)


def parse_report(text: str) -> ChildUsage:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise Pi2Error("pi2-rusage wrote no report (was it killed?)")
    try:
        obj = json.loads(lines[-1])
        return ChildUsage(pid=int(obj["pid"]), exit_code=obj["exit_code"], signal=obj["signal"],
                          exec_errno=int(obj["exec_errno"]), maxrss_bytes=int(obj["maxrss_bytes"]),
                          utime_s=float(obj["utime_s"]), stime_s=float(obj["stime_s"]),
                          wall_s=float(obj["wall_s"]))  # fmt: skip
    except (ValueError, KeyError, TypeError) as exc:
        raise Pi2Error(f"pi2-rusage wrote a malformed report {lines[-1][:120]!r}: {exc}") from None


class Measured:
    """One command wrapped in pi2-rusage: start `cmd` however the caller starts processes, then read
    `usage()` once it has ended. The report lives in a temporary file removed on exit."""

    def __init__(self, cmd: list[str], binary: Path | None = None):
        wrapper = str(binary or wrapper_binary())
        fd, path = tempfile.mkstemp(prefix="pi2-rusage-", suffix=".json")
        os.close(fd)
        self.report = Path(path)
        self.cmd = [wrapper, "-o", path, "--", *cmd]

    def __enter__(self) -> Measured:
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def usage(self) -> ChildUsage:
        try:
            text = self.report.read_text()
        except OSError as exc:
            raise Pi2Error(f"pi2-rusage's report {self.report} cannot be read: {exc.strerror}") from None
        return parse_report(text)

    def cleanup(self) -> None:
        with contextlib.suppress(OSError):
            self.report.unlink()


def engine_pid(wrapper_pid: int) -> int | None:
    """The pid of the command pi2-rusage (at wrapper_pid) started, None until it has forked it (or
    once both are gone)."""
    try:
        text = Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children").read_text()
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: ask psutil (it scans /proc)
        import psutil

        try:
            children = psutil.Process(wrapper_pid).children()
        except psutil.Error:
            return None
        return children[0].pid if children else None
    pids = text.split()
    return int(pids[0]) if pids else None
