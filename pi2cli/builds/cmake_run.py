"""Running a CMake build with a log file and a progress bar: shared by the pi2 and llama.cpp builders."""

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from pi2cli.errors import Pi2Error


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


def cmake_build(source: Path, build_dir: Path, *, name: str, label: str, target: str, args: list[str], jobs: int,
                show: bool, takes: str, build_targets: tuple[str, ...] = ()) -> None:  # fmt: skip
    """Configure and build `source` into `build_dir` (Ninja when there is one), every line into
    build_dir/build.log, with a progress bar on a terminal and one plain line off it (a long build
    says what runs and for how long). name: what failures are called ("pi2-engine"); label: what
    runs ("llama.cpp 0c1e570"); takes: how long it usually takes; build_targets: CMake targets to
    build (none: all). Raises one Pi2Error line with the log's last errors when a step fails."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    log_path = build_dir / "build.log"
    configure = ["cmake", "-S", str(source), "-B", str(build_dir), *generator, *args]
    build = ["cmake", "--build", str(build_dir), "-j", str(jobs)]
    if build_targets:
        build += ["--target", *build_targets]
    progress = Progress(TextColumn(f"{label} [{target}]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), transient=True, disable=not show)  # fmt: skip
    if show and not sys.stderr.isatty():  # no progress bar off a terminal: say what runs, and for how long
        print(f"pi2: building {label} for {target} ({takes}; log: {log_path})", file=sys.stderr, flush=True)
    with open(log_path, "w") as log, progress:
        task = progress.add_task("configure", total=None)
        if run_logged(configure, log) != 0:
            raise Pi2Error(f"{name} configure failed for {target}: {log_tail(log_path)} (log: {log_path})")

        def on_line(line: str) -> None:
            if got := parse_progress(line):
                progress.update(task, completed=got[0], total=got[1])

        if run_logged(build, log, on_line) != 0:
            raise Pi2Error(f"{name} build failed for {target}: {log_tail(log_path)} (log: {log_path})")
