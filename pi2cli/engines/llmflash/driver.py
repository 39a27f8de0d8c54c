"""LLM in a Flash (Alizadeh et al., 2023) as a named baseline: pi2-engine with `--policy llmflash`.

The policy reads neuron bundles predicted active (row-column bundling) and keeps the neurons used by the
last K tokens in memory (the paper's sliding window; K = 5 by default, as in the paper), but has none of
PowerInfer-2's segmented hot/cold cache, two-phase reads or pipelining. It runs the same .pi2 model,
the same workloads and the same measurement as the pi2 driver (pi2-engine chat, events JSONL); only the
policy differs, so the comparison isolates the techniques. Its results say engine "llmflash", policy
"llmflash" and the window (settings.llmflash_window).
"""

from __future__ import annotations

from pathlib import Path

from pi2cli.engines.pi2.driver import Pi2Driver, model_has_predictor
from pi2cli.errors import Pi2Error

DEFAULT_WINDOW = 5  # the window LLM in a Flash runs with (k = 5 tokens)


class LlmFlashDriver(Pi2Driver):
    name = "llmflash"
    policy = "llmflash"
    options = ("llmflash_window",)

    def __init__(self, window: int = DEFAULT_WINDOW):
        super().__init__()
        self.window = window

    def set_option(self, name: str, value) -> None:
        assert name == "llmflash_window"
        self.window = value

    @property
    def window(self) -> int:
        return self._window

    @window.setter
    def window(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise Pi2Error(f"--llmflash-window must be a positive number of tokens, got {value!r}")
        self._window = value
        self.extra_settings = {"llmflash_window": value}

    def configure(self, target, model_local: Path) -> None:
        if model_has_predictor(model_local) is False:  # unreadable (None): the engine will say why
            raise Pi2Error(f"engine 'llmflash' needs a model with activation predictors and {model_local} has "
                           f"none (`pi2 models synth` and the converters of sparse models write them)")  # fmt: skip
        self.policy = "llmflash"

    def engine_options(self, budget_bytes: int | None, binary_dir: str | None = None) -> dict:
        return {**super().engine_options(budget_bytes, binary_dir), "llmflash_window": self.window}
