"""The .pi2 model file: a streaming writer and a validating reader (layout in docs/FORMAT.md).

Writing a model:

    header = Pi2Header(arch="llama", ffn_act="swiglu", n_vocab=..., n_embd=..., n_layer=...,
                       n_head=..., n_head_kv=..., n_ff=..., neuron_type="Q4_0")
    with Pi2Writer("model.pi2", header, tokenizer_blob=blob, metadata={"synthetic": True}) as w:
        w.add_tensor("token_embd.weight", embeddings_f32, "Q8_0")   # floats: quantized here
        ...all resident tensors (any order)...
        for layer in range(n_layer):
            w.add_ffn(layer, gate, up, down, order=hot_first)       # then the neuron region

Tensors and FFN blocks may be added in any interleaving (FFN blocks in layer, expert order); the neuron
region has a size known from the header, so it sits first and each block is written at its final
offset as it arrives: a model larger than memory needs only one layer's FFN in RAM.
The file appears under its final name only when `close()` (the `with` exit) has written the header
and checksums; on an exception the partial file is removed.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pi2cli import safe_write

MAGIC = b"PI2MODEL"
FORMAT_VERSION = 1
PAGE = 4096
HEADER_BYTES = 4096
ENTRY_BYTES = 128
NAME_BYTES = 64
MAX_DIMS = 4
MAX_TENSORS = 1_000_000  # the engine's limit too
QK = 32

ARCHES = {"llama": 1, "moe": 2}
ACTS = {"swiglu": 1, "relu": 2, "drelu": 3}
ROPE_NORMAL = 0

FLAG_TIED_EMBEDDINGS = 1 << 0
FLAG_DENSE_DOWN = 1 << 1
FLAG_PREDICTOR = 1 << 2
FLAG_GATE_PREDICTOR = 1 << 3  # the predictor is the thresholded gate (CATS): blk.L.pred_gate

# Type ids are ggml's. I32 is for index tensors (neuron order) only.
TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "I32": 26}
TYPE_NAMES = {v: k for k, v in TYPES.items()}
WEIGHT_TYPES = ("F32", "F16", "Q4_0", "Q4_1", "Q8_0")
# (bytes per block, elements per block)
BLOCK = {"F32": (4, 1), "F16": (2, 1), "I32": (4, 1), "Q4_0": (18, QK), "Q4_1": (20, QK), "Q8_0": (34, QK)}
# By type id, for the vectorized table check: elements and bytes per block (0: not a tensor type here).
_PER_BLOCK = np.zeros(max(TYPES.values()) + 1, dtype=np.uint64)
_BLOCK_BYTES = np.zeros_like(_PER_BLOCK)
for _name, _id in TYPES.items():
    _BLOCK_BYTES[_id], _PER_BLOCK[_id] = BLOCK[_name]

# Sections in the order of the header's section table (file order: neurons, resident, table,
# tokenizer, metadata). Tensor entries name their region by these ids.
SEC_NEURONS, SEC_RESIDENT, SEC_TABLE, SEC_TOKENIZER, SEC_METADATA = range(5)
SECTION_NAMES = ("neuron region", "resident region", "tensor table", "tokenizer", "metadata")
N_SECTIONS = 5

# Header: fixed fields (128 bytes), the section table, zero padding, the header CRC at 4092.
_HEADER_FIELDS = struct.Struct("<8s14Iff4I3Q2IQ")
_SECTION = struct.Struct("<QQII")
_SECTIONS_AT = 128
_HEADER_CRC_AT = HEADER_BYTES - 4
_ENTRY = struct.Struct(f"<{NAME_BYTES}sII4QIIQQ")
_ENTRY_DTYPE = np.dtype([("name", f"S{NAME_BYTES}"), ("type", "<u4"), ("n_dims", "<u4"), ("ne", "<u8", (4,)),
                         ("region", "<u4"), ("reserved", "<u4"), ("offset", "<u8"), ("nbytes", "<u8")])  # fmt: skip
assert _HEADER_FIELDS.size == _SECTIONS_AT and _ENTRY.size == ENTRY_BYTES == _ENTRY_DTYPE.itemsize


class Pi2FormatError(ValueError):
    """A .pi2 file (or a writer call) that breaks the format; the message is one line."""


def row_size(type_name: str, n: int) -> int:
    nbytes, per = BLOCK[type_name]
    if n % per:
        raise Pi2FormatError(f"{type_name} rows need a multiple of {per} elements, got {n}")
    return n // per * nbytes


def round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def default_bundle_align(part_bytes: int) -> int:
    """4 KiB (the page and phone-storage block) once a bundle is 2 KiB or more; 512 bytes (the
    smallest O_DIRECT unit) for smaller bundles, so tiny test models do not double in size."""
    return PAGE if 3 * part_bytes >= PAGE // 2 else 512


def hparam_problems(n_ctx_train, rope_theta, rms_eps) -> list[tuple[str, object, str]]:
    """(field, value, why) for each of the scalar hyperparameters the engine would refuse: rule 8 of
    docs/FORMAT.md as native/src/model/pi2file.c applies it to the header's u32 and float32 fields,
    so a value that only fails after rounding to float32 (1e39 -> inf, 1e-50 -> 0) counts too."""
    problems = []
    if not (isinstance(n_ctx_train, numbers.Integral) and not isinstance(n_ctx_train, bool)
            and 1 <= n_ctx_train < 1 << 32):  # fmt: skip
        problems.append(("n_ctx_train", n_ctx_train, "must be an integer in [1, 2^32)"))
    for name, value in (("rope_theta", rope_theta), ("rms_eps", rms_eps)):
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if ok:
            with np.errstate(over="ignore"):
                as_f32 = float(np.float32(value))
            ok = math.isfinite(as_f32) and as_f32 > 0
        if not ok:
            problems.append((name, value, "must be finite and positive as a float32"))
    return problems


@dataclass
class Pi2Header:
    arch: str  # "llama" (dense) or "moe" (Mixtral-style)
    ffn_act: str  # "swiglu", "relu" (relu(gate)*up) or "drelu" (relu(gate)*relu(up))
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int  # FFN neurons per layer (per expert)
    neuron_type: str  # quant type of the neuron region's bundles
    head_dim: int = 0  # 0: n_embd // n_head
    n_expert: int = 0
    n_expert_used: int = 0
    n_ctx_train: int = 4096
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tied_embeddings: bool = False
    dense_down: bool = True  # also store each FFN down matrix densely in the resident region
    has_predictor: bool = False
    gate_predictor: bool = False  # the predictor is blk.L.pred_gate thresholded on |silu| (CATS)
    bundle_align: int = 0  # 0: default_bundle_align()
    rope_type: int = ROPE_NORMAL

    def __post_init__(self):
        if not self.head_dim and self.n_head:
            self.head_dim = self.n_embd // self.n_head
        if not self.bundle_align and self.n_embd and self.neuron_type in BLOCK:
            self.bundle_align = default_bundle_align(self.part_bytes)

    @property
    def part_bytes(self) -> int:
        return row_size(self.neuron_type, self.n_embd)

    @property
    def bundle_stride(self) -> int:
        return round_up(3 * self.part_bytes, self.bundle_align)

    @property
    def ffn_block_bytes(self) -> int:
        """Bytes of one layer's (one expert's) bundles in the neuron region, 4 KiB-rounded."""
        return round_up(self.n_ff * self.bundle_stride, PAGE)

    @property
    def neuron_region_bytes(self) -> int:
        return self.n_layer * self.n_ffn_blocks * self.ffn_block_bytes

    def ffn_block_offset(self, layer: int, expert: int = 0) -> int:
        """Offset of a block's first bundle from the start of the neuron region."""
        return (layer * self.n_ffn_blocks + expert) * self.ffn_block_bytes

    @property
    def n_ffn_blocks(self) -> int:
        """FFN blocks per layer: 1 for dense models, n_expert for MoE."""
        return self.n_expert if self.arch == "moe" else 1

    @property
    def flags(self) -> int:
        return (
            (FLAG_TIED_EMBEDDINGS if self.tied_embeddings else 0)
            | (FLAG_DENSE_DOWN if self.dense_down else 0)
            | (FLAG_PREDICTOR if self.has_predictor else 0)
            | (FLAG_GATE_PREDICTOR if self.gate_predictor else 0)
        )

    def validate(self) -> None:
        if self.arch not in ARCHES:
            raise Pi2FormatError(f"unknown arch '{self.arch}' (known: {', '.join(ARCHES)})")
        if self.ffn_act not in ACTS:
            raise Pi2FormatError(f"unknown ffn_act '{self.ffn_act}' (known: {', '.join(ACTS)})")
        if self.neuron_type not in WEIGHT_TYPES:
            raise Pi2FormatError(f"neuron_type must be one of {', '.join(WEIGHT_TYPES)}")
        for name in ("n_vocab", "n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "head_dim"):
            if getattr(self, name) <= 0:
                raise Pi2FormatError(f"{name} must be positive")
        # The engine's ranges (docs/FORMAT.md, validation rule 8): a file outside them would be refused.
        for name, hi in (("n_vocab", 1 << 24), ("n_embd", 65536), ("n_layer", 1024), ("n_head", 1024),
                         ("head_dim", 1024), ("n_ff", 1 << 20)):  # fmt: skip
            if getattr(self, name) > hi:
                raise Pi2FormatError(f"{name} {getattr(self, name)} is above {hi} (.pi2 rule 8)")
        if self.n_head % self.n_head_kv:
            raise Pi2FormatError("n_head must be a multiple of n_head_kv")
        if self.head_dim % 2:
            raise Pi2FormatError("head_dim must be even (RoPE rotates pairs)")
        if self.arch == "moe" and not (0 < self.n_expert_used <= self.n_expert):
            raise Pi2FormatError("moe needs 0 < n_expert_used <= n_expert")
        if self.arch == "llama" and (self.n_expert or self.n_expert_used):
            raise Pi2FormatError("a dense llama model has n_expert = n_expert_used = 0")
        for name, value, why in hparam_problems(self.n_ctx_train, self.rope_theta, self.rms_eps):
            raise Pi2FormatError(f"{name} {value!r} {why} (.pi2 rule 8)")
        if self.gate_predictor and not (self.has_predictor and self.ffn_act == "swiglu"):
            raise Pi2FormatError("a gate predictor needs has_predictor and a SwiGLU FFN (.pi2 rule 8)")
        a = self.bundle_align
        if a < 512 or a > PAGE or a & (a - 1):
            raise Pi2FormatError("bundle_align must be a power of two in [512, 4096]")
        row_size(self.neuron_type, self.n_embd)


@dataclass
class TensorEntry:
    name: str
    type: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length (contiguous)
    region: int  # SEC_RESIDENT or SEC_NEURONS
    offset: int  # from the start of its region
    nbytes: int

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[1:])) if len(self.shape) > 1 else 1


