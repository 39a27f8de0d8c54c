"""llama.cpp's driver: llama-server with one slot and the prompt cache on, on this machine or on an
adb device (pi2cli/engines/llamacpp/device.py: pushed, started over adb shell, reached
through adb forward).

Each turn sends the whole conversation so far (rendered by the host with the model's chat template,
the same text pi2 gets); the server reuses the longest common prefix already in its KV cache
(cache_prompt), so a turn prefills only what is new; `pi2 generate` is one turn on a fresh server. See
pi2cli/engines/llamacpp/server.py for how it measures.
"""

from __future__ import annotations

import contextlib
import os
import platform
from pathlib import Path

from pi2cli.engines.base import Driver, TurnFailed, TurnMetrics
from pi2cli.engines.llamacpp.server import LlamaServer, default_bin_dir
from pi2cli.errors import Pi2Error
from pi2cli.targets.base import normalize_arch

DEVICE_HOW = (
    "; on the device: llama-server listens on the device's 127.0.0.1 (started with adb shell), reached "
    "through adb forward; TTFT/TBT are the server's per-token stamps on the device's clock (arrivals "
    "through the forward come in bursts and are never used as token times); peak RSS = VmHWM read on "
    "the device"
)


DEFAULT_CTX = 4096  # llama-server's context when the caller names none (`pi2 generate`)


def local_how() -> str:
    """How llama.cpp is measured on this machine (pi2cli/engines/llamacpp/server.py says more)."""
    from pi2cli.builds.baselines.llamacpp_build import LLAMACPP_COMMIT
    from pi2cli.engines.llamacpp.server import HOW

    return HOW.format(commit=LLAMACPP_COMMIT, load_mode="mmap", repack=False) + (
        "; multi-turn: the whole conversation each turn, one slot, cache_prompt (KV prefix reuse)"
    )


class LlamaCppSession:
    def __init__(self, server: LlamaServer, seed: int = 0, temperature: float = 0.0):
        self.server = server
        self.seed = seed
        self.temperature = temperature
        self.pid = server.proc.pid if server.proc else None

    def _down(self, wait_s: float = 0.0) -> Exception | None:
        """Why the server cannot answer (TargetError: the device is gone), None when it is up."""
        if hasattr(self.server, "down_reason"):
            return self.server.down_reason(wait_s)
        proc = self.server.proc
        if proc is not None and proc.poll() is not None:
            return Pi2Error(f"llama-server exited with code {proc.returncode}: {self.server.log_tail()}")
        return None

    def turn(self, prompt: str, n_predict: int, *, ignore_eos: bool = True, on_text=None,
             messages: list[dict] | None = None) -> TurnMetrics:  # fmt: skip
        down = self._down()
        if down is not None:
            raise down
        try:
            turn = self.server.complete(
                prompt, n_predict, temperature=self.temperature, seed=self.seed, ignore_eos=ignore_eos
            )
        except Pi2Error as exc:
            down = self._down(wait_s=3.0)  # a broken stream: did the server or the device go away?
            if down is not None:
                raise down from None
            if "answered" in str(exc):
                raise TurnFailed(str(exc)) from None  # the server refused this request but is still up
            raise
        if on_text and turn.text:
            on_text(turn.text)
        return turn

    def close(self) -> dict:
        peak = self.server.current_peak_rss()
        self.server.stop()
        peak = max(peak, self.server.peak_rss_bytes) or None
        return {"peak_rss_bytes": peak, "load_s": self.server.load_s,
                "peak_rss_source": self.server.peak_rss_source if peak else None}  # fmt: skip

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.server.stop()


def build_target_for(target) -> str:
    """Which llama.cpp build (pi2cli.builds.baselines.llamacpp_build target) runs on `target`: this machine's
    for local and for devices of this machine's architecture (x86-64 emulators, the test adb daemon);
    arm64 devices get the NDK build when ANDROID_NDK_HOME is set, else the static linux-arm64 one
    (static binaries run on Android from /data/local/tmp)."""
    if target.arch == normalize_arch(platform.machine()):  # this machine, or a device of its kind
        return "host"
    if target.arch == "arm64":
        return "android-arm64" if os.environ.get("ANDROID_NDK_HOME") else "linux-arm64"
    raise Pi2Error(f"no llama.cpp build runs on {target.name} ({target.arch})")


