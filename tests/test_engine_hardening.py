"""The engine against hostile input: crafted .pi2 files (shapes whose byte counts overflow 64 bits,
data placed past the end of the mapping, 100k tensors), corrupted sections and bad flags each get
exactly one error line and a non-zero exit, never a signal."""

import struct
import subprocess
import time

import pytest
from crafted_models import (
    _sections,
    craft_many_tensors,
    craft_overflowing_norm,
    craft_overflowing_threshold,
    fix_checksums,
    write_tiny_model,
)
from engine_helpers import engine_bin

from pi2cli.pi2file import SEC_TOKENIZER


def _engine(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(engine_bin()), *map(str, args)], capture_output=True, text=True, env=env, timeout=60
    )


def _one_error_line(done: subprocess.CompletedProcess, *needles: str) -> str:
    """The run failed with a plain exit code (no signal) and exactly one line on stderr."""
    assert done.returncode > 0, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pi2-engine: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


CRAFTED = {
    "overflowing_threshold": (craft_overflowing_threshold, "'blk.0.pred_threshold': shape [1, 4294967296"),
    "overflowing_norm": (craft_overflowing_norm, "'output_norm.weight': shape [32, 4294967296"),
    "duplicate_among_100k": (lambda p: craft_many_tensors(p, duplicate=True), "tensor 't0' appears twice"),
}


@pytest.mark.parametrize("kind", sorted(CRAFTED))
def test_crafted_files_are_refused_with_one_line(tmp_path, kind):
    craft, needle = CRAFTED[kind]
    model = craft(tmp_path / f"{kind}.pi2")
    t0 = time.monotonic()
    info = _engine("info", "-m", model)
    assert time.monotonic() - t0 < 1.0  # the 100k-entry table: a hash, not a quadratic scan
    _one_error_line(info, str(model), needle)
    assert info.stdout == ""
    gen = _engine("generate", "-m", model, "-p", "hello", "-n", "2", "--policy", "powerinfer2")
    _one_error_line(gen, needle)


def test_100k_tensors_load_in_well_under_a_second(tmp_path):
    model = craft_many_tensors(tmp_path / "many.pi2")
    t0 = time.monotonic()
    info = _engine("info", "-m", model, "--json")
    elapsed = time.monotonic() - t0
    assert info.returncode == 0, info.stderr
    assert '"n_tensors": 100015' in info.stdout
    assert elapsed < 1.0, elapsed
    # the extra tensors are ignored; the model's own are found through the hash
    gen = _engine("generate", "-m", model, "-p", "hello", "-n", "2", "--policy", "powerinfer2")
    assert gen.returncode == 0, gen.stderr


def test_info_checks_the_predictors_generate_binds(tmp_path):
    # A threshold of the wrong rank used to pass `info` and fail (or crash) only in a sparse run.
    from crafted_models import patch_entry

    model = write_tiny_model(tmp_path / "m.pi2")
    patch_entry(model, "blk.0.pred_threshold", n_dims=2)
    _one_error_line(_engine("info", "-m", model), "predictor tensor 'blk.0.pred_threshold' must be F32 [1]")


def test_tokenizer_error_keeps_its_reason(tmp_path):
    # The context was formatted into the buffer holding the reason: "X: tokenizer section: X: tok..."
    model = write_tiny_model(tmp_path / "m.pi2")
    raw = bytearray(model.read_bytes())
    off = _sections(raw)[SEC_TOKENIZER][0]
    struct.pack_into("<I", raw, off + 8, 99)  # the vocabulary blob's version
    model.write_bytes(fix_checksums(raw))
    line = _one_error_line(_engine("generate", "-m", model, "-p", "hi", "-n", "1"))
    assert line.count("tokenizer section") == 1, line
    assert line.startswith(f"pi2-engine: error: {model}: tokenizer section: ")
    reason = line.split("tokenizer section: ", 1)[1]
    assert reason and str(model) not in reason, line


@pytest.mark.parametrize("size", ["1e3", "0x1p30", " 2G", "1.5", "inf", "99999999999999T", "2Gi"])
def test_memory_budget_sizes_are_strict(tmp_path, size):
    model = write_tiny_model(tmp_path / "m.pi2")
    done = _engine(
        "generate", "-m", model, "-p", "hi", "-n", "1", "--policy", "cache", "--memory-budget", size
    )
    assert done.returncode == 2
    _one_error_line(done, "--memory-budget: ", f"'{size}'")


def test_plan_memory_budget_goes_through_the_same_parser(tmp_path):
    model = write_tiny_model(tmp_path / "m.pi2")
    plan = tmp_path / "plan.json"
    plan.write_text('{"format": "pi2-plan", "version": 1, "policy": "cache", "memory_budget": 1e40}')
    done = _engine("generate", "-m", model, "-p", "hi", "-n", "1", "--plan", plan)
    _one_error_line(done, "--memory-budget: expected a size", "'1e40'")
