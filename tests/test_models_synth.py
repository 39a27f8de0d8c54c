"""`pi2 models synth`: tiny synthetic models, checked from the files they write, not from the generator."""

import json
import math
import subprocess

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from pi2cli.cli import cli
from pi2cli.errors import Pi2Error
from pi2cli.models import gguf_twin, synth
from pi2cli.models.numpy_llama import attention, ffn_activation, rms_norm
from pi2cli.models.pi2file import Pi2File

TINY = dict(n_layer=2, hidden=64, ffn=256, calib_seqs=6, eval_seqs=2)


@pytest.fixture(scope="module")
def tiny_dense(tmp_path_factory, smollm2_gguf):
    out = tmp_path_factory.mktemp("dense")
    cfg = synth.SynthConfig(like="turbosparse-mistral-7b", tokenizer_gguf=smollm2_gguf, **TINY)
    summary = synth.synthesize(cfg, out)
    return out, summary


def _gguf_tensor(reader, name):
    t = next(t for t in reader.tensors if t.name == name)
    return t, np.asarray(t.data)


@pytest.mark.slow
def test_writes_both_files_and_nothing_else(tiny_dense):
    out, summary = tiny_dense
    assert sorted(p.name for p in out.iterdir()) == ["model.gguf", "model.pi2"]
    f = Pi2File(out / "model.pi2", verify=True)
    assert f.header.ffn_act == "drelu" and f.header.has_predictor and f.header.n_layer == 2
    assert f.metadata["synthetic"] is True and f.metadata["gguf_twin"] == "model.gguf"
    r = gguf.GGUFReader(out / "model.gguf")
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["pi2.synthetic"].contents() is True
    assert len(r.fields["tokenizer.ggml.tokens"].data) == f.header.n_vocab == 49152


def test_measured_statistics_are_near_the_design(tiny_dense):
    _, summary = tiny_dense
    m = summary["measured"]
    assert abs(m["sparsity"] - 0.90) < 0.04
    assert m["hot_coverage"] > 0.6  # designed ~0.8 for a 20% hot set; noisy at 256 neurons
    assert m["recall"] > 0.85
    assert 0.1 < m["precision"] <= 1.0
    assert len(summary["layers"]) == 2


@pytest.mark.slow
def test_gate_and_up_bundles_are_the_gguf_bytes(tiny_dense):
    out, _ = tiny_dense
    f = Pi2File(out / "model.pi2")
    r = gguf.GGUFReader(out / "model.gguf")
    part = f.header.part_bytes
    for layer in range(2):
        order = f.tensor(f"blk.{layer}.ffn_order").astype(np.int64)
        assert sorted(order) == list(range(256))
        bundles = f.raw(f"blk.{layer}.ffn_bundles")
        _, gate = _gguf_tensor(r, f"blk.{layer}.ffn_gate.weight")
        _, up = _gguf_tensor(r, f"blk.{layer}.ffn_up.weight")
        assert np.array_equal(bundles[:, :part], gate.reshape(256, -1)[order])
        assert np.array_equal(bundles[:, part : 2 * part], up.reshape(256, -1)[order])
        _, down = _gguf_tensor(r, f"blk.{layer}.ffn_down.weight")
        assert np.array_equal(f.raw(f"blk.{layer}.ffn_down.weight").reshape(-1), down.reshape(-1))


