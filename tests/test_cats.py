"""CATS (pi2cli/quality/cats.py) and the engine's gate predictor (flags bit3, sparse_predict.c).

On small random SwiGLU models: at threshold 0 every policy's logits equal the dense policy's (the
oracle tests' tolerance, tests/test_engine_reference.py); at a real threshold they equal a numpy
reference that drops exactly the neurons with |silu(gate . x)| <= t, and not the dense logits. On
SmolLM2-135M (real weights): `pi2 convert --sparsify cats --sparsity 0` gives the dense logits on real
text, and a 50% CATS file under a budget below its size keeps its RSS under the budget and reports
speed and quality.
"""

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from engine_helpers import engine_logits, run_engine

from pi2cli.cli import cli
from pi2cli.models.numpy_llama import Reference
from pi2cli.models.pi2file import Pi2File
from pi2cli.models.randmodel import write_random_model
from pi2cli.quality.cats import calibrate, write_cats

TOKENS = [1, 5, 7, 9, 11, 3, 42, 17, 60, 2, 33, 71]
REL_TOL = 2e-2  # tests/test_engine_reference.py
POLICIES = ["bundle", "llmflash", "cache", "powerinfer2"]


class CatsReference(Reference):
    """The numpy forward with CATS applied: neurons with |silu(g)| <= t[layer] contribute nothing."""

    def __init__(self, path, thresholds):
        super().__init__(path)
        self.t = thresholds

    def _ffn_block(self, x, layer, expert):
        b = self._ffn(layer, expert)
        g = self._mm(x, b["gate"], self.h.neuron_type)
        u = self._mm(x, b["up"], self.h.neuron_type)
        s = g / (1.0 + np.exp(-g.astype(np.float64))).astype(np.float32)
        a = np.where(np.abs(s) > self.t[layer], s * u, 0.0).astype(np.float32)
        return (a.astype(np.float64) @ b["down_cols"].astype(np.float64)).astype(np.float32)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    # no dense down copy: the dense policy then uses the bundles' down columns, as the sparse path does
    return write_random_model(tmp_path_factory.mktemp("cats") / "dense.pi2", dense_down=False, seed=3)


def _cats(dense, path, thresholds, **kw):
    write_cats(dense, path, 0.5, {"thresholds": thresholds}, **kw)
    return path


def _close(got, want, what):
    scale = np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= REL_TOL * scale, f"{what}: max diff {err:.3g} vs scale {scale:.3g}"
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all(), f"{what}: greedy tokens differ"


def test_the_file_says_gate_predictor_and_keeps_the_weights(dense, tmp_path):
    cats = _cats(dense, tmp_path / "c.pi2", [0.0, 0.0])
    h = Pi2File(cats).header
    assert h.has_predictor and h.gate_predictor
    # bundle k's gate row is pred_gate's row k (bundle order), and the dense policy gives the same logits
    f = Pi2File(cats)
    raw = np.asarray(f.raw("blk.1.ffn_bundles"))
    assert np.array_equal(raw[:, : h.part_bytes], np.asarray(f.raw("blk.1.pred_gate")))
    assert np.array_equal(engine_logits(cats, TOKENS, tmp_path), engine_logits(dense, TOKENS, tmp_path))


@pytest.mark.parametrize("policy", POLICIES)
def test_threshold_zero_gives_the_dense_logits(dense, tmp_path, policy):
    cats = _cats(dense, tmp_path / "c.pi2", [0.0, 0.0])
    want = engine_logits(cats, TOKENS, tmp_path, "--batch", "1")
    _close(engine_logits(cats, TOKENS, tmp_path, "--batch", "1", "--policy", policy), want, policy)


@pytest.mark.parametrize("policy", ["cache", "powerinfer2"])
def test_a_threshold_drops_exactly_the_small_activations(dense, tmp_path, policy):
    ref = Reference(dense)
    # per layer: the median |silu(gate)| of this prompt's tokens at layer input ~ 50% sparsity
    thresholds = [0.08, 0.1]
    cats = _cats(dense, tmp_path / "c.pi2", thresholds)
    got = engine_logits(cats, TOKENS, tmp_path, "--batch", "1", "--policy", policy)
    _close(got, CatsReference(dense, thresholds).forward(TOKENS), f"{policy} vs CATS reference")
    full = ref.forward(TOKENS)
    assert np.abs(got - full).max() > REL_TOL * np.abs(full).max(), "the thresholds changed nothing"


