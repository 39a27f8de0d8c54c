"""Synthetic sparse models with real (or scaled-down) shapes and measured, realistic statistics.

What is built (deterministic from the seed; every tensor has its own random stream):

* Residual stream. Real hidden states are anisotropic: a persistent mean direction ("massive
  activations") plus a low-rank, power-law spectrum. The embeddings are `a*u + B^T z + noise` with u a
  unit vector (~35% of the energy), B a basis of k = hidden/4 directions whose variances fall as
  j^-1.2 (~55%) and isotropic noise (~10%). Attention and FFN outputs write into span(B) plus 10%
  isotropic, scaled so each adds ~0.15 of the residual's RMS, so the stream keeps its structure.
* Per-neuron activation frequency. Each FFN (each expert) draws target frequencies p_i from a
  lognormal with sigma 2.1 scaled to the target density d = 1 - sparsity (capped at 0.8, mean
  renormalised). With the cap, the top 20% of neurons then carry ~80% of all activations (the hot
  set). Per-layer densities jitter +-10% around d.
* Gate rows by construction. There are no FFN biases in llama models, so the bias is carried by the
  mean direction: gate_i = r_i + t_i * u_hat, where r_i is a random direction and u_hat the measured
  mean direction of this layer's FFN input (x . u_hat = c_x > 0). gate_i . x > 0  <=>  t_i > -r_i.x / c_x,
  so t_i is a per-neuron quantile over calibration hidden states taken from the model's own residual
  stream (the layer-by-layer forward below). For dReLU, up rows are built the same way with
  P(up > 0) = 0.85 and the gate quantile is taken over the states where up > 0, so P(active) = p_i.
* Predictor (fc1/fc2, per layer, per expert). From the SVD of the calibration inputs, V_r = the top-r
  right singular vectors; fc1 = [V_r; -V_r], fc2 = [G V_r^T, -G V_r^T] / e (e_i: the per-neuron
  residual std), so fc2 . relu(fc1 . x) = (G V_r^T V_r x) / e exactly: a low-rank projection of the
  gate pre-activation in units of its error. The threshold (sigmoid(score) > tau) is set on the
  calibration states for recall >= 0.95.
* Then everything is MEASURED on held-out sequences that took no part in the calibration, using the
  quantized weights as written: per-layer sparsity, hot-set coverage (hot set ranked on the
  calibration states), predictor recall and precision. The numbers go into the metadata of both files.

Writing streams layer by layer: one layer's FFN is in memory at a time (plus the calibration states),
the .pi2 writer places each FFN block at its final offset and the GGUF twin writes tensors in order.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import gguf
import numpy as np

from pi2cli.errors import Pi2Error
from pi2cli.models import gguf_twin, synth_quant, synth_resume
from pi2cli.models.numpy_llama import attention, ffn_activation, rms_norm
from pi2cli.models.registry import ModelSpec, get_model, validate_dims
from pi2cli.models.synth_stats import LayerStats

HOT_FRACTION = 0.2
LOGNORMAL_SIGMA = 2.1  # with the 0.8 cap, the top 20% of neurons hold ~80% of the activations
MAX_NEURON_FREQ = 0.8
UP_POSITIVE = 0.85  # dReLU: P(up > 0)
TARGET_RECALL = 0.95
STREAM_SHARES = (0.35, 0.55, 0.10)  # mean direction, low-rank latent, isotropic noise
LAYER_WRITE_RMS = 0.15  # each attention / FFN output's RMS relative to a unit-RMS residual
HEAD_DIM = 128


@dataclass
class SynthConfig:
    like: str
    n_layer: int | None = None
    hidden: int | None = None
    ffn: int | None = None
    quant: str = "q4_0"
    seed: int = 0
    sparsity: float | None = None  # default: the model's published sparsity (0.9 if none)
    predictor_rank: int | None = None  # default hidden // 16 (>= 16)
    calib_seqs: int = 8
    eval_seqs: int = 4
    seq_len: int = 64
    dense_down: bool | None = None  # default: only for dense FFNs (MoE FFNs are read as bundles)
    tokenizer_gguf: Path | None = None  # default: SmolLM2's GGUF (its real byte-level BPE vocab)


def synth_spec(cfg: SynthConfig, vocab: int) -> ModelSpec:
    """The registry model's shapes with --layers/--hidden/--ffn applied (heads follow the hidden size
    at head_dim 128, keeping the model's query/kv head ratio) and the tokenizer's vocabulary."""
    base = get_model(cfg.like)
    if base.activation == "silu":
        raise Pi2Error(f"{base.name} is a dense SwiGLU model; synth makes sparse models (ReLU/dReLU) only")
    hidden = cfg.hidden or base.hidden
    if cfg.hidden and cfg.hidden != base.hidden:
        n_head = max(1, hidden // HEAD_DIM)
        ratio = base.n_head // base.n_kv_head
        n_kv = max(1, n_head // ratio)
        while n_head % n_kv:
            n_kv -= 1
    else:
        n_head, n_kv = base.n_head, base.n_kv_head
    spec = replace(
        base,
        name=f"synthetic-{base.name}",
        n_layer=cfg.n_layer or base.n_layer,
        hidden=hidden,
        ffn=cfg.ffn or base.ffn,
        n_head=n_head,
        n_kv_head=n_kv,
        vocab=vocab,
        hf_repo=None,
        hf_gguf_repo=None,
        aliases=(),
    )
    problems = validate_dims(spec)
    if problems:
        raise Pi2Error(f"synth --like {cfg.like}: {problems[0]}")
    return spec


SYNTH_VOCAB = 49152  # the default tokenizer's (SmolLM2): sizes can be planned without loading it


def default_config(name: str) -> SynthConfig:
    """The full-size synth of a registry model, as `models synth --like NAME` and the store make it."""
    return SynthConfig(like=get_model(name).name)


def check_config(cfg: SynthConfig) -> ModelSpec:
    """Fail fast (before any work or output) on options that cannot make a model."""
    if cfg.quant not in ("q4_0", "q4_1", "q8_0", "f16"):
        raise Pi2Error(f"--quant {cfg.quant}: choose q4_0, q4_1, q8_0 or f16")
    if cfg.sparsity is not None and not 0.0 < cfg.sparsity < 1.0:
        raise Pi2Error(f"--sparsity must be between 0 and 1, got {cfg.sparsity}")
    return synth_spec(cfg, get_model(cfg.like).vocab)


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *key])))


# stream ids for _rng
_EMBED, _OUTPUT, _BASIS, _TOKENS, _LAYER = 1, 2, 3, 4, 100


def frequency_targets(rng: np.random.Generator, n: int, density: float) -> np.ndarray:
    """Per-neuron activation probabilities: lognormal(sigma 2.1) with mean `density`, each <= 0.8."""
    raw = rng.lognormal(0.0, LOGNORMAL_SIGMA, n)
    p = raw * (density / raw.mean())
    for _ in range(20):
        p = np.minimum(p, MAX_NEURON_FREQ)
        p *= density / p.mean()
    return np.minimum(p, MAX_NEURON_FREQ)


def _column_quantile_shift(z: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per column, a value t with exactly counts[j] entries of z[:, j] below it (inf = never below)."""
    zs = np.sort(z, axis=0)
    finite = np.isfinite(zs).sum(axis=0)
    k = np.minimum(counts, np.maximum(finite - 1, 0))
    cols = np.arange(z.shape[1])
    lo = zs[np.maximum(k - 1, 0), cols]
    hi = zs[k, cols]
    hi = np.where(np.isfinite(hi), hi, lo + 1.0)
    lo0 = np.where(np.isfinite(zs[0, cols]), zs[0, cols], 0.0)
    return np.where(k >= 1, 0.5 * (lo + hi), lo0 - 1.0).astype(np.float32)


