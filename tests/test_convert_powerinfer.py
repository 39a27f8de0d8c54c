"""`pi2 convert` on PowerInfer GGUFs made here with the gguf package, named and laid out as PowerInfer's
convert-hf-to-powerinfer-gguf.py writes them (magic PWRI, blk.N.ffn_down_t, blk.N.fc1/fc2,
powerinfer.sparse_threshold), plus `--profile` on GGUF input and the routing of safetensors sources.

The strong check: pi2-engine's logits on the converted file match a numpy forward computed straight
from the GGUF's own (dequantized) weights with PowerInfer's FFN math, so a converter that misplaces a
row, a column or the activation fails it, even though the .pi2 reader would agree with itself."""

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from engine_helpers import engine_logits

from pi2cli.cli import cli
from pi2cli.errors import Pi2Error
from pi2cli.models.convert import convert_gguf
from pi2cli.models.numpy_llama import Reference, attention, ffn_activation, rms_norm
from pi2cli.models.pi2file import Pi2File, decode_rows, encode_rows
from pi2cli.models.profile import save_profile

E, F, R, NH, NKV, L = 64, 96, 32, 4, 2, 2  # n_embd, n_ff, predictor rank, heads, kv heads, layers
EPS = 1e-5
TOKENS = [1, 5, 7, 9, 11, 3, 42, 17]


def _vocab():
    """A small SentencePiece-style vocabulary: specials, 256 byte tokens, a few pieces."""
    tokens = (
        ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [f"\u2581w{i}" for i in range(29)]
    )
    types = [2, 3, 3] + [6] * 256 + [1] * 29
    scores = [0.0] * 259 + [-float(i) for i in range(29)]
    return tokens, types, scores


def write_gguf(path, arch="llama", wtype="Q8_0", down_type=None, threshold=None, predictors=True,
               transposed_down=True, drop=(), reshape=None, zero_norm=False, seed=0):  # fmt: skip
    """A PowerInfer-style GGUF (or, with transposed_down=False and predictors=False, a plain one).
    Returns the float weights as stored (dequantized), keyed by GGUF name, numpy shapes."""
    rng = np.random.default_rng(seed)
    tokens, types, scores = _vocab()
    v, hd = len(tokens), E // NH
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(512)
    w.add_embedding_length(E)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_rope_dimension_count(hd)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if threshold is not None:
        w.add_float32("powerinfer.sparse_threshold", threshold)
    stored = {}

    def add(name, values, qtype=None):
        if name in drop:
            return
        qtype = qtype or wtype
        values = np.asarray(values, np.float32)
        if reshape and name in reshape:
            values = values.reshape(reshape[name])
        if qtype == "F32":
            w.add_tensor(name, values)
            stored[name] = values
            return
        if qtype == "F16":
            w.add_tensor(name, values.astype(np.float16))
            stored[name] = values.astype(np.float16).astype(np.float32)
            return
        raw = gguf.quants.quantize(values, gguf.GGMLQuantizationType[qtype])
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType[qtype])
        stored[name] = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(values.shape)

    def mat(rows, cols, scale):
        return rng.standard_normal((rows, cols)) * scale

    add("token_embd.weight", mat(v, E, 1.0))
    add("output_norm.weight", 0.5 + rng.random(E), "F32")
    add("output.weight", mat(v, E, 0.2))
    for i in range(L):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", 0.5 + rng.random(E), "F32")
        add(p + "attn_q.weight", mat(E, E, 0.15))
        add(p + "attn_k.weight", mat(NKV * hd, E, 0.15))
        add(p + "attn_v.weight", mat(NKV * hd, E, 0.15))
        add(p + "attn_output.weight", mat(E, E, 0.1))
        norm = 0.5 + rng.random(E)  # not all ones: the fold is visible
        if zero_norm and i == 1:
            norm[3] = 0.0
        add(p + "ffn_norm.weight", norm, "F32")
        add(p + "ffn_gate.weight", mat(F, E, 0.15))
        add(p + "ffn_up.weight", mat(F, E, 0.15))
        down = mat(E, F, 0.1)  # the usual down (n_embd, n_ff)
        if transposed_down:
            add(p + "ffn_down_t.weight", down.T, down_type)  # PowerInfer: data = down.T
        else:
            add(p + "ffn_down.weight", down, down_type)
        if predictors:
            add(p + "fc1.weight", mat(R, E, 0.2), "F16")  # nn.Linear(hidden, rank).weight
            add(p + "fc2.weight", mat(F, R, 0.2), "F16")  # nn.Linear(rank, n_ff).weight
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if transposed_down or predictors:
        with open(path, "r+b") as fh:  # PowerInfer overwrites the magic
            fh.write(b"PWRI")
    return stored


