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
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import gguf
import numpy as np

from pi2cli.errors import Pi2Error
from pi2cli.models import gguf_twin
from pi2cli.models.numpy_llama import attention, ffn_activation, rms_norm
from pi2cli.models.registry import QUANT_BYTES_PER_ELEMENT, ModelSpec, get_model, validate_dims

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
    dense_down: bool = True
    tokenizer_gguf: Path | None = None  # default: SmolLM2's GGUF (its real byte-level BPE vocab)


@dataclass
class LayerStats:
    layer: int
    target_sparsity: float
    sparsity: float
    hot_coverage: float
    recall: float
    precision: float
    predicted_fraction: float
    threshold: float
    per_expert: list[dict] = field(default_factory=list)


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


@dataclass
class FfnBlock:
    gate_q: np.ndarray  # quantized rows (n_ff, row_bytes)
    up_q: np.ndarray
    down: np.ndarray  # float (hidden, n_ff), pre-quantization
    down_q: np.ndarray  # quantized rows (hidden, row_bytes(n_ff))
    gate: np.ndarray  # dequantized, for the forward
    up: np.ndarray
    down_deq: np.ndarray
    order: np.ndarray  # hottest first (calibration frequencies)
    fc1: np.ndarray  # (2r, hidden) f16-exact float32
    fc2: np.ndarray  # (n_ff, 2r) in ORIGINAL neuron order
    threshold: float  # sigmoid threshold tau
    calib_freq: np.ndarray
    act: np.ndarray | None = None  # hidden activations of every forward row


def build_ffn_block(
    rng: np.random.Generator,
    x_all: np.ndarray,
    n_calib: int,
    basis: np.ndarray,
    v_r: np.ndarray,
    n_ff: int,
    density: float,
    activation: str,
    quant: str,
) -> FfnBlock:
    """Gate/up rows calibrated so P(neuron active) follows a skewed profile on the first n_calib rows
    of `x_all`; down rows writing into span(basis) (unscaled: the caller scales them); the predictor.
    Also returns the hidden activations of all rows under the quantized gate/up (block.act)."""
    x_calib = x_all[:n_calib]
    n, hidden = x_calib.shape
    mu = x_calib.mean(axis=0)
    u_hat = (mu / np.linalg.norm(mu)).astype(np.float32)
    c = x_calib @ u_hat
    eligible = c > 0.05 * float(np.mean(np.abs(c)))
    c_safe = np.where(eligible, c, 1.0)[:, None]

    p = frequency_targets(rng, n_ff, density)
    r_gate = rng.standard_normal((n_ff, hidden), dtype=np.float32) / np.float32(math.sqrt(hidden))
    r_up = rng.standard_normal((n_ff, hidden), dtype=np.float32) / np.float32(math.sqrt(hidden))

    up_pos = np.broadcast_to(eligible[:, None], (n, n_ff))
    up_rows = r_up
    if activation == "drelu":
        s_up = x_calib @ r_up.T
        z_up = -s_up / c_safe
        z_up[~eligible] = np.inf
        t_up = _column_quantile_shift(z_up, np.full(n_ff, int(round(UP_POSITIVE * eligible.sum()))))
        del z_up
        up_rows = r_up + t_up[:, None] * u_hat[None, :]
        up_pos = (s_up + c[:, None] * t_up[None, :] > 0) & eligible[:, None]
        del s_up
    z = -(x_calib @ r_gate.T) / c_safe
    z[~up_pos] = np.inf
    t_gate = _column_quantile_shift(z, np.round(p * n).astype(np.int64))
    del z, up_pos
    gate_rows = r_gate + t_gate[:, None] * u_hat[None, :]
    del r_gate, r_up

    # down: columns write into span(basis) (90% of the energy) plus isotropic (10%)
    k = basis.shape[0]
    down = (
        basis.T @ rng.standard_normal((k, n_ff), dtype=np.float32) * np.float32(math.sqrt(0.9 * hidden / k))
    )
    down += rng.standard_normal((hidden, n_ff), dtype=np.float32) * np.float32(math.sqrt(0.1))
    down /= np.float32(math.sqrt(n_ff))

    gate_q = gguf_twin.encode(gate_rows, quant)
    up_q = gguf_twin.encode(up_rows, quant)
    del gate_rows, up_rows
    gate = gguf_twin.decode(gate_q, quant, hidden)
    up = gguf_twin.decode(up_q, quant, hidden)

    # activations of every row with the quantized weights (the forward and the measurements reuse them)
    g_all = x_all @ gate.T
    act = ffn_activation(g_all, x_all @ up.T, activation)
    active = act[:n_calib] != 0
    calib_freq = active.mean(axis=0)
    order = np.argsort(-calib_freq, kind="stable").astype(np.int32)

    # predictor: low-rank projection of the gate pre-activation, in units of its residual std. V_r came
    # from the first PREDICTOR_FIT of the calibration rows; the residual std and the threshold are set
    # on the rest, which V_r never saw (setting them on the fit rows overstates recall on new tokens)
    n_fit = predictor_fit_rows(n_calib)
    x_thr, g_thr, active_thr = x_calib[n_fit:], g_all[n_fit:n_calib], active[n_fit:]
    gp = gate @ v_r.T  # (n_ff, r)
    g_hat = (x_thr @ v_r.T) @ gp.T
    err = np.maximum((g_thr - g_hat).std(axis=0), 1e-3).astype(np.float32)
    del g_hat, g_all
    fc1 = np.concatenate([v_r, -v_r]).astype(np.float16).astype(np.float32)
    fc2 = (
        np.concatenate([gp / err[:, None], -gp / err[:, None]], axis=1).astype(np.float16).astype(np.float32)
    )
    score = np.maximum(x_thr @ fc1.T, 0) @ fc2.T
    active_scores = score[active_thr]
    s_thr = float(np.quantile(active_scores, 1.0 - TARGET_RECALL)) if active_scores.size else 0.0
    threshold = float(1.0 / (1.0 + math.exp(-s_thr)))
    empty = np.zeros(0, np.float32)
    block = FfnBlock(gate_q, up_q, down, empty, gate, up, empty, order, fc1, fc2, threshold, calib_freq)
    block.act = act
    return block


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


