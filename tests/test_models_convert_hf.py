"""`pi2 models convert-hf`: tiny Hugging Face-style checkpoints made here, converted and checked."""

import json
import subprocess

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from engine_helpers import engine_bin
from safetensors.numpy import save_file

from pi2cli.cli import cli
from pi2cli.errors import Pi2Error
from pi2cli.models import gguf_twin
from pi2cli.models.convert_safetensors import convert, permute_qk
from pi2cli.models.numpy_llama import rope_normal
from pi2cli.models.pi2file import Pi2File

H, F, NH, NKV, L, V = 64, 96, 2, 1, 2, 49152


def _bf16_file(path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file with bf16 tensors (numpy has no bf16: written by hand, truncating)."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = (np.ascontiguousarray(arr, np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        header[name] = {
            "dtype": "BF16",
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


def make_checkpoint(root, model_type="bamboo", moe=False, drop=None, predictor=False, predictor_bias=False):
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    cfg = {"model_type": model_type, "hidden_size": H, "intermediate_size": F, "num_hidden_layers": L,
           "num_attention_heads": NH, "num_key_value_heads": NKV, "vocab_size": V, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "hidden_act": "relu", "max_position_embeddings": 512}  # fmt: skip
    if moe:
        cfg.update(num_local_experts=4, num_experts_per_tok=2)
    (root / "config.json").write_text(json.dumps(cfg))
    hd = H // NH

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32) * 0.05

    t = {
        "model.embed_tokens.weight": w(V, H),
        "model.norm.weight": np.ones(H, np.float32),
        "lm_head.weight": w(V, H),
    }
    layers = {}
    for i in range(L):
        p = f"model.layers.{i}."
        layers.update({p + "input_layernorm.weight": np.ones(H, np.float32),
                       p + "post_attention_layernorm.weight": np.ones(H, np.float32),
                       p + "self_attn.q_proj.weight": w(NH * hd, H), p + "self_attn.k_proj.weight": w(NKV * hd, H),
                       p + "self_attn.v_proj.weight": w(NKV * hd, H), p + "self_attn.o_proj.weight": w(H, NH * hd)})  # fmt: skip
        if moe:
            layers[p + "block_sparse_moe.gate.weight"] = w(4, H)
            for e in range(4):
                q = p + f"block_sparse_moe.experts.{e}."
                layers.update({q + "w1.weight": w(F, H), q + "w3.weight": w(F, H), q + "w2.weight": w(H, F)})
        else:
            layers.update({p + "mlp.gate_proj.weight": w(F, H), p + "mlp.up_proj.weight": w(F, H),
                           p + "mlp.down_proj.weight": w(H, F)})  # fmt: skip
        if predictor:  # TurboSparse's BambooMLP layout: fc1 [rank, hidden], fc2 [ffn, rank], no biases
            layers[p + "post_attention_layernorm.weight"] = 0.5 + rng.random(H).astype(np.float32)
            for where in [f"block_sparse_moe.experts.{e}." for e in range(4)] if moe else ["mlp."]:
                layers[p + where + "predictor.fc1.weight"] = w(16, H) * 20
                layers[p + where + "predictor.fc2.weight"] = w(F, 16) * 20
                if predictor_bias:  # a layout pi2 does not read
                    layers[p + where + "predictor.fc1.bias"] = w(16)
    for name in drop or ():
        layers.pop(name, None)
        t.pop(name, None)
    save_file(t, str(root / "model-00001-of-00002.safetensors"))  # f32
    _bf16_file(root / "model-00002-of-00002.safetensors", layers)  # bf16
    return {**t, **layers}


def _gguf(reader, name):
    return next(x for x in reader.tensors if x.name == name)


