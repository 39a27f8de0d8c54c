"""Activation statistics of a model on real text, from the numpy forward (`pi2 models show --measure`):
what the synthetic generator assumes, measured: the share of activations the top 20% of neurons carry,
whether neurons that fire together sit next to each other in the file, and per-layer sparsity
(docs/MODELS.md compares them with a synthetic model's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pi2cli.errors import Pi2Error

SYNTH_TOP20_SHARE = 0.80  # pi2cli/models/synth.py: lognormal(2.1) frequencies, top 20% carry ~80%


class _ActivationRecorder:
    """Wraps pi2cli.models.numpy_llama.Reference: per layer, which neurons (file order) are active per token."""

    def __init__(self, path: Path):
        from pi2cli.models.numpy_llama import Reference
        from pi2cli.models.pi2file import Pi2File

        f = Pi2File(path, verify=False)
        h = f.header
        if h.arch != "llama":
            raise Pi2Error(f"{path}: activation statistics are measured on dense (non-MoE) models")
        self.thresholds = None
        if h.ffn_act == "swiglu":
            if not h.gate_predictor:
                raise Pi2Error(f"{path}: a SwiGLU model has no zero activations; measure a CATS file "
                               "(pi2 convert --sparsify cats)")  # fmt: skip
            self.thresholds = [float(f.tensor(f"blk.{i}.pred_threshold")[0]) for i in range(h.n_layer)]
        self.active: dict[int, list[np.ndarray]] = {}
        rec = self

        class Ref(Reference):
            def _ffn_block(self, x, layer, expert):
                b = self._ffn(layer, expert)
                g = self._mm(x, b["gate"], self.h.neuron_type)
                if self.h.ffn_act == "swiglu":
                    on = np.abs(g / (1.0 + np.exp(-g.astype(np.float64)))) > rec.thresholds[layer]
                elif self.h.ffn_act == "relu":
                    on = g > 0
                else:
                    on = (g > 0) & (self._mm(x, b["up"], self.h.neuron_type) > 0)
                rec.active.setdefault(layer, []).append(on)
                return super()._ffn_block(x, layer, expert)

        self.ref = Ref(f, emulate_rounding=False)
        self.h = h


def layer_statistics(active: np.ndarray, rng: np.random.Generator) -> dict:
    """active: (tokens, n_ff) bool in file order -> sparsity, top-20% share, adjacency of co-activation."""
    freq = active.mean(axis=0)
    total = freq.sum()
    top = np.sort(freq)[::-1][: max(1, int(round(0.2 * len(freq))))]
    a = active.astype(np.float64)
    on = a.sum()

    def neighbour_given_active(i: np.ndarray, j: np.ndarray) -> float:
        return float((a[:, i] * a[:, j]).sum() / a[:, i].sum()) if a[:, i].sum() else float("nan")

    k = np.arange(active.shape[1] - 1)
    return {
        "sparsity": float(1 - freq.mean()),
        "top20_share": float(top.sum() / total) if total else float("nan"),
        # P(neuron k+1 active | neuron k active), file neighbours vs random pairs: above 1 in ratio, the
        # file's order puts neurons that fire together next to each other (one read serves both)
        "adjacent_coactivation": neighbour_given_active(k, k + 1),
        "random_coactivation": neighbour_given_active(k, rng.permutation(active.shape[1])[: len(k)]),
        "activations": int(on),
    }


def measure_activations(model: Path, n_tokens: int = 256, workload: str = "multi-turn") -> dict:
    """Per-layer and overall statistics on the first n_tokens of the workload's evaluation text."""
    from pi2cli.quality.text import tokenize, workload_text

    model = Path(model)
    if not model.is_file():
        raise Pi2Error(f"{model}: no such file")
    rec = _ActivationRecorder(model)
    ids = tokenize(model, workload_text(workload, "evaluation")).ids[:n_tokens]
    rec.ref.forward([int(t) for t in ids])
    rng = np.random.default_rng(0)
    layers = [
        {"layer": i, **layer_statistics(np.concatenate(rec.active[i]), rng)} for i in range(rec.h.n_layer)
    ]

    def mean(key):
        vals = [x[key] for x in layers if x[key] == x[key]]
        return float(np.mean(vals)) if vals else float("nan")

    return {
        "how": f"numpy forward (pi2cli.models.numpy_llama) over {len(ids)} tokens of {workload}'s evaluation text; active = "
        + (
            "|silu(gate)| > the file's CATS threshold"
            if rec.thresholds
            else f"{rec.h.ffn_act} output non-zero"
        ),
        "tokens": int(len(ids)),
        **{k: mean(k) for k in ("sparsity", "top20_share", "adjacent_coactivation", "random_coactivation")},
        "layers": layers,
    }


def format_activations(columns: dict[str, dict]) -> str:
    """Side by side: {column title: measure_activations(...)}; a last column says what synth assumes."""
    names = list(columns)
    rows = [("sparsity", "sparsity", "{:.1%}", "per layer, target +-10%"),
            ("top-20% share of activations", "top20_share", "{:.1%}", f"~{SYNTH_TOP20_SHARE:.0%} by design"),
            ("P(file neighbour on | on)", "adjacent_coactivation", "{:.3f}", "hot-first order only"),
            ("P(random neuron on | on)", "random_coactivation", "{:.3f}", "")]  # fmt: skip
    width = max(14, *(len(n) for n in names))
    out = ["activation statistics (" + "; ".join(f"{n}: {columns[n]['how']}" for n in names) + ")"]
    out.append(f"  {'':30s}" + "".join(f"{n:>{width + 2}s}" for n in names) + "   synthesizer assumes")
    for title, key, fmt, assumed in rows:
        out.append(f"  {title:30s}" + "".join(f"{fmt.format(columns[n][key]):>{width + 2}s}" for n in names)
                   + f"   {assumed}")  # fmt: skip
    for n in names:
        per = ", ".join(f"{x['sparsity']:.0%}" for x in columns[n]["layers"])
        out.append(f"  {n}: sparsity per layer {per}")
    return "\n".join(out)
