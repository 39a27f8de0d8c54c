"""Shared helpers for the engine tests: the built programs, running them, and whether one still runs.

One rule for a program of the host build (pi2-engine, pi2-probe, pi2-fuzz, ...) that is not there:
where CI is set, `make test` built it first, so its absence is a failure; anywhere else the tests that
need it are skipped with the command that builds it (the rest of the suite still runs).
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pi2cli.paths import host_build_dir


def built(name: str = "pi2-engine") -> Path:
    """The host build's program `name`, or the test that asked ends by the rule above."""
    path = host_build_dir() / name
    if not path.is_file():
        why = f"{path} is not built: run `make engine` first"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return path


def engine_bin() -> Path:
    return built("pi2-engine")


# A mark for tests that run the engine without calling it themselves (through pi2 commands): the
# `engine` fixture (conftest.py) applies the rule above before the test starts.
needs_engine = pytest.mark.usefixtures("engine")


def run_engine(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([str(engine_bin()), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and done.returncode != 0:
        raise AssertionError(f"pi2-engine {' '.join(map(str, args))} failed: {done.stderr.strip()}")
    return done


def engine_logits(model: Path, tokens: list[int], tmp: Path, *extra: str) -> np.ndarray:
    """Logits for every position, shape (len(tokens), n_vocab)."""
    out = tmp / "logits.bin"
    run_engine(
        "eval", "-m", model, "--tokens", ",".join(map(str, tokens)), "--logits-out", out, "--all", *extra
    )
    return np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie nobody has reaped yet counts as stopped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:  # gone; reaped between open and read, the read fails with ESRCH (a CI run, 2026-11-27)
        return False
