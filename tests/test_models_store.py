"""Models by name: the local store, the one-line missing-model message, planned sizes vs what synth
writes, resuming an interrupted synth, and `pi2 plan` predicting a phone without the model file."""

import json

import pytest
from click.testing import CliRunner
from engine_helpers import needs_engine

from pi2cli.cli import cli
from pi2cli.errors import Pi2Error
from pi2cli.models import store, synth
from pi2cli.models.registry import get_model

TINY_MOE = dict(n_layer=2, hidden=256, ffn=512, calib_seqs=6, eval_seqs=2)


def test_missing_model_is_one_line_with_how_to_get_it_and_its_size(tmp_path, monkeypatch):
    monkeypatch.setenv("PI2_MODELS_DIR", str(tmp_path / "store"))
    result = CliRunner().invoke(cli, ["bench", "--model", "turbosparse-mixtral-47b", "--memory-budget", "7G",
                                      "-e", "pi2", "-e", "llama.cpp", "--limit", "1", "--n-gen", "16"])  # fmt: skip
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pi2: error: model turbosparse-mixtral-47b is not in")
    line = lines[0]
    assert "pi2 models synth --like turbosparse-mixtral-47b" in line and "pi2 models pull" in line
    assert " GB" in line and " min" in line and "free" in line and "bench --synth" in line
    assert not (tmp_path / "store").exists()  # nothing made


@pytest.mark.slow
def test_a_stored_model_resolves_by_name_and_stays_labelled_synthetic(tmp_path, monkeypatch, smollm2_gguf):
    monkeypatch.setenv("PI2_MODELS_DIR", str(tmp_path))
    spec = get_model("turbosparse-mixtral-47b")
    out = store.synthetic_dir(spec)
    synth.synthesize(synth.SynthConfig(like=spec.name, tokenizer_gguf=smollm2_gguf, **TINY_MOE), out)
    assert store.model_arg("turbosparse-mixtral-47b") == str(out / "model.pi2")
    assert store.find(spec).synthetic and store.find(spec).label == "synthetic-turbosparse-mixtral-47b"
    assert store.model_arg(str(out / "model.gguf")) == str(out / "model.gguf")  # paths stay paths
    with pytest.raises(Pi2Error, match="not in"):
        store.model_arg("turbosparse-mistral-7b")
    # generate takes the name too (pi2-engine runs the .pi2, llama.cpp would run its twin)
    result = CliRunner().invoke(
        cli, ["generate", "-m", "turbosparse-mixtral-47b", "-p", "Hello", "-n", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout.strip().splitlines()[-1])["token_ids"]) == 3


@pytest.mark.slow
@pytest.mark.parametrize("like,dims", [("turbosparse-mixtral-47b", TINY_MOE),
                                       ("turbosparse-mistral-7b", dict(n_layer=2, hidden=512, ffn=2048, calib_seqs=6, eval_seqs=2))])  # fmt: skip
def test_planned_sizes_are_within_5_percent_of_what_synth_writes(tmp_path, smollm2_gguf, like, dims):
    cfg = synth.SynthConfig(like=like, tokenizer_gguf=smollm2_gguf, **dims)
    spec, fields, _, rank = synth.resolve(cfg)
    planned = synth.planned_sizes(cfg, spec, rank, fields)
    summary = synth.synthesize(cfg, tmp_path)
    for name, written in summary["bytes_written"].items():
        assert abs(planned[name] - written) / written < 0.05, (name, planned[name], written)
    # the registry's old estimate (params x bytes per weight) was far off for a full-size file
    full = synth.synth_spec(synth.default_config(like), synth.SYNTH_VOCAB)
    sizes = synth.planned_sizes(synth.default_config(like), full, synth.default_predictor_rank(full))
    assert sizes["model.pi2"] > 0 and sizes["model.gguf"] > 0


def test_synth_refuses_when_the_disk_cannot_hold_it(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "free_bytes", lambda path: 10 * store.GiB)
    result = CliRunner().invoke(
        cli, ["models", "synth", "--like", "turbosparse-mixtral-47b", "--out", str(tmp_path / "m")]
    )
    assert result.exit_code == 1
    assert (
        "needs" in result.stderr and "GiB" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    )
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())


