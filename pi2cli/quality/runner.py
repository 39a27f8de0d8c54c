"""Run the quality measurement: the engine's `eval --all` (token ids -> float32 logits at every
position) over the chunks of a workload's evaluation text, once with the dense policy and once with the
configuration under test, then the metrics of pi2cli.quality.metrics over the scored positions.

The dense reference is the same file under `--policy dense` unless another model is given (the two
must share the vocabulary). Both runs use the same --batch, 1 by default: every position then goes
through the decode path, and under powerinfer2 through the predictor (its prefill batches of 8 tokens
or more are dense by design, so they would hide what the predictor drops).
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pi2cli.engines.pi2.driver import engine_binary
from pi2cli.errors import Pi2Error, failure_line
from pi2cli.quality import metrics, text

DEFAULT_CTX = 256
DEFAULT_CHUNKS = 8


@dataclass
class QualityConfig:
    model: Path
    policy: str = "powerinfer2"
    memory_budget: str | None = None
    extra: list[str] = field(default_factory=list)  # more pi2-engine flags for the run under test
    reference: Path | None = None  # the dense model; default: model under --policy dense
    workload: str = "multi-turn"
    ctx: int = DEFAULT_CTX
    chunks: int = DEFAULT_CHUNKS
    batch: int = 1
    threads: int | None = None


def _eval(model: Path, ids: np.ndarray, out: Path, flags: list[str]) -> np.ndarray:
    cmd = [str(engine_binary()), "eval", "-m", str(model), "--tokens", ",".join(map(str, ids.tolist())),
           "--logits-out", str(out), "--all", "--no-verify-neurons", *flags]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if done.returncode != 0:
        raise Pi2Error(f"pi2-engine eval failed: {failure_line(done.stderr, 'no output', 'pi2-engine')}")
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


def measure(cfg: QualityConfig, progress=None) -> dict:
    """The `quality` block of a result (docs/RESULTS.md): metrics with intervals, and how they were got."""
    model = Path(cfg.model)
    reference = Path(cfg.reference) if cfg.reference else model
    for p in {model, reference}:
        if not p.is_file():
            raise Pi2Error(f"{p}: no such file")
    if cfg.policy == "dense" and reference == model and not cfg.extra:
        raise Pi2Error("--policy dense against the same file measures nothing: give a sparse policy")
    tok = text.tokenize(model, text.workload_text(cfg.workload, "evaluation"))
    parts = text.chunks(tok, cfg.ctx, cfg.chunks)
    first, last = text.scored(cfg.ctx)
    common = ["--batch", str(cfg.batch)] + (["--threads", str(cfg.threads)] if cfg.threads else [])
    under_test = ["--policy", cfg.policy, *(["--memory-budget", cfg.memory_budget] if cfg.memory_budget else []),
                  *cfg.extra]  # fmt: skip
    scores = []
    with tempfile.TemporaryDirectory(prefix="pi2-quality-") as tmp:
        out = Path(tmp) / "logits.bin"
        for i, ids in enumerate(parts):
            d = _eval(reference, ids, out, [*common, "--policy", "dense"])[first:last]
            s = _eval(model, ids, out, [*common, *under_test])[first:last]
            if d.shape[1] != s.shape[1]:
                raise Pi2Error(
                    f"{reference} and {model} have different vocabularies ({d.shape[1]}, {s.shape[1]})"
                )
            scores.append(metrics.score_positions(d, s, ids[first + 1 : last + 1]))
            if progress:
                progress(i + 1, len(parts))
    summary = metrics.summarize(metrics.TokenScores.concat(scores))
    return {
        **summary,
        "reference": "dense policy, same file" if reference == model else f"dense policy, {reference.name}",
        "policy": cfg.policy,
        "memory_budget": cfg.memory_budget,
        "workload": cfg.workload,
        "text": "evaluation part (pi2cli/quality/text.py)",
        "ctx": cfg.ctx,
        "chunks": len(parts),
        "batch": cfg.batch,
        "how": f"pi2-engine eval --all over {len(parts)} chunks of {cfg.ctx} tokens, second half of each "
        f"scored (llama-perplexity's protocol); 95% bootstrap over blocks of {metrics.BLOCK} positions",
    }
