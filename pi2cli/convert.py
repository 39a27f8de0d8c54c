"""GGUF (llama architecture) -> .pi2, copying F32/F16/Q4_0/Q4_1/Q8_0 weights without loss.

Attention, embeddings, norms and the dense down copy are the GGUF bytes verbatim; FFN gate and up
rows go into the neuron bundles verbatim; only the bundles' down columns are re-quantized (GGUF's
blocks run along the other axis; see docs/FORMAT.md). The optional GGUF twin is a byte copy of the
source, so llama.cpp and pi2-engine run identical weights.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pi2cli import __version__
from pi2cli.errors import Pi2Error
from pi2cli.pi2file import ACTS, TYPE_NAMES, WEIGHT_TYPES, Pi2FormatError, Pi2Header, Pi2Writer, decode_rows

ProgressFn = Callable[[int, int], None]


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return default if value is None else value


def _raw_rows(tensor) -> np.ndarray:
    """A GGUF tensor's bytes as (rows, row_bytes) uint8, whatever its type."""
    data = np.asarray(tensor.data)
    rows = int(np.prod(tensor.shape[1:])) if len(tensor.shape) > 1 else 1
    return np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)


def _type_name(tensor) -> str:
    name = TYPE_NAMES.get(int(tensor.tensor_type))
    if name not in WEIGHT_TYPES:
        raise Pi2Error(
            f"tensor {tensor.name} is {tensor.tensor_type.name}; convert copies only "
            f"{', '.join(WEIGHT_TYPES)} (re-quantize the GGUF with llama-quantize first)"
        )
    return name