def test_probability_thresholds_are_refused_with_one_line(dense, tmp_path):
    cats = _cats(dense, tmp_path / "c.pi2", [0.08, 0.1])
    for flag in ("--pred-threshold", "--miss-threshold"):
        bad = run_engine("eval", "-m", cats, "--tokens", "1,2", "--logits-out", tmp_path / "l.bin", "--policy",
                         "cache", flag, "0.5", check=False)  # fmt: skip
        assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert "gate predictor" in bad.stderr and not (tmp_path / "l.bin").exists()


def test_q8_bundles_take_the_down_columns_from_the_dense_copy(tmp_path):
    """A 4-bit source's bundle columns are re-quantized; CATS rebuilds them from the lossless copy."""
    src = write_random_model(tmp_path / "d.pi2", wtype="Q4_1", seed=5)
    cats = _cats(src, tmp_path / "c.pi2", [0.0, 0.0], bundle_type="Q8_0")
    f, d = Pi2File(cats), Pi2File(src)
    assert f.header.neuron_type == "Q8_0" and f.tensors["blk.0.pred_gate"].type == "Q4_1"
    order = f.tensor("blk.0.ffn_order").astype(int)
    down = d.tensor("blk.0.ffn_down.weight")  # (n_embd, n_ff), lossless
    err_q8 = np.abs(f.ffn(0)["down_cols"] - down.T[order]).max()
    err_q4 = np.abs(d.ffn(0)["down_cols"] - down.T[d.tensor("blk.0.ffn_order").astype(int)]).max()
    assert err_q8 < err_q4 / 4, (err_q8, err_q4)
    want = engine_logits(src, TOKENS, tmp_path, "--batch", "1")
    _close(
        engine_logits(cats, TOKENS, tmp_path, "--batch", "1", "--policy", "powerinfer2"), want, "q8 bundles"
    )


def test_convert_errors_are_one_line(dense, tmp_path):
    runner = CliRunner()
    relu = write_random_model(tmp_path / "relu.pi2", ffn_act="relu")
    res = runner.invoke(cli, ["convert", str(relu), "--sparsify", "cats", "--sparsity", "0", "--out",
                              str(tmp_path / "x.pi2")])  # fmt: skip
    assert res.exit_code != 0 and "CATS needs a dense SwiGLU model" in res.output, res.output
    for args, words in (
        (["--sparsity", "0.5"], "go with --sparsify"),
        (["--sparsify", "cats"], "needs --sparsity"),
        (["--sparsify", "cats", "--sparsity", "0.5", "--quant", "q4_0"], "--quant does not go"),
    ):
        res = runner.invoke(cli, ["convert", str(dense), "--out", str(tmp_path / "x.pi2"), *args])
        assert res.exit_code != 0 and words in res.output, res.output
        assert not (tmp_path / "x.pi2").exists()


# ----------------------------------------------------------------------------------- SmolLM2-135M (real)
@pytest.fixture(scope="module")
def smollm2_dense(smollm2_pi2):
    return smollm2_pi2


# The real model's tolerance (tests/test_smollm2_agreement.py): 30 layers amplify float summation
# order, so the dense path's own batched and one-token passes differ by 2.7% of the largest logit on
# this file; its sparse policies by 2.4% (KL 0.003 nats).
REAL_TOL, REAL_KL = 0.05, 0.05


