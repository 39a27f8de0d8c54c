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
