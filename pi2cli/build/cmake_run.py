"""Running a CMake build with a log file and a progress bar: shared by the pi2 and llama.cpp builders."""

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path


def default_jobs() -> int:
    # The tools compile a few huge C++ files; more jobs than cores only thrashes memory.
    return max(1, min(os.cpu_count() or 2, 8))


NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]")
MAKE_PROGRESS = re.compile(r"^\[\s*(\d+)%\]")


def parse_progress(line: str) -> tuple[int, int] | None:
    """(done, total) from one line of ninja ('[12/200] ...') or make ('[ 45%] ...') output."""
    if m := NINJA_PROGRESS.match(line):
        return int(m.group(1)), int(m.group(2))
    if m := MAKE_PROGRESS.match(line):
        return int(m.group(1)), 100
    return None


def run_logged(cmd: list[str], log, on_line: Callable[[str], None] | None = None) -> int:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()  # so `tail -f build.log` shows where a long build is
            if on_line:
                on_line(line)
        return proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def log_tail(log_path: Path) -> str:
    """The last error lines of a build log (or its last lines), for a one-line failure message."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [ln for ln in lines if "error" in ln.lower()]
    return " | ".join((errors or lines)[-3:])[-400:]
