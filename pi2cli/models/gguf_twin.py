"""The GGUF twin of a synthetic model: the same quantized bytes, loadable by llama.cpp (arch llama).

llama.cpp has no dReLU (ReLU(gate)*ReLU(up)) FFN for llama-family models: its llama graph always uses
SwiGLU, and the only string-selectable ReLU FFN (`<arch>.hidden_activation`) belongs to ModernBert-style
encoders; T5 and SmallThinker use ReLU but are other architectures. So the twin is arch `llama`
(Mixtral-style experts in the same arch for MoE), llama.cpp computes SwiGLU over it, and it serves the
DENSE baseline runs: identical weight bytes, identical bytes read per token, a different FFN
nonlinearity (so different text). Its metadata says so (`pi2.ffn_activation`, `pi2.synthetic`).

The writer streams: every tensor's name, shape and type are declared first (from the dimensions),
the header is written, then tensors are written in that order as the generator produces them.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np

from pi2cli import safe_write
from pi2cli.errors import Pi2Error
from pi2cli.models.pi2file import encode_rows

GGML_TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7}  # llama_ftype


def encode(values: np.ndarray, quant: str) -> np.ndarray:
    """Float rows -> bytes (uint8, rows x row_bytes) in `quant` (ggml's reference quantization): the
    .pi2 writer's encoding, so twin and .pi2 hold the same bytes."""
    return encode_rows(values, GGML_TYPES[quant].name)


def decode(raw: np.ndarray, quant: str, n: int) -> np.ndarray:
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if quant == "f32":
        return raw.view(np.float32).reshape(*raw.shape[:-1], n)
    if quant == "f16":
        return raw.view(np.float16).astype(np.float32).reshape(*raw.shape[:-1], n)
    return gguf.quants.dequantize(raw, GGML_TYPES[quant]).reshape(*raw.shape[:-1], n)


def row_bytes(quant: str, n: int) -> int:
    return int(encode(np.zeros((1, n), np.float32), quant).shape[-1])


def tokenizer_fields(reader: gguf.GGUFReader) -> list[tuple[str, object, gguf.GGUFValueType, object]]:
    """(key, value, type, sub_type) of every tokenizer.* field of a GGUF, to copy into another."""
    out = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        out.append((key, field.contents(), vtype, sub))
    return out


def load_tokenizer(path: Path) -> tuple[list, int]:
    """The tokenizer.* fields of a GGUF and its vocabulary size. Parsing ~100k strings with
    GGUFReader takes seconds, so the fields are cached as JSON next to pi2's other caches."""
    import json

    from pi2cli.paths import cache_dir

    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise Pi2Error(f"tokenizer GGUF {path}: {exc.strerror}") from None
    cache = cache_dir() / "tokenizers" / f"{path.name}-{st.st_size}-{int(st.st_mtime)}.json"
    if cache.exists():
        data = json.loads(cache.read_text())
    else:
        try:
            reader = gguf.GGUFReader(path)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the same user error
            raise Pi2Error(f"cannot read tokenizer GGUF {path}: {exc}") from None
        data = [[k, v, int(t), None if s is None else int(s)] for k, v, t, s in tokenizer_fields(reader)]
        cache.parent.mkdir(parents=True, exist_ok=True)
        safe_write.write_text(cache, json.dumps(data))
    fields = [
        (k, v, gguf.GGUFValueType(t), None if s is None else gguf.GGUFValueType(s)) for k, v, t, s in data
    ]
    tokens = next((v for k, v, _, _ in fields if k == "tokenizer.ggml.tokens"), None)
    if not tokens:
        raise Pi2Error(f"tokenizer GGUF {path} has no tokenizer.ggml.tokens")
    return fields, len(tokens)


class GgufTwinWriter:
    """Declare tensors (name, numpy shape, quant), then write them; close() renames the temp file into
    place, abort() removes it.

    The header (kv pairs, tensor infos) is written by gguf's GGUFWriter; tensor data is then written
    with pwrite at each tensor's final offset (the layout GGUFWriter gives: data aligned to 32 bytes,
    each tensor padded to 32). So an expert's slice of a stacked MoE tensor can be written as soon as
    that expert exists (`write_part`), and an interrupted synthesis can reopen the temp file and go on
    (`resume=True`, with `next` restored from its checkpoint)."""

    ALIGN = gguf.GGUF_DEFAULT_ALIGNMENT

    def __init__(self, path: Path, kv: list[tuple[str, object, gguf.GGUFValueType, object]]):
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.partial")
        self.kv = kv
        self.declared: list[tuple[str, tuple[int, ...], str, int]] = []
        self.next = 0  # tensors fully written, in declaration order
        self._parts: dict[int, int] = {}  # tensor index -> parts written (-1: complete)
        self._fd: int | None = None
        self.data_start = 0
        self.offsets: list[int] = []

    def declare(self, name: str, shape: tuple[int, ...], quant: str) -> None:
        nbytes = int(np.prod(shape[:-1])) * row_bytes(quant, shape[-1])
        self.declared.append((name, tuple(shape), quant, nbytes))

    def planned_bytes(self, header_bytes: int) -> int:
        """File size given the header's size (tensor data only depends on the declarations)."""
        pad = gguf.GGUFWriter.ggml_pad
        return pad(header_bytes, self.ALIGN) + sum(pad(n, self.ALIGN) for _, _, _, n in self.declared)

    def _layout(self, header_end: int) -> None:
        pad = gguf.GGUFWriter.ggml_pad
        self.data_start = pad(header_end, self.ALIGN)
        self.offsets, pos = [], 0
        for _, _, _, nbytes in self.declared:
            self.offsets.append(pos)
            pos += pad(nbytes, self.ALIGN)
        self.total_bytes = self.data_start + pos

    def start(self, resume: bool = False) -> None:
        """Write the header (or, resuming, check the temp file is there) and open it for pwrite."""
        # The temp name is fixed (a rerun resumes it), so whatever is planted under it is never followed:
        # resuming opens it O_NOFOLLOW, a fresh start removes the entry and creates the file exclusively.
        safe_write.check_target(self.path)
        if resume and self.tmp.exists():
            header_end = self._write_header(self.path.with_name(f".{self.path.name}.header"), probe=True)
            self._layout(header_end)
            self._fd = os.open(self.tmp, os.O_WRONLY | os.O_NOFOLLOW)
            return
        self.tmp.unlink(missing_ok=True)
        os.close(os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
        self._layout(self._write_header(self.tmp))
        self._fd = os.open(self.tmp, os.O_WRONLY | os.O_NOFOLLOW)
        os.ftruncate(self._fd, self.total_bytes)  # sparse until written; the size is final from here

    def _write_header(self, path: Path, probe: bool = False) -> int:
        writer = gguf.GGUFWriter(path, "llama")
        for key, value, vtype, sub in self.kv:
            writer.add_key_value(key, value, vtype, sub)
        for name, shape, quant, nbytes in self.declared:
            byte_shape = (*shape[:-1], row_bytes(quant, shape[-1]))
            dtype = (
                np.uint8
                if quant not in ("f32", "f16")
                else np.dtype(np.float32 if quant == "f32" else np.float16)
            )
            writer.add_tensor_info(name, byte_shape if dtype == np.uint8 else shape, np.dtype(dtype), nbytes,
                                   raw_dtype=GGML_TYPES[quant])  # fmt: skip
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        writer.close()
        end = path.stat().st_size
        if probe:  # the header is a pure function of the declarations: only its length was wanted
            path.unlink(missing_ok=True)
        return end

    def _pwrite(self, data, pos: int) -> None:
        view = memoryview(data).cast("B")
        while view:
            n = os.pwrite(self._fd, view, pos)
            view, pos = view[n:], pos + n

    def write(self, name: str, raw: np.ndarray) -> None:
        """raw: the tensor's bytes (uint8, any shape) in its declared type."""
        self.write_part(name, raw, 0, 1)

    def write_part(self, name: str, raw: np.ndarray, index: int, count: int) -> None:
        """Part `index` of `count` equal slices along the first axis (an expert of a stacked tensor).
        Tensors are completed in declaration order, but the parts of the next few may interleave
        (gate, up, down of expert 0, then of expert 1...); each tensor's parts go in order."""
        if self._fd is None:
            self.start()
        i = next((j for j in range(self.next, len(self.declared)) if self.declared[j][0] == name), None)
        if i is None:
            raise Pi2Error(f"GGUF twin: tensor {name} was not declared or is already written")
        if i > self.next and count == 1 or self._parts.get(i, 0) != index:
            raise Pi2Error(
                f"GGUF twin: tensor {name} written out of order (expected {self.declared[self.next][0]})"
            )
        _, _, _, nbytes = self.declared[i]
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        if raw.nbytes * count != nbytes:
            raise Pi2Error(f"GGUF twin: tensor {name} has {raw.nbytes * count} bytes, expected {nbytes}")
        self._pwrite(raw, self.data_start + self.offsets[i] + index * raw.nbytes)
        self._parts[i] = index + 1
        if index + 1 == count:
            self._parts[i] = -1  # complete
        while self.next < len(self.declared) and self._parts.get(self.next) == -1:
            del self._parts[self.next]
            self.next += 1

    def sync(self) -> None:
        """Make what was written durable (before a checkpoint says it was)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> Path:
        if self.next != len(self.declared):
            missing = self.declared[self.next][0]
            self.abort()
            raise Pi2Error(f"GGUF twin: tensor {missing} was never written")
        if self._fd is None:
            self.start()
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        return safe_write.commit(self.tmp, self.path)

    def detach(self) -> None:
        """Close without removing the temp file (an interrupted run that can be resumed)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def abort(self) -> None:
        self.detach()
        self.tmp.unlink(missing_ok=True)
