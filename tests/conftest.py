"""Shared fixtures: the real test model (as downloaded and converted), the synthetic shapes, the engine,
the llama.cpp reference build, the test adb server and devices."""

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


# ------------------------------------------------------------------ programs and models, made once
@pytest.fixture(scope="session")
def engine() -> Path:
    """The host build's pi2-engine; missing, the test fails under CI and is skipped elsewhere (the rule in
    engine_helpers.built)."""
    from engine_helpers import built

    return built("pi2-engine")


# The synthetic shapes the engine tests run on (some in several modules): each is synthesized once a
# session, on first use. Tests read them and never change them (one that must, copies the file to its tmp_path first; the
# check at the end of the session names a test that did not). SmolLM2's tokenizer in every one.
MISTRAL, MIXTRAL = "turbosparse-mistral-7b", "turbosparse-mixtral-47b"
SPARSE = dict(dense_down=False, calib_seqs=6, eval_seqs=2)  # bundles only, the sparse tests' calibration
SHAPES = {
    # 2 layers (16 MB), as `pi2 models synth --like turbosparse-mistral-7b --layers 2 --hidden 256 --ffn 512`
    "tiny": dict(like=MISTRAL, n_layer=2, hidden=256, ffn=512),
    "tiny-moe": dict(like=MIXTRAL, n_layer=2, hidden=256, ffn=512, **SPARSE),
    "sparse-1k": dict(like=MISTRAL, n_layer=2, hidden=256, ffn=1024, **SPARSE),
    # 2 x 8192 neurons (an 8 MiB FFN): under a budget most bundles are read from storage per token
    "ffn-8k": dict(like=MISTRAL, n_layer=2, hidden=128, ffn=8192, calib_seqs=1, eval_seqs=1),
    # 2 x 8192 bundles of 512 B over ~30 MiB of fixed region
    "ffn-8k-wide": dict(
        like=MISTRAL, n_layer=2, hidden=256, ffn=8192, dense_down=False, calib_seqs=2, eval_seqs=1
    ),
    # an FFN (32 MiB) that is most of the file, so a budget below the file size still fits the rest
    "ffn-32k": dict(like=MISTRAL, n_layer=2, hidden=128, ffn=32768, **SPARSE),
}


def _snapshot(d: Path) -> dict:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(d.iterdir())}


@pytest.fixture(scope="session")
def _shared_dirs():
    """The directories of the shared models, checked unchanged when the session ends."""
    made: dict[Path, dict] = {}
    yield made
    changed = [str(d) for d, snap in made.items() if _snapshot(d) != snap]
    assert not changed, f"a test changed a shared model (copy it to tmp_path first): {changed}"


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory, smollm2_gguf, _shared_dirs) -> Path:
    """SmolLM2 as DIR/model.pi2 + DIR/model.gguf (the same weights), as `pi2 convert` writes them."""
    from pi2cli.models.convert import convert_gguf

    d = tmp_path_factory.mktemp("smollm2")
    convert_gguf(smollm2_gguf, d / "model.pi2", d / "model.gguf")
    _shared_dirs[d] = _snapshot(d)
    return d


@pytest.fixture(scope="session")
def smollm2_pi2(smollm2_dir) -> Path:
    """SmolLM2-135M (real weights) as .pi2, its GGUF twin beside it."""
    return smollm2_dir / "model.pi2"


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory, smollm2_gguf, _shared_dirs):
    """synth_model(NAME) -> DIR/model.pi2 (+ DIR/model.gguf) of SHAPES[NAME], synthesized on first use."""
    from pi2cli.models import synth

    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            out = tmp_path_factory.mktemp(f"synth-{name}")
            synth.synthesize(synth.SynthConfig(tokenizer_gguf=smollm2_gguf, **SHAPES[name]), out)
            _shared_dirs[out] = _snapshot(out)
            made[name] = out / "model.pi2"
        return made[name]

    return get


@pytest.fixture(scope="session")
def tiny_model(synth_model) -> Path:
    """A 2-layer synthetic model (16 MB): DIR/model.pi2 + its GGUF twin, which llama.cpp runs."""
    return synth_model("tiny")


@pytest.fixture
def bench_env(monkeypatch, tmp_path, llamacpp_bindir) -> Path:
    """A results directory for `pi2 bench` runs, with the llama.cpp build found and pi2's cache apart."""
    monkeypatch.setenv("PI2_LLAMACPP_BIN_DIR", str(llamacpp_bindir))
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    return tmp_path / "results"


@pytest.fixture(scope="session")
def plain_gguf(tmp_path_factory) -> Path:
    """A small llama GGUF with no predictors and the usual down layout: the base the convert tests break."""
    from test_convert_powerinfer import write_gguf

    path = tmp_path_factory.mktemp("gguf") / "plain.gguf"
    write_gguf(path, transposed_down=False, predictors=False)
    return path


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
