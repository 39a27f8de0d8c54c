"""CATS (Lee et al., "CATS: Contextually-Aware Thresholding for Sparsity in Large Language Models",
arXiv 2404.08763): training-free activation sparsity for SwiGLU models, written as a .pi2 whose
predictor is the thresholded gate.

CATS zeroes a neuron's activation when |SiLU(gate . x)| is at most a per-layer threshold t, chosen so
that a fraction S of the activations of calibration text fall below it (the S-quantile of |SiLU(gate)|
over the calibration tokens and the layer's neurons). The gate row then is an exact predictor: the
engine keeps every layer's gate rows resident (blk.L.pred_gate, the bundles' gate rows in bundle
order), computes |SiLU(gate . x)| for all neurons and reads and computes up and down only for those
above t (docs/FORMAT.md, "Gate predictor").

Calibration runs the dense model (pi2cli.models.numpy_llama, the numpy forward) over the calibration part of a
workload's real text (pi2cli/quality/text.py), which is held apart from the text quality is evaluated
on. At S = 0 the threshold is 0: every neuron with a non-zero output is computed, so the logits are the
dense model's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from pathlib import Path

import numpy as np

from pi2cli import safe_write
from pi2cli.errors import Pi2Error
from pi2cli.models.numpy_llama import Reference
from pi2cli.models.pi2file import Pi2File, Pi2FormatError, Pi2Writer, bundle_suffix, decode_rows, encode_rows

CALIB_CTX = 256
CALIB_CHUNKS = 4


class _Recorder(Reference):
    """The dense forward, keeping |SiLU(gate . x)| of every FFN neuron (bundle order) per layer."""

    def __init__(self, path):
        super().__init__(path, emulate_rounding=False)
        self.acts: dict[int, list[np.ndarray]] = {}

    def _ffn_block(self, x, layer, expert):
        g = self._mm(x, self._ffn(layer, expert)["gate"], self.h.neuron_type).astype(np.float64)
        self.acts.setdefault(layer, []).append(np.abs(g / (1.0 + np.exp(-g))).astype(np.float32))
        return super()._ffn_block(x, layer, expert)


def calibrate(dense: Path, sparsity: float, workload: str = "multi-turn", ctx: int = CALIB_CTX,
              max_chunks: int = CALIB_CHUNKS) -> dict:  # fmt: skip
    """Per-layer thresholds t_l with P(|SiLU(gate)| <= t_l) = sparsity on the calibration text."""
    from pi2cli.quality.text import chunks, tokenize, workload_text

    if sparsity <= 0:  # t = 0 whatever the text says: nothing to calibrate
        n_layer = Pi2File(dense, verify=False).header.n_layer
        return {
            "thresholds": [0.0] * n_layer,
            "workload": None,
            "part": None,
            "tokens": 0,
            "chunks": 0,
            "ctx": 0,
        }
    tok = tokenize(dense, workload_text(workload, "calibration"))
    parts = chunks(tok, ctx, max_chunks)
    rec = _Recorder(dense)
    if rec.h.ffn_act != "swiglu" or rec.h.arch != "llama":
        raise Pi2Error(f"{dense}: CATS needs a dense SwiGLU model (this one is {rec.h.arch}/{rec.h.ffn_act})")
    for c in parts:
        rec.forward([int(t) for t in c])
    thresholds = []
    for layer in range(rec.h.n_layer):
        a = np.concatenate(rec.acts[layer]).ravel()
        thresholds.append(0.0 if sparsity <= 0 else float(np.quantile(a, sparsity)))
    return {"thresholds": thresholds, "workload": workload, "part": "calibration",
            "tokens": int(sum(len(c) for c in parts)), "chunks": len(parts), "ctx": ctx}  # fmt: skip


def write_cats(dense: Path, out: Path, sparsity: float, calib: dict, bundle_type: str | None = None,
               extra_meta: dict | None = None) -> None:  # fmt: skip
    """dense .pi2 -> the same weights plus the gate predictor (flags bit3) and its thresholds.
    bundle_type: re-encode the bundles in this type (the gate predictor keeps the source rows).
    extra_meta: more metadata (the twin's name, the chat template: convert_cats)."""
    f = Pi2File(dense, verify=False)
    if f.header.arch != "llama" or f.header.ffn_act != "swiglu":
        raise Pi2Error(
            f"{dense}: CATS needs a dense SwiGLU model (this one is {f.header.arch}/{f.header.ffn_act})"
        )
    src_type = f.header.neuron_type
    # No dense down copy: the dense policy then multiplies the bundles' down columns as every sparse
    # policy does, so at threshold 0 they compute the same thing (the copy's Q4_1 rows against the
    # columns' Q8_0 moved SmolLM2's logits by 4.4% of the largest). What the re-encoding costs against
    # the source is measured against the source file (pi2 quality --reference).
    h = dataclasses.replace(f.header, has_predictor=True, gate_predictor=True, dense_down=False,
                            neuron_type=bundle_type or src_type, bundle_align=0)  # fmt: skip
    meta = dict(f.metadata)
    meta["predictor"] = {"kind": "cats-gate", "sparsity_target": sparsity, "paper": "arXiv 2404.08763",
                         "calibration": {k: v for k, v in calib.items() if k != "thresholds"},
                         "thresholds": calib["thresholds"]}  # fmt: skip
    meta.update(extra_meta or {})
    skip = {f"blk.{layer}.ffn_{kind}{bundle_suffix(h, None)}" for layer in range(h.n_layer)
            for kind in ("bundles", "order", "down.weight")}  # fmt: skip
    p = f.header.part_bytes
    with Pi2Writer(out, h, tokenizer_blob=f.tokenizer_blob, metadata=meta) as w:
        for layer in range(h.n_layer):
            raw = np.asarray(f.raw(f"blk.{layer}.ffn_bundles"))
            order = f.tensor(f"blk.{layer}.ffn_order").astype(np.int64)
            inv = np.empty_like(order)
            inv[order] = np.arange(len(order))
            orig = raw[inv]  # the bundles back in original neuron order: add_ffn reorders them by `order`

            def part(i: int) -> np.ndarray:  # gate (0), up (1) or down column (2) rows in the bundle type
                rows = np.ascontiguousarray(orig[:, i * p : (i + 1) * p])  # noqa: B023 (used right here)
                return (
                    rows
                    if h.neuron_type == src_type
                    else encode_rows(decode_rows(rows, src_type, h.n_embd), h.neuron_type)
                )

            if f.header.dense_down:  # the columns from the lossless dense copy, not the re-quantized ones
                w.add_ffn(layer, part(0), part(1), f.tensor(f"blk.{layer}.ffn_down.weight"), order=order)
            else:
                w.add_ffn(layer, part(0), part(1), None, order=order, down_cols=part(2))
            # the predictor: the gate rows again, resident, in bundle order (row k scores bundle k)
            w.add_tensor(f"blk.{layer}.pred_gate", np.ascontiguousarray(raw[:, 0:p]), src_type,
                         (h.n_embd, h.n_ff))  # fmt: skip
            w.add_tensor(f"blk.{layer}.pred_threshold", np.array([calib["thresholds"][layer]], np.float32),
                         "F32", (1,))  # fmt: skip
        for name, e in f.tensors.items():
            if name not in skip:
                w.add_tensor(name, np.asarray(f.raw(name)), e.type, e.shape)


def default_bundle_type(src_type: str, choice: str | None) -> str:
    """q8_0 for 4-bit sources: their bundles' down columns are re-quantized along n_embd, which on
    SmolLM2 Q4_1 alone costs 0.10 nats of KL at sparsity 0 (docs/MODELS.md); 8 bits keep them."""
    if choice == "source" or (choice is None and src_type not in ("Q4_0", "Q4_1")):
        return src_type
    return (choice or "q8_0").upper()


def dense_twin(dense_pi2: Path) -> Path | None:
    """The GGUF twin beside a dense .pi2 (the name its metadata records, else X.gguf), if it is there."""
    with contextlib.suppress(Pi2FormatError, OSError, ValueError):
        name = Pi2File(dense_pi2, verify=False).metadata.get("gguf_twin")
        if isinstance(name, str) and (dense_pi2.parent / name).is_file():
            return dense_pi2.parent / name
    twin = dense_pi2.with_suffix(".gguf")
    return twin if twin.is_file() else None


def chat_template_meta(gguf: Path) -> dict | None:
    """The GGUF's chat template and BOS/EOS texts, kept in a CATS .pi2 so `pi2 bench -e pi2` runs the
    chat workloads on it without a twin; None when the GGUF has none."""
    from pi2cli.workloads import gguf_chat_template

    try:
        t = gguf_chat_template(gguf)
    except (Pi2Error, OSError, ValueError):
        return None
    return {"template": t.source, "bos": t.bos_token, "eos": t.eos_token}


def convert_cats(src: Path, out: Path, sparsity: float, workload: str = "multi-turn", progress=None,
                 bundle_type: str | None = None, gguf_twin: Path | None = None) -> dict:  # fmt: skip
    """SRC (a GGUF, or a dense .pi2 without predictors) -> a CATS .pi2 at OUT. gguf_twin: also write the
    GGUF twin there, the dense source's weights (llama.cpp runs the dense model, CATS's own baseline):
    a GGUF source's conversion twin, or a dense .pi2's twin beside it, copied. Both appear only once the
    .pi2 is complete."""
    from pi2cli.models.convert_any import convert_any

    if not 0.0 <= sparsity < 1.0:
        raise Pi2Error(f"--sparsity {sparsity}: must be in [0, 1)")
    src, out = Path(src), Path(out)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".cats-") as tmp:
        twin_src = None
        if src.suffix == ".pi2":
            dense = src
            try:
                if Pi2File(dense, verify=False).header.has_predictor:
                    raise Pi2Error(f"{src} already has a predictor: give the dense model")
            except (Pi2FormatError, OSError) as err:
                raise Pi2Error(f"{src}: {err}") from err
            twin_src = dense_twin(dense)
            if gguf_twin is not None and twin_src is None:
                raise Pi2Error(f"--gguf-twin: {src} has no GGUF twin beside it to copy; give its GGUF source "
                               f"instead (`pi2 convert SRC.gguf --sparsify cats --gguf-twin ...`)")  # fmt: skip
        else:
            dense = Path(tmp) / "dense.pi2"
            twin_src = Path(tmp) / "dense.gguf" if gguf_twin is not None else None
            convert_any(src, dense, gguf_twin=twin_src, progress=progress)
        calib = calibrate(dense, sparsity, workload)
        btype = default_bundle_type(Pi2File(dense, verify=False).header.neuron_type, bundle_type)
        extra = {"gguf_twin": Path(gguf_twin).name if gguf_twin is not None else None}
        template = chat_template_meta(twin_src or src) if (twin_src or src.suffix == ".gguf") else None
        if template:
            extra["chat_template"] = template
        write_cats(dense, out, sparsity, calib, bundle_type=btype, extra_meta=extra)
        if gguf_twin is not None:
            try:  # exclusive temp, random name, renamed over a regular file only: a planted link is refused
                with open(twin_src, "rb") as src_f, safe_write.safe_open(gguf_twin) as f:
                    shutil.copyfileobj(src_f, f)
            except BaseException:
                out.unlink(missing_ok=True)  # no .pi2 without the twin that was asked for
                raise
    return {"out": str(out), "sparsify": "cats", "sparsity": sparsity, "calibration": calib,
            "bundle_type": btype, "bytes": out.stat().st_size,
            "gguf_twin": str(gguf_twin) if gguf_twin is not None else None}  # fmt: skip
