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


class Driver:
    """One engine as pi2 drives it, for `pi2 generate` and `pi2 bench` alike: which model twin it runs,
    the options it declares, what it puts on a target and a session to run conversations in (`pi2
    generate` is one turn of that session). A driver
    subclasses this and overrides what differs; the defaults are what most engines need, so the bench
    calls every member on every driver and never asks which engine it has."""

    name: str = ""
    policy: str | None = None  # the pi2-engine policy it runs with, recorded in the result
    model_suffix: str = ".pi2"  # ".pi2" or ".gguf": which twin of the model this engine runs
    how: str = ""  # how TTFT/TBT are measured, stored in every result
    # how pi2 drives the engine, stored as settings.via where there is a choice (pi2-engine: "pipe", its
    # own stdin protocol, or "server", its OpenAI-compatible server); None: the engine's one way
    via: str | None = None
    # The bench options that belong to this engine (names of pi2cli.bench.run.BenchConfig fields, e.g.
    # llmflash_window); the bench passes each one that was given to set_option().
    options: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.extra_settings: dict = {}  # engine options stored in the result's settings block

    def set_option(self, name: str, value) -> None:
        """One of `options` from the bench's command line."""
        raise NotImplementedError(f"{self.name} declares option {name} but does not take it")

    def prepare_generate(self, target, model: Path) -> str:
        """`pi2 generate`: check what `-m` names and configure for it as the bench does; returns the
        model argument for open_chat (pi2cli.engines.generate runs the one turn)."""
        from pi2cli.errors import Pi2Error

        if not model.is_file():
            raise Pi2Error(f"model file not found: {model}")
        self.configure(target, model)
        return str(model)

    def generate_ctx(self, request: GenerateRequest) -> int | None:
        """The context `pi2 generate` opens the session with; None: the engine's default."""
        return None

    def generate_extra(self, session, turn) -> dict:
        """What `pi2 generate --json` adds under `extra` for this engine, once the session is closed."""
        return {}

    def supports(self, target) -> str | None:
        """None when this engine can run on `target`, else the one-line reason it cannot."""
        return None

    def binaries(self, target) -> list[Path]:
        """Local files of the engine to put on the target (none for a local target)."""
        return []

    def extra_files(self) -> dict[str, list[Path]]:
        """More files the engine reads, by push kind (e.g. {"plans": [plan.json]})."""
        return {}

    def files_pushed(self, workdir: str) -> None:
        """Told where the files landed on a device (WORKDIR/KIND/NAME), after the push."""

    def configure(self, target, model_local: Path) -> None:
        """Called once the model is known, before engine_info (pi2 picks its policy here)."""

    def measurement(self, target) -> str:
        """`how` as it applies on `target` (stored in each result)."""
        return self.how

    def budget_outside(self) -> str | None:
        """Why a memory budget cannot bind this engine (a server pi2 does not start), else None."""
        return None

    def open_chat(self, target, model: str, *, binary_dir: str | None, threads: int | None, n_ctx: int | None,
                  budget=None, seed: int = 0, budget_bytes: int | None = None,
                  temperature: float = 0.0) -> ChatSession:  # fmt: skip
        """Start the engine on `target` with `model` (a path there). n_ctx None: the engine's default
        context. budget: a pi2cli.plan.budget.Budget (local targets only) the process must start inside;
        budget_bytes: the same budget in bytes on any target, for engines that manage their own memory
        (pi2-engine --memory-budget). temperature: 0 is greedy (the bench's); `pi2 generate` may sample."""
        raise NotImplementedError

    def engine_info(self, target) -> dict:
        """version / commit / build flags / binary sha256 for the result's engine block."""
        raise NotImplementedError