def gguf_forward(s: dict, tokens: list[int], act: str) -> np.ndarray:
    """Logits from the source GGUF's weights with PowerInfer's dense FFN math (float32 numpy)."""
    x = s["token_embd.weight"][np.asarray(tokens)]
    n = len(tokens)
    for i in range(L):
        p = f"blk.{i}."
        xn = rms_norm(x, EPS) * s[p + "attn_norm.weight"]
        a = attention(xn, s[p + "attn_q.weight"], s[p + "attn_k.weight"], s[p + "attn_v.weight"], NH, NKV, n,
                      10000.0)  # fmt: skip
        x = x + a @ s[p + "attn_output.weight"].T
        xn = rms_norm(x, EPS) * s[p + "ffn_norm.weight"]
        h = ffn_activation(xn @ s[p + "ffn_gate.weight"].T, xn @ s[p + "ffn_up.weight"].T, act)
        down = s[p + "ffn_down_t.weight"].T if p + "ffn_down_t.weight" in s else s[p + "ffn_down.weight"]
        x = x + h @ down.T
    return (rms_norm(x, EPS) * s["output_norm.weight"]) @ s["output.weight"].T


def _gguf_rows(path, name):
    """A GGUF tensor's raw bytes as (rows, row_bytes)."""
    from pi2cli.models.convert import _raw_rows, open_gguf

    t = next(t for t in open_gguf(path).tensors if t.name == name)
    return np.array(_raw_rows(t))


