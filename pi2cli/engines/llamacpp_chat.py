"""llama.cpp for `pi2 bench` (BenchDriver): llama-server on this machine, one slot, prompt cache on.

Each turn sends the whole conversation so far (rendered by the host with the model's chat template,
the same text pi2 gets); the server reuses the longest common prefix already in its KV cache
(cache_prompt), so a turn prefills only what is new. See pi2cli/engines/llamacpp.py for how it measures.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pi2cli.engines.base import TurnFailed
from pi2cli.engines.llamacpp import LlamaServer, TurnMetrics, default_bin_dir
from pi2cli.errors import Pi2Error


class LlamaCppSession:
    def __init__(self, server: LlamaServer, seed: int = 0):
        self.server = server
        self.seed = seed
        self.pid = server.proc.pid if server.proc else None

    def turn(self, prompt: str, n_predict: int, *, ignore_eos: bool = True, on_text=None,
             messages: list[dict] | None = None) -> TurnMetrics:  # fmt: skip
        if self.server.proc is not None and self.server.proc.poll() is not None:
            raise Pi2Error(
                f"llama-server exited with code {self.server.proc.returncode}: {self.server.log_tail()}"
            )
        try:
            turn = self.server.complete(
                prompt, n_predict, temperature=0.0, seed=self.seed, ignore_eos=ignore_eos
            )
        except Pi2Error as exc:
            if self.server.proc is not None and self.server.proc.poll() is None and "answered" in str(exc):
                raise TurnFailed(str(exc)) from None  # the server refused this request but is still up
            raise
        if on_text and turn.text:
            on_text(turn.text)
        return turn

    def close(self) -> dict:
        peak = self.server.current_peak_rss()
        self.server.stop()
        return {"peak_rss_bytes": max(peak, self.server.peak_rss_bytes) or None, "load_s": self.server.load_s}

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.server.stop()


class LlamaCppBenchDriver:
    name = "llama.cpp"
    policy = None
    model_suffix = ".gguf"

    def __init__(self, bin_dir: Path | None = None):
        self._bin_dir = Path(bin_dir) if bin_dir else None

    @property
    def how(self) -> str:
        from pi2cli.baselines.llamacpp_build import LLAMACPP_COMMIT
        from pi2cli.engines.llamacpp import HOW

        return HOW.format(commit=LLAMACPP_COMMIT, load_mode="mmap", repack=False) + (
            "; multi-turn: the whole conversation each turn, one slot, cache_prompt (KV prefix reuse)"
        )

    def supports(self, target) -> str | None:
        if target.kind != "local":
            return (f"llama.cpp runs only on this machine in pi2 bench for now (target {target.name} is "
                    f"{target.kind}: llama-server there needs a port forward pi2 does not set up yet)")  # fmt: skip
        return None

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = default_bin_dir()
        return self._bin_dir

    def binaries(self, target) -> list[Path]:
        return []

    def open_chat(self, target, model: str, *, binary_dir: str | None, threads: int | None, n_ctx: int,
                  budget=None, seed: int = 0, budget_bytes: int | None = None) -> LlamaCppSession:  # fmt: skip
        # budget_bytes: llama.cpp has no budget of its own; the cgroup (`budget`) is what binds it
        server = LlamaServer(self.bin_dir, Path(model), threads=threads, ctx_size=n_ctx, budget=budget)
        server.start()
        return LlamaCppSession(server, seed)

    def engine_info(self, target) -> dict:
        from pi2cli.baselines.llamacpp_build import LLAMACPP_COMMIT
        from pi2cli.push import sha256_file

        binary = self.bin_dir / "llama-server"
        return {"name": self.name, "version": None, "commit": LLAMACPP_COMMIT, "build_flags": None,
                "build_type": None, "policy": None,
                "binary_sha256": sha256_file(binary) if binary.is_file() else None}  # fmt: skip