class LlamaCppDriver(Driver):
    """llama.cpp: llama-server sessions here or on an adb device (`pi2 generate`: one turn of one);
    option: the host build to use (--llamacpp bin dir)."""

    name = "llama.cpp"
    policy = None
    model_suffix = ".gguf"
    options = ("llamacpp_bin_dir",)

    def __init__(self, bin_dir: Path | None = None):
        super().__init__()
        self.how = local_how()
        self._bin_dir = Path(bin_dir) if bin_dir else None
        self._device_bin_dirs: dict[str, Path] = {}

    def set_option(self, name: str, value) -> None:
        assert name == "llamacpp_bin_dir"
        self._bin_dir = Path(value)

    def configure(self, target, model_local: Path) -> None:
        """`how` as it applies on `target` (the bench stores it in each result)."""
        self.how = local_how() + ("" if target.on_this_machine else DEVICE_HOW)

    def supports(self, target) -> str | None:
        if target.native_here:
            return None
        if target.on_this_machine:  # emulated: no llama.cpp build for it
            return (f"llama.cpp does not run on {target.name} ({target.kind}) in pi2 bench: use this machine or "
                    f"an adb device")  # fmt: skip
        if "shell_v2" not in getattr(target, "features", set()):
            return f"llama.cpp on {target.name} needs adb shell v2 (Android 7 or later)"
        if target.arch not in ("arm64", normalize_arch(platform.machine())):
            return f"no llama.cpp build runs on {target.name} ({target.arch}): arm64 or this machine's only"
        return None

    @property
    def bin_dir(self) -> Path:
        """This machine's build: --llamacpp bin dir, $PI2_LLAMACPP_BIN_DIR, else the cached host build."""
        if self._bin_dir is None:
            self._bin_dir = default_bin_dir()
        return self._bin_dir

    def bin_dir_for(self, target) -> Path:
        """The build whose llama-server runs on `target` (built now when missing)."""
        which = build_target_for(target)
        if which == "host":
            return self.bin_dir
        if which not in self._device_bin_dirs:
            from pi2cli.builds.baselines.llamacpp_build import ensure_built

            self._device_bin_dirs[which] = ensure_built(which)
        return self._device_bin_dirs[which]

    def files(self, target) -> dict[str, list[Path]]:
        if target.on_this_machine:
            return {}
        binary = self.bin_dir_for(target) / "llama-server"
        if not binary.is_file():
            raise Pi2Error(f"llama-server not found in {binary.parent} (run `pi2 build --engine llama.cpp`)")
        return {"engine": [binary]}

    def open_chat(self, target, model: str, *, binary_dir: str | None, threads: int | None, n_ctx: int | None,
                  cgroup=None, budget_bytes: int | None = None, seed: int = 0,
                  temperature: float = 0.0) -> LlamaCppSession:  # fmt: skip
        # budget_bytes: llama.cpp has no budget of its own; the cgroup is what binds it
        n_ctx = n_ctx or DEFAULT_CTX
        if target.on_this_machine:
            server = LlamaServer(self.bin_dir, Path(model), threads=threads, ctx_size=n_ctx, cgroup=cgroup)
        else:
            from pi2cli.engines.llamacpp.device import DeviceLlamaServer

            binary = f"{binary_dir or target.workdir.rstrip('/') + '/bin'}/llama-server"
            server = DeviceLlamaServer(target, binary, model, threads=threads, ctx_size=n_ctx)
        server.start()
        return LlamaCppSession(server, seed, temperature)

    def generate_extra(self, session, turn) -> dict:
        return {
            "host_decode_tps": turn.host_decode_tps,
            "server_args": session.server.args,
            "clock": turn.clock,
        }

    def engine_info(self, target) -> dict:
        from pi2cli.builds.baselines.llamacpp_build import LLAMACPP_COMMIT, build_record
        from pi2cli.hw.push import sha256_file

        bin_dir = self.bin_dir_for(target)
        binary = bin_dir / "llama-server"
        args = build_record(bin_dir).get("cmake_args") or []  # empty for a build pi2 did not make
        build_type = next((a.split("=", 1)[1] for a in args if a.startswith("-DCMAKE_BUILD_TYPE=")), None)
        return {"name": self.name, "version": None, "commit": LLAMACPP_COMMIT,
                "build_flags": " ".join(args) or None, "build_type": build_type, "policy": None,
                "binary_sha256": sha256_file(binary) if binary.is_file() else None}  # fmt: skip
