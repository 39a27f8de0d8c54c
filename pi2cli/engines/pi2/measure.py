"""Activation statistics as the engine sees them: run pi2-engine with --check-predictor on a .pi2 and
read back the true sparsity and the predictor's recall and precision, overall and per layer.

The synthetic generator measures the same quantities with a numpy forward on its own held-out token
sequences; this is the engine's own count over the tokens it generates (every predicted neuron is
checked against the truth: all gate and up rows multiplied out), so the two can be compared.
"""

from __future__ import annotations

from pathlib import Path

from pi2cli.engines.pi2.driver import run_generate
from pi2cli.errors import Pi2Error

DEFAULT_PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


def measure_with_engine(model: Path, n_tokens: int = 32, prompt: str = DEFAULT_PROMPT, seed: int = 0) -> dict:
    """Generate n_tokens (sampled at temperature 0.8, EOS ignored) with the predictor checked; returns
    {"sparsity", "recall", "precision", "layers": [{"layer", "sparsity", "recall", "precision"}], ...}."""
    model = Path(model)
    if not model.is_file():
        raise Pi2Error(f"{model}: no such file")
    run = run_generate(model, prompt=prompt, n_predict=n_tokens, temperature=0.8, seed=seed, ignore_eos=True,
                       policy="cache", more=["--check-predictor"], timeout=None)  # fmt: skip
    if run.error is not None:
        raise Pi2Error(f"pi2-engine could not measure {model}: {run.error}")
    ev = run.events
    s = ev.get("summary") or {}
    if "predictor_recall" not in s:
        raise Pi2Error(f"pi2-engine reported no predictor statistics for {model}")
    return {
        "how": f"pi2-engine generate --check-predictor, {len(ev['token'])} tokens sampled from {prompt!r}",
        "tokens": len(ev["token"]),
        "sparsity": s["sparsity"],
        "recall": s["predictor_recall"],
        "precision": s["predictor_precision"],
        "predicted_fraction": s.get("active_fraction"),
        "layers": s.get("predictor_layers", []),
    }


def format_measurement(m: dict) -> str:
    lines = [
        f"  engine-measured ({m['how']}):",
        f"    sparsity {m['sparsity']:.1%}, predictor recall {m['recall']:.1%}, precision {m['precision']:.1%}, "
        f"predicted {m['predicted_fraction']:.1%} of neurons",
    ]
    for layer in m["layers"]:
        lines.append(
            f"    layer {layer['layer']:3d}: sparsity {layer['sparsity']:.1%}, recall {layer['recall']:.1%}, "
            f"precision {layer['precision']:.1%}"
        )
    return "\n".join(lines)
