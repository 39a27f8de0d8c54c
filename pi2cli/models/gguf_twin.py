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

import contextlib
import os
from pathlib import Path

import gguf
import numpy as np

from pi2cli.errors import Pi2Error

GGML_TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q4_0": gguf.GGMLQuantizationType.Q4_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7}  # llama_ftype


def encode(values: np.ndarray, quant: str) -> np.ndarray:
    """Float rows -> bytes (uint8, rows x row_bytes) in `quant` (ggml's reference quantization)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if quant == "f32":
        return values.view(np.uint8).reshape(*values.shape[:-1], -1)
    if quant == "f16":
        return values.astype(np.float16).view(np.uint8).reshape(*values.shape[:-1], -1)
    return gguf.quants.quantize(values, GGML_TYPES[quant])


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
        tmp = cache.with_suffix(".partial")
        tmp.write_text(json.dumps(data))
        tmp.replace(cache)
    fields = [
        (k, v, gguf.GGUFValueType(t), None if s is None else gguf.GGUFValueType(s)) for k, v, t, s in data
    ]
    tokens = next((v for k, v, _, _ in fields if k == "tokenizer.ggml.tokens"), None)
    if not tokens:
        raise Pi2Error(f"tokenizer GGUF {path} has no tokenizer.ggml.tokens")
    return fields, len(tokens)


class GgufTwinWriter:
    """Declare tensors (name, numpy shape, quant), then write them in the same order; close() renames
    the temp file into place. abort() removes it."""

    def __init__(self, path: Path, kv: list[tuple[str, object, gguf.GGUFValueType, object]]):
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.partial-{os.getpid()}")
        self.writer = gguf.GGUFWriter(self.tmp, "llama")
        for key, value, vtype, sub in kv:
            self.writer.add_key_value(key, value, vtype, sub)
        self.declared: list[tuple[str, tuple[int, ...], str]] = []
        self.next = 0
        self.started = False

    def declare(self, name: str, shape: tuple[int, ...], quant: str) -> None:
        nbytes = int(np.prod(shape[:-1])) * row_bytes(quant, shape[-1])
        byte_shape = (*shape[:-1], row_bytes(quant, shape[-1]))
        dtype = (
            np.uint8
            if quant not in ("f32", "f16")
            else np.dtype(np.float32 if quant == "f32" else np.float16)
        )
        self.writer.add_tensor_info(
            name,
            byte_shape if dtype == np.uint8 else shape,
            np.dtype(dtype),
            nbytes,
            raw_dtype=GGML_TYPES[quant],
        )
        self.declared.append((name, tuple(shape), quant))

    def start(self) -> None:
        self.writer.write_header_to_file()
        self.writer.write_kv_data_to_file()
        self.writer.write_ti_data_to_file()
        self.started = True

    def write(self, name: str, raw: np.ndarray) -> None:
        """raw: the tensor's bytes (uint8, any shape) in its declared type."""
        if not self.started:
            self.start()
        want, shape, quant = self.declared[self.next]
        if name != want:
            raise Pi2Error(f"GGUF twin: tensor {name} written out of order (expected {want})")
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        expected = int(np.prod(shape[:-1])) * row_bytes(quant, shape[-1])
        if raw.nbytes != expected:
            raise Pi2Error(f"GGUF twin: tensor {name} has {raw.nbytes} bytes, expected {expected}")
        self.writer.write_tensor_data(raw)
        self.next += 1

    def close(self) -> Path:
        if self.next != len(self.declared):
            missing = self.declared[self.next][0]
            self.abort()
            raise Pi2Error(f"GGUF twin: tensor {missing} was never written")
        self.writer.close()
        os.replace(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        with contextlib.suppress(Exception):  # the file is being thrown away anyway
            self.writer.close()
        self.tmp.unlink(missing_ok=True)
