"""`pi2 bench --quality`: a finished sparse run gets the quality block of the same configuration."""

from __future__ import annotations

from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.quality.runner import QualityConfig, measure

# engines whose runs pi2-engine eval can repeat: the driver name -> the policy it ran
SPARSE_DRIVERS = ("pi2", "llmflash")


def attach_quality(
    run: dict, model: Path, workload: str, budget_bytes: int | None, threads: int | None
) -> str:
    """Measure and store run["quality"]; returns a line saying what happened (never raises Pi2Error:
    a quality failure must not cost the speed run already measured)."""
    engine, policy = run["engine"]["name"], run["engine"].get("policy")
    if engine not in SPARSE_DRIVERS or not policy or policy == "dense":
        return (
            f"quality: skipped for {engine} ({policy or 'no policy'}): only sparse pi2-engine runs have one"
        )
    if run["status"] != "ok":
        return "quality: skipped, the run did not finish"
    # In memory even for a budgeted run: a budget changes which reads happen, never a float
    # (tests/test_sparse_engine.py), and one-token passes from flash would take many minutes.
    try:
        q = measure(QualityConfig(model=Path(model), policy=policy, workload=workload, threads=threads))
    except Pi2Error as err:
        return f"quality: not measured: {err}"
    except KeyboardInterrupt:  # stop the measurement, keep the speed run
        return "quality: interrupted, not measured"
    run["quality"] = q
    return f"quality: KL {q['kl_nats']:.4f} nats/token, top-1 {q['top1_agreement']:.1%}, ppl ratio {q['ppl_ratio']:.4f}"