def synthesize(
    cfg: SynthConfig,
    out_dir: Path,
    progress: Callable[[str, int, int], None] | None = None,
    write_pi2: bool = True,
) -> dict:
    """Generate DIR/model.pi2 and DIR/model.gguf. Returns the summary (also stored as metadata)."""
    from pi2cli.models.pi2file import Pi2Header, Pi2Writer

    if cfg.quant not in ("q4_0", "q4_1", "q8_0", "f16"):
        raise Pi2Error(f"--quant {cfg.quant}: choose q4_0, q4_1, q8_0 or f16")
    if cfg.tokenizer_gguf is None:
        from pi2cli.models.testmodels import smollm2_gguf

        cfg.tokenizer_gguf = smollm2_gguf()
    tok_fields, vocab = gguf_twin.load_tokenizer(cfg.tokenizer_gguf)
    spec = synth_spec(cfg, vocab)
    sparsity = cfg.sparsity if cfg.sparsity is not None else (get_model(cfg.like).published_sparsity or 0.9)
    if not 0.0 < sparsity < 1.0:
        raise Pi2Error(f"--sparsity must be between 0 and 1, got {sparsity}")
    h, f, quant = spec.hidden, spec.ffn, cfg.quant
    rank = cfg.predictor_rank or max(16, h // 16)
    n_calib, n_eval = cfg.calib_seqs * cfg.seq_len, cfg.eval_seqs * cfg.seq_len
    if rank > min(h, predictor_fit_rows(n_calib)):
        raise Pi2Error(
            f"predictor rank {rank} must be <= hidden {h} and 2/3 of the calibration tokens "
            f"({predictor_fit_rows(n_calib)}): lower --predictor-rank or raise --calib-seqs"
        )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pi2_path, gguf_path = out_dir / "model.pi2", out_dir / "model.gguf"
    tok_blob, tok_note = _tokenizer_blob(tok_fields)
    started = time.monotonic()

    twin = gguf_twin.GgufTwinWriter(gguf_path, _twin_kv(spec, cfg, tok_fields))
    _declare_twin(twin, spec, quant)
    writer = None
    if write_pi2:
        header = Pi2Header(
            arch="moe" if spec.is_moe else "llama", ffn_act=spec.activation, n_vocab=vocab, n_embd=h,
            n_layer=spec.n_layer, n_head=spec.n_head, n_head_kv=spec.n_kv_head, n_ff=f,
            neuron_type=quant.upper(), n_expert=spec.n_expert, n_expert_used=spec.n_expert_used,
            n_ctx_train=spec.context, rope_theta=spec.rope_theta, rms_eps=spec.norm_eps,
            dense_down=cfg.dense_down, has_predictor=True,
        )  # fmt: skip
        writer = Pi2Writer(pi2_path, header, tokenizer_blob=tok_blob, metadata={"synthetic": True})
    sinks = Sinks(writer, twin, quant)
    total_steps = spec.n_layer + 2

    def step(what: str, done: int) -> None:
        if progress:
            progress(what, done, total_steps)

    try:
        summary = _generate(cfg, spec, sparsity, rank, n_calib, n_eval, sinks, step)
        summary.update(
            synthetic=True, generator="pi2 models synth", like=cfg.like, seed=cfg.seed, quant=quant,
            gguf_twin=gguf_path.name, tokenizer=f"{Path(cfg.tokenizer_gguf).name} ({tok_note})",
            seconds=round(time.monotonic() - started, 1),
            dims={"n_layer": spec.n_layer, "hidden": h, "ffn": f, "n_head": spec.n_head,
                  "n_kv_head": spec.n_kv_head, "vocab": vocab, "n_expert": spec.n_expert,
                  "n_expert_used": spec.n_expert_used, "activation": spec.activation},
            twin_note="model.gguf holds the same quantized weights as arch llama; llama.cpp computes its "
            "FFN as SwiGLU (it has no dReLU), so it is the dense baseline: same bytes read per token, "
            "different nonlinearity.",
        )  # fmt: skip
        if writer is not None:
            # the file stays a pure function of its inputs: no timings in it
            writer.metadata.update({k: v for k, v in summary.items() if k != "seconds"})
            writer.close()
        twin.close()
    except BaseException:
        twin.abort()
        if writer is not None:
            if writer.closed:
                pi2_path.unlink(missing_ok=True)  # the twin failed after the .pi2 was renamed
            else:
                writer.abort()
        raise
    return summary


def _generate(cfg, spec, sparsity, rank, n_calib, n_eval, sinks: Sinks, step) -> dict:
    h, f, quant, seed = spec.hidden, spec.ffn, cfg.quant, cfg.seed
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

    # embeddings, generated and quantized in chunks; the forward needs only the sampled rows
    a_mean, a_lat, a_iso = (math.sqrt(s * h) for s in STREAM_SHARES)
    erng = _rng(seed, _EMBED)
    chunks, rows = [], 4096
    for start in range(0, spec.vocab, rows):
        n = min(rows, spec.vocab - start)
        z = erng.standard_normal((n, k), dtype=np.float32) * np.sqrt(basis_var)[None, :]
        emb = np.float32(a_mean) * u[None, :] + np.float32(a_lat) * (z @ basis)
        emb += erng.standard_normal((n, h), dtype=np.float32) * np.float32(a_iso / math.sqrt(h))
        chunks.append(gguf_twin.encode(emb, quant))
    embd_q = np.concatenate(chunks)
    del chunks
    sinks.resident("token_embd.weight", embd_q, (spec.vocab, h), quant)
    x = gguf_twin.decode(embd_q[tokens], quant, h)
    del embd_q
    step("embeddings", 1)

    ones = np.ones(h, dtype=np.float32)
    raw_ones = gguf_twin.encode(ones[None, :], "f32")
    per_layer: list[LayerStats] = []
    calib, held = slice(0, n_calib), slice(n_calib, n_all)
    lrng = _rng(seed, 7)
    for layer in range(spec.n_layer):
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
            w = rng.standard_normal((rows_n, h), dtype=np.float32) / np.float32(math.sqrt(h))
            mats[name] = gguf_twin.encode(w, quant)
        wq, wk, wv = (gguf_twin.decode(mats[n], quant, h) for n in ("attn_q", "attn_k", "attn_v"))
        att = attention(xn, wq, wk, wv, spec.n_head, spec.n_kv_head, cfg.seq_len, spec.rope_theta)
        wo = (basis.T @ rng.standard_normal((k, spec.n_head * hd), dtype=np.float32)) * np.float32(
            math.sqrt(0.9 * h / k)
        )
        wo += rng.standard_normal(wo.shape, dtype=np.float32) * np.float32(math.sqrt(0.1))
        wo *= np.float32(_scale_to_rms(att[calib] @ wo.T, LAYER_WRITE_RMS))
        mats["attn_output"] = gguf_twin.encode(wo, quant)
        for name in ("attn_q", "attn_k", "attn_v"):
            sinks.resident(p + name + ".weight", mats[name], (mats[name].shape[0], h), quant)
        sinks.resident(p + "attn_output.weight", mats["attn_output"], (h, spec.n_head * hd), quant)
        x = x + att @ gguf_twin.decode(mats["attn_output"], quant, spec.n_head * hd).T
        del att, mats, wq, wk, wv, wo

        # FFN
        sinks.resident(p + "ffn_norm.weight", raw_ones, (h,), "f32")
        xf = rms_norm(x, spec.norm_eps)
        v_r = top_right_singular_vectors(xf[: predictor_fit_rows(n_calib)], rank)
        density = float(np.clip((1 - sparsity) * (1 + 0.1 * lrng.uniform(-1, 1)), 1e-4, 0.79))
        n_blocks = spec.n_expert if spec.is_moe else 1
        if spec.is_moe:
            router = rng.standard_normal((spec.n_expert, h), dtype=np.float32) * np.float32(
                4.0 / math.sqrt(h)
            )
            logits = xf @ router.T
            top = np.argsort(-logits, axis=1)[:, : spec.n_expert_used]
            sel = np.take_along_axis(logits, top, axis=1)
            wts = np.exp(sel - sel.max(axis=1, keepdims=True))
            wts /= wts.sum(axis=1, keepdims=True)
            sinks.resident(
                p + "ffn_gate_inp.weight", gguf_twin.encode(router, "f32"), (spec.n_expert, h), "f32"
            )
        ffn_out = np.zeros_like(x)
        blocks_q = []
        stats_e = []
        for e in range(n_blocks):
            block = build_ffn_block(rng, xf, n_calib, basis, v_r, f, density, spec.activation, quant)
            if spec.is_moe:
                weight = np.where(top == e, wts, 0.0).sum(axis=1).astype(np.float32)
            else:
                weight = np.ones(x.shape[0], dtype=np.float32)
            weighted = block.act * weight[:, None]
            # scale down so this block adds the target RMS (measured on a few routed calibration rows)
            probe = np.flatnonzero(weight[calib] > 0)[:128]
            target = LAYER_WRITE_RMS / math.sqrt(max(spec.n_expert_used, 1))
            block.down *= np.float32(
                _scale_to_rms(weighted[probe] @ block.down.T, target) if probe.size else 1.0
            )
            block.down_q = gguf_twin.encode(block.down, quant)
            block.down_deq = gguf_twin.decode(block.down_q, quant, f)
            ffn_out += weighted @ block.down_deq.T
            del weighted
            routed_eval = np.flatnonzero(weight[held] > 0) + n_calib
            st = block_stats(block, xf[routed_eval], block.act[routed_eval])
            st["expert"] = e
            stats_e.append(st)
            _emit_ffn(sinks, spec, layer, e, block)
            if spec.is_moe:
                blocks_q.append((block.gate_q, block.up_q, block.down_q))
            else:
                for name, raw in (
                    ("ffn_gate", block.gate_q),
                    ("ffn_up", block.up_q),
                    ("ffn_down", block.down_q),
                ):
                    sinks.twin.write(p + name + ".weight", raw)
            del block
        if spec.is_moe:
            for i, name in enumerate(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")):
                sinks.twin.write(p + name + ".weight", np.stack([b[i] for b in blocks_q]))
            del blocks_q
        x = x + ffn_out
        del ffn_out, xf
        per_layer.append(_layer_summary(layer, 1 - density, stats_e, spec.is_moe))
        step(f"layer {layer + 1}/{spec.n_layer}", layer + 2)

    sinks.resident("output_norm.weight", raw_ones, (h,), "f32")
    orng = _rng(seed, _OUTPUT)
    out_chunks = []
    for start in range(0, spec.vocab, 4096):
        n = min(4096, spec.vocab - start)
        out_chunks.append(
            gguf_twin.encode(orng.standard_normal((n, h), dtype=np.float32) / np.float32(math.sqrt(h)), quant)
        )
    sinks.resident("output.weight", np.concatenate(out_chunks), (spec.vocab, h), quant)
    step("output", spec.n_layer + 2)
    return _model_summary(per_layer, sparsity, rank, spec, quant)


def _emit_ffn(sinks: Sinks, spec: ModelSpec, layer: int, expert: int, block: FfnBlock) -> None:
    if sinks.pi2 is None:
        return
    e = expert if spec.is_moe else None
    sfx = f".{expert}" if spec.is_moe else ""
    q = sinks.quant.upper()
    sinks.pi2.add_ffn(layer, block.gate_q, block.up_q, block.down, expert=e, order=block.order,
                      down_raw=block.down_q, down_raw_type=q)  # fmt: skip
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
        "size_bytes_estimate": int(spec.size_bytes(quant)) if quant in QUANT_BYTES_PER_ELEMENT else None,
    }
