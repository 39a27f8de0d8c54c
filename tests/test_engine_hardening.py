"""The engine against hostile input: crafted .pi2 files (shapes whose byte counts overflow 64 bits,
data placed past the end of the mapping, 100k tensors), corrupted sections and bad flags each get
exactly one error line and a non-zero exit, never a signal."""

import gzip
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from crafted_models import (
    _sections,
    _set_section,
    craft_many_tensors,
    craft_overflowing_norm,
    craft_overflowing_threshold,
    fix_checksums,
    write_tiny_model,
)
from engine_helpers import built, engine_bin

from pi2cli.models.pi2file import SEC_TOKENIZER


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


REGRESSIONS = Path(__file__).parent / "fuzz" / "regressions" / "pi2file"


@pytest.mark.parametrize("name", sorted(p.name for p in REGRESSIONS.glob("*.pi2.gz")))
def test_fuzz_regression_inputs_are_refused_with_one_line(tmp_path, name):
    # inputs pi2-fuzz found crashing the engine (docs/FUZZ.md)
    model = tmp_path / name.removesuffix(".gz")
    model.write_bytes(gzip.decompress((REGRESSIONS / name).read_bytes()))
    line = _one_error_line(_engine("info", "-m", model), str(model))
    assert "overflows 64 bits" in line or "more than 2^64 bytes" in line, line
    fuzz = built("pi2-fuzz")
    done = subprocess.run([str(fuzz), "pi2file", "--replay", str(model)], capture_output=True, text=True)
    assert done.returncode == 0 and "refused: " in done.stdout, done.stdout + done.stderr


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


# ---- a failing flash: the neuron store's fault-injection hook (PI2_IO_FAULT, native/src/io/neuron_io.c) ----


@pytest.fixture(scope="module")
def ffn_model(synth_model) -> Path:
    """Two layers of 8192 neurons: under a budget most bundles are read from storage per token."""
    return synth_model("ffn-8k")


def _sparse_generate(
    model: Path, tmp: Path, fault: str | None
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    events = tmp / "events.jsonl"
    env = dict(os.environ)
    env.pop("PI2_IO_FAULT", None)
    if fault:
        env["PI2_IO_FAULT"] = fault
    done = _engine("generate", "-m", model, "-p", "The capital of France is", "-n", "24", "--ignore-eos",
                   "--policy", "powerinfer2", "--memory-budget", "26M", "--events", events, env=env)  # fmt: skip
    return done, [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []


@pytest.mark.slow
@pytest.mark.parametrize("kind,why", [("eio", "Input/output error"), ("eof", "short read at end of file")])
def test_a_failed_neuron_read_mid_decode_ends_the_run_with_one_line(ffn_model, tmp_path, kind, why):
    done, events = _sparse_generate(ffn_model, tmp_path, None)
    assert done.returncode == 0, done.stderr
    tokens = [e for e in events if e["event"] == "token"]
    reads = events[-1]["storage_reads"]
    prefill_reads = tokens[0]["reads"]
    assert reads > prefill_reads + 100  # decode reads from storage: the fault lands there
    at = (prefill_reads + reads) // 2
    t0 = time.monotonic()
    done, events = _sparse_generate(ffn_model, tmp_path, f"{kind}:{at}")
    assert time.monotonic() - t0 < 30  # no hang on the reads still in flight
    line = _one_error_line(done, str(ffn_model), why)
    assert "read of " in line
    assert 1 < sum(e["event"] == "token" for e in events) < len(tokens)  # it failed in the middle of decode


def test_a_resumed_short_read_changes_nothing(ffn_model, tmp_path):
    clean, _ = _sparse_generate(ffn_model, tmp_path, None)
    short, _ = _sparse_generate(ffn_model, tmp_path, "short:50")
    assert short.returncode == 0, short.stderr
    assert short.stdout == clean.stdout


@pytest.mark.slow
def test_bench_records_a_failed_neuron_read_as_a_failed_run(ffn_model, tmp_path):
    # 38M: about half the FFN (8 MiB) cached, so decode reads from storage and the fault lands
    env = dict(os.environ, PI2_IO_FAULT="eio:3000")
    cmd = [sys.executable, "-m", "pi2cli", "bench", "--model", str(ffn_model), "--engine", "pi2",
           "--workload", "multi-turn", "--limit", "1", "--n-gen", "16", "--memory-budget", "38M",
           "--results-dir", str(tmp_path / "results")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stderr
    (run_file,) = (tmp_path / "results" / "runs").glob("*.json")
    run = json.loads(run_file.read_text())
    assert run["status"] == "failed"
    assert "Input/output error" in run["error"] and str(ffn_model) in run["error"], run["error"]


def test_a_nan_threshold_is_reported_under_its_own_name(tmp_path):
    # The NaN check named the tensor bound just before it (blk.0.pred_fc2), sending a reader to the
    # wrong tensor.
    from crafted_models import patch_tensor_data

    model = write_tiny_model(tmp_path / "m.pi2")
    patch_tensor_data(model, "blk.0.pred_threshold", struct.pack("<f", float("nan")))
    line = _one_error_line(_engine("info", "-m", model), "'blk.0.pred_threshold' holds NaN")
    assert "pred_fc2" not in line, line


def _tokenizer_craft(tmp_path, name: str) -> Path:
    """The tiny model with its tokenizer section broken in one way that the blob's own checks see only
    when a tokenizer is built from it."""
    from pi2cli.models.tokenizer_blob import vocab_blob_from_fields

    model = write_tiny_model(tmp_path / f"{name}.pi2")
    raw = bytearray(model.read_bytes())
    off, size, _ = _sections(raw)[SEC_TOKENIZER]
    if name == "version":
        struct.pack_into("<I", raw, off + 8, 99)  # the vocabulary blob's version
    else:  # more tokens than the model's n_vocab (64): ids past the embedding table
        blob = vocab_blob_from_fields(model="llama", tokens=[f"t{i}" for i in range(80)], scores=[0.0] * 80,
                                      token_types=[1] * 80)  # fmt: skip
        assert len(blob) <= size + (-size % 4096), "the bigger blob must fit the section's pages"
        raw[off : off + len(blob)] = blob
        _set_section(raw, SEC_TOKENIZER, off, len(blob), 0)  # (the checksum: fix_checksums)
    model.write_bytes(fix_checksums(raw))
    return model


@pytest.mark.parametrize("name", ["version", "too_many_tokens"])
def test_info_refuses_the_tokenizers_generate_refuses(tmp_path, name):
    # docs/FORMAT.md: a file `info` accepts is one `generate` can load; the tokenizer section was never
    # checked by info. Both now go through one function and print the same line.
    model = _tokenizer_craft(tmp_path, name)
    gen = _one_error_line(
        _engine("generate", "-m", model, "-p", "hi", "-n", "1"), f"{model}: tokenizer section: "
    )
    info = _one_error_line(_engine("info", "-m", model), f"{model}: tokenizer section: ")
    assert info == gen
    assert _engine("info", "-m", model, "--json").stdout == ""
