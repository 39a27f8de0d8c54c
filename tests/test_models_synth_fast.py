"""The synthesizer's fast paths write what the plain ones would: the Q4_0 codec against gguf's
reference, the one-pass random rows against the two-pass formula, and experts built two at a time in
threads against one after another."""

import math

import numpy as np
import pytest

from pi2cli.models import gguf_twin, synth, synth_quant


def _awkward_rows(rows: int = 37, cols: int = 256) -> np.ndarray:
    """Rows that exercise every branch of gguf's Q4_0: ties between +m and -m (either first), all-zero
    blocks, a lone extreme, and plain Gaussian and int8-grid values."""
    rng = np.random.default_rng(3)
    a = rng.integers(-127, 128, size=(rows, cols)).astype(np.float32) * np.float32(0.013)
    a[1] = rng.standard_normal(cols)
    a[2, :64] = 0
    a[3, :32] = 0
    a[3, 4], a[3, 9] = -2, 2  # tie, negative first
    a[4, :32] = 0
    a[4, 4], a[4, 9] = 2, -2  # tie, positive first
    a[5, :32] = 1e-3
    a[5, 31] = -7  # the extreme last in its block
    return a


@pytest.mark.parametrize("slice_blocks", [3, synth_quant.SLICE])
def test_q4_0_encode_and_decode_are_ggufs_bit_for_bit(monkeypatch, slice_blocks):
    monkeypatch.setattr(synth_quant, "SLICE", slice_blocks)  # slices that split rows and blocks unevenly
    a = _awkward_rows()
    ref = gguf_twin.encode(a, "q4_0")
    assert np.array_equal(synth_quant.encode(a, "q4_0"), ref)
    out = np.full_like(ref, 0xAA)
    assert synth_quant.encode(a, "q4_0", out=out) is out and np.array_equal(out, ref)
    assert np.array_equal(
        synth_quant.decode(ref, "q4_0", a.shape[1]), gguf_twin.decode(ref, "q4_0", a.shape[1])
    )


def test_other_types_go_through_gguf_unchanged():
    a = _awkward_rows(8, 64)
    for quant in ("q8_0", "q4_1", "f16", "f32"):
        raw = gguf_twin.encode(a, quant)
        assert np.array_equal(synth_quant.encode(a, quant), raw)
        assert np.array_equal(synth_quant.decode(raw, quant, 64), gguf_twin.decode(raw, quant, 64))


def test_column_encoding_is_the_transpose_encoded():
    a = _awkward_rows(64, 1100)  # 1100 columns: slices of 512 with a short last one
    assert np.array_equal(
        synth._encode_columns(a, "q4_0"), gguf_twin.encode(np.ascontiguousarray(a.T), "q4_0")
    )


def test_one_pass_uniform_rows_are_the_two_pass_floats():
    def two_pass(rng, shape, std):
        out = rng.integers(-127, 128, size=shape, dtype=np.int8).astype(np.float32)
        out *= np.float32(std / math.sqrt((255**2 - 1) / 12))
        return out

    shape, std = (300, 70), 0.37
    assert np.array_equal(
        synth._uniform_rows(synth._rng(0, 9), shape, std), two_pass(synth._rng(0, 9), shape, std)
    )
    base = np.random.default_rng(5).standard_normal(shape, dtype=np.float32)
    want = base + two_pass(synth._rng(1, 9), shape, std)
    assert np.array_equal(synth._add_uniform_rows(synth._rng(1, 9), base.copy(), std), want)


@pytest.mark.slow
def test_experts_built_in_threads_write_the_same_bytes_as_one_at_a_time(tmp_path, smollm2_gguf):
    cfg = dict(like="turbosparse-mixtral-47b", tokenizer_gguf=smollm2_gguf, n_layer=2, hidden=64, ffn=128,
               calib_seqs=6, eval_seqs=2)  # fmt: skip
    serial = synth.synthesize(synth.SynthConfig(**cfg), tmp_path / "serial", workers=1)
    threaded = synth.synthesize(synth.SynthConfig(**cfg), tmp_path / "threads", workers=3)
    for name in ("model.pi2", "model.gguf"):
        assert (tmp_path / "serial" / name).read_bytes() == (tmp_path / "threads" / name).read_bytes(), name
    assert serial["measured"] == threaded["measured"]