@pytest.mark.slow
def test_interrupted_synth_resumes_to_the_same_bytes(tmp_path, smollm2_gguf, monkeypatch):
    cfg = lambda: synth.SynthConfig(like="turbosparse-mixtral-47b", tokenizer_gguf=smollm2_gguf, **TINY_MOE)  # noqa: E731
    synth.synthesize(cfg(), tmp_path / "whole")

    real = synth._layer
    calls = []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # after layer 0 was checkpointed
        return real(*a, **k)

    monkeypatch.setattr(synth, "_layer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        synth.synthesize(cfg(), tmp_path / "cut")
    left = sorted(p.name for p in (tmp_path / "cut").iterdir())
    assert left == [".model.gguf.partial", ".model.pi2.partial", ".synth-state.json", ".synth-state.x.npy"]
    monkeypatch.setattr(synth, "_layer", real)
    steps = []
    summary = synth.synthesize(cfg(), tmp_path / "cut", progress=lambda w, d, t: steps.append(w))
    assert summary["resumed_from_layer"] == 1 and steps[0] == "resumed after layer 1"
    for name in ("model.pi2", "model.gguf"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["model.gguf", "model.pi2"]


@needs_engine
def test_plan_predicts_the_phone_from_a_name_without_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PI2_MODELS_DIR", str(tmp_path / "empty"))
    args = ["plan", "-m", "turbosparse-mixtral-47b", "--profile", "oneplus-12", "--json", "--memory-budget"]
    r19 = CliRunner().invoke(cli, [*args, "19G"])
    r7 = CliRunner().invoke(cli, [*args, "7G"])
    assert r19.exit_code == 0 and r7.exit_code == 0, r19.output + r7.output
    p19, p7 = json.loads(r19.stdout), json.loads(r7.stdout)
    assert p19["device"] == "oneplus-12" and p19["tok_s"] > p7["tok_s"] > 0
    mem = p19["memory_bytes_per_token"]
    # only the 2 routed experts' predictors of 8 are read per token, and no dense down copy exists
    per_block = mem["predictors"] / (32 * 2)
    assert 1e6 < per_block < 2e7
    assert p19["hit_rate"] > p7["hit_rate"]
    bad = CliRunner().invoke(cli, [*args[:-1], "--memory-budget", "19G", "--profile", "no-such-phone"])
    assert bad.exit_code == 1 and "oneplus-12" in bad.stderr


@pytest.mark.slow
def test_synth_flag_makes_the_model_into_the_store_first(tmp_path, monkeypatch, smollm2_gguf, capsys):
    monkeypatch.setenv("PI2_MODELS_DIR", str(tmp_path))
    small = lambda name: synth.SynthConfig(like=name, tokenizer_gguf=smollm2_gguf, **TINY_MOE)  # noqa: E731
    monkeypatch.setattr(synth, "default_config", small)
    path = store.model_arg("turbosparse-mixtral-47b", synth=True)
    assert path == str(tmp_path / "synthetic-turbosparse-mixtral-47b" / "model.pi2")
    err = capsys.readouterr().err
    assert "SYNTHETIC" in err and "model.pi2" in err and "bytes" in err
    with pytest.raises(Pi2Error, match="dense SwiGLU"):
        store.model_arg("smollm2-135m-instruct", synth=True)


def test_plain_progress_lines_have_eta_and_are_throttled():
    import io

    from pi2cli.models.info import PlainProgress

    now = [0.0]
    out = io.StringIO()
    p = PlainProgress("synth", out, every_s=10, clock=lambda: now[0])
    for step in range(1, 11):
        now[0] = step * 4.0  # a step every 4 s: a line at most every 10 s, and the last one
        p(f"layer {step}", step, 10)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("synth: layer 1 (1/10) 0m00s elapsed")
    assert 3 <= len(lines) <= 5 and lines[-1].startswith("synth: layer 10 (10/10)")
    assert "ETA 0m" in lines[1]  # 9 steps left at 4 s each: half a minute
