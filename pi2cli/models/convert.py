"""GGUF (llama architecture, and PowerInfer's sparse GGUFs) -> .pi2, copying F32/F16/Q4_0/Q4_1/Q8_0
weights without loss.

Attention, embeddings, norms and the dense down copy are the GGUF bytes verbatim; FFN gate and up
rows go into the neuron bundles verbatim; the bundles' down columns are re-quantized (GGUF's blocks
run along the other axis; see docs/FORMAT.md) unless the source has a transposed down. The optional
GGUF twin is a byte copy of the source, so llama.cpp and pi2-engine run identical weights.

PowerInfer GGUFs (SJTU-IPADS/PowerInfer, convert-hf-to-powerinfer-gguf.py): magic "PWRI" instead of
"GGUF", arch "llama" (ReLU-Llama, ProSparse) or "bamboo" (dReLU), the down projection stored
transposed as blk.N.ffn_down_t.weight ([n_embd, n_ff]: row i = column i of down, quantized along
n_embd, so it becomes the bundles' down columns bit for bit), and per-layer predictors
blk.N.fc1.weight [n_embd, rank] / blk.N.fc2.weight [rank, n_ff] with the key
powerinfer.sparse_threshold t (default 0): neuron i is active when fc2 relu(fc1 h) > t. Their
llama.cpp fork feeds the predictor h = the residual stream BEFORE ffn_norm; .pi2 predictors read the
normed FFN input x = h / rms(h) * g. Since fc1 h = rms(h) * (fc1 / g) x and relu is positively
homogeneous, score_pi2 = score_powerinfer / rms(h): pred_fc1 = fc1 / g (columns), and the sign test
(t = 0, threshold sigmoid(0) = 0.5) is exact. For t != 0 the stored threshold is sigmoid(t), exact
only where rms(h) = 1; the metadata says which.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pi2cli import __version__, safe_write
from pi2cli.errors import Pi2Error
from pi2cli.models.pi2file import (
    ACTS,
    TYPE_NAMES,
    WEIGHT_TYPES,
    Pi2FormatError,
    Pi2Header,
    Pi2Writer,
    decode_rows,
    encode_rows,
    hparam_problems,
)

ProgressFn = Callable[[int, int], None]

POWERINFER_MAGIC = b"PWRI"
THRESHOLD_KEY = "powerinfer.sparse_threshold"
GGUF_ARCHES = ("llama", "bamboo")  # bamboo: PowerInfer's dReLU Mistral-shaped models


def open_gguf(src: Path):
    """A GGUFReader for a GGUF or a PowerInfer GGUF (which differs only in its magic)."""
    import gguf

    class _Reader(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            if offset == 0 and bytes(self.data[:4]) == POWERINFER_MAGIC:
                return np.array([gguf.GGUF_MAGIC], dtype=np.uint32)
            return super()._get(offset, dtype, count, override_order)

    try:
        return _Reader(src)
    except Exception as err:  # the gguf package raises assorted errors on bad files
        raise Pi2Error(f"{src}: not a readable GGUF file ({err})") from err


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


def is_powerinfer(reader) -> bool:
    """PowerInfer's sparse flavour: its magic, its threshold key, predictors or a transposed down."""
    names = (t.name for t in reader.tensors)
    return (
        bytes(reader.data[:4]) == POWERINFER_MAGIC
        or THRESHOLD_KEY in reader.fields
        or any(n.endswith((".fc1.weight", ".fc2.weight", ".ffn_down_t.weight")) for n in names)
    )


def default_ffn_act(reader) -> str:
    """What the source's own runtime computes: PowerInfer's fork runs bamboo as dReLU
    (relu(gate) * relu(up)) and llama with predictors as ReLU (relu(gate) * up); plain llama
    GGUFs (and PowerInfer llama without predictors, its dense fallback) are SwiGLU."""
    arch = _field(reader, "general.architecture")
    if arch == "bamboo":
        return "drelu"
    if arch == "llama" and any(t.name.endswith(".fc1.weight") for t in reader.tensors):
        return "relu"
    return "swiglu"


