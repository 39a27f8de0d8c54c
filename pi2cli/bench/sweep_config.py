"""What `pi2 bench --mode pp-tg` is asked to do: its options (SweepConfig), the matrix of cells they
span (one engine x budget x threads x (pp P, tg N) each) and the synthetic prompt every cell runs.
Shared by the sweep (pi2cli.bench.sweep) and its cells (pi2cli.bench.sweep_cells)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pi2cli.errors import Pi2Error

SWEEP_ENGINES = ("pi2", "llmflash", "llama.cpp")
DEFAULT_N_PROMPT = [512]
DEFAULT_N_GEN = [128]
DEFAULT_REPEAT = 3
DEFAULT_WARMUP = 1
TOKEN_SEED = 1234  # the synthetic prompt's ids: the same prompt for every engine, run and cell


@dataclass
class SweepConfig:
    model: str
    engines: list[str] = field(default_factory=lambda: ["pi2"])
    n_prompt: list[int] = field(default_factory=lambda: list(DEFAULT_N_PROMPT))
    n_gen: list[int] = field(default_factory=lambda: list(DEFAULT_N_GEN))
    threads: list[int | None] = field(default_factory=lambda: [None])
    repeat: int = DEFAULT_REPEAT
    warmup: int = DEFAULT_WARMUP
    budgets: list[int | None] = field(default_factory=lambda: [None])
    device: str | None = None
    results_dir: str | None = None
    tags: list[str] = field(default_factory=list)
    llmflash_window: int = 5
    llamacpp_bin_dir: str | None = None
    samples_csv: str | None = None
    dry_run: bool = False
    timeout_s: float = 3600.0  # one engine process (failed past it); run_timeout_s: the whole cell (timeout)
    run_timeout_s: float | None = None


@dataclass
class Cell:
    engine: str
    budget: int | None
    threads: int | None
    n_prompt: int
    n_gen: int

    @property
    def workload(self) -> str:
        return f"pp{self.n_prompt}-tg{self.n_gen}"


def matrix(cfg: SweepConfig) -> list[Cell]:
    """Every cell, engine-major (one engine's cells run together), then budget, threads, pp, tg."""
    return [Cell(e, b, t, p, n) for e in dict.fromkeys(cfg.engines) for b in cfg.budgets for t in cfg.threads
            for p in cfg.n_prompt for n in cfg.n_gen]  # fmt: skip


def check_config(cfg: SweepConfig) -> None:
    """Everything that can be wrong with the options, before anything runs (one line each)."""
    for name in cfg.engines:
        if name not in SWEEP_ENGINES:
            raise Pi2Error(f"--mode pp-tg runs {', '.join(SWEEP_ENGINES)}; engine '{name}' has no pp-tg "
                           f"sweep (use --mode chat)")  # fmt: skip
    if cfg.repeat < 1:
        raise Pi2Error(f"--repeat must be at least 1, got {cfg.repeat}")
    if cfg.warmup < 0:
        raise Pi2Error(f"--warmup must be 0 or more, got {cfg.warmup}")
    if any(p < 1 for p in cfg.n_prompt) or any(n < 2 for n in cfg.n_gen):
        raise Pi2Error(
            "--mode pp-tg needs every --n-prompt >= 1 and every --n-gen >= 2 (a TBT needs two tokens)"
        )
    if any(t is not None and t < 1 for t in cfg.threads):
        raise Pi2Error("--threads must be at least 1")


def prompt_ids(n_vocab: int, n: int, seed: int = TOKEN_SEED) -> list[int]:
    """n token ids drawn from the vocabulary (ids 0..2, BOS/EOS/UNK in llama vocabularies, left out
    where the vocabulary is big enough), the same for every engine and run."""
    import numpy as np

    low = 3 if n_vocab > 16 else 0
    return [int(v) for v in np.random.default_rng(seed).integers(low, n_vocab, size=n)]
