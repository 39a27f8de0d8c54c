"""pi2 push's logic on the local target: hashes, skipping, free space, the engine build lookup."""

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from pi2cli.cli import cli
from pi2cli.errors import Pi2Error
from pi2cli.hw.push import collect_items, engine_files, model_remote_name, push_files, sha256_file
from pi2cli.targets import get_target


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))


def test_local_push_copies_verifies_and_then_skips(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(os.urandom(5 << 20))
    workdir = tmp_path / "device"
    args = ["push", "--device", "local", "--workdir", str(workdir), "--no-engine", "--no-workloads",
            "-m", str(model), "--json"]  # fmt: skip
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["copied"] == 1
    landed = workdir / "models" / model_remote_name(model, sha256_file(model))
    assert landed.name.startswith("m-") and landed.read_bytes() == model.read_bytes()
    assert json.loads((workdir / ".pi2-manifest.json").read_text())[str(landed)]["sha256"]
    second = json.loads(CliRunner().invoke(cli, args).stdout)
    assert second["copied"] == 0 and second["skipped"] == 1


def test_free_space_is_checked_before_anything_is_copied(tmp_path, monkeypatch):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"x" * 4096)
    target = get_target("local", workdir=str(tmp_path / "device"))
    monkeypatch.setattr(type(target), "free_bytes", lambda self, path: 100)
    items = collect_items(target, target.workdir, models=[model])
    with pytest.raises(Pi2Error, match="not enough space.*4 KiB to copy but only 100 B free"):
        push_files(target, items)
    assert not (tmp_path / "device" / "models").exists()


def test_sha256_cache_follows_the_file(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"one")
    cache = tmp_path / "hashes.json"
    first = sha256_file(f, cache)
    assert sha256_file(f, cache) == first
    f.write_bytes(b"two!")
    assert sha256_file(f, cache) != first  # size/mtime changed: hashed again, not served stale


def test_inputs_are_checked(tmp_path, monkeypatch):
    target = get_target("local", workdir=str(tmp_path / "device"))
    with pytest.raises(Pi2Error, match="model file not found"):
        collect_items(target, target.workdir, models=[tmp_path / "missing.gguf"])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "p.json").write_text("{}")
        (tmp_path / d / "model.pi2").write_bytes(d.encode())
    with pytest.raises(Pi2Error, match="same name"):
        collect_items(target, target.workdir, plans=[tmp_path / "a" / "p.json", tmp_path / "b" / "p.json"])
    # two models of one file name are told apart by their directory and hash, even in one push
    items = collect_items(
        target, target.workdir, models=[tmp_path / "a" / "model.pi2", tmp_path / "b" / "model.pi2"]
    )
    report = push_files(target, items)
    assert sorted(Path(f.remote).name.split("-")[0] for f in report.files) == ["a", "b"]
    assert [i.remote for i in items] == [f.remote for f in report.files]
    monkeypatch.setenv("PI2_BUILD_ROOT", str(tmp_path / "nobuild"))
    monkeypatch.delenv("PI2_BUILD_DIR", raising=False)
    with pytest.raises(Pi2Error, match="no engine build.*make engine"):
        engine_files(target)
    if shutil.which("qemu-aarch64"):
        with pytest.raises(Pi2Error, match="linux-arm64"):
            engine_files(get_target("qemu-arm64"))


def test_remote_model_names_carry_the_model_and_its_hash(tmp_path):
    a, b = tmp_path / "tiny-a" / "model.pi2", tmp_path / "tiny b" / "model.pi2"
    for path, body in ((a, b"a"), (b, b"b")):
        path.parent.mkdir()
        path.write_bytes(body)
    names = [model_remote_name(p, sha256_file(p)) for p in (a, b)]
    assert names[0] == f"tiny-a-{sha256_file(a)[:12]}.pi2" and names[1].startswith("tiny-b-")
    assert model_remote_name(tmp_path / "smollm2.gguf", "ab" * 32) == "smollm2-abababababab.gguf"
