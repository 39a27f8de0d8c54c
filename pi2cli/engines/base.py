"""The one interface every engine driver implements, and the metrics every engine reports alike."""

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from pi2cli.results.schema import tbt_from_times


@dataclass
class GenerateRequest:
    model: Path
    prompt: str
    n_predict: int = 64
    temperature: float = 0.0
    seed: int = 0
    threads: int | None = None  # None: the engine's default (all cores)


@dataclass
class TurnMetrics:
    """One turn as every engine reports it: its output and timings, the one shape a bench turn, `pi2
    generate` and the run's turn record (turn_fields) all come from. Times in seconds; token_times_s
    relative to the request."""

    text: str
    token_ids: list[int]
    n_prompt: int  # prompt tokens in total (cached + processed)
    n_prompt_cached: int  # prompt tokens reused from the KV cache (server timings.cache_n)
    n_prompt_processed: int  # prompt tokens actually prefilled (timings.prompt_n)
    ttft_s: float | None
    token_times_s: list[float]
    prefill_tps: float
    decode_tps: float
    host_decode_tps: float
    stop_type: str
    timings: dict = field(default_factory=dict)
    # tokens generated when token_ids / token_times_s cannot tell (engines that report counts and rates
    # only, as an MLC command runner); None: len(token_ids)
    n_gen: int | None = None
    # whose clock token_times_s are on: "engine" (taken where the engine runs: its own per-token stamps),
    # "host" (arrivals stamped here: only for a server on this machine), None (unknown)
    clock: str | None = None
    host_ttft_s: float | None = None  # arrivals here, for comparison with the engine's own times
    # the engine's own turn record beyond the fields above, as it wrote it (pi2-engine's turn event:
    # prefill_s, n_past, cpu_s, ...; docs/ENGINE.md), stored as the turn's extra.engine_turn
    engine_turn: dict = field(default_factory=dict)

    @property
    def tbt_s(self) -> list[float]:
        return [ns / 1e9 for ns in tbt_from_times(self.token_times_s)]

    def to_json(self) -> dict:
        out = asdict(self)
        out["tbt_s"] = self.tbt_s
        return out

    def turn_fields(self) -> dict:
        """add_turn's arguments (pi2cli.results.schema) for this turn. TTFT and TBT come from the
        per-token times wherever the engine gives them (the same for every engine); an engine that
        reports only rates (an MLC command runner) gets its own prefill/decode rates recorded instead
        (extra.rates_from = "engine")."""
        samples = tbt_from_times(self.token_times_s)
        n_gen = self.n_gen if self.n_gen is not None else (len(self.token_ids) or len(self.token_times_s))
        rate_only = not samples and n_gen > 1 and bool(self.decode_tps)
        extra = {"n_prompt_total": self.n_prompt, "n_prompt_cached": self.n_prompt_cached,
                 "engine_prefill_tps": self.prefill_tps, "engine_decode_tps": self.decode_tps,
                 "stop": self.stop_type, "text": self.text}  # fmt: skip
        if rate_only:
            extra["rates_from"] = "engine"
        if self.clock:  # whose clock the token times are on (llama.cpp: the server's own)
            extra["clock"] = self.clock
        if self.host_ttft_s is not None:
            extra["host_ttft_ms"] = round(self.host_ttft_s * 1e3, 3)
        server = {k: self.timings[k] for k in ("prompt_ms", "predicted_ms", "predicted_per_token_ms")
                  if k in self.timings}  # fmt: skip
        if server:
            extra["engine_timings"] = server
        if self.engine_turn:
            extra["engine_turn"] = self.engine_turn
        io = self.timings.get("sparse") or {}
        if io:
            extra["storage_reads"] = io["reads"]
        ttft = self.ttft_s
        return dict(
            n_prompt=self.n_prompt_processed, n_gen=n_gen, ttft_ns=None if ttft is None else round(ttft * 1e9),
            samples_ns=samples, extra=extra,
            prefill_ts=(self.prefill_tps or None) if rate_only and (ttft is None or not self.n_prompt_processed)
            else None,
            decode_ts=self.decode_tps if rate_only else None,
            bytes_read=io.get("bytes_read"), cache_hits=io.get("hits"), cache_misses=io.get("misses"),
            io_ns=io.get("io_ns"), compute_ns=io.get("compute_ns"),
        )  # fmt: skip


def _from_turn(name: str) -> property:
    return property(lambda self: getattr(self.turn, name), doc=f"The turn's {name}.")


@dataclass
class GenerateResult:
    """What `pi2 generate` produced and how fast: its one turn (the TurnMetrics a bench turn is) and
    what the process around it measured. Times are seconds; rates tokens per second.

    TTFT is measured from the engine starting to process the prompt to the first generated token;
    token_times_s are the monotonic timestamps of each generated token, so TBT = their differences.
    `how` says how the engine's figures were measured (e.g. "pi2-engine events JSONL").
    """

    engine: str
    turn: TurnMetrics
    peak_rss_bytes: int
    how: str = ""
    extra: dict = field(default_factory=dict)

    # the turn's own figures, read through (a GenerateResult is its turn plus the process around it)
    text = _from_turn("text")
    token_ids = _from_turn("token_ids")
    n_prompt = _from_turn("n_prompt")
    prefill_tps = _from_turn("prefill_tps")
    decode_tps = _from_turn("decode_tps")
    token_times_s = _from_turn("token_times_s")

    @property
    def ttft_s(self) -> float:
        return self.turn.ttft_s or 0.0  # an engine that reports no TTFT (rates only) prints 0

    def to_json(self) -> dict:
        """`pi2 generate --json`: the turn's figures flat, with the run's beside them."""
        return {"engine": self.engine, "text": self.text, "token_ids": self.token_ids, "n_prompt": self.n_prompt,
                "ttft_s": self.ttft_s, "prefill_tps": self.prefill_tps, "decode_tps": self.decode_tps,
                "peak_rss_bytes": self.peak_rss_bytes, "token_times_s": self.token_times_s, "how": self.how,
                "extra": self.extra}  # fmt: skip


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
        """Generate an answer to `prompt` (the full conversation so far); returns a TurnMetrics.
        on_text(str) receives generated text as it comes, when it can.
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
    # how pi2 drives the engine, stored as settings.via where there is a choice (pi2-engine: "pipe", its
    # own stdin protocol, or "server", its OpenAI-compatible server); None: the engine's one way
    via: str | None = None
    # The bench options that belong to this engine (names of pi2cli.bench.config.BenchConfig fields, e.g.
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