@pytest.mark.slow
def test_smollm2_cats_at_sparsity_zero_gives_the_dense_logits(smollm2_dense, tmp_path):
    from pi2cli.quality import metrics, text

    out = tmp_path / "cats0.pi2"
    res = CliRunner().invoke(cli, ["convert", str(smollm2_dense), "--sparsify", "cats", "--sparsity", "0",
                                   "--out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    ids = [int(t) for t in text.tokenize(out, text.workload_text("multi-turn", "evaluation")).ids[:24]]
    want = engine_logits(out, ids, tmp_path, "--batch", "1")
    oracle = engine_logits(out, ids, tmp_path, "--batch", "1", "--policy", "cache", "--predictor", "oracle")
    for policy in ("cache", "powerinfer2"):
        got = engine_logits(out, ids, tmp_path, "--batch", "1", "--policy", policy)
        assert np.array_equal(got, oracle), f"{policy}: threshold 0 dropped a neuron the oracle computes"
        scale, err = np.abs(want).max(), np.abs(got - want).max()
        assert err <= REAL_TOL * scale, f"{policy}: max diff {err:.3g} vs scale {scale:.3g}"
        kl = metrics.score_positions(want, got, np.zeros(len(ids), dtype=int)).kl.mean()
        assert kl < REAL_KL, f"{policy}: KL {kl:.4f}"


@pytest.mark.slow
def test_smollm2_cats50_under_a_budget_below_the_file_keeps_rss_and_reports_speed_and_quality(
    smollm2_dense, tmp_path
):
    from pi2cli.quality.runner import QualityConfig, measure

    calib = calibrate(smollm2_dense, 0.5, max_chunks=1)  # one chunk keeps the test short
    cats = tmp_path / "cats50.pi2"
    write_cats(smollm2_dense, cats, 0.5, calib, bundle_type="Q8_0")
    size = cats.stat().st_size
    budget = 128 << 20
    assert budget < size
    ev = tmp_path / "ev.jsonl"
    run_engine("generate", "-m", cats, "-p", "The capital of France is", "-n", "12", "--ignore-eos",
               "--policy", "powerinfer2", "--memory-budget", str(budget), "--threads", "2", "--events", ev)  # fmt: skip
    events = {e["event"]: e for e in map(json.loads, ev.read_text().splitlines())}  # the last of each kind
    turn, summary = events["turn"], events["summary"]
    assert summary["peak_rss_bytes"] < budget and summary["storage_bytes_read"] > 0
    assert turn["decode_tps"] > 0
    assert 0.3 < summary["active_fraction"] < 0.7, summary["active_fraction"]
    q = measure(
        QualityConfig(cats, policy="powerinfer2", memory_budget=str(budget), ctx=64, chunks=1, threads=2)
    )
    assert q["tokens_scored"] == 31 and q["memory_budget"] == str(budget)
    assert 0 < q["kl_nats"] < 2 and 0.3 < q["top1_agreement"] < 1 and q["ppl_ratio"] > 1


# --------------------------------------------------------------------- CATS output benches as any model
@pytest.mark.slow
def test_cats_writes_a_twin_and_benches_with_or_without_it(
    smollm2_gguf, smollm2_dense, tmp_path, monkeypatch
):
    """`--sparsify cats` once refused --gguf-twin, and bench refused a .pi2 without a twin even for pi2
    alone: the CATS workflow ended at the file. Now the twin is the dense source's GGUF, pi2 alone needs
    none (the .pi2 keeps the chat template) and llama.cpp without one says in one line how to make it."""
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    runner = CliRunner()
    twin = tmp_path / "with" / "cats0.gguf"
    twin.parent.mkdir()
    res = runner.invoke(cli, ["convert", str(smollm2_gguf), "--sparsify", "cats", "--sparsity", "0", "--out",
                              str(twin.with_suffix(".pi2")), "--gguf-twin", str(twin)])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert twin.read_bytes() == smollm2_gguf.read_bytes()  # a plain GGUF's twin is the source, byte for byte
    meta = Pi2File(twin.with_suffix(".pi2"), verify=False).metadata
    assert meta["gguf_twin"] == twin.name and "<|im_start|>" in meta["chat_template"]["template"]

    alone = tmp_path / "alone" / "cats0.pi2"
    alone.parent.mkdir()
    res = runner.invoke(cli, ["convert", str(smollm2_gguf), "--sparsify", "cats", "--sparsity", "0", "--out",
                              str(alone)])  # fmt: skip
    assert res.exit_code == 0 and list(alone.parent.iterdir()) == [alone], res.output
    results = tmp_path / "results"
    res = runner.invoke(cli, ["bench", "-m", str(alone), "-e", "pi2", "--limit", "1", "-n", "2", "--results-dir",
                              str(results), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["runs"]
    assert row["status"] == "ok" and row["policy"] == "powerinfer2"
    res = runner.invoke(cli, ["bench", "-m", str(alone), "-e", "pi2", "-e", "llama.cpp", "--limit", "1",
                              "--results-dir", str(tmp_path / "none")])  # fmt: skip
    assert (
        res.exit_code == 1
        and len(res.output.split()) > 5
        and len(res.output.strip().splitlines()) == 1
        and "--gguf-twin cats0.gguf" in res.output
    )
    assert not (tmp_path / "none" / "runs").exists() or not list((tmp_path / "none" / "runs").iterdir())

    # A dense .pi2 source without a twin beside it (the shared SmolLM2 has one: a lone copy): one line and
    # no output.
    lone = tmp_path / "lone" / "smollm2.pi2"
    lone.parent.mkdir()
    shutil.copy(smollm2_dense, lone)
    out = tmp_path / "from-pi2.pi2"
    res = runner.invoke(cli, ["convert", str(lone), "--sparsify", "cats", "--sparsity", "0", "--out",
                              str(out), "--gguf-twin", str(tmp_path / "from-pi2.gguf")])  # fmt: skip
    assert res.exit_code == 1 and "has no GGUF twin beside it" in res.output and not out.exists()