def tensor_nbytes(type_name: str, shape: tuple[int, ...]) -> int:
    rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return row_size(type_name, shape[0]) * rows


def encode_rows(values: np.ndarray, type_name: str) -> np.ndarray:
    """Float rows (..., n) -> their bytes in `type_name` (ggml's reference quantization)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if type_name == "F32":
        return values.view(np.uint8).reshape(*values.shape[:-1], -1)
    if type_name == "F16":
        return values.astype(np.float16).view(np.uint8).reshape(*values.shape[:-1], -1)
    import gguf

    return gguf.quants.quantize(values, gguf.GGMLQuantizationType[type_name])


def decode_rows(raw: np.ndarray, type_name: str, n: int) -> np.ndarray:
    """Bytes of rows in `type_name` -> float32 rows (..., n)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if type_name == "F32":
        return raw.view(np.float32).reshape(*raw.shape[:-1], n)
    if type_name == "F16":
        return raw.view(np.float16).astype(np.float32).reshape(*raw.shape[:-1], n)
    if type_name == "I32":
        return raw.view(np.int32).reshape(*raw.shape[:-1], n)
    import gguf

    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(*raw.shape[:-1], n)


def _as_rows_bytes(data: np.ndarray, type_name: str, shape: tuple[int, ...]) -> bytes:
    """Accept float values (quantized here) or raw uint8 bytes already in `type_name` blocks."""
    expected = tensor_nbytes(type_name, shape)
    arr = np.asarray(data)
    if arr.dtype == np.uint8:
        if arr.nbytes != expected:
            raise Pi2FormatError(f"raw {type_name} data has {arr.nbytes} bytes, shape needs {expected}")
        return np.ascontiguousarray(arr).tobytes()
    if type_name == "I32":
        return np.ascontiguousarray(arr, dtype="<i4").tobytes()
    if arr.size != int(np.prod(shape)):
        raise Pi2FormatError(f"data has {arr.size} values, shape {shape} needs {int(np.prod(shape))}")
    return encode_rows(arr.reshape(-1, shape[0]), type_name).tobytes()