@pytest.mark.parametrize(
    "arch, wtype, act, threshold",
    [("llama", "Q8_0", "relu", None), ("bamboo", "Q4_0", "drelu", 0.0), ("llama", "F16", "relu", 0.7)],
)
def test_powerinfer_gguf_converts_losslessly_and_the_engine_runs_it(tmp_path, arch, wtype, act, threshold):
    src = tmp_path / "m.powerinfer.gguf"
    stored = write_gguf(src, arch=arch, wtype=wtype, threshold=threshold)
    out = tmp_path / "m.pi2"
    summary = convert_gguf(src, out)
    assert summary["source_format"] == "powerinfer-gguf" and summary["ffn_act"] == act
    f = Pi2File(out, verify=True)
    h = f.header
    assert h.arch == "llama" and h.ffn_act == act and h.has_predictor and not h.dense_down
    assert h.neuron_type == wtype and f.metadata["source"]["format"] == "powerinfer-gguf"
    t = threshold or 0.0
    sig = 1.0 / (1.0 + np.exp(-t))
    assert f.metadata["predictor"]["threshold_exact"] == (t == 0.0)
    for layer in range(L):
        p = f"blk.{layer}."
        bundles = np.asarray(f.raw(p + "ffn_bundles"))
        part = h.part_bytes
        # gate and up rows and the transposed down's rows land in the bundles bit for bit
        assert np.array_equal(bundles[:, :part], _gguf_rows(src, p + "ffn_gate.weight"))
        assert np.array_equal(bundles[:, part : 2 * part], _gguf_rows(src, p + "ffn_up.weight"))
        assert np.array_equal(bundles[:, 2 * part : 3 * part], _gguf_rows(src, p + "ffn_down_t.weight"))
        assert np.array_equal(f.tensor(p + "ffn_order"), np.arange(F))
        assert f.tensors[p + "pred_fc1"].shape == (E, R) and f.tensors[p + "pred_fc2"].shape == (R, F)
        assert np.array_equal(np.asarray(f.raw(p + "pred_fc2")), _gguf_rows(src, p + "fc2.weight"))
        np.testing.assert_allclose(f.tensor(p + "pred_threshold"), [sig], rtol=1e-6)
        fc1 = f.tensor(p + "pred_fc1")  # numpy (rank, n_embd)
        np.testing.assert_allclose(fc1, stored[p + "fc1.weight"] / stored[p + "ffn_norm.weight"], rtol=2e-3,
                                   atol=1e-4)  # fmt: skip
        # The decision is PowerInfer's: score_pi2 * rms(h) == fc2 relu(fc1 h) for any residual h,
        # so with t = 0 the active sets are the same.
        hs = np.random.default_rng(layer).standard_normal((64, E)).astype(np.float32) * 3
        x = rms_norm(hs, EPS) * stored[p + "ffn_norm.weight"]
        ours = np.maximum(x @ fc1.T, 0) @ f.tensor(p + "pred_fc2").T
        theirs = np.maximum(hs @ stored[p + "fc1.weight"].T, 0) @ stored[p + "fc2.weight"].T
        rms = np.sqrt(np.mean(hs.astype(np.float64) ** 2, axis=1, keepdims=True) + EPS)
        np.testing.assert_allclose(ours * rms, theirs, rtol=1e-2, atol=1e-2 * np.abs(theirs).max())
        if t == 0.0:
            clear = np.abs(theirs) > 1e-2 * np.abs(theirs).max()
            decided = 1.0 / (1.0 + np.exp(-ours)) > f.tensor(p + "pred_threshold")[0]
            assert np.array_equal(decided[clear], (theirs > t)[clear])
    # pi2-engine runs it; its logits match both the .pi2 reference and the GGUF's own math
    got = engine_logits(out, TOKENS, tmp_path)
    ref = Reference(out).forward(TOKENS)
    assert np.abs(got - ref).max() <= 2e-2 * np.abs(ref).max()
    assert np.array_equal(got.argmax(axis=1), ref.argmax(axis=1))
    # The GGUF math runs on float activations (the engine rounds them to Q8/F16 blocks): a few
    # percent apart at most; a misplaced row or a wrong activation is off by tens of percent.
    src_ref = gguf_forward(stored, TOKENS, act)
    scale = np.abs(src_ref).max()
    assert np.abs(got - src_ref).max() <= 5e-2 * scale, np.abs(got - src_ref).max() / scale
    picked = got[np.arange(len(TOKENS)), src_ref.argmax(axis=1)]
    assert np.all(picked >= got.max(axis=1) - 5e-2 * scale)  # the source's top token is (near-)top here


def test_down_of_another_type_is_requantized_into_the_bundles(tmp_path):
    src = tmp_path / "m.gguf"
    stored = write_gguf(src, wtype="Q4_0", down_type="F16")
    convert_gguf(src, tmp_path / "m.pi2")
    f = Pi2File(tmp_path / "m.pi2")
    cols = f.ffn(1)["down_cols"]
    want = decode_rows(encode_rows(stored["blk.1.ffn_down_t.weight"], "Q4_0"), "Q4_0", E)
    np.testing.assert_allclose(cols, want, rtol=1e-6)


