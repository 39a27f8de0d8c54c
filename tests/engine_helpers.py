"""Shared helpers for the engine tests: the built binary and running it."""

import subprocess
from pathlib import Path

import numpy as np
import pytest

from pi2cli.paths import host_build_dir


def engine_bin() -> Path:
    path = host_build_dir() / "pi2-engine"
    if not path.is_file():
        pytest.fail(f"{path} is not built: run `make engine` first")
    return path


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
