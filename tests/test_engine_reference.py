"""pi2-engine's logits match the numpy reference forward (pi2cli/models/numpy_llama.py) on small random
models of every architecture, FFN activation and weight type, through both the batched prefill
(GEMM) and the one-token decode (GEMV) paths, on two threads.

Tolerance: max |engine - reference| <= 2e-2 * max |reference| per model, and the same greedy token at
every position. The reference applies the engine's activation roundings (Q8 blocks, F16 q/K/V), so
most models agree to ~1e-6 relative; the rest is float summation order, which now and then moves an
activation across a Q8 rounding boundary and shifts later logits by up to ~1.2% (measured). A real
bug (wrong norm, RoPE, head mapping, neuron order) shifts them by tens of percent.
"""

import numpy as np
import pytest
from engine_helpers import engine_logits

from pi2cli.models.numpy_llama import Reference
from pi2cli.models.randmodel import write_random_model

TOKENS = [1, 5, 7, 9, 11, 3, 42, 17]
REL_TOL = 2e-2

CASES = {
    "llama-swiglu-F32": dict(wtype="F32"),
    "llama-swiglu-F16": dict(wtype="F16"),
    "llama-swiglu-Q8_0": dict(wtype="Q8_0"),
    "llama-swiglu-Q4_0": dict(wtype="Q4_0"),
    "llama-swiglu-Q4_1": dict(wtype="Q4_1"),
    "relu-llama-Q4_0": dict(wtype="Q4_0", ffn_act="relu"),
    "drelu-Q8_0-axpy-down": dict(wtype="Q8_0", ffn_act="drelu", dense_down=False),
    "mistral-gqa-tied-Q4_1": dict(wtype="Q4_1", n_head=8, n_head_kv=2, tied=True),
    "mixtral-moe-Q4_0": dict(wtype="Q4_0", arch="moe", n_expert=4, n_expert_used=2),
    "moe-relu-F16-axpy-down": dict(
        wtype="F16", arch="moe", n_expert=4, n_expert_used=2, ffn_act="relu", dense_down=False
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", list(CASES))
def test_engine_logits_match_reference(case, tmp_path):
    model = write_random_model(tmp_path / "m.pi2", seed=len(case), **CASES[case])
    ref = Reference(model).forward(TOKENS)
    scale = np.abs(ref).max()
    prefill = engine_logits(model, TOKENS, tmp_path, "--threads", "2")
    decode = engine_logits(model, TOKENS, tmp_path, "--threads", "2", "--batch", "1")
    # Straight from the bundles (the FFN rows not packed into dense memory), both paths.
    bundles = engine_logits(model, TOKENS, tmp_path, "--threads", "2", "--no-pack-ffn")
    bundles1 = engine_logits(model, TOKENS, tmp_path, "--batch", "1", "--no-pack-ffn")
    runs = (("prefill", prefill), ("decode", decode), ("bundles", bundles), ("bundles-decode", bundles1))
    for name, got in runs:
        err = np.abs(got - ref).max()
        assert err <= REL_TOL * scale, f"{case} {name}: max diff {err:.3g} vs scale {scale:.3g}"
        assert (got.argmax(axis=1) == ref.argmax(axis=1)).all(), f"{case} {name}: greedy tokens differ"


def test_reference_detects_a_wrong_weight(tmp_path):
    """The comparison can fail: perturbing one layer's norm in the reference breaks agreement."""
    model = write_random_model(tmp_path / "m.pi2", wtype="F32")
    ref = Reference(model)
    good = ref.forward(TOKENS)
    norm = ref.f.tensor("blk.1.ffn_norm.weight").copy()
    norm[3] += 2.0
    original = ref.f.tensor
    ref.f.tensor = lambda name: norm if name == "blk.1.ffn_norm.weight" else original(name)
    bad = ref.forward(TOKENS)
    eng = engine_logits(model, TOKENS, tmp_path)
    assert np.abs(eng - good).max() <= REL_TOL * np.abs(good).max()
    assert np.abs(eng - bad).max() > REL_TOL * np.abs(good).max()
