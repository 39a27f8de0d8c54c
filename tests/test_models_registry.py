"""The model registry and `pi2 models list/show/pull`."""

import json
import sys

import pytest
from click.testing import CliRunner

from pi2cli.cli import cli
from pi2cli.errors import Pi2Error
from pi2cli.models.registry import all_models, get_model


def _llama_params(layers, hidden, ffn, heads, kv_heads, vocab, experts=0):
    hd = hidden // heads
    attn = 2 * hidden * heads * hd + 2 * hidden * kv_heads * hd
    ffn_params = 3 * hidden * ffn * max(experts, 1) + experts * hidden
    return layers * (attn + ffn_params + 2 * hidden) + hidden + 2 * vocab * hidden


def test_param_counts_follow_published_model_sizes():
    mistral = get_model("turbosparse-mistral-7b")
    assert mistral.param_counts()["total"] == _llama_params(32, 4096, 14336, 32, 8, 32000)
    assert 7.2e9 < mistral.param_counts()["total"] < 7.3e9  # Mistral-7B: 7.24B
    mixtral = get_model("turbosparse-mixtral-47b")
    assert mixtral.param_counts()["total"] == _llama_params(32, 4096, 14336, 32, 8, 57024, experts=8)
    assert 46.5e9 < mixtral.param_counts()["total"] < 47.5e9
    llama7 = get_model("sparse-llama-7b")  # alias of prosparse-llama-2-7b
    assert llama7.name == "prosparse-llama-2-7b"
    assert 6.7e9 < llama7.param_counts()["total"] < 6.8e9  # Llama-2-7B: 6.74B
    assert 13.0e9 < get_model("sparse-llama-13b").param_counts()["total"] < 13.1e9


def test_sizes_are_computed_per_quant_type():
    m = get_model("bamboo-7b")
    counts = m.param_counts()
    assert m.size_bytes("q4_0") == int((counts["total"] - counts["norms"]) * 18 / 32 + counts["norms"] * 4)
    assert m.size_bytes("f16") > m.size_bytes("q8_0") > m.size_bytes("q4_1") > m.size_bytes("q4_0")
    with pytest.raises(Pi2Error, match="unknown quant"):
        m.size_bytes("q3_k")


def test_every_paper_model_has_a_source_and_the_test_model_is_there():
    names = {m.name for m in all_models()}
    for name in ("turbosparse-mistral-7b", "turbosparse-mixtral-47b", "prosparse-llama-2-7b",
                 "sparse-llama-13b", "bamboo-7b", "smollm2-135m-instruct"):  # fmt: skip
        assert name in names
        assert get_model(name).hf_repo
    assert get_model("turbosparse-mixtral-47b").active_ffn_params_per_token() < 0.05 * 45e9


def test_unknown_model_is_one_clear_error():
    result = CliRunner().invoke(cli, ["models", "show", "llama-99b"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "unknown model 'llama-99b'" in result.stderr and "turbosparse-mistral-7b" in result.stderr


def test_list_and_show_json():
    runner = CliRunner()
    listed = json.loads(runner.invoke(cli, ["models", "list", "--json"]).stdout)
    assert {m["name"] for m in listed} == {m.name for m in all_models()}
    shown = json.loads(runner.invoke(cli, ["models", "show", "turbosparse-mixtral", "--json"]).stdout)
    assert shown["n_expert"] == 8 and shown["params"]["total"] > 46e9
    assert shown["size_bytes"]["q4_0"] < shown["size_bytes"]["q8_0"]
    text = runner.invoke(cli, ["models", "show", "prosparse-llama-2-7b"]).stdout
    assert "SparseLLM/prosparse-llama-2-7b" in text and "89.3%" in text


def test_pull_without_hub_access_fails_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what a machine without hub access sees, made instant
    result = CliRunner().invoke(cli, ["models", "pull", "bamboo-7b", "--out", str(tmp_path / "b")])
    assert result.exit_code != 0
    assert len(result.stderr.strip().splitlines()) == 1
    assert "PowerInfer/Bamboo-base-v0_1" in result.stderr
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").rglob("*.safetensors"))


def test_pull_without_huggingface_hub_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    result = CliRunner().invoke(cli, ["models", "pull", "turbosparse-mistral-7b"])
    assert result.exit_code == 1
    assert "pip install 'pi2[hub]'" in result.stderr
