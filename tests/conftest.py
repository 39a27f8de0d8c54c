"""Shared fixtures: the real test model, the llama.cpp reference build, the test adb server and devices."""

import os
from pathlib import Path

import pytest

_USER_CACHE = os.environ.get("PI2_CACHE")  # as the session started, before any test changed it


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from pi2cli.models.testmodels import smollm2_gguf as fetch

    return fetch()


@pytest.fixture(scope="session")
def llamacpp_bindir() -> Path:
    """Directory holding llama.cpp's tools (llama-completion, llama-tokenize, llama-bench, ...).

    Built from the pinned source by pi2cli.builds.baselines.llamacpp_build (cached under ~/.cache/pi2);
    $PI2_LLAMACPP_BIN_DIR overrides it.
    """
    override = os.environ.get("PI2_LLAMACPP_BIN_DIR")
    if override:
        return Path(override)
    from pi2cli.builds.baselines.llamacpp_build import ensure_built

    # The session's first test that asks may run inside a module that points PI2_CACHE at a temporary
    # directory (adb_server): the build is taken from the user's cache all the same, not rebuilt there.
    with pytest.MonkeyPatch.context() as mp:
        if _USER_CACHE is None:
            mp.delenv("PI2_CACHE", raising=False)
        else:
            mp.setenv("PI2_CACHE", _USER_CACHE)
        return ensure_built("host")


@pytest.fixture
def chat_pids(monkeypatch) -> list[int]:
    """The pids of the local `pi2-engine chat` processes the test starts, to check none is left running."""
    import pi2cli.engines.pi2.chat as chat

    started: list[int] = []
    real = chat.LocalChatProcess.__init__

    def spy(self, *a, **k):
        real(self, *a, **k)
        started.append(self.pid)

    monkeypatch.setattr(chat.LocalChatProcess, "__init__", spy)
    return started


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer synthetic model (16 MB): DIR/model.pi2 + its GGUF twin, which llama.cpp runs."""
    from click.testing import CliRunner

    from pi2cli.cli import cli

    out = tmp_path_factory.mktemp("tiny")
    r = CliRunner().invoke(cli, ["models", "synth", "--like", "turbosparse-mistral-7b", "--layers", "2",
                                 "--hidden", "256", "--ffn", "512", "--out", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    return out / "model.pi2"


@pytest.fixture(autouse=True)
def _unsaved_results_in_tmp(tmp_path_factory, monkeypatch):
    """Runs a test cannot store (deliberately bad ones included) are kept here, not in ~/.cache/pi2."""
    monkeypatch.setenv("PI2_UNSAVED_DIR", str(tmp_path_factory.getbasetemp() / "unsaved"))


# ------------------------------------------------------------------ the test adb daemon (tests/adbd)
@pytest.fixture(scope="module")
def adb_server(tmp_path_factory):
    """The real adb server (bundled with adbutils) on a port of its own, with pi2's cache apart."""
    from adbd.harness import AdbServer

    server = AdbServer(tmp_path_factory.mktemp("adbhome"))
    mp = pytest.MonkeyPatch()
    mp.setenv("ANDROID_ADB_SERVER_PORT", str(server.port))
    mp.setenv("PI2_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield server
    mp.undo()
    server.stop()


@pytest.fixture
def make_device(adb_server, tmp_path):
    """make(*flags, want="device"): a test daemon started with flags and connected to the server."""
    from adbd.harness import TestDevice

    devices = []

    def make(*flags, want="device"):
        d = TestDevice(tmp_path / f"dev{len(devices)}", *flags)
        devices.append(d)
        adb_server.connect(d.serial, want=want)
        return d

    yield make
    for d in devices:
        adb_server.call("disconnect", d.serial, timeout=10)
        d.stop()
