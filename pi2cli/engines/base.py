"""The one interface every engine driver implements, and the metrics every engine reports alike."""

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass
class GenerateRequest:
    model: Path
    prompt: str
    n_predict: int = 64
    temperature: float = 0.0
    seed: int = 0
    threads: int | None = None  # None: the engine's default (all cores)


@dataclass
class GenerateResult:
    """What one generation produced and how fast. Times are seconds; rates tokens per second.

    TTFT is measured from the engine starting to process the prompt to the first generated token;
    token_times_s are the monotonic timestamps of each generated token, so TBT = their differences.
    `how` says how the engine's figures were measured (e.g. "pi2-engine events JSONL").
    """

    engine: str
    text: str
    token_ids: list[int]
    n_prompt: int
    ttft_s: float
    prefill_tps: float
    decode_tps: float
    peak_rss_bytes: int
    token_times_s: list[float] = field(default_factory=list)
    how: str = ""
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


class EngineDriver(Protocol):
    name: str

    def generate(self, request: GenerateRequest) -> GenerateResult: ...


# ---------------------------------------------------------------------------------------------------
# Multi-turn sessions, as `pi2 bench` drives them. A driver that benches implements BenchDriver; each
# conversation turn sends the WHOLE conversation so far (rendered with the model's chat template) and
# the session decides what it can reuse from its KV cache, so every engine sees identical prompts.


class TurnFailed(Exception):
    """One turn could not run (context full, a rejected request) but the engine is still up: the
    bench records the turn as failed and goes on with the next conversation."""


class ChatSession(Protocol):
    """One engine process holding a model and a KV cache, on a target."""

    pid: int | None  # the engine process ON THE TARGET (memory sampling), None when unknown

    def turn(self, prompt: str, n_predict: int, *, ignore_eos: bool = True, on_text=None, messages=None):
        """Generate an answer to `prompt` (the full conversation so far); returns a TurnMetrics
        (pi2cli.engines.llamacpp). on_text(str) receives generated text as it comes, when it can.
        messages: the same conversation as chat messages, for engines that apply their own template."""
        ...

    def close(self) -> dict:
        """Stop the engine; run-level counters (peak_rss_bytes, bytes_read, ...) it reported."""
        ...

    def kill(self) -> None:
        """Stop the engine now (Ctrl-C, lost device); never raises."""
        ...


class BenchDriver(Protocol):
    """What `pi2 bench` needs from an engine: which model file it runs, what to put on the target,
    and a session to run conversations in."""

    name: str
    policy: str | None
    model_suffix: str  # ".pi2" or ".gguf": which twin of the model this engine runs
    how: str  # how TTFT/TBT are measured, stored in every result
    extra_settings: dict  # optional: engine options stored in the result's settings (llmflash_window)

    def supports(self, target) -> str | None:
        """None when this engine can run on `target`, else the one-line reason it cannot."""
        ...

    def binaries(self, target) -> list[Path]:
        """Local files of the engine to put on the target (empty for a local target)."""
        ...

    def configure(self, target, model_local: Path) -> None:
        """Optional: called once the model is known, before engine_info (pi2 picks its policy here)."""
        ...

    def open_chat(self, target, model: str, *, binary_dir: str | None, threads: int | None, n_ctx: int,
                  budget=None, seed: int = 0, budget_bytes: int | None = None) -> ChatSession:  # fmt: skip
        """Start the engine on `target` with `model` (a path there). budget: a pi2cli.plan.budget.Budget
        (local targets only) the process must start inside; budget_bytes: the same budget in bytes on
        any target, for engines that manage their own memory (pi2-engine --memory-budget)."""
        ...

    def engine_info(self, target) -> dict:
        """version / commit / build flags / binary sha256 for the result's engine block."""
        ...