def bundle_suffix(header: Pi2Header, expert: int | None) -> str:
    return f".{expert}" if header.arch == "moe" else ""


class Pi2Writer:
    """Streams a .pi2 file. The neuron region's size follows from the header, so it comes first
    (at 4 KiB) and each FFN block is written straight to its final offset; resident tensors append
    after it. close() writes the tensor table, tokenizer, metadata and header, then renames."""

    def __init__(
        self,
        path: str | os.PathLike,
        header: Pi2Header,
        tokenizer_blob: bytes = b"",
        metadata: dict | None = None,
    ):
        header.validate()
        self.path = Path(path)
        self.header = header
        self.tokenizer_blob = bytes(tokenizer_blob)
        self.metadata = dict(metadata or {})
        self.entries: list[TensorEntry] = []
        self._names: set[str] = set()
        # created exclusively beside the target, never through a link (pi2cli.safe_write)
        self._fd, self._tmp = safe_write.create_temp(self.path)
        self._neuron_start = HEADER_BYTES
        self._resident_start = HEADER_BYTES + header.neuron_region_bytes
        self._resident_pos = 0  # bytes written to the resident region
        self._crc = {SEC_NEURONS: 0, SEC_RESIDENT: 0}
        self._ffn_done = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once close() finished (the file is in place) or abort() dropped it."""
        return self._closed

    def __enter__(self) -> Pi2Writer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _pwrite(self, data: bytes, pos: int) -> None:
        view = memoryview(data)
        while view:
            n = os.pwrite(self._fd, view, pos)
            view, pos = view[n:], pos + n

    def _resident_append(self, data: bytes) -> int:
        """Append to the resident region at a 4 KiB boundary; returns the region offset."""
        pad = round_up(self._resident_pos, PAGE) - self._resident_pos
        if pad:
            self._crc[SEC_RESIDENT] = zlib.crc32(b"\0" * pad, self._crc[SEC_RESIDENT])
            self._resident_pos += pad
        offset = self._resident_pos
        self._pwrite(data, self._resident_start + offset)
        self._crc[SEC_RESIDENT] = zlib.crc32(data, self._crc[SEC_RESIDENT])
        self._resident_pos += len(data)
        return offset

    def _add_entry(
        self, name: str, type_name: str, shape: tuple[int, ...], region: int, offset: int, nbytes: int
    ):
        if not name or len(name.encode()) >= NAME_BYTES:
            raise Pi2FormatError(f"tensor name '{name}' must be 1..{NAME_BYTES - 1} bytes")
        if name in self._names:
            raise Pi2FormatError(f"tensor '{name}' added twice")
        self._names.add(name)
        self.entries.append(TensorEntry(name, type_name, shape, region, offset, nbytes))

    def add_tensor(self, name: str, data: np.ndarray, type_name: str, shape: tuple[int, ...] | None = None):
        """A resident tensor. `data`: float values (quantized to `type_name` here) or uint8 bytes
        already in that type's blocks (copied as is). `shape` is ggml order (row length first);
        by default the reversed numpy shape of float data."""
        self._check_open()
        if type_name not in TYPES:
            raise Pi2FormatError(f"tensor '{name}': unknown type {type_name}")
        if shape is None:
            arr = np.asarray(data)
            if arr.dtype == np.uint8:
                raise Pi2FormatError(f"tensor '{name}': raw bytes need an explicit shape")
            shape = tuple(reversed(arr.shape))
        shape = tuple(int(d) for d in shape)
        if not 1 <= len(shape) <= MAX_DIMS or any(d <= 0 for d in shape):
            raise Pi2FormatError(f"tensor '{name}': bad shape {shape}")
        raw = _as_rows_bytes(data, type_name, shape)
        if name in self._names:
            raise Pi2FormatError(f"tensor '{name}' added twice")
        offset = self._resident_append(raw)
        self._add_entry(name, type_name, shape, SEC_RESIDENT, offset, len(raw))

    def add_ffn(
        self,
        layer: int,
        gate: np.ndarray,
        up: np.ndarray,
        down: np.ndarray | None,
        expert: int | None = None,
        order: np.ndarray | None = None,
        down_raw: np.ndarray | None = None,
        down_raw_type: str | None = None,
        down_cols: np.ndarray | None = None,
    ) -> None:
        """One layer's (one expert's) FFN as neuron bundles; blocks go in (layer, expert) order.

        gate, up: (n_ff, n_embd) rows: floats, or uint8 bytes already in neuron_type blocks (copied
          losslessly).
        down: float (n_embd, n_ff), the usual down matrix (GGUF ggml shape [n_ff, n_embd]). Its
          columns become the bundles' down parts, quantized to neuron_type along n_embd.
        order: bundle k holds original neuron order[k] (hottest first); default identity. Stored as
          the resident I32 tensor blk.L.ffn_order[.E].
        down_raw, down_raw_type: bytes of the dense down matrix in its own type, stored as is as
          blk.L.ffn_down.weight[.E] when the header has dense_down (lossless GGUF copy); without
          them `down` is quantized to neuron_type for that copy.
        down_cols: instead of `down` (pass down=None), the down columns as rows (n_ff, n_embd) in
          original neuron order: floats, or uint8 bytes already in neuron_type blocks, copied
          losslessly (a transposed down such as PowerInfer's ffn_down_t is quantized along n_embd).
        """
        self._check_open()
        h = self.header
        e = 0 if expert is None else int(expert)
        if (h.arch == "moe") != (expert is not None):
            raise Pi2FormatError("give expert= exactly when the model is moe")
        want = divmod(self._ffn_done, h.n_ffn_blocks)
        if (layer, e) != want or layer >= h.n_layer:
            raise Pi2FormatError(
                f"ffn blocks go in (layer, expert) order; expected {want}, got ({layer}, {e})"
            )
        suffix = bundle_suffix(h, expert)
        n_ff, n_embd, t, part = h.n_ff, h.n_embd, h.neuron_type, h.part_bytes
        order = np.arange(n_ff, dtype=np.int32) if order is None else np.asarray(order, dtype=np.int32)
        if order.shape != (n_ff,) or not np.array_equal(np.sort(order), np.arange(n_ff)):
            raise Pi2FormatError(f"layer {layer}: order must be a permutation of 0..{n_ff - 1}")

        def rows_bytes(x, what) -> np.ndarray:
            x = np.asarray(x)
            if x.dtype == np.uint8:
                if x.shape != (n_ff, part):
                    raise Pi2FormatError(f"layer {layer} {what}: raw rows must be ({n_ff}, {part}) bytes")
                return x
            if x.shape != (n_ff, n_embd):
                raise Pi2FormatError(f"layer {layer} {what}: expected ({n_ff}, {n_embd}), got {x.shape}")
            return encode_rows(x, t)

        if (down is None) == (down_cols is None):
            raise Pi2FormatError(f"layer {layer}: give exactly one of down and down_cols")
        if down is not None:
            down = np.asarray(down, dtype=np.float32)
            if down.shape != (n_embd, n_ff):
                raise Pi2FormatError(f"layer {layer} down: expected ({n_embd}, {n_ff}), got {down.shape}")
            cols = encode_rows(np.ascontiguousarray(down.T), t)
        else:
            cols = rows_bytes(down_cols, "down_cols")
        stride = h.bundle_stride
        bundles = np.zeros((n_ff, stride), dtype=np.uint8)
        bundles[:, 0:part] = rows_bytes(gate, "gate")[order]
        bundles[:, part : 2 * part] = rows_bytes(up, "up")[order]
        bundles[:, 2 * part : 3 * part] = cols[order]
        block = bundles.tobytes()
        block += b"\0" * (h.ffn_block_bytes - len(block))
        offset = h.ffn_block_offset(layer, e)
        self._pwrite(block, self._neuron_start + offset)
        self._crc[SEC_NEURONS] = zlib.crc32(block, self._crc[SEC_NEURONS])
        self._add_entry(
            f"blk.{layer}.ffn_bundles{suffix}", t, (n_embd, n_ff), SEC_NEURONS, offset, n_ff * stride
        )
        self._ffn_done += 1

        self.add_tensor(f"blk.{layer}.ffn_order{suffix}", order, "I32", (n_ff,))
        if h.dense_down:
            name = f"blk.{layer}.ffn_down.weight{suffix}"
            if down_raw is not None:
                self.add_tensor(
                    name, np.asarray(down_raw, dtype=np.uint8), down_raw_type or t, (n_ff, n_embd)
                )
            else:
                if down is None:  # the dense copy from the columns, re-quantized along n_ff
                    down = np.ascontiguousarray(decode_rows(cols, t, n_embd).T)
                self.add_tensor(name, down, t, (n_ff, n_embd))

    def _check_open(self) -> None:
        if self._closed:
            raise Pi2FormatError("writer is closed")

    def close(self) -> Path:
        """Write table, tokenizer, metadata and header; rename into place. Returns the path."""
        self._check_open()
        h = self.header
        if self._ffn_done != h.n_layer * h.n_ffn_blocks:
            self.abort()
            raise Pi2FormatError(
                f"only {self._ffn_done} of {h.n_layer * h.n_ffn_blocks} FFN blocks were added"
            )
        resident_size = self._resident_pos
        pos = self._resident_start + round_up(resident_size, PAGE)
        sections = [(0, 0, 0)] * N_SECTIONS
        sections[SEC_NEURONS] = (self._neuron_start, h.neuron_region_bytes, self._crc[SEC_NEURONS])
        sections[SEC_RESIDENT] = (self._resident_start, resident_size, self._crc[SEC_RESIDENT])
        table = b"".join(_pack_entry(e) for e in self.entries)
        meta = json.dumps(self.metadata, sort_keys=True).encode()
        for sec, data in ((SEC_TABLE, table), (SEC_TOKENIZER, self.tokenizer_blob), (SEC_METADATA, meta)):
            self._pwrite(data, pos)
            sections[sec] = (pos, len(data), zlib.crc32(data))
            pos = round_up(pos + len(data), PAGE)
        file_bytes = pos
        os.ftruncate(self._fd, file_bytes)
        header = bytearray(HEADER_BYTES)
        _HEADER_FIELDS.pack_into(
            header, 0, MAGIC, FORMAT_VERSION, HEADER_BYTES, ARCHES[h.arch], ACTS[h.ffn_act],
            h.n_vocab, h.n_embd, h.n_layer, h.n_head, h.n_head_kv, h.head_dim, h.n_ff,
            h.n_expert, h.n_expert_used, h.n_ctx_train, h.rope_theta, h.rms_eps, h.rope_type,
            h.flags, TYPES[h.neuron_type], h.bundle_align, h.part_bytes, h.bundle_stride,
            h.ffn_block_bytes, len(self.entries), 0, file_bytes,
        )  # fmt: skip
        for i, (off, size, crc) in enumerate(sections):
            _SECTION.pack_into(header, _SECTIONS_AT + i * _SECTION.size, off, size, crc, 0)
        struct.pack_into("<I", header, _HEADER_CRC_AT, zlib.crc32(bytes(header[:_HEADER_CRC_AT])))
        self._pwrite(bytes(header), 0)
        os.fsync(self._fd)
        os.close(self._fd)
        self._closed = True
        return safe_write.commit(self._tmp, self.path)

    def abort(self) -> None:
        """Drop the partial file (called on exceptions inside `with`)."""
        if not self._closed:
            self._closed = True
            os.close(self._fd)
            self._tmp.unlink(missing_ok=True)


def _pack_entry(e: TensorEntry) -> bytes:
    ne = list(e.shape) + [1] * (MAX_DIMS - len(e.shape))
    return _ENTRY.pack(e.name.encode(), TYPES[e.type], len(e.shape), *ne, e.region, 0, e.offset, e.nbytes)


def _entry_name(raw_name: bytes) -> bytes:
    return raw_name.split(b"\0", 1)[0]


def _first_duplicate(raw: np.ndarray, n: int, inner_nul: list[int]) -> int:
    """Index of the first entry whose name (bytes up to the first NUL, as the engine compares them)
    an earlier entry has; n when none. The names are hashed as 8 words each by numpy and only
    entries with equal hashes are compared, so a 1M-entry table needs no 1M-key dict."""
    words = raw.view("<u8").reshape(n, ENTRY_BYTES // 8)[:, : NAME_BYTES // 8]
    h = _name_hash(words)
    for k in inner_nul:  # bytes after an inner NUL are not part of the name: hash what is
        row = np.frombuffer(_entry_name(raw[k * ENTRY_BYTES : k * ENTRY_BYTES + NAME_BYTES].tobytes())
                            .ljust(NAME_BYTES, b"\0"), dtype="<u8")  # fmt: skip
        h[k] = _name_hash(row[None, :])[0]
    order = np.argsort(h, kind="stable")
    hs = h[order]
    same = np.flatnonzero(hs[1:] == hs[:-1])
    if not same.size:
        return n
    first, seen = n, {}
    for k in sorted({int(order[i]) for i in same} | {int(order[i + 1]) for i in same}):
        name = _entry_name(raw[k * ENTRY_BYTES : k * ENTRY_BYTES + NAME_BYTES].tobytes())
        if name in seen:
            return k  # ascending k: the first repeat
        seen[name] = k
    return first


def _name_hash(words: np.ndarray) -> np.ndarray:
    h = np.full(words.shape[0], 0xCBF29CE484222325, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(words.shape[1]):
            h = (h ^ words[:, k]) * np.uint64(0x100000001B3)  # FNV-1a over 8-byte words
    return h


class _TensorTable(Mapping):
    """name -> TensorEntry over the validated table; the names and each TensorEntry are made on first
    use: a 1M-entry table would otherwise cost a second in objects nobody reads."""

    def __init__(self, table: np.ndarray, inner_nul: list[int]):
        self._t, self._inner_nul, self._names, self._index, self._built = table, inner_nul, None, None, {}

    def _lookup(self) -> dict[str, int]:
        if self._index is None:
            listed = self._t["name"].tolist()  # numpy drops the trailing NULs
            # The engine compares names as bytes; any byte but NUL is allowed, so decode losslessly.
            try:
                names = list(map(bytes.decode, listed))
            except UnicodeDecodeError:
                names = [b.decode("utf-8", "backslashreplace") for b in listed]
            for k in self._inner_nul:
                names[k] = _entry_name(listed[k]).decode("utf-8", "backslashreplace")
            self._names, self._index = names, dict(zip(names, range(len(names)), strict=True))
        return self._index

    def __getitem__(self, name: str) -> TensorEntry:
        e = self._built.get(name)
        if e is None:
            r = self._t[self._lookup()[name]]
            n_dims = int(r["n_dims"])
            e = TensorEntry(name, TYPE_NAMES[int(r["type"])], tuple(int(x) for x in r["ne"][:n_dims]),
                            int(r["region"]), int(r["offset"]), int(r["nbytes"]))  # fmt: skip
            self._built[name] = e
        return e

    def __contains__(self, name) -> bool:
        return name in self._lookup()

    def __iter__(self):
        self._lookup()
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._t)


class Pi2File:
    """Reads and validates a .pi2 file (numpy memmap for the data). Raises Pi2FormatError with one
    line naming the problem and the rule it breaks; tests, the planner, `pi2 models show` and the
    reference forward use it, the engine has its own reader (native/src/model/pi2file.c).

    The checks are the engine's, in the engine's order, numbered as in docs/FORMAT.md ("Validation
    rules"), so a file one reader refuses the other refuses too. Python integers do not wrap, so sizes
    and shapes are exact here (a 1 x 2^32 x 2^32 tensor needs 2^64 elements, not 0)."""

    def __init__(self, path: str | os.PathLike, verify: bool = True):
        self.path = Path(path)
        try:
            st = self.path.stat()
        except OSError as err:
            raise Pi2FormatError(f"{self.path}: cannot open: {err.strerror or err}") from None
        if not self.path.is_file():
            self._fail(1, "not a regular file")
        size = st.st_size
        if size < HEADER_BYTES:
            self._fail(1, f"truncated: {size} bytes, a .pi2 header alone is {HEADER_BYTES}")
        try:
            self.data = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as err:
            raise Pi2FormatError(f"{self.path}: cannot map: {err}") from None
        raw = bytes(self.data[:HEADER_BYTES])
        f = _HEADER_FIELDS.unpack_from(raw, 0)
        self._check_header(f, raw, size)
        self.sections = [
            _SECTION.unpack_from(raw, _SECTIONS_AT + i * _SECTION.size)[:3] for i in range(N_SECTIONS)
        ]
        self._check_sections(f[24], size)
        for i in range(SEC_RESIDENT, N_SECTIONS):  # as the engine: the neuron region only when asked
            self._check_crc(i)
        if verify:
            self._check_crc(SEC_NEURONS)
        self.tensors: Mapping[str, TensorEntry] = {}
        self._read_table(f[24])
        off, n, _ = self.sections[SEC_METADATA]
        try:
            self.metadata = json.loads(bytes(self.data[off : off + n]).decode("utf-8") or "{}")
        except (ValueError, RecursionError) as err:
            self._fail(20, f"metadata is not UTF-8 JSON ({str(err)[:80]})")
        if not isinstance(self.metadata, dict):
            self._fail(20, "metadata is not a JSON object")
        off, n, _ = self.sections[SEC_TOKENIZER]
        self.tokenizer_blob = bytes(self.data[off : off + n])

    def _fail(self, rule: int, message: str):
        raise Pi2FormatError(f"{self.path}: {message} (.pi2 rule {rule}, docs/FORMAT.md)")

    def _check_header(self, f: tuple, raw: bytes, size: int) -> None:
        if f[0] != MAGIC:
            self._fail(2, "not a .pi2 model file (bad magic)")
        if f[1] != FORMAT_VERSION:
            self._fail(
                3, f"format version {f[1]}, this reader knows version {FORMAT_VERSION} (re-convert the model)"
            )
        (crc,) = struct.unpack_from("<I", raw, _HEADER_CRC_AT)
        if zlib.crc32(raw[:_HEADER_CRC_AT]) != crc:
            self._fail(4, "header checksum mismatch (corrupted header)")
        if f[2] != HEADER_BYTES:
            self._fail(5, f"header_bytes is {f[2]}, expected {HEADER_BYTES}")
        if f[26] != size:
            self._fail(6, f"file is {size} bytes but its header says {f[26]} (truncated or padded file)")
        arch = {v: k for k, v in ARCHES.items()}.get(f[3])
        act = {v: k for k, v in ACTS.items()}.get(f[4])
        if arch is None:
            self._fail(7, f"unknown arch {f[3]}")
        if act is None:
            self._fail(7, f"unknown ffn activation {f[4]}")
        (n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_expert, n_expert_used, n_ctx,
         theta, eps, rope, flags) = f[5:19]  # fmt: skip
        checks = [
            (1 <= n_vocab <= 1 << 24, f"n_vocab {n_vocab} out of range [1, 2^24]"),
            (32 <= n_embd <= 65536 and n_embd % 32 == 0, f"n_embd {n_embd} is not a multiple of 32 in [32, 65536]"),
            (1 <= n_layer <= 1024, f"n_layer {n_layer} out of range [1, 1024]"),
            (1 <= n_head <= 1024 and n_head_kv >= 1 and n_head % n_head_kv == 0,
             f"n_head {n_head} / n_head_kv {n_head_kv}: need n_head in [1, 1024] and n_head_kv >= 1 dividing it"),
            (2 <= head_dim <= 1024 and head_dim % 2 == 0, f"head_dim {head_dim} must be even in [2, 1024]"),
            (1 <= n_ff <= 1 << 20, f"n_ff {n_ff} out of range [1, 2^20]"),
            (2 <= n_expert <= 256 and 1 <= n_expert_used <= n_expert if arch == "moe" else n_expert == n_expert_used == 0,
             f"experts {n_expert} (used {n_expert_used}): moe needs 2..256 and 1..n_expert, dense 0 and 0"),
            (n_ctx >= 1, "n_ctx_train is 0"),
            (math.isfinite(theta) and theta > 0, "rope_theta must be finite and positive"),
            (math.isfinite(eps) and eps > 0, "rms_eps must be finite and positive"),
            (rope == ROPE_NORMAL, f"unknown rope_type {rope}"),
            (flags & ~15 == 0, f"unknown flags 0x{flags:x}"),
            (not flags & FLAG_GATE_PREDICTOR or (flags & FLAG_PREDICTOR and act == "swiglu"),
             "a gate predictor (flags bit3) needs the predictor bit (bit2) and a SwiGLU FFN"),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                self._fail(8, message)
        neuron_type = TYPE_NAMES.get(f[19])
        if neuron_type not in WEIGHT_TYPES:
            self._fail(9, f"neuron_type {f[19]} is not a weight type")
        a = f[20]
        if a < 512 or a > PAGE or a & (a - 1):
            self._fail(9, f"bundle_align {a} is not a power of two in [512, 4096]")
        if n_embd % BLOCK[neuron_type][1]:
            self._fail(9, f"n_embd {n_embd} does not fill whole {neuron_type} blocks")
        self.header = Pi2Header(
            arch=arch, ffn_act=act, n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
            n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff, n_expert=n_expert, n_expert_used=n_expert_used,
            n_ctx_train=n_ctx, rope_theta=theta, rms_eps=eps, rope_type=rope,
            tied_embeddings=bool(flags & FLAG_TIED_EMBEDDINGS), dense_down=bool(flags & FLAG_DENSE_DOWN),
            has_predictor=bool(flags & FLAG_PREDICTOR), gate_predictor=bool(flags & FLAG_GATE_PREDICTOR),
            neuron_type=neuron_type, bundle_align=a,
        )  # fmt: skip
        h = self.header
        if (f[21], f[22], f[23]) != (h.part_bytes, h.bundle_stride, h.ffn_block_bytes):
            self._fail(
                9,
                f"bundle geometry (part {f[21]}, stride {f[22]}, block {f[23]}) does not match the dimensions",
            )
        if not 1 <= f[24] <= MAX_TENSORS:
            self._fail(10, f"n_tensors {f[24]} out of range [1, {MAX_TENSORS}]")

    def _check_sections(self, n_tensors: int, size: int) -> None:
        for s, (off, n, _) in enumerate(self.sections):
            name = SECTION_NAMES[s]
            if off % PAGE or off < HEADER_BYTES:
                self._fail(11, f"{name} offset {off} is not a 4 KiB boundary after the header")
            if off + n > size:
                self._fail(11, f"{name} [{off}, +{n}) lies beyond the end of the file")
            for t in range(s):
                o_off, o_n, _ = self.sections[t]
                if n and o_n and off < o_off + o_n and o_off < off + n:
                    self._fail(11, f"sections {SECTION_NAMES[t]} and {name} overlap")
        need = self.header.neuron_region_bytes
        if self.sections[SEC_NEURONS][1] != need:
            self._fail(
                12, f"neuron region is {self.sections[SEC_NEURONS][1]} bytes, the dimensions need {need}"
            )
        if self.sections[SEC_TABLE][1] != n_tensors * ENTRY_BYTES:
            self._fail(12, f"tensor table is {self.sections[SEC_TABLE][1]} bytes, {n_tensors} entries need "
                           f"{n_tensors * ENTRY_BYTES}")  # fmt: skip

    def _check_crc(self, s: int) -> None:
        off, n, crc = self.sections[s]
        if zlib.crc32(self.data[off : off + n]) != crc:
            self._fail(13, f"{SECTION_NAMES[s]} checksum mismatch (corrupted file)")

    def _read_table(self, n_tensors: int) -> None:
        """Rules 14-19 over the whole table at once (numpy; a 1M-entry table in a fraction of a second,
        as the engine), then the entry-by-entry checks below only for the entries numpy flagged, so the
        first problem is still reported as the engine reports it: the first bad entry, its first rule."""
        t_off = self.sections[SEC_TABLE][0]
        raw = np.frombuffer(self.data, dtype=np.uint8, count=n_tensors * ENTRY_BYTES, offset=t_off)
        t = raw.view(_ENTRY_DTYPE)
        # each field copied out once: arithmetic on 128-byte-strided views would stream the table per step
        n_dims, region, type_id = (np.ascontiguousarray(t[k]) for k in ("n_dims", "region", "type"))
        ne0, ne1, ne2, ne3 = (np.ascontiguousarray(t["ne"][:, d]) for d in range(MAX_DIMS))
        offset, nbytes = np.ascontiguousarray(t["offset"]), np.ascontiguousarray(t["nbytes"])
        zero = raw.reshape(n_tensors, ENTRY_BYTES)[:, :NAME_BYTES] == 0
        first_nul = zero.argmax(axis=1)
        suspect = ~zero[np.arange(n_tensors), first_nul] | (first_nul == 0)  # rule 14
        # a NUL inside the name (bytes after it): numpy keeps them, the engine does not; decoded one by one
        inner_nul = np.strings.str_len(t["name"]) != first_nul
        del zero
        suspect |= (n_dims - 1) >= MAX_DIMS  # rule 15 (unsigned: 0 wraps high)
        for d, n in enumerate((ne0, ne1, ne2, ne3)):
            suspect |= ((n - 1) >= 1 << 32) | ((n != 1) & (n_dims <= d))
        neurons = region == SEC_NEURONS
        suspect |= ~neurons & (region != SEC_RESIDENT)  # rule 16
        # rule 17: a known type, whole blocks per row, nbytes what the shape needs
        tid = np.minimum(type_id, len(_PER_BLOCK) - 1)  # the last id is I32; larger ones are flagged below
        per, block_bytes = _PER_BLOCK[tid], _BLOCK_BYTES[tid]
        suspect |= (type_id >= len(_PER_BLOCK)) | (per == 0)
        per = np.maximum(per, 1)
        suspect |= ne0 % per != 0
        h = self.header
        suspect |= neurons & ((n_dims != 2) | (type_id != TYPES[h.neuron_type]) | (ne0 != h.n_embd))
        # sizes: where the exact product could pass 2^53 the entry is left to the exact (Python int) check
        with np.errstate(over="ignore"):
            big = (ne1 >= 1 << 17) | (ne2 >= 1 << 17) | (ne3 >= 1 << 17) | (ne0 >= 1 << 20)
            want = np.where(
                neurons, ne1 * np.uint64(h.bundle_stride), (ne0 // per) * block_bytes * ne1 * ne2 * ne3
            )
        suspect |= big | (nbytes != want)
        # rule 18: aligned, inside its region (compared without the u64 sum that could wrap)
        limit = np.where(
            neurons, np.uint64(self.sections[SEC_NEURONS][1]), np.uint64(self.sections[SEC_RESIDENT][1])
        )
        suspect |= (offset % PAGE != 0) | (offset > limit) | (nbytes > limit - np.minimum(offset, limit))
        first_dup = _first_duplicate(raw, n_tensors, np.flatnonzero(inner_nul).tolist())  # rule 19
        for k in np.flatnonzero(suspect[:first_dup]).tolist():
            self._check_entry(k, _ENTRY.unpack_from(raw, k * ENTRY_BYTES))  # raises when it is bad
        if first_dup < n_tensors:
            e = self._check_entry(first_dup, _ENTRY.unpack_from(raw, first_dup * ENTRY_BYTES))
            self._fail(19, f"tensor '{e.name}' appears twice")
        self.tensors = _TensorTable(t, np.flatnonzero(inner_nul).tolist())

    def _check_entry(self, i: int, v: tuple) -> TensorEntry:
        """Rules 14-18 for one entry, exactly (Python ints do not wrap)."""
        h = self.header
        name_bytes = v[0]
        if b"\0" not in name_bytes or name_bytes[0] == 0:
            self._fail(14, f"tensor entry {i} has no NUL-terminated name")
        name = name_bytes[: name_bytes.index(b"\0")].decode("utf-8", "backslashreplace")
        type_id, n_dims = v[1], v[2]
        if not 1 <= n_dims <= MAX_DIMS:
            self._fail(15, f"tensor '{name}' has {n_dims} dims (1..4 allowed)")
        ne = v[3:7]
        for d, n in enumerate(ne):
            if not 1 <= n <= 1 << 32 or (d >= n_dims and n != 1):
                self._fail(15, f"tensor '{name}' has a bad dimension {d} ({n})")
        region, offset, nbytes = v[7], v[9], v[10]
        if region not in (SEC_NEURONS, SEC_RESIDENT):
            self._fail(
                16,
                f"tensor '{name}' names region {region} (only the neuron and resident regions hold tensors)",
            )
        type_name = TYPE_NAMES.get(type_id)
        per = BLOCK[type_name][1] if type_name else 0
        if type_name is None or (type_name not in WEIGHT_TYPES and type_name != "I32") or ne[0] % per:
            self._fail(17, f"tensor '{name}': type {type_id} with rows of {ne[0]} elements is invalid")
        rows = ne[1] * ne[2] * ne[3]  # exact: Python ints do not wrap
        if region == SEC_NEURONS:
            if n_dims != 2 or type_name != h.neuron_type or ne[0] != h.n_embd:
                self._fail(17, f"bundle tensor '{name}' must be [n_embd, n_ff] of the neuron type")
            want = ne[1] * h.bundle_stride
        else:
            want = row_size(type_name, ne[0]) * rows
        if nbytes != want:
            self._fail(17, f"tensor '{name}' is {nbytes} bytes, its shape needs {want}")
        if offset % PAGE:
            self._fail(18, f"tensor '{name}' offset is not 4 KiB-aligned")
        if offset + nbytes > self.sections[region][1]:
            self._fail(18, f"tensor '{name}' extends past the end of the {SECTION_NAMES[region]}")
        return TensorEntry(name, type_name, tuple(ne[:n_dims]), region, offset, nbytes)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as (rows, row_bytes) uint8 (bundles: (n_ff, bundle_stride))."""
        e = self.tensors[name]
        base = self.sections[e.region][0] + e.offset
        flat = self.data[base : base + e.nbytes]
        rows = e.shape[1] if e.region == SEC_NEURONS else e.n_rows
        return flat.reshape(rows, -1)

    def tensor(self, name: str) -> np.ndarray:
        """Float32 (or int32) values, numpy shape = reversed ggml shape."""
        e = self.tensors[name]
        return decode_rows(self.raw(name), e.type, e.shape[0]).reshape(tuple(reversed(e.shape)))

    def ffn(self, layer: int, expert: int | None = None) -> dict[str, np.ndarray]:
        """gate (n_ff, n_embd), up (n_ff, n_embd), down_cols (n_ff, n_embd) in bundle order, and
        order (bundle k = original neuron order[k])."""
        h = self.header
        suffix = bundle_suffix(h, expert)
        b = self.raw(f"blk.{layer}.ffn_bundles{suffix}")
        p, t, n = h.part_bytes, h.neuron_type, h.n_embd
        return {
            "gate": decode_rows(b[:, 0:p], t, n),
            "up": decode_rows(b[:, p : 2 * p], t, n),
            "down_cols": decode_rows(b[:, 2 * p : 3 * p], t, n),
            "order": self.tensor(f"blk.{layer}.ffn_order{suffix}"),
        }