@pytest.mark.slow
def test_predictor_in_the_file_predicts_fresh_tokens(tiny_dense):
    """Recompute layer 0 from the .pi2's own tensors on tokens the generator never saw."""
    out, summary = tiny_dense
    f = Pi2File(out / "model.pi2")
    h = f.header
    rng = np.random.default_rng(123)
    tokens = rng.integers(0, h.n_vocab, size=4 * 64)
    x = f.tensor("token_embd.weight")[tokens]
    xn = rms_norm(x, h.rms_eps)
    att = attention(xn, f.tensor("blk.0.attn_q.weight"), f.tensor("blk.0.attn_k.weight"),
                    f.tensor("blk.0.attn_v.weight"), h.n_head, h.n_head_kv, 64, h.rope_theta)  # fmt: skip
    x = x + att @ f.tensor("blk.0.attn_output.weight").T
    xf = rms_norm(x, h.rms_eps)
    ffn = f.ffn(0)  # bundle order
    active = ffn_activation(xf @ ffn["gate"].T, xf @ ffn["up"].T, "drelu") != 0
    fc1, fc2 = f.tensor("blk.0.pred_fc1"), f.tensor("blk.0.pred_fc2")
    thr = float(f.tensor("blk.0.pred_threshold")[0])
    score = np.maximum(xf @ fc1.T, 0) @ fc2.T
    predicted = score > math.log(thr / (1 - thr))  # sigmoid(score) > thr
    sparsity = 1 - active.mean()
    recall = (predicted & active).sum() / active.sum()
    assert abs(sparsity - summary["layers"][0]["sparsity"]) < 0.05
    assert recall > 0.85
    assert predicted.mean() < 0.5  # the predictor is selective, not "everything is active"
    # hottest-first order: the first 20% of bundles carry most activations on fresh tokens too
    hot = active[:, : int(0.2 * h.n_ff)].sum() / active.sum()
    assert hot > 0.55


@pytest.mark.slow
def test_same_seed_same_files_other_seed_other_weights(tiny_dense, tmp_path, smollm2_gguf):
    out, _ = tiny_dense
    cfg = synth.SynthConfig(like="turbosparse-mistral-7b", tokenizer_gguf=smollm2_gguf, **TINY)
    synth.synthesize(cfg, tmp_path / "again")
    assert (tmp_path / "again" / "model.gguf").read_bytes() == (out / "model.gguf").read_bytes()
    assert (tmp_path / "again" / "model.pi2").read_bytes() == (out / "model.pi2").read_bytes()
    other = synth.SynthConfig(like="turbosparse-mistral-7b", tokenizer_gguf=smollm2_gguf, seed=1, **TINY)
    synth.synthesize(other, tmp_path / "other")
    assert (tmp_path / "other" / "model.gguf").read_bytes() != (out / "model.gguf").read_bytes()


@pytest.mark.slow
def test_moe_model_has_experts_routers_and_per_expert_predictors(tmp_path, smollm2_gguf):
    cfg = synth.SynthConfig(like="turbosparse-mixtral-47b", tokenizer_gguf=smollm2_gguf, n_layer=1, hidden=64,
                            ffn=128, calib_seqs=6, eval_seqs=2)  # fmt: skip
    summary = synth.synthesize(cfg, tmp_path)
    f = Pi2File(tmp_path / "model.pi2", verify=True)
    assert f.header.arch == "moe" and f.header.n_expert == 8 and f.header.n_expert_used == 2
    assert f.tensor("blk.0.pred_threshold").shape == (8,)
    assert "blk.0.pred_fc2.7" in f.tensors and "blk.0.ffn_gate_inp.weight" in f.tensors
    r = gguf.GGUFReader(tmp_path / "model.gguf")
    t, _ = _gguf_tensor(r, "blk.0.ffn_gate_exps.weight")
    assert list(t.shape) == [64, 128, 8]
    assert r.fields["llama.expert_count"].contents() == 8
    assert abs(summary["measured"]["sparsity"] - 0.85) < 0.06
    assert len(summary["layers"][0]["per_expert"]) == 8
    # the profile counts through the reference forward's recording hook: every token reaches its 2
    # experts, and the routed rows' activations are the reference's own
    from pi2cli.models import profile
    from pi2cli.models.numpy_llama import Reference

    seq = list(np.random.default_rng(3).integers(0, 49152, size=30))
    arrays = profile.profile_tokens(tmp_path / "model.pi2", [seq])
    assert sum(int(arrays[f"tokens/0.{e}"]) for e in range(8)) == 30 * 2
    seen = []
    Reference(f, emulate_rounding=False).forward(seq, record=lambda *a: seen.append(a))
    assert sorted({e for _, e, _, _ in seen}) == [e for e in range(8) if int(arrays[f"tokens/0.{e}"])]
    for e in {e for _, e, _, _ in seen}:
        act = np.concatenate([a for _, x, rows, a in seen if x == e])
        assert act.shape == (int(arrays[f"tokens/0.{e}"]), 128)
        assert np.allclose(arrays[f"freq/0.{e}"][f.ffn(0, e)["order"]], (act != 0).mean(axis=0))