def _sha256_prefix(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()[:16]


def header_from_gguf(reader, ffn_act: str = "swiglu") -> Pi2Header:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise Pi2Error(f"GGUF architecture {arch!r} is not supported (only 'llama', incl. Mistral/Mixtral)")
    tensors = {t.name: t for t in reader.tensors}

    def need(key):
        value = _field(reader, f"llama.{key}")
        if value is None:
            raise Pi2Error(f"GGUF key llama.{key} is missing")
        return value

    n_embd, n_head = int(need("embedding_length")), int(need("attention.head_count"))
    n_head_kv = int(_field(reader, "llama.attention.head_count_kv", n_head))
    head_dim = int(_field(reader, "llama.attention.key_length", n_embd // n_head))
    rope_dims = int(_field(reader, "llama.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise Pi2Error(f"partial RoPE ({rope_dims} of {head_dim} dims) is not supported")
    if _field(reader, "llama.rope.scaling.type", "none") not in ("none", None):
        raise Pi2Error("RoPE scaling is not supported")
    n_expert = int(_field(reader, "llama.expert_count", 0) or 0)
    n_vocab = int(tensors["token_embd.weight"].shape[1])
    gate = tensors.get("blk.0.ffn_gate.weight") or tensors.get("blk.0.ffn_gate_exps.weight")
    if gate is None:
        raise Pi2Error("GGUF has no blk.0.ffn_gate weight")
    if ffn_act not in ACTS:
        raise Pi2Error(f"unknown FFN activation {ffn_act!r}")
    try:
        return Pi2Header(
            arch="moe" if n_expert else "llama",
            ffn_act=ffn_act,
            n_vocab=n_vocab,
            n_embd=n_embd,
            n_layer=int(need("block_count")),
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=int(need("feed_forward_length")),
            n_expert=n_expert,
            n_expert_used=int(_field(reader, "llama.expert_used_count", 0) or 0),
            n_ctx_train=int(_field(reader, "llama.context_length", 4096)),
            rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
            rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
            tied_embeddings="output.weight" not in tensors,
            neuron_type=_type_name(gate),
            dense_down=True,
        )
    except Pi2FormatError as err:
        raise Pi2Error(f"GGUF dimensions do not fit .pi2: {err}") from err


def convert_gguf(
    src: str | os.PathLike,
    out: str | os.PathLike,
    gguf_twin: str | os.PathLike | None = None,
    ffn_act: str = "swiglu",
    progress: ProgressFn | None = None,
) -> dict:
    """Convert a llama-architecture GGUF to .pi2 (and optionally copy it as the GGUF twin).
    Returns a summary dict. Raises Pi2Error on anything unsupported; no partial output is left."""
    import gguf

    from pi2cli.tokenizer_blob import vocab_blob_from_gguf

    src, out = Path(src), Path(out)
    if not src.is_file():
        raise Pi2Error(f"{src}: no such file")
    try:
        reader = gguf.GGUFReader(src)
    except Exception as err:  # the gguf package raises assorted errors on bad files
        raise Pi2Error(f"{src}: not a readable GGUF file ({err})") from err
    header = header_from_gguf(reader, ffn_act)
    tensors = {t.name: t for t in reader.tensors}
    blob = vocab_blob_from_gguf(reader)
    metadata = {
        "converter": f"pi2 {__version__}",
        "source": {"path": src.name, "sha256_16": _sha256_prefix(src), "format": "gguf"},
        "synthetic": False,
    }
    if gguf_twin:
        metadata["gguf_twin"] = Path(gguf_twin).name

    def get(name: str):
        t = tensors.get(name)
        if t is None:
            raise Pi2Error(f"GGUF tensor {name} is missing")
        return t

    def copy(w: Pi2Writer, name: str, as_f32: bool = False) -> None:
        t = get(name)
        shape = tuple(int(d) for d in t.shape)
        if as_f32:  # norms: the engine reads them as F32
            values = decode_rows(_raw_rows(t), _type_name(t), shape[0])
            w.add_tensor(name, values.reshape(-1), "F32", shape)
        else:
            w.add_tensor(name, _raw_rows(t), _type_name(t), shape)

    h = header
    out.parent.mkdir(parents=True, exist_ok=True)
    n_steps = h.n_layer + 1
    with Pi2Writer(out, header, tokenizer_blob=blob, metadata=metadata) as w:
        copy(w, "token_embd.weight")
        copy(w, "output_norm.weight", as_f32=True)
        if not h.tied_embeddings:
            copy(w, "output.weight")
        if progress:
            progress(1, n_steps)
        for layer in range(h.n_layer):
            p = f"blk.{layer}."
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                copy(w, f"{p}{name}.weight")
            copy(w, f"{p}attn_norm.weight", as_f32=True)
            copy(w, f"{p}ffn_norm.weight", as_f32=True)
            if h.arch == "moe":
                copy(w, f"{p}ffn_gate_inp.weight")
                _add_experts(w, h, layer, get(f"{p}ffn_gate_exps.weight"), get(f"{p}ffn_up_exps.weight"),
                             get(f"{p}ffn_down_exps.weight"))  # fmt: skip
            else:
                gate, up, down = (
                    get(f"{p}ffn_gate.weight"),
                    get(f"{p}ffn_up.weight"),
                    get(f"{p}ffn_down.weight"),
                )
                for t in (gate, up):
                    if _type_name(t) != h.neuron_type:
                        raise Pi2Error(
                            f"{t.name} is {_type_name(t)}, blk.0.ffn_gate is {h.neuron_type}: mixed FFN types"
                        )
                down_type = _type_name(down)
                down_raw = _raw_rows(down)
                down_f = decode_rows(down_raw, down_type, h.n_ff)  # (n_embd, n_ff)
                w.add_ffn(
                    layer, _raw_rows(gate), _raw_rows(up), down_f, down_raw=down_raw, down_raw_type=down_type
                )
            if progress:
                progress(layer + 2, n_steps)
    if gguf_twin:
        twin = Path(gguf_twin)
        partial = twin.with_name(f".{twin.name}.partial-{os.getpid()}")
        try:
            shutil.copyfile(src, partial)
            partial.replace(twin)
        finally:
            partial.unlink(missing_ok=True)
    return {
        "out": str(out),
        "gguf_twin": str(gguf_twin) if gguf_twin else None,
        "arch": h.arch,
        "n_layer": h.n_layer,
        "neuron_type": h.neuron_type,
        "bytes": out.stat().st_size,
    }


def _add_experts(w: Pi2Writer, h: Pi2Header, layer: int, gate, up, down) -> None:
    """Mixtral-style GGUF stacks experts in 3-D tensors [n_embd, n_ff, n_expert] (down: [n_ff, n_embd,
    n_expert]); slice one expert at a time."""
    for t in (gate, up):
        if _type_name(t) != h.neuron_type:
            raise Pi2Error(f"{t.name} is {_type_name(t)}, expected {h.neuron_type}: mixed FFN types")
    g_all, u_all, d_all = _raw_rows(gate), _raw_rows(up), _raw_rows(down)
    down_type = _type_name(down)
    for e in range(h.n_expert):
        g = g_all[e * h.n_ff : (e + 1) * h.n_ff]
        u = u_all[e * h.n_ff : (e + 1) * h.n_ff]
        d_raw = d_all[e * h.n_embd : (e + 1) * h.n_embd]
        d = decode_rows(d_raw, down_type, h.n_ff)
        w.add_ffn(layer, g, u, d, expert=e, down_raw=d_raw, down_raw_type=down_type)