def check_architecture(src: Path) -> str:
    """general.architecture, read without building the tensor list; one Pi2Error if unsupported."""
    from pi2cli.models.gguf_meta import read_gguf_metadata

    try:
        arch = read_gguf_metadata(src, {"general.architecture"}).get("general.architecture")
    except Pi2Error as err:
        raise Pi2Error(f"{src}: not a readable GGUF file ({err})") from None
    if arch not in GGUF_ARCHES:
        raise Pi2Error(f"GGUF architecture {arch!r} is not supported (only 'llama', incl. Mistral/Mixtral, "
                       "and PowerInfer's 'bamboo')")  # fmt: skip
    return arch


def check_hparams(reader) -> None:
    """The scalar hyperparameters as the engine will check them (finite, positive, in range; .pi2
    rule 8), before anything is written: a NaN rope_theta, a negative rms_eps or a context of 0 used
    to convert to files both readers refuse."""
    arch = _field(reader, "general.architecture")
    keys = {"n_ctx_train": (f"{arch}.context_length", 4096), "rope_theta": (f"{arch}.rope.freq_base", 10000.0),
            "rms_eps": (f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)}  # fmt: skip
    values = {name: _field(reader, key, default) for name, (key, default) in keys.items()}
    for name, value, why in hparam_problems(**values):
        raise Pi2Error(
            f"GGUF key {keys[name][0]} is {value!r}: {why} (the engine refuses it; nothing written)"
        )


def check_tensors(reader, src: Path) -> None:
    """What llama.cpp refuses too: a zero dimension, data not on the file's alignment (gguf's reader
    would read it shifted, silently), data past the end of the file."""
    align = int(getattr(reader, "alignment", 32) or 32)
    size = src.stat().st_size
    for t in reader.tensors:
        shape = [int(d) for d in t.shape]
        if not shape or min(shape) < 1:
            raise Pi2Error(f"GGUF tensor {t.name} has a zero dimension {shape}")
        rel = int(t.data_offset) - int(reader.data_offset)
        if rel % align:
            raise Pi2Error(f"GGUF tensor {t.name}: data offset {rel} is not a multiple of the file's "
                           f"alignment {align} (corrupt file)")  # fmt: skip
        if int(t.data_offset) + int(t.n_bytes) > size:
            raise Pi2Error(f"GGUF tensor {t.name}: data runs past the end of the file (truncated?)")


def check_layers(tensors: dict, n_layer: int) -> None:
    """block_count agrees with the layers the file holds (a huge one would fail after converting them all)."""
    for layer in (0, n_layer - 1):
        if f"blk.{layer}.attn_q.weight" not in tensors:
            held = sum(1 for name in tensors if name.endswith(".attn_q.weight"))
            raise Pi2Error(f"GGUF block_count is {n_layer} but the file holds tensors for {held} layer(s)")


