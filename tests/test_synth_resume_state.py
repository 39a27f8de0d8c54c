"""The synth resume state is plain data: a model directory may be shared or downloaded, so nothing in
it may run code. A planted pickle (the old `.synth-state.pkl`, or a pickled .npy) is never loaded, and
a state that does not fit the run starts it over instead of resuming from it."""

import contextlib
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pi2cli.cli import cli
from pi2cli.models import synth, synth_resume

TINY = dict(like="turbosparse-mixtral-47b", n_layer=2, hidden=64, ffn=128, calib_seqs=6, eval_seqs=2)


class _Touch:
    """Unpickling this creates `path`: the attack a planted state file carried."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


@pytest.mark.slow
def test_a_planted_pickle_is_never_unpickled_and_the_run_writes_its_files(tmp_path, smollm2_gguf):
    out, marker = tmp_path / "m", tmp_path / "pwned"
    out.mkdir()
    (out / ".synth-state.pkl").write_bytes(pickle.dumps({"fingerprint": "x", "hook": _Touch(marker)}))
    # the array beside the new state, pickled: numpy with allow_pickle=False refuses it unread
    np.save(out / synth_resume.X_NAME, np.array([_Touch(marker)], dtype=object), allow_pickle=True)
    r = CliRunner().invoke(cli, ["models", "synth", "--like", TINY["like"], "--layers", "2", "--hidden", "64",
                                 "--ffn", "128", "--calib-seqs", "6", "--eval-seqs", "2",
                                 "--tokenizer", str(smollm2_gguf), "--out", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert not marker.exists()
    assert sorted(p.name for p in out.iterdir()) == ["model.gguf", "model.pi2"]


def _cut(tmp_path, smollm2_gguf, monkeypatch, name="cut"):
    """Interrupt a run after layer 0 was checkpointed; returns its directory."""
    real, calls = synth._layer, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(synth, "_layer", interrupted)
    with contextlib.suppress(KeyboardInterrupt):
        synth.synthesize(synth.SynthConfig(tokenizer_gguf=smollm2_gguf, **TINY), tmp_path / name)
    monkeypatch.setattr(synth, "_layer", real)
    return tmp_path / name


@pytest.mark.slow
def test_the_state_is_json_and_a_raw_array(tmp_path, smollm2_gguf, monkeypatch):
    cut = _cut(tmp_path, smollm2_gguf, monkeypatch)
    assert sorted(p.name for p in cut.iterdir()) == [
        ".model.gguf.partial", ".model.pi2.partial", synth_resume.STATE_NAME, synth_resume.X_NAME,
    ]  # fmt: skip
    doc = json.loads((cut / synth_resume.STATE_NAME).read_text())
    assert doc["layer_done"] == 1 and len(doc["per_layer"]) == 1
    x = np.load(cut / synth_resume.X_NAME, allow_pickle=False)
    assert x.dtype == np.float32 and x.ndim == 2


@pytest.mark.slow
def test_a_state_that_does_not_fit_the_run_starts_it_over(tmp_path, smollm2_gguf, monkeypatch):
    whole = tmp_path / "whole"
    synth.synthesize(synth.SynthConfig(tokenizer_gguf=smollm2_gguf, **TINY), whole)
    tampered = [
        lambda d: d.update(layer_done=7),  # past this run's layers
        lambda d: d.update(x_sha256="0" * 64),  # the array is not the one recorded
        lambda d: d["pi2"]["entries"][0].__setitem__(1, "BOGUS"),
        lambda d: d.update(per_layer=[{"layer": 0}]),
    ]
    for i, tamper in enumerate(tampered):
        cut = _cut(tmp_path, smollm2_gguf, monkeypatch, name=f"cut{i}")
        doc = json.loads((cut / synth_resume.STATE_NAME).read_text())
        tamper(doc)
        (cut / synth_resume.STATE_NAME).write_text(json.dumps(doc))
        summary = synth.synthesize(synth.SynthConfig(tokenizer_gguf=smollm2_gguf, **TINY), cut)
        assert summary["resumed_from_layer"] is None, i
        for name in ("model.pi2", "model.gguf"):
            assert (cut / name).read_bytes() == (whole / name).read_bytes(), (i, name)


@pytest.mark.slow
def test_a_planted_link_at_the_pi2_temp_name_is_removed_not_written_through(tmp_path, smollm2_gguf):
    out, victim = tmp_path / "m", tmp_path / "victim"
    out.mkdir()
    victim.write_bytes(b"keep me")
    (out / ".model.pi2.partial").symlink_to(victim)
    synth.synthesize(synth.SynthConfig(tokenizer_gguf=smollm2_gguf, **TINY), out)
    assert victim.read_bytes() == b"keep me"
    assert sorted(p.name for p in out.iterdir()) == ["model.gguf", "model.pi2"]


def test_a_residual_array_declaring_a_huge_shape_is_refused_before_numpy_allocates_it(tmp_path):
    """The .npy header names its shape; a planted one declaring 2^40 floats once reached numpy's
    allocation (a MemoryError traceback from `pi2 models synth`): the header is checked first."""
    import io

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (1 << 20, 1 << 20)}
    )
    path = tmp_path / synth_resume.X_NAME
    path.write_bytes(header.getvalue() + bytes(64))
    assert synth_resume._load_x(path, (4, 256), "0" * 64) is None
    x = np.arange(4 * 256, dtype=np.float32).reshape(4, 256)  # the real thing still loads
    np.save(path, x)
    assert np.array_equal(synth_resume._load_x(path, (4, 256), synth_resume._sha256(x)), x)