@pytest.mark.slow
def test_llama_cpp_loads_and_generates_from_the_twin(tiny_dense, llamacpp_bindir):
    out, _ = tiny_dense
    done = subprocess.run(
        [str(llamacpp_bindir / "llama-completion"), "-m", str(out / "model.gguf"), "-p", "Hello", "-n", "4",
         "--temp", "0", "-t", "1", "-no-cnv", "--no-warmup"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "eval time" in done.stderr
    assert " 4 runs" in done.stderr or "/     3 runs" in done.stderr or "runs" in done.stderr


@pytest.mark.slow
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, smollm2_gguf, monkeypatch):
    runner = CliRunner()
    for args, needle in (
        (["--like", "gpt-17"], "unknown model 'gpt-17'"),
        (["--like", "turbosparse-mistral-7b", "--hidden", "100"], "multiples of 32"),
        (["--like", "smollm2-135m-instruct"], "dense SwiGLU"),
    ):
        out = tmp_path / "x"
        result = runner.invoke(
            cli,
            ["models", "synth", *args, "--layers", "1", "--tokenizer", str(smollm2_gguf), "--out", str(out)],
        )
        assert result.exit_code == 1, (args, result.output)
        assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert not out.exists() or not any(out.iterdir())

    # a failure halfway through removes both partial files
    real = synth.build_ffn_block
    calls = []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise Pi2Error("injected failure in layer 1")
        return real(*a, **k)

    monkeypatch.setattr(synth, "build_ffn_block", failing)
    with pytest.raises(Pi2Error, match="injected"):
        synth.synthesize(
            synth.SynthConfig(like="turbosparse-mistral-7b", tokenizer_gguf=smollm2_gguf, **TINY),
            tmp_path / "half",
        )
    assert list((tmp_path / "half").iterdir()) == []


def test_show_prints_measured_statistics_and_rejects_truncated_files(tiny_dense, tmp_path):
    out, summary = tiny_dense
    result = CliRunner().invoke(cli, ["models", "show", str(out / "model.pi2")])
    assert result.exit_code == 0
    assert "SYNTHETIC" in result.stdout and "recall" in result.stdout and "hot 20% covers" in result.stdout
    data = json.loads(CliRunner().invoke(cli, ["models", "show", str(out / "model.pi2"), "--json"]).stdout)
    assert math.isclose(data["metadata"]["measured"]["recall"], summary["measured"]["recall"])
    cut = tmp_path / "cut.pi2"
    cut.write_bytes((out / "model.pi2").read_bytes()[:20000])
    result = CliRunner().invoke(cli, ["models", "show", str(cut)])
    assert result.exit_code == 1 and "truncated" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_frequency_profile_is_skewed_with_the_requested_mean():
    p = synth.frequency_targets(np.random.default_rng(0), 14336, 0.10)
    assert abs(p.mean() - 0.10) < 1e-6 and p.max() <= synth.MAX_NEURON_FREQ
    top = np.sort(p)[::-1][: len(p) // 5]
    assert 0.75 < top.sum() / p.sum() < 0.85


def test_gguf_twin_writer_refuses_out_of_order_tensors(tmp_path):
    w = gguf_twin.GgufTwinWriter(tmp_path / "t.gguf", [])
    w.declare("a", (2, 32), "q4_0")
    w.declare("b", (32,), "f32")
    with pytest.raises(Pi2Error, match="out of order"):
        w.write("b", np.zeros(32, np.float32))
    w.abort()
    assert list(tmp_path.iterdir()) == []


def test_profile_reference_forward_agrees_with_the_synth_measurements(tiny_dense, tmp_path):
    """A full forward through both layers, from the .pi2 alone, on fresh token sequences."""
    from pi2cli.models import profile

    out, summary = tiny_dense
    rng = np.random.default_rng(7)
    seqs = [list(rng.integers(0, 49152, size=n)) for n in (64, 40, 25)]
    arrays = profile.profile_tokens(out / "model.pi2", seqs)
    rows = profile.summarize(arrays)
    assert [r["block"] for r in rows] == ["0", "1"] and rows[0]["tokens"] == 129
    for row, layer in zip(rows, summary["layers"], strict=True):
        assert abs(row["sparsity"] - layer["sparsity"]) < 0.05
        assert row["hot_coverage"] > 0.6
    assert arrays["coact/1"].shape == (256, 256)
    assert np.all(
        np.diag(arrays["coact/1"]) >= arrays["coact/1"].max(axis=0)
    )  # a neuron co-fires with itself most
    saved = profile.save_profile(tmp_path / "p.npz", arrays, {"tokens": 129})
    loaded, meta = profile.load_profile(saved)
    assert meta == {"tokens": 129} and np.array_equal(loaded["freq/0"], arrays["freq/0"])
    assert [p.name for p in tmp_path.iterdir()] == ["p.npz"]


def test_profile_command_bad_input(tiny_dense, tmp_path):
    out, _ = tiny_dense
    bad = tmp_path / "w.jsonl"
    bad.write_text('{"id": 1}\n')
    runner = CliRunner()
    result = runner.invoke(cli, ["models", "profile", "-m", str(out / "model.pi2"), "-w", str(bad)])
    assert result.exit_code == 1 and "w.jsonl:1: not a JSON object with 'turns'" in result.stderr
    good = tmp_path / "g.jsonl"
    good.write_text(json.dumps({"id": "a", "system": None, "turns": ["Hello there"]}) + "\n")
    result = runner.invoke(cli, ["models", "profile", "-m", str(out / "model.pi2"), "-w", str(good),
                                 "--tokenizer-bin", str(tmp_path / "missing-pi2-tokenize")])  # fmt: skip
    assert result.exit_code == 1 and "build the engine first" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_pi2_engine_verifies_and_generates_from_the_synthetic_model(tiny_dense):
    from engine_helpers import run_engine

    out, _ = tiny_dense
    info = run_engine("info", "-m", out / "model.pi2", "--verify")
    assert "neuron region ok" in info.stdout + info.stderr and "drelu" in info.stdout + info.stderr
    done = run_engine("generate", "-m", out / "model.pi2", "-p", "Hello world", "-n", "6", "--threads", "1",
                      "--ignore-eos")  # fmt: skip
    assert "6 generated tokens" in done.stderr


@pytest.mark.slow
def test_twin_converted_by_the_gguf_converter_has_the_same_weights(tiny_dense, tmp_path):
    """The engine's GGUF -> .pi2 converter, run on the twin, yields synth's .pi2 weights (up to order)."""
    from pi2cli.models.convert import convert_gguf

    out, _ = tiny_dense
    convert_gguf(out / "model.gguf", tmp_path / "via.pi2", ffn_act="drelu")
    a, b = Pi2File(out / "model.pi2"), Pi2File(tmp_path / "via.pi2")
    assert a.tokenizer_blob == b.tokenizer_blob
    for name in ("token_embd.weight", "output.weight", "blk.1.attn_q.weight", "blk.1.ffn_down.weight"):
        assert np.array_equal(a.raw(name), b.raw(name)), name
    for layer in range(2):
        fa, fb = a.ffn(layer), b.ffn(layer)
        for part in ("gate", "up"):
            xa, xb = np.empty_like(fa[part]), np.empty_like(fb[part])
            xa[fa["order"].astype(int)], xb[fb["order"].astype(int)] = fa[part], fb[part]
            assert np.array_equal(xa, xb), (layer, part)