def _transpose(a: np.ndarray, tile: int = 512) -> np.ndarray:
    """A contiguous transpose in cache-sized tiles: ~4x faster than np.ascontiguousarray(a.T) at
    (4096, 14336)."""
    out = np.empty((a.shape[1], a.shape[0]), a.dtype)
    for i in range(0, a.shape[0], tile):
        for j in range(0, a.shape[1], tile):
            out[j : j + tile, i : i + tile] = a[i : i + tile, j : j + tile].T
    return out


def _add_outer(a: np.ndarray, t: np.ndarray, u: np.ndarray, rows: int = 1024) -> np.ndarray:
    """a += outer(t, u) in place, a few rows at a time (no (n, hidden) temporary)."""
    for i in range(0, a.shape[0], rows):
        a[i : i + rows] += t[i : i + rows, None] * u[None, :]
    return a


def _uniform_rows(
    rng: np.random.Generator, shape: tuple[int, ...], std: float, out: np.ndarray | None = None
) -> np.ndarray:
    """Random float32 entries with mean 0 and standard deviation `std`, from uniform int8 draws in
    [-127, 127] (variance 5418.67). Drawing int8 is ~5x faster than Gaussians and projections of these
    rows are Gaussian all the same (sums of thousands of terms); only the directions' randomness matters.
    One pass (int8 -> float32 is exact, so this is float32(i) * scale as before), into `out` if given."""
    ints = rng.integers(-127, 128, size=shape, dtype=np.int8)
    if out is None:
        out = np.empty(shape, np.float32)
    return np.multiply(ints, _uniform_scale(std), out=out, dtype=np.float32)