@pytest.mark.slow
def test_dense_drelu_checkpoint_converts_losslessly_to_both_files(tmp_path, smollm2_gguf):
    src = make_checkpoint(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "out", smollm2_gguf, "q8_0")
    f = Pi2File(tmp_path / "out" / "model.pi2", verify=True)
    assert f.header.ffn_act == "drelu" and f.header.n_layer == L and f.header.n_head_kv == NKV
    assert len(f.tokenizer_blob) > 0
    r = gguf.GGUFReader(tmp_path / "out" / "model.gguf")
    assert r.fields["pi2.ffn_activation"].contents() == "drelu"
    # q rows are permuted to GGUF order; values survive q8_0 within its rounding
    q = gguf_twin.decode(np.asarray(_gguf(r, "blk.1.attn_q.weight").data), "q8_0", H)
    hf_q = (src["model.layers.1.self_attn.q_proj.weight"].view(np.uint32) >> 16 << 16).view(np.float32)
    assert np.allclose(q, permute_qk(hf_q, NH), atol=0.01)
    assert np.array_equal(f.tensor("blk.1.attn_q.weight"), q)
    part = f.header.part_bytes
    bundles = f.raw("blk.0.ffn_bundles")
    assert np.array_equal(
        bundles[:, :part], np.asarray(_gguf(r, "blk.0.ffn_gate.weight").data).reshape(F, -1)
    )


def test_qk_permutation_turns_hf_rope_into_adjacent_pair_rope():
    rng = np.random.default_rng(1)
    hd, n = 16, 3
    wq, wk = rng.standard_normal((n * hd, 32)), rng.standard_normal((n * hd, 32))
    x1, x2 = rng.standard_normal(32), rng.standard_normal(32)

    def rope_hf(v, pos):  # Hugging Face rotate_half on (heads, hd)
        inv = 10000.0 ** (-np.arange(0, hd, 2) / hd)
        ang = np.concatenate([pos * inv, pos * inv])
        rot = np.concatenate([-v[..., hd // 2 :], v[..., : hd // 2]], axis=-1)
        return v * np.cos(ang) + rot * np.sin(ang)

    hf = (rope_hf((wq @ x1).reshape(n, hd), 5) * rope_hf((wk @ x2).reshape(n, hd), 2)).sum(-1)
    qg = rope_normal((permute_qk(wq, n) @ x1).reshape(1, n, hd).astype(np.float32), np.array([5]), 10000.0)
    kg = rope_normal((permute_qk(wk, n) @ x2).reshape(1, n, hd).astype(np.float32), np.array([2]), 10000.0)
    assert np.allclose(hf, (qg * kg).sum(-1)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_moe_checkpoint_and_profile_order(tmp_path, smollm2_gguf):
    from pi2cli.models.profile import save_profile

    make_checkpoint(tmp_path / "hf", model_type="turbosparsemixtral", moe=True)
    freqs = {f"freq/{layer}.{e}": np.random.default_rng(e).random(F).astype(np.float32)
             for layer in range(L) for e in range(4)}  # fmt: skip
    save_profile(tmp_path / "p.npz", freqs, {})
    convert(tmp_path / "hf", tmp_path / "out", smollm2_gguf, "q4_0", profile=tmp_path / "p.npz")
    f = Pi2File(tmp_path / "out" / "model.pi2", verify=True)
    assert f.header.arch == "moe" and f.header.n_expert == 4
    order = f.tensor("blk.1.ffn_order.2").astype(int)
    assert np.array_equal(order, np.argsort(-freqs["freq/1.2"], kind="stable"))
    r = gguf.GGUFReader(tmp_path / "out" / "model.gguf")
    assert list(_gguf(r, "blk.0.ffn_down_exps.weight").shape) == [F, H, 4]


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda root: make_checkpoint(root, drop=["model.layers.1.mlp.up_proj.weight"]),
         "missing tensor model.layers.1.mlp.up_proj.weight"),
        (lambda root: make_checkpoint(root, model_type="gpt_neox"), "unknown architecture model_type='gpt_neox'"),
        (lambda root: (make_checkpoint(root), _truncate(root / "model-00002-of-00002.safetensors")),
         "truncated: tensor"),
        (lambda root: (make_checkpoint(root), _patch_config(root, intermediate_size=128)),
         "has shape (96, 64), the config implies (128, 64)"),
    ],
)  # fmt: skip
def test_bad_checkpoints_fail_in_one_line_with_no_output(tmp_path, smollm2_gguf, mutate, needle):
    mutate(tmp_path / "hf")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["models", "convert-hf", str(tmp_path / "hf"), "--tokenizer-gguf",
                                      str(smollm2_gguf), "--out", str(out)])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not out.exists() or list(out.iterdir()) == []


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])


def _patch_config(root, **kw):
    cfg = json.loads((root / "config.json").read_text())
    cfg.update(kw)
    (root / "config.json").write_text(json.dumps(cfg))


