"""Issue 34: `pi2 convert` validates the scalar hyperparameters as the engine will (finite, positive, in
range) before writing anything. A NaN rope_theta, a negative rms_eps or a context of 0 used to exit 0
with files both readers refuse."""

import json

import pytest
from click.testing import CliRunner
from test_convert_hardening import _set_f32, _set_u32
from test_models_convert_hf import make_checkpoint

from pi2cli.cli import cli
from pi2cli.models.pi2file import Pi2FormatError, Pi2Header

GGUF_CASES = {
    "NaN rope_theta": (lambda r: _set_f32(r, "llama.rope.freq_base", float("nan")), "llama.rope.freq_base is nan"),
    "inf rope_theta": (lambda r: _set_f32(r, "llama.rope.freq_base", float("inf")), "llama.rope.freq_base is inf"),
    "negative rms_eps": (lambda r: _set_f32(r, "llama.attention.layer_norm_rms_epsilon", -1e-5), "rms_epsilon is -"),
    "zero rms_eps": (lambda r: _set_f32(r, "llama.attention.layer_norm_rms_epsilon", 0.0), "rms_epsilon is 0.0"),
    "context 0": (lambda r: _set_u32(r, "llama.context_length", 0), "llama.context_length is 0"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_bad_gguf_hparams_are_one_line_and_nothing_is_written(plain_gguf, tmp_path, case):
    edit, words = GGUF_CASES[case]
    raw = bytearray(plain_gguf.read_bytes())
    edit(raw)
    src = tmp_path / "bad.gguf"
    src.write_bytes(bytes(raw))
    r = CliRunner().invoke(cli, ["convert", str(src), "--out", str(tmp_path / "o.pi2"),
                                 "--gguf-twin", str(tmp_path / "o.gguf")])  # fmt: skip
    assert r.exit_code == 1, (r.output, r.exception)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("pi2: error: "), r.stderr
    assert words in r.stderr and "the engine refuses it" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


@pytest.mark.parametrize(
    "patch, words",
    [
        ({"rope_theta": float("nan")}, "rope_theta is nan"),
        ({"rms_norm_eps": -1e-5}, "rms_norm_eps is -1e-05"),
        ({"max_position_embeddings": 0}, "max_position_embeddings is 0"),
        ({"rope_theta": 1e39}, "rope_theta is 1e+39"),  # finite here, inf as the header's float32
        ({"rope_theta": "fast"}, "not a number"),
    ],
)
def test_bad_checkpoint_hparams_are_one_line_and_nothing_is_written(tmp_path, smollm2_gguf, patch, words):
    make_checkpoint(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg.update(patch)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))  # json writes NaN as NaN, as HF does
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["convert", str(tmp_path / "hf"), "--out", str(out / "m.pi2"),
                                 "--tokenizer-gguf", str(smollm2_gguf)])  # fmt: skip
    assert r.exit_code == 1, (r.output, r.exception)
    assert r.stderr.count("\n") == 1 and words in r.stderr, r.stderr
    assert not out.exists() or list(out.iterdir()) == []


def test_every_writer_refuses_what_the_engine_would():
    ok = dict(arch="llama", ffn_act="relu", n_vocab=64, n_embd=64, n_layer=1, n_head=2, n_head_kv=2, n_ff=64,
              neuron_type="Q8_0")  # fmt: skip
    Pi2Header(**ok).validate()
    for bad in (
        {"n_ctx_train": 0},
        {"rope_theta": float("nan")},
        {"rms_eps": 1e-50},
        {"n_ctx_train": 1 << 32},
    ):
        with pytest.raises(Pi2FormatError, match="rule 8"):
            Pi2Header(**ok, **bad).validate()