def test_profile_orders_bundles_and_predictor_rows_alike(tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src)
    rng = np.random.default_rng(3)
    freqs = {f"freq/{layer}": rng.random(F).astype(np.float32) for layer in range(L)}
    save_profile(tmp_path / "p.npz", freqs, {})
    result = CliRunner().invoke(cli, ["convert", str(src), "--out", str(tmp_path / "m.pi2"), "--profile",
                                      str(tmp_path / "p.npz"), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    f = Pi2File(tmp_path / "m.pi2")
    for layer in range(L):
        p = f"blk.{layer}."
        order = np.argsort(-freqs[f"freq/{layer}"], kind="stable")
        assert np.array_equal(f.tensor(p + "ffn_order"), order)
        part = f.header.part_bytes
        assert np.array_equal(
            np.asarray(f.raw(p + "ffn_bundles"))[:, :part], _gguf_rows(src, p + "ffn_gate.weight")[order]
        )
        # row k of pred_fc2 scores bundle k
        assert np.array_equal(np.asarray(f.raw(p + "pred_fc2")), _gguf_rows(src, p + "fc2.weight")[order])
    # the reordered file computes the same function
    ref = Reference(tmp_path / "m.pi2").forward(TOKENS)
    convert_gguf(src, tmp_path / "plain.pi2")
    plain = Reference(tmp_path / "plain.pi2").forward(TOKENS)
    np.testing.assert_allclose(ref, plain, rtol=1e-4, atol=1e-4 * np.abs(plain).max())


def test_profile_on_a_plain_gguf_keeps_the_lossless_dense_down(tmp_path):
    src = tmp_path / "plain.gguf"
    write_gguf(src, predictors=False, transposed_down=False)
    freqs = {f"freq/{layer}": np.linspace(0, 1, F, dtype=np.float32) for layer in range(L)}
    save_profile(tmp_path / "p.npz", freqs, {})
    summary = convert_gguf(src, tmp_path / "m.pi2", profile=tmp_path / "p.npz")
    assert summary["source_format"] == "gguf" and summary["ffn_act"] == "swiglu"
    f = Pi2File(tmp_path / "m.pi2")
    assert f.header.dense_down and not f.header.has_predictor
    assert np.array_equal(f.tensor("blk.0.ffn_order"), np.arange(F)[::-1])
    assert np.array_equal(
        np.asarray(f.raw("blk.0.ffn_down.weight")), _gguf_rows(src, "blk.0.ffn_down.weight")
    )


def _fails(tmp_path, args, needle):
    out = tmp_path / "o.pi2"
    result = CliRunner().invoke(cli, ["convert", *map(str, args), "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists() and not any(p.name.startswith(".o.pi2") for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(drop=("blk.1.fc2.weight",)), "blk.1.fc2.weight is missing (blk.1.fc1.weight exists"),
        (dict(drop=("blk.1.fc1.weight", "blk.1.fc2.weight")), "blk.1.fc1.weight is missing"),
        (dict(reshape={"blk.0.fc2.weight": (F // 2, 2 * R)}), "tensor blk.0.fc2.weight has shape [64, 48]"),
        (dict(reshape={"blk.1.fc1.weight": (2 * R, E // 2)}), "tensor blk.1.fc1.weight has shape [32, 64]"),
        (
            dict(reshape={"blk.0.ffn_down_t.weight": (E, F)}),
            "tensor blk.0.ffn_down_t.weight has shape [96, 64]",
        ),
        (dict(drop=("blk.0.ffn_down_t.weight",)), "blk.0.ffn_down_t.weight is missing"),
        (dict(zero_norm=True), "blk.1.ffn_norm.weight has zero or non-finite entries"),
    ],
)
def test_bad_powerinfer_files_name_the_tensor(tmp_path, kwargs, needle):
    write_gguf(tmp_path / "bad.gguf", **kwargs)
    _fails(tmp_path, [tmp_path / "bad.gguf"], needle)


def test_options_that_do_not_apply_are_refused(tmp_path):
    write_gguf(tmp_path / "m.gguf")
    _fails(tmp_path, [tmp_path / "m.gguf", "--quant", "q8_0"], "--quant applies to safetensors")
    _fails(
        tmp_path, [tmp_path / "m.gguf", "--tokenizer-gguf", tmp_path / "m.gguf"], "--tokenizer-gguf applies"
    )
    save_profile(tmp_path / "p.npz", {"freq/0": np.ones(F + 1, np.float32)}, {})
    _fails(tmp_path, [tmp_path / "m.gguf", "--profile", tmp_path / "p.npz"], "freq/0 has shape (97,)")
    save_profile(tmp_path / "q.npz", {"freq/0": np.ones(F, np.float32)}, {})
    _fails(tmp_path, [tmp_path / "m.gguf", "--profile", tmp_path / "q.npz"], "profile has no freq/1")


def test_convert_api_error_is_a_pi2error(tmp_path):
    write_gguf(tmp_path / "bad.gguf", drop=("blk.0.fc2.weight",))
    with pytest.raises(Pi2Error, match="blk.0.fc2.weight"):
        convert_gguf(tmp_path / "bad.gguf", tmp_path / "o.pi2")


def test_a_wrong_conversion_would_fail_the_source_check(tmp_path):
    """The source-math comparison can fail: the same weights with SwiGLU instead of ReLU."""
    src = tmp_path / "m.gguf"
    stored = write_gguf(src)
    convert_gguf(src, tmp_path / "m.pi2", ffn_act="swiglu")
    got = engine_logits(tmp_path / "m.pi2", TOKENS, tmp_path)
    src_ref = gguf_forward(stored, TOKENS, "relu")
    assert np.abs(got - src_ref).max() > 0.2 * np.abs(src_ref).max()


@pytest.mark.parametrize("arch, wtype", [("bamboo", "Q4_0"), ("llama", "F16")])
def test_gguf_twin_of_a_powerinfer_gguf_is_what_llama_cpp_loads(tmp_path, llamacpp_bindir, arch, wtype):
    """The twin: magic GGUF, arch llama, ffn_down (the .pi2's dense copy, byte for byte), no
    predictors; llama.cpp generates from it."""
    import json
    import subprocess

    src = tmp_path / "m.gguf"
    stored = write_gguf(src, arch=arch, wtype=wtype, threshold=0.0)
    twin = tmp_path / "twin.gguf"
    args = ["convert", str(src), "--out", str(tmp_path / "m.pi2"), "--gguf-twin", str(twin)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert twin.read_bytes()[:4] == b"GGUF"
    r = gguf.GGUFReader(twin)
    names = {t.name for t in r.tensors}
    assert "blk.0.ffn_down.weight" in names and not any(".fc" in n or "down_t" in n for n in names)
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["llama.embedding_length"].contents() == E
    assert not any(k.startswith(("bamboo.", "powerinfer.")) for k in r.fields)
    f = Pi2File(tmp_path / "m.pi2")
    assert f.header.dense_down and f.header.has_predictor
    down = next(t for t in r.tensors if t.name == "blk.1.ffn_down.weight")
    assert [int(d) for d in down.shape] == [F, E]
    twin_bytes = np.asarray(down.data).view(np.uint8).reshape(-1)
    assert np.array_equal(np.asarray(f.raw("blk.1.ffn_down.weight")).reshape(-1), twin_bytes)
    want = stored["blk.1.ffn_down_t.weight"].T
    tol = 1e-6 if wtype == "F16" else 0.2 * np.abs(want).max()
    np.testing.assert_allclose(f.tensor("blk.1.ffn_down.weight"), want, atol=tol)
    # the dense path, now on the twin's down, still agrees with the GGUF's own math. The reference is
    # float32 without the engine's Q8 activations, which alone put Q4_0 at 4.8-5.0% of the largest
    # logit (measured with the F16-accumulator attention and with the float one); F16 at 0.06%.
    got = engine_logits(tmp_path / "m.pi2", TOKENS, tmp_path)
    src_ref = gguf_forward(stored, TOKENS, "drelu" if arch == "bamboo" else "relu")
    assert np.abs(got - src_ref).max() <= (7e-2 if wtype == "Q4_0" else 5e-3) * np.abs(src_ref).max()
    # llama-bench, not llama-completion: with this test's 288-token vocabulary the pinned llama-completion
    # (0c1e570) exits 0 right after loading in about a third of runs, having generated nothing (SmolLM2
    # and synthetic twins: 0 of 12). llama-bench needs no tokenizer to load and run the weights.
    done = subprocess.run(
        [str(llamacpp_bindir / "llama-bench"), "-m", str(twin), "-p", "0", "-n", "4", "-t", "1", "-r", "1", "-o", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout)[0]
    assert row["n_gen"] == 4 and row["avg_ts"] > 0