def test_vocab_mismatch_is_refused(tmp_path, smollm2_gguf):
    make_checkpoint(tmp_path / "hf")
    _patch_config(tmp_path / "hf", vocab_size=32000)
    with pytest.raises(Pi2Error, match="49152 tokens, the checkpoint's vocab_size is 32000"):
        convert(tmp_path / "hf", tmp_path / "out", smollm2_gguf)


@pytest.mark.slow
def test_llama_cpp_runs_the_converted_twin(tmp_path, smollm2_gguf, llamacpp_bindir):
    make_checkpoint(tmp_path / "hf", model_type="llama")
    convert(tmp_path / "hf", tmp_path / "out", smollm2_gguf, "q4_0")
    done = subprocess.run(
        [str(llamacpp_bindir / "llama-completion"), "-m", str(tmp_path / "out" / "model.gguf"), "-p", "Hi",
         "-n", "3", "--temp", "0", "-t", "1", "-no-cnv", "--no-warmup"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_pi2_convert_routes_a_checkpoint_to_this_converter(tmp_path, smollm2_gguf):
    """`pi2 convert DIR` (or DIR/x.safetensors) writes the same .pi2 as convert-hf, with or without a
    twin; options that need a GGUF-less source are checked."""
    make_checkpoint(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "ref", smollm2_gguf, "q8_0")
    runner = CliRunner()
    args = ["convert", str(tmp_path / "hf" / "model-00001-of-00002.safetensors"), "--out",
            str(tmp_path / "a" / "m.pi2"), "--tokenizer-gguf", str(smollm2_gguf), "--quant", "q8_0", "--json"]  # fmt: skip
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["source_format"] == "safetensors" and summary["gguf_twin"] is None
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["m.pi2"]
    a, ref = Pi2File(tmp_path / "a" / "m.pi2"), Pi2File(tmp_path / "ref" / "model.pi2")
    assert a.header == ref.header
    for name in ("blk.1.ffn_bundles", "token_embd.weight", "blk.0.attn_q.weight"):
        assert np.array_equal(np.asarray(a.raw(name)), np.asarray(ref.raw(name)))
    result = runner.invoke(cli, ["convert", str(tmp_path / "hf"), "--out", str(tmp_path / "b.pi2"),
                                 "--tokenizer-gguf", str(smollm2_gguf), "--gguf-twin", str(tmp_path / "b.gguf"),
                                 "--ffn-act", "relu"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert Pi2File(tmp_path / "b.pi2").header.ffn_act == "relu"
    assert (tmp_path / "b.gguf").read_bytes() != b"" and gguf.GGUFReader(tmp_path / "b.gguf").tensors
    result = runner.invoke(cli, ["convert", str(tmp_path / "hf"), "--out", str(tmp_path / "c.pi2")])
    assert result.exit_code == 1 and "give --tokenizer-gguf" in result.stderr
    assert not (tmp_path / "c.pi2").exists()


@pytest.mark.slow
def test_checkpoint_predictors_are_kept_in_powerinfer_form(tmp_path, smollm2_gguf):
    """A TurboSparse checkpoint's merged predictors were dropped and the model then ran dense without a
    word: now fc1 / ffn_norm and fc2's rows (in bundle order) become the .pi2's predictor, and the
    sparse engine runs it with its own predictor."""
    from pi2cli.models.profile import save_profile

    src = make_checkpoint(tmp_path / "hf", predictor=True)
    freqs = {f"freq/{layer}": np.random.default_rng(layer).random(F).astype(np.float32) for layer in range(L)}
    save_profile(tmp_path / "p.npz", freqs, {})
    res = CliRunner().invoke(cli, ["convert", str(tmp_path / "hf"), "--out", str(tmp_path / "m.pi2"),
                                   "--tokenizer-gguf", str(smollm2_gguf), "--profile", str(tmp_path / "p.npz")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "predictors: PowerInfer fc1/fc2, sigmoid threshold 0.5" in res.output and "dense" not in res.output
    f = Pi2File(tmp_path / "m.pi2", verify=True)
    assert f.header.has_predictor and f.metadata["predictor"]["threshold"] == 0.5

    def bf16(name):
        return (src[name].view(np.uint32) >> 16 << 16).view(np.float32)

    for layer in range(L):
        p = f"model.layers.{layer}."
        order = f.tensor(f"blk.{layer}.ffn_order").astype(int)
        assert np.array_equal(order, np.argsort(-freqs[f"freq/{layer}"], kind="stable"))
        fc1 = bf16(p + "mlp.predictor.fc1.weight") / bf16(p + "post_attention_layernorm.weight")
        assert np.allclose(f.tensor(f"blk.{layer}.pred_fc1").reshape(16, H), fc1, rtol=2e-3, atol=1e-3)
        fc2 = bf16(p + "mlp.predictor.fc2.weight")[order]
        assert np.allclose(f.tensor(f"blk.{layer}.pred_fc2").reshape(F, 16), fc2, rtol=2e-3, atol=1e-3)
        assert f.tensor(f"blk.{layer}.pred_threshold")[0] == 0.5
    engine = engine_bin()
    ev = tmp_path / "ev.jsonl"
    done = subprocess.run([str(engine), "generate", "-m", str(tmp_path / "m.pi2"), "-p", "Hello", "-n", "4",
                           "--policy", "powerinfer2", "--events", str(ev)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    summary = [json.loads(x) for x in ev.read_text().splitlines() if '"summary"' in x][-1]
    assert summary["policy"] == "powerinfer2" and summary["predictor"] == "model"


@pytest.mark.slow
def test_moe_checkpoint_predictors_are_kept_per_expert(tmp_path, smollm2_gguf):
    src = make_checkpoint(tmp_path / "hf", model_type="turbosparsemixtral", moe=True, predictor=True)
    convert(tmp_path / "hf", tmp_path / "out", smollm2_gguf, "q8_0")
    f = Pi2File(tmp_path / "out" / "model.pi2", verify=True)
    assert f.header.has_predictor and f.header.n_expert == 4
    assert np.array_equal(f.tensor("blk.1.pred_threshold"), np.full(4, 0.5, np.float32))

    def bf16(name):
        return (src[name].view(np.uint32) >> 16 << 16).view(np.float32)

    fc1 = bf16("model.layers.1.block_sparse_moe.experts.2.predictor.fc1.weight")
    norm = bf16("model.layers.1.post_attention_layernorm.weight")
    assert np.allclose(f.tensor("blk.1.pred_fc1.2").reshape(16, H), fc1 / norm, rtol=2e-3, atol=1e-3)
    engine = engine_bin()
    ev = tmp_path / "ev.jsonl"
    done = subprocess.run([str(engine), "generate", "-m", str(tmp_path / "out" / "model.pi2"), "-p", "Hi",
                           "-n", "3", "--policy", "powerinfer2", "--events", str(ev)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    summary = [json.loads(x) for x in ev.read_text().splitlines() if '"summary"' in x][-1]
    assert summary["policy"] == "powerinfer2" and summary["predictor"] == "model"


@pytest.mark.slow
def test_predictors_pi2_cannot_read_are_said_to_run_dense(tmp_path, smollm2_gguf, monkeypatch):
    """Predictors in a layout pi2 does not read (here: with biases) are left out: the conversion and the
    bench both say the model runs dense, and the file records why."""
    make_checkpoint(tmp_path / "hf", predictor=True, predictor_bias=True)
    out = tmp_path / "biased" / "model.pi2"
    res = CliRunner().invoke(cli, ["convert", str(tmp_path / "hf"), "--out", str(out), "--tokenizer-gguf",
                                   str(smollm2_gguf), "--gguf-twin", str(out.with_suffix(".gguf"))])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "note: model.pi2: 6 predictor tensors" in res.output and "pi2 runs it dense" in res.output
    f = Pi2File(out, verify=False)
    assert not f.header.has_predictor and f.metadata["dropped_predictors"]["count"] == 6
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    # A dReLU model converted without any predictor says so too.
    make_checkpoint(tmp_path / "plain")
    res = CliRunner().invoke(cli, ["convert", str(tmp_path / "plain"), "--out", str(tmp_path / "plain.pi2"),
                                   "--tokenizer-gguf", str(smollm2_gguf)])  # fmt: skip
    assert (
        res.exit_code == 0 and "a drelu model without activation predictors: pi2 runs it dense" in res.output
    )
    engine_bin()  # the bench runs it
    res = CliRunner().invoke(cli, ["bench", "-m", str(out), "--mode", "pp-tg", "-p", "4", "-n", "2", "--repeat",
                                   "1", "--warmup", "0", "--results-dir", str(tmp_path / "res")])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "pi2 runs it dense (policy dense)" in " ".join(res.output.split()) and "pi2:dense" in res.output