def _add_uniform_rows(rng: np.random.Generator, a: np.ndarray, std: float) -> np.ndarray:
    """a += _uniform_rows(rng, a.shape, std), the same floats, without a full-size temporary."""
    ints = rng.integers(-127, 128, size=a.shape, dtype=np.int8)
    scale = _uniform_scale(std)
    rows = max(1, (1 << 18) // max(1, a.shape[-1]))  # ~1 MiB of floats at a time
    for i in range(0, a.shape[0], rows):
        a[i : i + rows] += np.multiply(ints[i : i + rows], scale, dtype=np.float32)
    return a


def _uniform_scale(std: float) -> np.float32:
    return np.float32(std / math.sqrt((255**2 - 1) / 12))


def _workspace(ws, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 buffer reused from one expert to the next in the same thread (`ws`: a threading.local,
    or None for a fresh array). A fresh 235 MB array costs its page faults every time: at the 47B shape
    the kernel's time for those was a third of the run's CPU time."""
    if ws is None:
        return np.empty(shape, np.float32)
    bufs = getattr(ws, "bufs", None)
    if bufs is None:
        bufs = ws.bufs = {}
    buf = bufs.get(name)
    if buf is None or buf.shape != shape:
        buf = bufs[name] = np.empty(shape, np.float32)
    return buf


@dataclass
class LayerInputs:
    """What every FFN block of a layer shares: its normed inputs and their mean direction."""

    x_all: np.ndarray  # (n_all, hidden): calibration rows first, then held-out rows
    n_calib: int
    u_hat: np.ndarray  # unit mean direction of the calibration rows
    c: np.ndarray  # x_calib . u_hat
    eligible: np.ndarray  # calibration rows with a clearly positive mean component
    basis: np.ndarray
    v_r: np.ndarray  # predictor subspace (r, hidden)


def layer_inputs(xf: np.ndarray, n_calib: int, basis: np.ndarray, v_r: np.ndarray) -> LayerInputs:
    mu = xf[:n_calib].mean(axis=0)
    u_hat = (mu / np.linalg.norm(mu)).astype(np.float32)
    c = xf[:n_calib] @ u_hat
    eligible = c > 0.05 * float(np.mean(np.abs(c)))
    return LayerInputs(xf, n_calib, u_hat, c, eligible, basis, v_r)


@dataclass
class FfnBlock:
    gate_q: np.ndarray  # quantized rows (n_ff, row_bytes)
    up_q: np.ndarray
    down: np.ndarray  # float (hidden, n_ff), pre-quantization, scaled
    down_q: np.ndarray  # quantized rows (hidden, row_bytes(n_ff)): the GGUF's and the dense copy's
    down_cols_q: np.ndarray  # down columns quantized along hidden (n_ff, row_bytes(hidden)): the bundles'
    order: np.ndarray  # hottest first (calibration frequencies)
    fc1: np.ndarray  # (2r, hidden) f16-exact float32
    fc2: np.ndarray  # (n_ff, 2r) in ORIGINAL neuron order
    threshold: float  # sigmoid threshold tau
    calib_freq: np.ndarray
    rows: np.ndarray  # the rows of x_all this block ran on (the routed ones; all for a dense FFN)
    act: np.ndarray  # their hidden activations under the QUANTIZED gate/up
    stats: dict = field(default_factory=dict)
    out: np.ndarray | None = None  # (len(rows), hidden): this block's weighted output


def build_ffn_block(
    rng: np.random.Generator,
    li: LayerInputs,
    rows: np.ndarray,
    n_ff: int,
    density: float,
    activation: str,
    quant: str,
    ws=None,
) -> FfnBlock:
    """Gate/up rows calibrated so P(neuron active) follows a skewed profile on the calibration rows;
    down rows writing into span(basis) (unscaled: build_and_measure scales them); the predictor; and
    the quantized activations of `rows` (the rows routed to this block).

    Calibration (the gate/up biases, the hot order, the predictor's error scale and threshold) uses the
    float weights: x . (r + t u) = x . r + t (x . u), so the calibration matmuls are done once, before t
    is known. Everything measured afterwards uses the quantized weights as written."""
    x_calib = li.x_all[: li.n_calib]
    n, hidden = x_calib.shape
    c, eligible, u_hat = li.c, li.eligible, li.u_hat
    c_safe = np.where(eligible, c, 1.0)[:, None]

    p = frequency_targets(rng, n_ff, density)
    std = 1.0 / math.sqrt(hidden)
    r_gate = _uniform_rows(rng, (n_ff, hidden), std, _workspace(ws, "gate", (n_ff, hidden)))
    r_up = _uniform_rows(rng, (n_ff, hidden), std, _workspace(ws, "up", (n_ff, hidden)))

    up_pos = np.broadcast_to(eligible[:, None], (n, n_ff))
    up_rows = r_up
    up_pre = None
    if activation == "drelu":
        s_up = x_calib @ r_up.T
        z_up = -s_up / c_safe
        z_up[~eligible] = np.inf
        t_up = _column_quantile_shift(z_up, np.full(n_ff, int(round(UP_POSITIVE * eligible.sum()))))
        del z_up
        up_rows = _add_outer(r_up, t_up, u_hat)
        up_pre = s_up + c[:, None] * t_up[None, :]
        up_pos = (up_pre > 0) & eligible[:, None]
        del s_up
    s_gate = x_calib @ r_gate.T
    z = -s_gate / c_safe
    z[~up_pos] = np.inf
    t_gate = _column_quantile_shift(z, np.round(p * n).astype(np.int64))
    del z, up_pos
    gate_rows = _add_outer(r_gate, t_gate, u_hat)
    g_cal = s_gate + c[:, None] * t_gate[None, :]  # float gate pre-activations of the calibration rows
    del r_gate, r_up, s_gate
    active_cal = g_cal > 0
    if up_pre is not None:
        active_cal &= up_pre > 0
    del up_pre
    calib_freq = active_cal.mean(axis=0)
    order = np.argsort(-calib_freq, kind="stable").astype(np.int32)

    # down: columns write into a random kd-dimensional subspace of span(basis) (90% of the energy) plus
    # isotropic (10%). kd <= 128 keeps this matmul small at full size; the residual stream's structure
    # (what the predictors exploit) comes from the basis, not from kd
    basis = li.basis
    k = basis.shape[0]
    kd = min(k, 128)
    dirs = (rng.standard_normal((kd, k), dtype=np.float32) @ basis) / np.float32(math.sqrt(k))
    down = np.matmul(dirs.T, rng.standard_normal((kd, n_ff), dtype=np.float32),
                     out=_workspace(ws, "down", (hidden, n_ff)))  # fmt: skip
    down *= np.float32(math.sqrt(0.9 * hidden / kd))
    _add_uniform_rows(rng, down, math.sqrt(0.1))
    down /= np.float32(math.sqrt(n_ff))

    gate_q = synth_quant.encode(gate_rows, quant)
    up_q = synth_quant.encode(up_rows, quant)
    del up_rows

    # predictor: low-rank projection of the gate pre-activation, in units of its residual std. V_r came
    # from the first PREDICTOR_FIT of the calibration rows; the residual std and the threshold are set
    # on the rest, which V_r never saw (setting them on the fit rows overstates recall on new tokens)
    v_r = li.v_r
    n_fit = predictor_fit_rows(li.n_calib)
    x_thr, g_thr, active_thr = x_calib[n_fit:], g_cal[n_fit:], active_cal[n_fit:]
    gp = gate_rows @ v_r.T  # (n_ff, r)
    del gate_rows
    g_hat = (x_thr @ v_r.T) @ gp.T
    err = np.maximum((g_thr - g_hat).std(axis=0), 1e-3).astype(np.float32)
    del g_hat, g_cal, active_cal
    fc1 = np.concatenate([v_r, -v_r]).astype(np.float16).astype(np.float32)
    fc2 = (
        np.concatenate([gp / err[:, None], -gp / err[:, None]], axis=1).astype(np.float16).astype(np.float32)
    )
    score = np.maximum(x_thr @ fc1.T, 0) @ fc2.T
    active_scores = score[active_thr]
    s_thr = float(np.quantile(active_scores, 1.0 - TARGET_RECALL)) if active_scores.size else 0.0
    threshold = float(1.0 / (1.0 + math.exp(-s_thr)))

    # the quantized weights as written, on the routed rows only; dequantized into the buffers the
    # float rows no longer need. (Not slice by slice: BLAS may round a slice's products differently.)
    xr = li.x_all[rows]
    g_r = xr @ synth_quant.decode(gate_q, quant, hidden, out=_workspace(ws, "gate", (n_ff, hidden))).T
    up = synth_quant.decode(up_q, quant, hidden, out=_workspace(ws, "up", (n_ff, hidden)))
    act = ffn_activation(g_r, xr @ up.T, activation)
    del up, g_r
    empty = np.zeros(0, np.uint8)
    return FfnBlock(gate_q, up_q, down, empty, empty, order, fc1, fc2, threshold, calib_freq, rows, act)


def build_and_measure(
    rng: np.random.Generator, li: LayerInputs, weight: np.ndarray, n_ff: int, density: float,
    activation: str, quant: str, target_rms: float, ws=None,
) -> FfnBlock:  # fmt: skip
    """One FFN block (an expert) end to end: built, its down scaled so it adds `target_rms` to the
    residual, quantized both ways, measured on its held-out routed rows, and its weighted output."""
    rows = np.flatnonzero(weight > 0)
    block = build_ffn_block(rng, li, rows, n_ff, density, activation, quant, ws)
    w = weight[rows]
    weighted = block.act * w[:, None]
    # scale down so this block adds the target RMS (measured on a few routed calibration rows)
    probe = np.flatnonzero(rows < li.n_calib)[:128]
    if probe.size:
        block.down *= np.float32(_scale_to_rms(weighted[probe] @ block.down.T, target_rms))
    block.down_q = synth_quant.encode(block.down, quant)
    block.down_cols_q = _encode_columns(block.down, quant)
    # the forward into the next layer uses the float down (the next layer's calibration needs only a
    # realistic residual stream); the measured statistics below use the quantized gate/up as written
    block.out = weighted @ block.down.T
    held = rows >= li.n_calib
    block.stats = block_stats(block, li.x_all[rows[held]], block.act[held])
    block.act = np.zeros((0, n_ff), np.float32)
    block.down = np.zeros((0, 0), np.float32)
    return block


def _encode_columns(a: np.ndarray, quant: str, cols: int = 512) -> np.ndarray:
    """encode(a.T): the columns quantized as rows, a slice of columns at a time (rows are quantized
    independently, so the bytes are the same without the full transposed copy)."""
    first = synth_quant.encode(_transpose(a[:, :cols]), quant)
    out = np.empty((a.shape[1], first.shape[1]), np.uint8)
    out[: first.shape[0]] = first
    for j in range(cols, a.shape[1], cols):
        synth_quant.encode(_transpose(a[:, j : j + cols]), quant, out=out[j : j + cols])
    return out


def top_right_singular_vectors(x: np.ndarray, r: int) -> np.ndarray:
    """(r, cols): the top-r right singular vectors of x (rows << cols), via the small Gram matrix."""
    gram = (x @ x.T).astype(np.float64)
    w, v = np.linalg.eigh(gram)
    idx = np.argsort(w)[::-1][:r]
    vecs = (v[:, idx].T @ x.astype(np.float64)) / np.sqrt(np.maximum(w[idx], 1e-12))[:, None]
    return np.ascontiguousarray(vecs, dtype=np.float32)


PREDICTOR_FIT = 2 / 3


def predictor_fit_rows(n_calib: int) -> int:
    """Calibration rows the predictor's subspace is fitted on; the rest set its threshold."""
    return max(1, int(n_calib * PREDICTOR_FIT))


def predict_active(fc1: np.ndarray, fc2: np.ndarray, threshold: float, x: np.ndarray) -> np.ndarray:
    score = np.maximum(x @ fc1.T, 0) @ fc2.T
    s_thr = math.log(threshold / (1.0 - threshold))
    return score > s_thr


def block_stats(block: FfnBlock, x_eval: np.ndarray, act_eval: np.ndarray) -> dict:
    """Measured on held-out states (x_eval) with the quantized weights (act_eval: their activations)."""
    if x_eval.shape[0] == 0:
        return {"tokens": 0, "sparsity": float("nan"), "hot_coverage": float("nan"), "recall": float("nan"),
                "precision": float("nan"), "predicted_fraction": float("nan")}  # fmt: skip
    active = act_eval != 0
    pred = predict_active(block.fc1, block.fc2, block.threshold, x_eval)
    n_ff = active.shape[1]
    hot = block.order[: max(1, int(round(HOT_FRACTION * n_ff)))]
    total = int(active.sum())
    tp = int((pred & active).sum())
    return {
        "tokens": int(x_eval.shape[0]),
        "sparsity": float(1.0 - active.mean()),
        "hot_coverage": float(active[:, hot].sum() / total) if total else float("nan"),
        "recall": float(tp / total) if total else float("nan"),
        "precision": float(tp / pred.sum()) if pred.sum() else float("nan"),
        "predicted_fraction": float(pred.mean()),
    }


def _scale_to_rms(out: np.ndarray, target: float) -> float:
    rms = float(np.sqrt(np.mean(out.astype(np.float64) ** 2)))
    return target / rms if rms > 0 else 1.0


class Sinks:
    """Where the tensors go: the .pi2 writer and the GGUF twin, fed in generation order."""

    def __init__(self, pi2_writer, twin: gguf_twin.GgufTwinWriter, quant: str):
        self.pi2 = pi2_writer
        self.twin = twin
        self.quant = quant
        self.thresholds: list[float] = []  # this layer's predictor thresholds, one per expert

    def resident(self, name: str, raw: np.ndarray, shape_np: tuple[int, ...], quant: str) -> None:
        self.twin.write(name, raw)
        if self.pi2 is not None:
            self.pi2.add_tensor(name, np.ascontiguousarray(raw).view(np.uint8).reshape(-1), quant.upper(),
                                shape=tuple(reversed(shape_np)))  # fmt: skip

    def twin_part(self, name: str, raw: np.ndarray, index: int, count: int) -> None:
        self.twin.write_part(name, raw, index, count)


def _declare_twin(twin: gguf_twin.GgufTwinWriter, spec: ModelSpec, quant: str) -> None:
    h, hd = spec.hidden, spec.head_dim
    twin.declare("token_embd.weight", (spec.vocab, h), quant)
    for layer in range(spec.n_layer):
        p = f"blk.{layer}."
        twin.declare(p + "attn_norm.weight", (h,), "f32")
        twin.declare(p + "attn_q.weight", (spec.n_head * hd, h), quant)
        twin.declare(p + "attn_k.weight", (spec.n_kv_head * hd, h), quant)
        twin.declare(p + "attn_v.weight", (spec.n_kv_head * hd, h), quant)
        twin.declare(p + "attn_output.weight", (h, spec.n_head * hd), quant)
        twin.declare(p + "ffn_norm.weight", (h,), "f32")
        if spec.is_moe:
            e = spec.n_expert
            twin.declare(p + "ffn_gate_inp.weight", (e, h), "f32")
            twin.declare(p + "ffn_gate_exps.weight", (e, spec.ffn, h), quant)
            twin.declare(p + "ffn_up_exps.weight", (e, spec.ffn, h), quant)
            twin.declare(p + "ffn_down_exps.weight", (e, h, spec.ffn), quant)
        else:
            twin.declare(p + "ffn_gate.weight", (spec.ffn, h), quant)
            twin.declare(p + "ffn_up.weight", (spec.ffn, h), quant)
            twin.declare(p + "ffn_down.weight", (h, spec.ffn), quant)
    twin.declare("output_norm.weight", (h,), "f32")
    twin.declare("output.weight", (spec.vocab, h), quant)


def _twin_kv(spec: ModelSpec, cfg: SynthConfig, tok_fields) -> list:
    t = gguf.GGUFValueType
    pre = "llama."
    kv = [
        ("general.type", "model", t.STRING, None),
        ("general.name", f"{spec.name} (SYNTHETIC, seed {cfg.seed})", t.STRING, None),
        ("general.description", "Synthetic model made by `pi2 models synth`: random weights with designed "
         "sparse-activation statistics. Not a language model. llama.cpp runs its FFN as SwiGLU; the "
         f"matching .pi2 runs it as {spec.activation}.", t.STRING, None),
        ("general.file_type", gguf_twin.FILE_TYPES[cfg.quant], t.UINT32, None),
        ("general.quantization_version", 2, t.UINT32, None),
        (pre + "block_count", spec.n_layer, t.UINT32, None),
        (pre + "context_length", spec.context, t.UINT32, None),
        (pre + "embedding_length", spec.hidden, t.UINT32, None),
        (pre + "feed_forward_length", spec.ffn, t.UINT32, None),
        (pre + "attention.head_count", spec.n_head, t.UINT32, None),
        (pre + "attention.head_count_kv", spec.n_kv_head, t.UINT32, None),
        (pre + "rope.freq_base", float(spec.rope_theta), t.FLOAT32, None),
        (pre + "rope.dimension_count", spec.head_dim, t.UINT32, None),
        (pre + "attention.layer_norm_rms_epsilon", float(spec.norm_eps), t.FLOAT32, None),
        (pre + "vocab_size", spec.vocab, t.UINT32, None),
        ("pi2.synthetic", True, t.BOOL, None),
        ("pi2.synthetic_like", cfg.like, t.STRING, None),
        ("pi2.seed", cfg.seed, t.UINT64, None),
        ("pi2.ffn_activation", spec.activation, t.STRING, None),
    ]  # fmt: skip
    if spec.is_moe:
        kv += [(pre + "expert_count", spec.n_expert, t.UINT32, None),
               (pre + "expert_used_count", spec.n_expert_used, t.UINT32, None)]  # fmt: skip
    return kv + list(tok_fields)


def _tokenizer_blob(fields: list) -> tuple[bytes, str]:
    """The .pi2 vocab blob (pi2cli.models.tokenizer_blob) from the cached GGUF tokenizer fields."""
    try:
        from pi2cli.models.tokenizer_blob import vocab_blob_from_fields
    except ImportError:
        return b"", "none: pi2cli.models.tokenizer_blob was not available when this file was made"
    kv = {k: v for k, v, _, _ in fields}

    def opt(key, cast):
        return None if kv.get(key) is None else cast(kv[key])

    blob = vocab_blob_from_fields(
        model=kv.get("tokenizer.ggml.model", ""),
        tokens=kv["tokenizer.ggml.tokens"],
        scores=kv.get("tokenizer.ggml.scores"),
        token_types=kv.get("tokenizer.ggml.token_type"),
        merges=kv.get("tokenizer.ggml.merges") or [],
        pre=kv.get("tokenizer.ggml.pre") or "",
        bos_id=opt("tokenizer.ggml.bos_token_id", int),
        eos_id=opt("tokenizer.ggml.eos_token_id", int),
        unk_id=opt("tokenizer.ggml.unknown_token_id", int),
        pad_id=opt("tokenizer.ggml.padding_token_id", int),
        add_bos=opt("tokenizer.ggml.add_bos_token", bool),
        add_space_prefix=opt("tokenizer.ggml.add_space_prefix", bool),
    )
    return blob, "copied from the tokenizer GGUF"


def planned_sizes(
    cfg: SynthConfig, spec: ModelSpec, rank: int, tok_fields: list | None = None
) -> dict[str, int]:
    """Bytes each output file will have, from the writers' own layouts: tensor data exactly; the GGUF
    header exactly when the tokenizer fields are given (else ~4 MB), the .pi2's tokenizer and metadata
    approximately (2 MB)."""
    from pi2cli.models.pi2file import PAGE, round_up

    if cfg.dense_down is None:
        cfg = replace(cfg, dense_down=not spec.is_moe)
    header = _pi2_header(cfg, spec)
    h, hd, quant = spec.hidden, spec.head_dim, cfg.quant
    rb = gguf_twin.row_bytes
    n_blocks = spec.n_expert if spec.is_moe else 1
    resident = [spec.vocab * rb(quant, h), spec.vocab * rb(quant, h), 4 * h]
    per_layer = [4 * h, spec.n_head * hd * rb(quant, h), 2 * spec.n_kv_head * hd * rb(quant, h),
                 h * rb(quant, spec.n_head * hd), 4 * h]  # fmt: skip
    if spec.is_moe:
        per_layer.append(4 * spec.n_expert * h)
    per_block = [4 * spec.ffn, 2 * (2 * rank) * h, 2 * spec.ffn * 2 * rank]  # order, fc1, fc2 (F16)
    if cfg.dense_down:
        per_block.append(h * rb(quant, spec.ffn))
    tensors = resident + spec.n_layer * (per_layer + n_blocks * per_block + [4 * n_blocks])
    pi2 = 4096 + header.neuron_region_bytes + sum(round_up(t, PAGE) for t in tensors)
    pi2 += 2 * 1024 * 1024  # tensor table, tokenizer blob (~1 MB for 49152 tokens), metadata
    header_bytes = 4 * 1024 * 1024  # ~4 MB of tokenizer strings and merges
    if tok_fields is not None:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            probe = gguf_twin.GgufTwinWriter(Path(tmp) / "probe.gguf", _twin_kv(spec, cfg, tok_fields))
            _declare_twin(probe, spec, quant)
            header_bytes = probe._write_header(Path(tmp) / "header.gguf", probe=True)
    twin = gguf_twin.GgufTwinWriter(Path("unused.gguf"), [])
    _declare_twin(twin, spec, quant)
    gguf_bytes = twin.planned_bytes(header_bytes)
    return {"model.pi2": int(pi2), "model.gguf": int(gguf_bytes)}


def _pi2_header(cfg: SynthConfig, spec: ModelSpec):
    from pi2cli.models.pi2file import Pi2Header, default_bundle_align

    quant = cfg.quant
    part = gguf_twin.row_bytes(quant, spec.hidden)
    # Bundles are read one by one from flash, so padding is read too: at full size a Q4_0 bundle
    # (3 x 2304 = 6912 bytes) padded to 8 KiB wastes 16% of the file and of every read. 512 bytes is
    # the O_DIRECT unit the engine needs; PAGE alignment stays for shapes where it costs < 5%.
    align = default_bundle_align(part)
    if align > 512 and (-(3 * part) % align) > 0.05 * 3 * part:
        align = 512
    return Pi2Header(
        arch="moe" if spec.is_moe else "llama", ffn_act=spec.activation, n_vocab=spec.vocab,
        n_embd=spec.hidden, n_layer=spec.n_layer, n_head=spec.n_head, n_head_kv=spec.n_kv_head,
        n_ff=spec.ffn, neuron_type=quant.upper(), n_expert=spec.n_expert,
        n_expert_used=spec.n_expert_used, n_ctx_train=spec.context, rope_theta=spec.rope_theta,
        rms_eps=spec.norm_eps, dense_down=cfg.dense_down, has_predictor=True, bundle_align=align,
    )  # fmt: skip


def resolve(cfg: SynthConfig) -> tuple[ModelSpec, list, float, int]:
    """(spec with the tokenizer's vocabulary, tokenizer fields, sparsity, predictor rank), checked."""
    if cfg.quant not in ("q4_0", "q4_1", "q8_0", "f16"):
        raise Pi2Error(f"--quant {cfg.quant}: choose q4_0, q4_1, q8_0 or f16")
    if cfg.tokenizer_gguf is None:
        from pi2cli.models.testmodels import smollm2_gguf

        cfg.tokenizer_gguf = smollm2_gguf()
    tok_fields, vocab = gguf_twin.load_tokenizer(cfg.tokenizer_gguf)
    spec = synth_spec(cfg, vocab)
    if cfg.dense_down is None:
        cfg.dense_down = not spec.is_moe
    sparsity = cfg.sparsity if cfg.sparsity is not None else (get_model(cfg.like).published_sparsity or 0.9)
    if not 0.0 < sparsity < 1.0:
        raise Pi2Error(f"--sparsity must be between 0 and 1, got {sparsity}")
    rank = cfg.predictor_rank or default_predictor_rank(spec)
    n_calib = cfg.calib_seqs * cfg.seq_len
    if rank > min(spec.hidden, predictor_fit_rows(n_calib)):
        raise Pi2Error(
            f"predictor rank {rank} must be <= hidden {spec.hidden} and 2/3 of the calibration tokens "
            f"({predictor_fit_rows(n_calib)}): lower --predictor-rank or raise --calib-seqs"
        )
    return spec, tok_fields, sparsity, rank


def default_predictor_rank(spec: ModelSpec) -> int:
    """hidden/16 (>= 16) for a dense FFN; for MoE, hidden/32 per expert: every expert's predictor is
    resident (the fixed region) while only the routed ones run, so at the 47B shape hidden/16 would be
    4.8 GB of predictors, more than half of a 7 GB budget (docs/MODELS.md, "What the 47B .pi2 holds")."""
    return max(16, spec.hidden // (32 if spec.is_moe else 16))


def synthesize(
    cfg: SynthConfig,
    out_dir: Path,
    progress: Callable[[str, int, int], None] | None = None,
    write_pi2: bool = True,
    workers: int | None = None,
) -> dict:
    """Generate DIR/model.pi2 and DIR/model.gguf. Returns the summary (also stored as metadata).

    Resumes from DIR/.synth-state.json (plain data, checked against this run) when an earlier run of the same options was interrupted
    (pi2cli.models.synth_resume). `workers`: FFN blocks (experts) built at once, each with one BLAS
    thread [default: the CPU count, for MoE; dense layers use all BLAS threads on their one block]."""
    spec, tok_fields, sparsity, rank = resolve(cfg)
    h, f, quant, vocab = spec.hidden, spec.ffn, cfg.quant, spec.vocab
    n_calib, n_eval = cfg.calib_seqs * cfg.seq_len, cfg.eval_seqs * cfg.seq_len

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pi2_path, gguf_path = out_dir / "model.pi2", out_dir / "model.gguf"
    tok_blob, tok_note = _tokenizer_blob(tok_fields)
    started = time.monotonic()
    cfg_fields = {k: v for k, v in asdict(cfg).items() if k != "tokenizer_gguf"}
    cfg_fields["tokenizer"] = Path(cfg.tokenizer_gguf).name
    fp = synth_resume.fingerprint({**cfg_fields, "pi2": write_pi2}, asdict(spec))
    state = synth_resume.load(out_dir, fp, spec.n_layer, (n_calib + n_eval, h))

    twin = gguf_twin.GgufTwinWriter(gguf_path, _twin_kv(spec, cfg, tok_fields))
    _declare_twin(twin, spec, quant)
    writer = None
    if write_pi2:
        writer = synth_resume.ResumablePi2Writer(
            pi2_path, _pi2_header(cfg, spec), tokenizer_blob=tok_blob, metadata={"synthetic": True},
            resume_state=state["pi2"] if state else None,
        )  # fmt: skip
    if state:
        twin.start(resume=True)
        twin.next = state["twin_next"]
    sinks = Sinks(writer, twin, quant)
    n_blocks = spec.n_expert if spec.is_moe else 1
    total_steps = spec.n_layer * n_blocks + 2

    def step(what: str, done: int) -> None:
        if progress:
            progress(what, done, total_steps)

    def checkpoint(layer_done: int, x, per_layer) -> None:
        twin.sync()
        synth_resume.save(out_dir, {
            "fingerprint": fp, "layer_done": layer_done, "x": x, "per_layer": per_layer,
            "pi2": writer.snapshot() if writer is not None else None, "twin_next": twin.next,
        })  # fmt: skip

    try:
        summary = _generate(cfg, spec, sparsity, rank, n_calib, n_eval, sinks, step, state, checkpoint,
                            workers)  # fmt: skip
        summary.update(
            synthetic=True, generator="pi2 models synth", like=cfg.like, seed=cfg.seed, quant=quant,
            gguf_twin=gguf_path.name, tokenizer=f"{Path(cfg.tokenizer_gguf).name} ({tok_note})",
            planned_bytes=planned_sizes(cfg, spec, rank, tok_fields),
            seconds=round(time.monotonic() - started, 1), resumed_from_layer=state["layer_done"] if state else None,
            dims={"n_layer": spec.n_layer, "hidden": h, "ffn": f, "n_head": spec.n_head,
                  "n_kv_head": spec.n_kv_head, "vocab": vocab, "n_expert": spec.n_expert,
                  "n_expert_used": spec.n_expert_used, "activation": spec.activation},
            twin_note="model.gguf holds the same quantized weights as arch llama; llama.cpp computes its "
            "FFN as SwiGLU (it has no dReLU), so it is the dense baseline: same bytes read per token, "
            "different nonlinearity.",
        )  # fmt: skip
        if writer is not None:
            # the file stays a pure function of its inputs: no timings in it
            writer.metadata.update(
                {k: v for k, v in summary.items() if k not in ("seconds", "resumed_from_layer")}
            )
            writer.close()
        twin.close()
        synth_resume.clear(out_dir)
    except (KeyboardInterrupt, SystemExit):
        # interrupted: keep the temp files and the last checkpoint; the same command resumes
        twin.detach()
        if writer is not None:
            writer.detach()
        raise
    except BaseException:
        twin.abort()
        synth_resume.clear(out_dir)
        if writer is not None:
            if writer.closed:
                pi2_path.unlink(missing_ok=True)  # the twin failed after the .pi2 was renamed
            else:
                writer.abort()
        raise
    summary["bytes_written"] = {p.name: p.stat().st_size for p in (pi2_path, gguf_path) if p.exists()}
    return summary


def _generate(
    cfg, spec, sparsity, rank, n_calib, n_eval, sinks: Sinks, step, state, checkpoint, workers
) -> dict:
    h, quant, seed = spec.hidden, cfg.quant, cfg.seed
    k = max(8, h // 4)
    basis_rng = _rng(seed, _BASIS)
    basis = basis_rng.standard_normal((k, h), dtype=np.float32) / np.float32(math.sqrt(h))
    basis_var = np.arange(1, k + 1, dtype=np.float64) ** -1.2
    basis_var = (basis_var / basis_var.sum()).astype(np.float32)
    u = basis_rng.standard_normal(h).astype(np.float32)
    u /= np.linalg.norm(u)

    # tokens: Zipf-like unigram over a random permutation of the vocabulary
    trng = _rng(seed, _TOKENS)
    ranks = trng.permutation(spec.vocab)
    probs = 1.0 / (np.arange(spec.vocab) + 10.0) ** 1.1
    probs /= probs.sum()
    n_all = n_calib + n_eval
    tokens = ranks[trng.choice(spec.vocab, size=n_all, p=probs)]
    n_blocks = spec.n_expert if spec.is_moe else 1

    if state:
        first, x, per_layer = state["layer_done"], state["x"], state["per_layer"]
        step(f"resumed after layer {first}", 1 + first * n_blocks)
    else:
        # embeddings, generated and quantized in chunks; the forward needs only the sampled rows
        a_mean, a_lat, a_iso = (math.sqrt(s * h) for s in STREAM_SHARES)
        erng = _rng(seed, _EMBED)
        chunks, rows = [], 4096
        for start in range(0, spec.vocab, rows):
            n = min(rows, spec.vocab - start)
            z = erng.standard_normal((n, k), dtype=np.float32) * np.sqrt(basis_var)[None, :]
            emb = np.float32(a_mean) * u[None, :] + np.float32(a_lat) * (z @ basis)
            emb += _uniform_rows(erng, (n, h), a_iso / math.sqrt(h))
            chunks.append(synth_quant.encode(emb, quant))
        embd_q = np.concatenate(chunks)
        del chunks
        sinks.resident("token_embd.weight", embd_q, (spec.vocab, h), quant)
        x = synth_quant.decode(embd_q[tokens], quant, h)
        del embd_q
        first, per_layer = 0, []
        step("embeddings", 1)

    ones = np.ones(h, dtype=np.float32)
    raw_ones = synth_quant.encode(ones[None, :], "f32")
    calib = slice(0, n_calib)
    lrng = _rng(seed, 7)
    densities = [float(lrng.uniform(-1, 1)) for _ in range(spec.n_layer)]  # drawn up front: resumable
    if workers is None:
        workers = (os.cpu_count() or 1) if spec.is_moe else 1
    pool = ThreadPoolExecutor(max_workers=workers) if workers > 1 else None
    ws = threading.local()  # each thread's reused expert-sized buffers, freed with this run
    try:
        for layer in range(first, spec.n_layer):
            base = 1 + layer * n_blocks
            x = _layer(cfg, spec, layer, x, basis, k, rank, n_calib, sparsity, densities[layer], raw_ones,
                       sinks, per_layer, pool, ws, lambda what, done, base=base: step(what, base + done))  # fmt: skip
            checkpoint(layer + 1, x, per_layer)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    sinks.resident("output_norm.weight", raw_ones, (h,), "f32")
    orng = _rng(seed, _OUTPUT)
    out_chunks = []
    for start in range(0, spec.vocab, 4096):
        n = min(4096, spec.vocab - start)
        out_chunks.append(synth_quant.encode(_uniform_rows(orng, (n, h), 1.0 / math.sqrt(h)), quant))
    sinks.resident("output.weight", np.concatenate(out_chunks), (spec.vocab, h), quant)
    step("output", spec.n_layer * n_blocks + 2)
    del calib
    return _model_summary(per_layer, sparsity, rank, spec, quant)


def _layer(cfg, spec, layer, x, basis, k, rank, n_calib, sparsity, jitter, raw_ones, sinks, per_layer, pool,
           ws, step) -> np.ndarray:  # fmt: skip
    """One transformer layer: attention written and applied, then every FFN block (expert) built,
    measured and written. Returns the residual stream after the layer."""
    h, f, quant, seed = spec.hidden, spec.ffn, cfg.quant, cfg.seed
    calib = slice(0, n_calib)
    rng = _rng(seed, _LAYER + layer)
    p = f"blk.{layer}."
    # attention
    sinks.resident(p + "attn_norm.weight", raw_ones, (h,), "f32")
    xn = rms_norm(x, spec.norm_eps)
    hd = spec.head_dim
    mats = {}
    for name, rows_n in (
        ("attn_q", spec.n_head * hd),
        ("attn_k", spec.n_kv_head * hd),
        ("attn_v", spec.n_kv_head * hd),
    ):
        mats[name] = synth_quant.encode(_uniform_rows(rng, (rows_n, h), 1.0 / math.sqrt(h)), quant)
    wq, wk, wv = (synth_quant.decode(mats[n], quant, h) for n in ("attn_q", "attn_k", "attn_v"))
    att = attention(xn, wq, wk, wv, spec.n_head, spec.n_kv_head, cfg.seq_len, spec.rope_theta)
    wo = (basis.T @ rng.standard_normal((k, spec.n_head * hd), dtype=np.float32)) * np.float32(
        math.sqrt(0.9 * h / k)
    )
    wo += _uniform_rows(rng, wo.shape, math.sqrt(0.1))
    wo *= np.float32(_scale_to_rms(att[calib] @ wo.T, LAYER_WRITE_RMS))
    mats["attn_output"] = synth_quant.encode(wo, quant)
    for name in ("attn_q", "attn_k", "attn_v"):
        sinks.resident(p + name + ".weight", mats[name], (mats[name].shape[0], h), quant)
    sinks.resident(p + "attn_output.weight", mats["attn_output"], (h, spec.n_head * hd), quant)
    x = x + att @ synth_quant.decode(mats["attn_output"], quant, spec.n_head * hd).T
    del att, mats, wq, wk, wv, wo

    # FFN
    sinks.resident(p + "ffn_norm.weight", raw_ones, (h,), "f32")
    xf = rms_norm(x, spec.norm_eps)
    v_r = top_right_singular_vectors(xf[: predictor_fit_rows(n_calib)], rank)
    density = float(np.clip((1 - sparsity) * (1 + 0.1 * jitter), 1e-4, 0.79))
    n_blocks = spec.n_expert if spec.is_moe else 1
    n_all = x.shape[0]
    if spec.is_moe:
        router = rng.standard_normal((spec.n_expert, h), dtype=np.float32) * np.float32(4.0 / math.sqrt(h))
        logits = xf @ router.T
        top = np.argsort(-logits, axis=1)[:, : spec.n_expert_used]
        sel = np.take_along_axis(logits, top, axis=1)
        wts = np.exp(sel - sel.max(axis=1, keepdims=True))
        wts /= wts.sum(axis=1, keepdims=True)
        sinks.resident(p + "ffn_gate_inp.weight", gguf_twin.encode(router, "f32"), (spec.n_expert, h), "f32")
        weights = [np.where(top == e, wts, 0.0).sum(axis=1).astype(np.float32) for e in range(n_blocks)]
    else:
        weights = [np.ones(n_all, dtype=np.float32)]
    li = layer_inputs(xf, n_calib, basis, v_r)
    target = LAYER_WRITE_RMS / math.sqrt(max(spec.n_expert_used, 1))

    def job(e: int) -> FfnBlock:
        # every block has its own random stream, so blocks can be built in any order or at once
        brng = _rng(seed, _LAYER + layer, 1 + e)
        return build_and_measure(brng, li, weights[e], f, density, spec.activation, quant, target, ws)

    if pool is not None:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(1):  # the pool's threads each run one BLAS thread
            ffn_out, stats_e = _emit_all(pool.map(job, range(n_blocks)), sinks, spec, layer, x, step)
    else:
        ffn_out, stats_e = _emit_all(map(job, range(n_blocks)), sinks, spec, layer, x, step)
    per_layer.append(_layer_summary(layer, 1 - density, stats_e, spec.is_moe))
    return x + ffn_out


def _emit_all(blocks, sinks: Sinks, spec: ModelSpec, layer: int, x: np.ndarray, step):
    """Write each block as it comes (in expert order) and sum their outputs into the residual.
    Returns (ffn_out, per-block stats)."""
    ffn_out = np.zeros_like(x)
    stats_e = []
    p = f"blk.{layer}."
    n_blocks = spec.n_expert if spec.is_moe else 1
    for e, block in enumerate(blocks):
        ffn_out[block.rows] += block.out
        st = dict(block.stats)
        st["expert"] = e
        stats_e.append(st)
        _emit_ffn(sinks, spec, layer, e, block)
        if spec.is_moe:
            for name, raw in (("ffn_gate_exps", block.gate_q), ("ffn_up_exps", block.up_q),
                              ("ffn_down_exps", block.down_q)):  # fmt: skip
                sinks.twin_part(p + name + ".weight", raw, e, n_blocks)
        else:
            for name, raw in (("ffn_gate", block.gate_q), ("ffn_up", block.up_q), ("ffn_down", block.down_q)):
                sinks.twin.write(p + name + ".weight", raw)
        del block
        step(
            f"layer {layer + 1}/{spec.n_layer}" + (f" expert {e + 1}/{n_blocks}" if spec.is_moe else ""),
            e + 1,
        )
    return ffn_out, stats_e


def _emit_ffn(sinks: Sinks, spec: ModelSpec, layer: int, expert: int, block: FfnBlock) -> None:
    if sinks.pi2 is None:
        return
    e = expert if spec.is_moe else None
    sfx = f".{expert}" if spec.is_moe else ""
    q = sinks.quant.upper()
    sinks.pi2.add_ffn(layer, block.gate_q, block.up_q, None, expert=e, order=block.order,
                      down_raw=block.down_q, down_raw_type=q, down_cols=block.down_cols_q)  # fmt: skip
    sinks.pi2.add_tensor(f"blk.{layer}.pred_fc1{sfx}", block.fc1, "F16")
    sinks.pi2.add_tensor(f"blk.{layer}.pred_fc2{sfx}", block.fc2[block.order], "F16")
    sinks.thresholds.append(block.threshold)
    if len(sinks.thresholds) == (spec.n_expert if spec.is_moe else 1):
        sinks.pi2.add_tensor(f"blk.{layer}.pred_threshold", np.asarray(sinks.thresholds, np.float32), "F32")
        sinks.thresholds = []


def _nanmean(values) -> float:
    arr = np.asarray([v for v in values if v == v], dtype=np.float64)
    return float(arr.mean()) if arr.size else float("nan")


def _layer_summary(layer: int, target: float, stats_e: list[dict], moe: bool) -> LayerStats:
    return LayerStats(
        layer=layer,
        target_sparsity=round(target, 4),
        sparsity=_nanmean(s["sparsity"] for s in stats_e),
        hot_coverage=_nanmean(s["hot_coverage"] for s in stats_e),
        recall=_nanmean(s["recall"] for s in stats_e),
        precision=_nanmean(s["precision"] for s in stats_e),
        predicted_fraction=_nanmean(s["predicted_fraction"] for s in stats_e),
        threshold=0.0,
        per_expert=stats_e if moe else [],
    )


def _model_summary(
    per_layer: list[LayerStats], sparsity: float, rank: int, spec: ModelSpec, quant: str
) -> dict:
    def avg(key):
        return round(_nanmean(getattr(s, key) for s in per_layer), 4)

    return {
        "activation_profile": {
            "source": "synthetic design, measured on held-out synthetic token sequences (numpy forward, "
            "quantized weights)",
            "target_sparsity": sparsity,
            "frequency_distribution": f"lognormal(sigma={LOGNORMAL_SIGMA}) per neuron, mean = 1 - sparsity, "
            f"capped at {MAX_NEURON_FREQ}: the top {int(HOT_FRACTION * 100)}% of neurons are designed to "
            "carry ~80% of activations",
            "hot_fraction": HOT_FRACTION,
        },
        "predictor": {
            "kind": "fc2(relu(fc1 x)) low-rank gate projection",
            "rank": 2 * rank,
            "target_recall": TARGET_RECALL,
        },  # fmt: skip
        "measured": {
            "sparsity": avg("sparsity"),
            "hot_coverage": avg("hot_coverage"),
            "recall": avg("recall"),
            "precision": avg("precision"),
            "predicted_fraction": avg("predicted_fraction"),
        },
        "layers": [
            {
                k: (round(v, 4) if isinstance(v, float) else v)
                for k, v in asdict(s).items()
                if k not in ("threshold",)
            }
            for s in per_layer
        ],  # fmt: skip
    }
