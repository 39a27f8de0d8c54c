"""What a `pi2 bench` is asked to do (BenchConfig) and how it talks to a user (Reporter): shared by the
bench's modes (pi2cli.bench.run: chat; pi2cli.bench.llama_bench; pi2cli.bench.sweep: pp-tg) and the
run recorder (pi2cli.bench.recorder)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MODES = ("chat", "llama-bench")


@dataclass
class BenchConfig:
    model: str
    engines: list[str] = field(default_factory=lambda: ["pi2"])
    workloads: list[str] = field(default_factory=lambda: ["multi-turn"])
    limit: int | None = None
    seed: int | None = None
    budgets: list[int | None] = field(default_factory=lambda: [None])
    device: str | None = None
    repeat: int | None = 1  # None: 1, or 3 in llama-bench mode
    threads: int | None = None
    n_gen: int | None = None  # tokens per turn; None: the workload's max_new_tokens of each turn
    ctx: int | None = None  # KV cache tokens of every engine; None: what the workload needs (context_for)
    ignore_eos: bool = True  # every engine generates exactly the same number of tokens
    results_dir: str | None = None
    cool_below: float | None = None  # None: 45 on phones, no waiting elsewhere; 0: never wait
    cool_timeout_s: float = 600.0
    tags: list[str] = field(default_factory=list)
    llamacpp_bin_dir: str | None = None
    mode: str = "chat"  # "chat": the workloads, multi-turn; "llama-bench": llama.cpp's own pp/tg benchmark
    n_prompt: int = 512  # llama-bench mode: prompt tokens of the pp test (-p)
    llmflash_window: int = 5  # llmflash: keep the neurons used by the last K tokens
    mlc_runner: str | None = None  # mlc-llm: the runner (URL or command); None: $PI2_MLC_RUNNER
    mlc_model: str | None = None  # mlc-llm: the model id the runner is given; None: $PI2_MLC_MODEL
    plan: str | None = None  # pi2: a plan file from `pi2 plan` (pi2-engine --plan)
    via: str = "pipe"  # pi2-engine's engines: "pipe" (pi2-engine chat) or "server" (pi2-engine serve)
    annotate: Callable[[dict], None] | None = None  # called on every run right before it is saved (pi2 farm)
    quality: bool = False  # sparse pi2 runs: also score them against the dense model (pi2cli.quality)
    run_timeout_s: float | None = (
        None  # each run's limit, engine start to stop (pi2cli.bench.limit); None: none
    )


class Reporter:
    """What the bench tells a user. The base class says nothing (tests, --json without a terminal)."""

    def message(self, text: str) -> None: ...

    def run_started(self, label: str, total_turns: int) -> None: ...

    def turn_started(self, label: str, conversation: str, turn: int, n_turns: int) -> None: ...

    def turn_done(self, label: str, decode_tps: float | None, ttft_ms: float | None) -> None: ...

    def run_done(self, label: str, status: str) -> None: ...
