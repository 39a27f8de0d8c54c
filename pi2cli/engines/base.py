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
        (pi2cli.engines.llamacpp.server). on_text(str) receives generated text as it comes, when it can.
        messages: the same conversation as chat messages, for engines that apply their own template."""
        ...

    def close(self) -> dict:
        """Stop the engine; run-level counters (peak_rss_bytes, bytes_read, ...) it reported."""
        ...

    def kill(self) -> None:
        """Stop the engine now (Ctrl-C, lost device); never raises."""
        ...


class Driver:
    """One engine as pi2 drives it, for `pi2 bench` and `pi2 generate` alike (a generation is one turn of
    the bench's session). What the bench reads of an engine is plain data below; what depends on the
    target or the model is one of six methods, and `pi2 generate` adds two. The defaults are what most
    engines need, so the bench calls every member on every driver and never asks which engine it has.

    The order a driver is used in: set_option (each of `options` given) -> supports(target) ->
    configure(target, model) (or prepare_generate) -> files(target), pushed to a device -> engine_info
    (target) -> open_chat(...) -> the session's turns."""

    name: str = ""
    policy: str | None = None  # the pi2-engine policy it runs with, recorded in the result
    model_suffix: str = ".pi2"  # ".pi2" or ".gguf": which twin of the model this engine runs
    how: str = ""  # how TTFT/TBT are measured on the configured target, stored in every result
    # The bench options that belong to this engine (names of pi2cli.bench.run.BenchConfig fields, e.g.
    # llmflash_window); the bench passes each one that was given to set_option().
    options: tuple[str, ...] = ()
    # Why a memory budget cannot bind this engine (a server pi2 does not start), else None; the bench then
    # records the budget as not enforced.
    budget_outside: str | None = None

    def __init__(self) -> None:
        self.extra_settings: dict = {}  # engine options stored in the result's settings block

    def set_option(self, name: str, value) -> None:
        """One of `options` from the bench's command line."""
        raise NotImplementedError(f"{self.name} declares option {name} but does not take it")

    def supports(self, target) -> str | None:
        """None when this engine can run on `target`, else the one-line reason it cannot."""
        return None

    def configure(self, target, model_local: Path) -> None:
        """The model and target are known: pick what depends on them (pi2 its policy, `how` on a device)
        before files, engine_info and open_chat."""

    def files(self, target) -> dict[str, list[Path]]:
        """Local files to put on the target by push kind (pi2cli.hw.push.collect_items: "engine" for
        binaries, "plans"); none for a target on this machine, which uses them in place."""
        return {}

    def open_chat(self, target, model: str, *, binary_dir: str | None, threads: int | None, n_ctx: int | None,
                  cgroup=None, budget_bytes: int | None = None, seed: int = 0,
                  temperature: float = 0.0) -> ChatSession:  # fmt: skip
        """Start the engine on `target` with `model` (a path there). binary_dir: where files() landed on
        a device (WORKDIR/bin, the push layout of pi2cli.hw.push), None here. n_ctx None: the engine's
        default context. cgroup: the pi2cli.hw.cgroup.Budget (this machine only) the process must start
        inside; budget_bytes: the run's budget in bytes on any target, for engines that size their own
        memory to it (pi2-engine --memory-budget). temperature: 0 is greedy (the bench's)."""
        raise NotImplementedError

    def engine_info(self, target) -> dict:
        """version / commit / build flags / binary sha256 for the result's engine block."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------- `pi2 generate`
    def prepare_generate(self, target, request: GenerateRequest) -> tuple[str, int | None]:
        """Check what `-m` names and configure for it as the bench does; returns the model argument and
        the context for open_chat (None: the engine's default). pi2cli.engines.generate runs the turn."""
        from pi2cli.errors import Pi2Error

        model = Path(request.model)
        if not model.is_file():
            raise Pi2Error(f"model file not found: {model}")
        self.configure(target, model)
        return str(model), None

    def generate_extra(self, session, turn) -> dict:
        """What `pi2 generate --json` adds under `extra` for this engine, once the session is closed."""
        return {}