def header_from_gguf(reader, ffn_act: str | None = None) -> Pi2Header:
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHES:
        raise Pi2Error(
            f"GGUF architecture {arch!r} is not supported (only 'llama', incl. Mistral/Mixtral, "
            "and PowerInfer's 'bamboo')"
        )
    tensors = {t.name: t for t in reader.tensors}

    def need(key):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise Pi2Error(f"GGUF key {arch}.{key} is missing")
        return value

    n_embd, n_head = int(need("embedding_length")), int(need("attention.head_count"))
    for key, value in (("embedding_length", n_embd), ("attention.head_count", n_head),
                       ("block_count", int(need("block_count"))), ("feed_forward_length", int(need("feed_forward_length")))):  # fmt: skip
        if value < 1:
            raise Pi2Error(f"GGUF key {arch}.{key} is {value} (must be at least 1)")
    n_head_kv = int(_field(reader, f"{arch}.attention.head_count_kv", n_head))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", n_embd // n_head))
    rope_dims = int(_field(reader, f"{arch}.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise Pi2Error(f"partial RoPE ({rope_dims} of {head_dim} dims) is not supported")
    if _field(reader, f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise Pi2Error("RoPE scaling is not supported")
    n_expert = int(_field(reader, f"{arch}.expert_count", 0) or 0)
    if "token_embd.weight" not in tensors:
        raise Pi2Error("GGUF tensor token_embd.weight is missing")
    n_vocab = int(tensors["token_embd.weight"].shape[1])
    gate = tensors.get("blk.0.ffn_gate.weight") or tensors.get("blk.0.ffn_gate_exps.weight")
    if gate is None:
        raise Pi2Error("GGUF has no blk.0.ffn_gate weight")
    ffn_act = ffn_act or default_ffn_act(reader)
    if ffn_act not in ACTS:
        raise Pi2Error(f"unknown FFN activation {ffn_act!r}")
    sparse = is_powerinfer(reader)
    if sparse and n_expert:
        raise Pi2Error("PowerInfer GGUFs with experts are not supported (their fork has no MoE predictors)")
    try:
        header = Pi2Header(
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
            n_expert_used=int(_field(reader, f"{arch}.expert_used_count", 0) or 0),
            n_ctx_train=int(_field(reader, f"{arch}.context_length", 4096)),
            rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
            rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            tied_embeddings="output.weight" not in tensors,
            neuron_type=_type_name(gate),
            # PowerInfer files hold only the transposed down: the bundles carry it losslessly and
            # the engine computes down from their columns (a dense copy would be re-quantized).
            dense_down="blk.0.ffn_down.weight" in tensors or n_expert > 0,
            has_predictor="blk.0.fc1.weight" in tensors,
        )
        header.validate()  # the engine's ranges, before anything is read or written
        return header
    except Pi2FormatError as err:
        raise Pi2Error(f"GGUF dimensions do not fit .pi2: {err}") from err


def convert_gguf(
    src: str | os.PathLike,
    out: str | os.PathLike,
    gguf_twin: str | os.PathLike | None = None,
    ffn_act: str | None = None,
    profile: str | os.PathLike | None = None,
    progress: ProgressFn | None = None,
) -> dict:
    """Convert a llama-architecture GGUF or a PowerInfer GGUF to .pi2 (and optionally copy it as the
    GGUF twin). ffn_act None: what the source's runtime computes (default_ffn_act). profile: a
    `pi2 models profile` .npz whose frequencies order each block's bundles hottest first.
    Returns a summary dict. Raises Pi2Error on anything unsupported; no partial output is left."""
    from pi2cli.models.tokenizer_blob import vocab_blob_from_gguf

    src, out = Path(src), Path(out)
    if not src.is_file():
        raise Pi2Error(f"{src}: no such file")
    check_architecture(
        src
    )  # from the key/value header alone: an unsupported GGUF is refused before its tensors
    reader = open_gguf(src)
    check_tensors(reader, src)
    check_hparams(reader)
    header = header_from_gguf(reader, ffn_act)
    h = header
    tensors = {t.name: t for t in reader.tensors}
    check_layers(tensors, h.n_layer)
    sparse = is_powerinfer(reader)
    threshold = None
    if sparse:
        _check_powerinfer(tensors, h)
        threshold = float(_field(reader, THRESHOLD_KEY, 0.0))
        if not np.isfinite(threshold):
            raise Pi2Error(f"GGUF key {THRESHOLD_KEY} is {threshold}")
        if gguf_twin:
            # the .pi2's dense down copy becomes the twin's down, so both engines' dense paths
            # read the same bytes (the bundles keep the lossless transposed down)
            header.dense_down = True
    orders = {}
    if profile is not None:
        from pi2cli.models.profile import hot_first_orders

        orders = hot_first_orders(Path(profile), h.n_layer, h.n_expert if h.arch == "moe" else 0, h.n_ff)
    blob = vocab_blob_from_gguf(reader)
    metadata = {
        "converter": f"pi2 {__version__}",
        "source": {"path": src.name, "sha256_16": _sha256_prefix(src),
                   "format": "powerinfer-gguf" if sparse else "gguf"},
        "synthetic": False,
        "ffn_activation": h.ffn_act,
    }  # fmt: skip
    if profile is not None:
        metadata["activation_profile"] = {"source": Path(profile).name, "order": "hottest first"}
    if h.has_predictor:
        metadata["predictor"] = {
            "source": "PowerInfer fc1/fc2",
            "powerinfer_threshold": threshold,
            "threshold": _sigmoid(threshold),
            # exact when t = 0: the pi2 score is PowerInfer's divided by rms(h) > 0
            "threshold_exact": threshold == 0.0,
            "fc1": "fc1 / ffn_norm (PowerInfer feeds the predictor the residual before ffn_norm)",
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

    twin_downs = {}
    if sparse and gguf_twin:
        twin_downs = {layer: _down_from_transposed(tensors, h, layer) for layer in range(h.n_layer)}
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
                             get(f"{p}ffn_down_exps.weight"), orders)  # fmt: skip
            else:
                order = orders.get(f"{layer}")
                gate, up = get(f"{p}ffn_gate.weight"), get(f"{p}ffn_up.weight")
                for t in (gate, up):
                    if _type_name(t) != h.neuron_type:
                        raise Pi2Error(
                            f"{t.name} is {_type_name(t)}, blk.0.ffn_gate is {h.neuron_type}: mixed FFN types"
                        )
                if f"{p}ffn_down_t.weight" in tensors:
                    _add_powerinfer_ffn(w, h, layer, gate, up, tensors, order, twin_downs.get(layer))
                else:
                    down = get(f"{p}ffn_down.weight")
                    down_type = _type_name(down)
                    down_raw = _raw_rows(down)
                    down_f = decode_rows(down_raw, down_type, h.n_ff)  # (n_embd, n_ff)
                    w.add_ffn(layer, _raw_rows(gate), _raw_rows(up), down_f, order=order,
                              down_raw=down_raw, down_raw_type=down_type)  # fmt: skip
                if h.has_predictor:
                    _add_predictor(w, h, layer, tensors, order, threshold)
            if progress:
                progress(layer + 2, n_steps)
    if gguf_twin:
        twin = Path(gguf_twin)
        fd, partial = safe_write.create_temp(twin)  # exclusive, random name: a planted link is never followed
        try:
            with os.fdopen(fd, "wb") as f:
                if not sparse:
                    with open(src, "rb") as s:
                        shutil.copyfileobj(s, f)
            if sparse:
                _write_llama_twin(reader, tensors, h, twin_downs, partial)
            fd = os.open(partial, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)  # whole on disk before it takes the twin's name
            finally:
                os.close(fd)
            safe_write.commit(partial, twin)  # over a regular file only: a link or device there is refused
        except BaseException:
            out.unlink(missing_ok=True)  # no .pi2 without the twin that was asked for
            raise
        finally:
            partial.unlink(missing_ok=True)
    return {
        "out": str(out),
        "gguf_twin": str(gguf_twin) if gguf_twin else None,
        "arch": h.arch,
        "source_format": "powerinfer-gguf" if sparse else "gguf",
        "ffn_act": h.ffn_act,
        "n_layer": h.n_layer,
        "neuron_type": h.neuron_type,
        "predictor": h.has_predictor,
        "predictor_threshold": _sigmoid(threshold) if h.has_predictor else None,
        "predictor_threshold_exact": (threshold == 0.0) if h.has_predictor else None,
        "profile": str(profile) if profile is not None else None,
        "bytes": out.stat().st_size,
    }


def _sigmoid(t: float | None) -> float | None:
    return None if t is None else float(1.0 / (1.0 + np.exp(-np.float64(t))))


def _shape(t) -> list[int]:
    return [int(d) for d in t.shape]


def _check_powerinfer(tensors: dict, h: Pi2Header) -> None:
    """Every PowerInfer tensor present, typed and shaped right, before any output exists: fc1 and
    fc2 in every layer or in none, fc1 [n_embd, rank], fc2 [rank, n_ff], ffn_down_t [n_embd, n_ff],
    and an ffn_norm the predictor can be moved behind (no zero entries)."""
    with_pred = [layer for layer in range(h.n_layer) if f"blk.{layer}.fc1.weight" in tensors
                 or f"blk.{layer}.fc2.weight" in tensors]  # fmt: skip
    for layer in range(h.n_layer):
        p = f"blk.{layer}."
        down_t = tensors.get(f"{p}ffn_down_t.weight")
        if down_t is None and f"{p}ffn_down.weight" not in tensors:
            raise Pi2Error(f"GGUF tensor {p}ffn_down_t.weight is missing")
        if down_t is not None:
            if _shape(down_t) != [h.n_embd, h.n_ff]:
                raise Pi2Error(f"GGUF tensor {down_t.name} has shape {_shape(down_t)}, "
                               f"expected [{h.n_embd}, {h.n_ff}]")  # fmt: skip
            _type_name(down_t)  # raises on a type convert cannot copy
        if not with_pred:
            continue
        fc1, fc2 = tensors.get(f"{p}fc1.weight"), tensors.get(f"{p}fc2.weight")
        if fc1 is None or fc2 is None:
            need = f"{p}fc1.weight" if fc1 is None else f"{p}fc2.weight"
            have = f"{p}fc2.weight" if fc1 is None else f"{p}fc1.weight"
            if layer not in with_pred:
                have = f"blk.{with_pred[0]}.fc1.weight"
            raise Pi2Error(f"GGUF tensor {need} is missing ({have} exists: predictors come in fc1/fc2 pairs)")
        if len(fc1.shape) != 2 or _shape(fc1)[0] != h.n_embd:
            raise Pi2Error(f"GGUF tensor {fc1.name} has shape {_shape(fc1)}, expected [{h.n_embd}, rank]")
        rank = _shape(fc1)[1]
        if _shape(fc2) != [rank, h.n_ff]:
            raise Pi2Error(f"GGUF tensor {fc2.name} has shape {_shape(fc2)}, expected [{rank}, {h.n_ff}]")
        for t in (fc1, fc2):
            _type_name(t)
        norm = tensors.get(f"{p}ffn_norm.weight")
        if norm is None:
            raise Pi2Error(f"GGUF tensor {p}ffn_norm.weight is missing")
        g = decode_rows(_raw_rows(norm), _type_name(norm), h.n_embd)
        if not np.all(np.isfinite(g) & (g != 0)):
            raise Pi2Error(f"GGUF tensor {norm.name} has zero or non-finite entries: the predictor "
                           "cannot be moved behind the norm")  # fmt: skip


def _add_powerinfer_ffn(w: Pi2Writer, h: Pi2Header, layer: int, gate, up, tensors: dict, order,
                        twin_down: tuple[np.ndarray, str] | None) -> None:  # fmt: skip
    """Bundles from gate/up rows and the transposed down's rows: all three copied bit for bit when
    the down has the bundles' type (PowerInfer quantizes every matrix alike). The dense down copy,
    when there is one, is the file's own ffn_down or the twin's (twin_down)."""
    p = f"blk.{layer}."
    down_t = tensors[f"{p}ffn_down_t.weight"]
    cols = _raw_rows(down_t)  # (n_ff, row bytes): row i = column i of down
    if _type_name(down_t) != h.neuron_type:
        cols = decode_rows(cols, _type_name(down_t), h.n_embd)
    down = tensors.get(f"{p}ffn_down.weight")
    if down is not None:
        twin_down = (_raw_rows(down), _type_name(down))
    if h.dense_down and twin_down is not None:
        w.add_ffn(layer, _raw_rows(gate), _raw_rows(up), None, order=order, down_cols=cols,
                  down_raw=twin_down[0], down_raw_type=twin_down[1])  # fmt: skip
    else:
        w.add_ffn(layer, _raw_rows(gate), _raw_rows(up), None, order=order, down_cols=cols)


def _down_from_transposed(tensors: dict, h: Pi2Header, layer: int) -> tuple[np.ndarray, str]:
    """ffn_down ([n_ff, n_embd], blocks along n_ff) rebuilt from ffn_down_t in the same type: exact
    for F32/F16, re-quantized for block types. Returns (rows (n_embd, row bytes), type)."""
    t = tensors[f"blk.{layer}.ffn_down_t.weight"]
    tname = _type_name(t)
    down = np.ascontiguousarray(decode_rows(_raw_rows(t), tname, h.n_embd).T)  # (n_embd, n_ff)
    if tname not in ("F32", "F16") and h.n_ff % 32:
        raise Pi2Error(f"{t.name}: n_ff {h.n_ff} is not a multiple of 32, so no {tname} GGUF twin can hold "
                       "the untransposed down")  # fmt: skip
    return encode_rows(down, tname), tname


def _write_llama_twin(reader, tensors: dict, h: Pi2Header, downs: dict, path: Path) -> None:
    """A GGUF llama.cpp loads from a PowerInfer GGUF: magic GGUF, arch llama (keys renamed from
    bamboo.*), ffn_down instead of ffn_down_t (the bytes of the .pi2's dense copy), no predictors
    and no powerinfer.* keys. llama.cpp runs its llama FFN as SwiGLU (see docs/MODELS.md)."""
    import gguf

    arch = _field(reader, "general.architecture")
    writer = gguf.GGUFWriter(path, "llama")
    for key, field in reader.fields.items():
        if key.startswith(("GGUF.", "powerinfer.")) or key in ("general.architecture", "general.alignment"):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        name = "llama." + key[len(arch) + 1 :] if key.startswith(arch + ".") else key
        writer.add_key_value(name, field.contents(), vtype, sub)
    writer.add_string("pi2.ffn_activation", h.ffn_act)
    for t in reader.tensors:
        name = t.name
        if name.endswith((".fc1.weight", ".fc2.weight")):
            continue
        if name.endswith(".ffn_down_t.weight"):
            layer = int(name.split(".")[1])
            raw, tname = downs[layer]
            name, ne = f"blk.{layer}.ffn_down.weight", (h.n_ff, h.n_embd)
        else:
            raw, tname, ne = _raw_rows(t), _type_name(t), tuple(int(d) for d in t.shape)
        qtype = gguf.GGMLQuantizationType[tname]
        if tname in ("F32", "F16"):
            data = np.ascontiguousarray(raw).view(np.float32 if tname == "F32" else np.float16)
            writer.add_tensor(name, data.reshape(tuple(reversed(ne))), raw_dtype=qtype)
        else:
            writer.add_tensor(name, np.ascontiguousarray(raw), raw_dtype=qtype)  # shape from the bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_predictor(w: Pi2Writer, h: Pi2Header, layer: int, tensors: dict, order, threshold: float) -> None:
    """pred_fc1 = fc1 / ffn_norm (see the module doc), F16 unless that overflows; pred_fc2 = fc2's
    rows in bundle order, bit for bit; pred_threshold = sigmoid(PowerInfer's threshold)."""
    p = f"blk.{layer}."
    fc1, fc2 = tensors[f"{p}fc1.weight"], tensors[f"{p}fc2.weight"]
    norm = tensors[f"{p}ffn_norm.weight"]
    g = decode_rows(_raw_rows(norm), _type_name(norm), h.n_embd).reshape(-1).astype(np.float64)
    rank = int(fc1.shape[1])
    w1 = decode_rows(_raw_rows(fc1), _type_name(fc1), h.n_embd).astype(np.float64) / g  # (rank, n_embd)
    fits_f16 = np.abs(w1).max(initial=0.0) < 60000.0
    w.add_tensor(f"{p}pred_fc1", w1.astype(np.float32), "F16" if fits_f16 else "F32", (h.n_embd, rank))
    rows = _raw_rows(fc2)  # (n_ff, row bytes): row i scores original neuron i
    if order is not None:
        rows = rows[np.asarray(order)]
    w.add_tensor(f"{p}pred_fc2", np.ascontiguousarray(rows), _type_name(fc2), (rank, h.n_ff))
    w.add_tensor(f"{p}pred_threshold", np.array([_sigmoid(threshold)], dtype=np.float32), "F32", (1,))


def _add_experts(w: Pi2Writer, h: Pi2Header, layer: int, gate, up, down, orders: dict) -> None:
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
        w.add_ffn(layer, g, u, d, expert=e, order=orders.get(f"{layer}.{e}"), down_raw=d_raw,
                  down_raw_type=down_type)  # fmt: skip
