"""The vocabulary blob: the tokenizer data a .pi2 file stores verbatim for the native tokenizer.

The byte layout is documented at the top of native/src/vocab_blob.h (and parsed there); this module
writes it, from a GGUF file's tokenizer.ggml.* keys or from plain Python lists. Defaults that GGUF
leaves implicit are resolved here the way llama.cpp resolves them, so the native side stays simple:
missing special ids fall back to llama.cpp's per-model defaults, add_bos follows the pre-tokenizer,
empty token texts become "[EMPTY_<id>]".
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from pi2cli.errors import Pi2Error

MAGIC = b"PI2VOCAB"
VERSION = 1
HEADER_SIZE = 64
KIND_SPM = 1
KIND_BPE = 2
FLAG_ADD_BOS = 1
FLAG_ADD_SPACE_PREFIX = 2
FLAG_HAS_SCORES = 4
FLAG_HAS_TYPES = 8

# GGUF tokenizer.ggml.pre values the native byte-level BPE tokenizer implements (keep in sync with
# pre_type_from_name in native/src/tokenizer.c). Grouped by the pre-tokenizer regex llama.cpp uses.
BPE_PRE_TOKENIZERS = {
    "default": ("default",),
    "gpt2": (
        "gpt-2",
        "gpt2",
        "phi-2",
        "mpt",
        "olmo",
        "jais",
        "jina-es",
        "jina-de",
        "jina-v2-es",
        "jina-v2-de",
        "exaone4",
    ),
    "smollm": ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
    "llama3": (
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "dbrx",
        "smaug-bpe",
    ),
    "qwen2": ("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"),
}
SUPPORTED_BPE_PRE = {name for names in BPE_PRE_TOKENIZERS.values() for name in names}
# pre-tokenizers for which llama.cpp turns add_bos on when the GGUF does not say
_BPE_PRE_ADD_BOS = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}


def _pad4(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def vocab_blob_from_fields(
    *,
    model: str,
    tokens: Sequence[bytes | str],
    scores: Sequence[float] | None = None,
    token_types: Sequence[int] | None = None,
    merges: Sequence[bytes | str] = (),
    pre: str = "",
    bos_id: int | None = None,
    eos_id: int | None = None,
    unk_id: int | None = None,
    pad_id: int | None = None,
    add_bos: bool | None = None,
    add_space_prefix: bool | None = None,
) -> bytes:
    """Serialize a vocabulary. model: "llama" (SentencePiece BPE) or "gpt2" (byte-level BPE).

    Ids left as None (or out of range) take llama.cpp's defaults for the model; add_bos None means
    "what llama.cpp does for this model and pre-tokenizer".
    """
    if model == "llama":
        kind = KIND_SPM
        defaults = {"bos": 1, "eos": 2, "unk": 0, "pad": -1}
        default_add_bos = True
    elif model == "gpt2":
        kind = KIND_BPE
        defaults = {"bos": 11, "eos": 11, "unk": -1, "pad": -1}
        pre = pre or "default"
        if pre not in SUPPORTED_BPE_PRE:
            raise Pi2Error(
                f"tokenizer pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(SUPPORTED_BPE_PRE))})"
            )
        default_add_bos = pre in _BPE_PRE_ADD_BOS
    else:
        raise Pi2Error(f"tokenizer model {model!r} is not supported (only 'llama' and 'gpt2')")

    n_vocab = len(tokens)
    if n_vocab == 0:
        raise Pi2Error("the vocabulary has no tokens")
    if n_vocab > 1 << 24:
        raise Pi2Error(f"the vocabulary is too large ({n_vocab} tokens)")
    if kind == KIND_BPE and not merges:
        raise Pi2Error("byte-level BPE vocabulary without merges (tokenizer.ggml.merges)")
    for name, seq in (("scores", scores), ("token types", token_types)):
        if seq is not None and len(seq) < n_vocab:
            raise Pi2Error(f"tokenizer {name} cover {len(seq)} of {n_vocab} tokens")

    def pick(name: str, value: int | None) -> int:
        if value is not None and 0 <= value < n_vocab:
            return int(value)
        default = defaults[name]
        return default if default < n_vocab else -1

    ids = [pick("bos", bos_id), pick("eos", eos_id), pick("unk", unk_id), pick("pad", pad_id)]
    if add_bos is None:
        add_bos = default_add_bos
    if add_space_prefix is None:
        add_space_prefix = kind == KIND_SPM

    texts = []
    for i, tok in enumerate(tokens):
        raw = tok.encode("utf-8") if isinstance(tok, str) else bytes(tok)
        texts.append(raw or f"[EMPTY_{i}]".encode())
    merge_texts = [m.encode("utf-8") if isinstance(m, str) else bytes(m) for m in merges]
    pre_bytes = pre.encode("utf-8")
    if len(pre_bytes) > 255 or b"\0" in pre_bytes:
        raise Pi2Error(f"bad pre-tokenizer name {pre!r}")

    flags = (FLAG_ADD_BOS if add_bos else 0) | (FLAG_ADD_SPACE_PREFIX if add_space_prefix else 0)
    body = [_pad4(pre_bytes + b"\0")]
    body.append(struct.pack(f"<{n_vocab}I", *(len(t) for t in texts)))
    body.append(_pad4(b"".join(texts)))
    if scores is not None:
        flags |= FLAG_HAS_SCORES
        body.append(struct.pack(f"<{n_vocab}f", *(float(s) for s in scores[:n_vocab])))
    if token_types is not None:
        flags |= FLAG_HAS_TYPES
        body.append(struct.pack(f"<{n_vocab}i", *(int(t) for t in token_types[:n_vocab])))
    body.append(struct.pack(f"<{len(merge_texts)}I", *(len(m) for m in merge_texts)))
    body.append(_pad4(b"".join(merge_texts)))
    payload = b"".join(body)
    total = HEADER_SIZE + len(payload)
    if total >= 1 << 32:
        raise Pi2Error("the vocabulary does not fit a 4 GiB blob")
    header = MAGIC + struct.pack(
        "<IIIii4iII12x", VERSION, kind, flags, n_vocab, len(merge_texts), *ids, len(pre_bytes), total
    )
    assert len(header) == HEADER_SIZE
    return header + payload


def _field(reader, key: str):
    return reader.fields.get(key)


def _scalar(reader, key: str):
    field = _field(reader, key)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    if len(field.types) == 1 and field.types[0].name == "STRING":
        return bytes(value).decode("utf-8", errors="replace")
    return value.tolist()[0]


def _string_array(reader, key: str) -> list[bytes] | None:
    field = _field(reader, key)
    if field is None:
        return None
    if len(field.types) != 2 or field.types[1].name != "STRING":
        raise Pi2Error(f"GGUF key {key} is not a string array")
    return [bytes(field.parts[i]) for i in field.data]


def _number_array(reader, key: str) -> list | None:
    field = _field(reader, key)
    if field is None:
        return None
    if len(field.types) != 2 or field.types[1].name == "STRING":
        raise Pi2Error(f"GGUF key {key} is not a numeric array")
    return [field.parts[i].tolist()[0] for i in field.data]


def vocab_blob_from_gguf(reader) -> bytes:
    """The vocab blob for a GGUF file (a gguf.GGUFReader), or Pi2Error when it has no usable tokenizer."""
    model = _scalar(reader, "tokenizer.ggml.model")
    if model is None:
        raise Pi2Error("the GGUF file has no tokenizer (tokenizer.ggml.model missing)")
    if model not in ("llama", "gpt2"):
        raise Pi2Error(f"GGUF tokenizer model {model!r} is not supported (only 'llama' and 'gpt2')")
    tokens = _string_array(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise Pi2Error("the GGUF file has no tokenizer.ggml.tokens")
    merges = _string_array(reader, "tokenizer.ggml.merges") or []
    add_bos = _scalar(reader, "tokenizer.ggml.add_bos_token")
    add_prefix = _scalar(reader, "tokenizer.ggml.add_space_prefix")
    return vocab_blob_from_fields(
        model=model,
        tokens=tokens,
        scores=_number_array(reader, "tokenizer.ggml.scores"),
        token_types=_number_array(reader, "tokenizer.ggml.token_type"),
        merges=merges,
        pre=_scalar(reader, "tokenizer.ggml.pre") or "",
        bos_id=_scalar(reader, "tokenizer.ggml.bos_token_id"),
        eos_id=_scalar(reader, "tokenizer.ggml.eos_token_id"),
        unk_id=_scalar(reader, "tokenizer.ggml.unknown_token_id"),
        pad_id=_scalar(reader, "tokenizer.ggml.padding_token_id"),
        add_bos=None if add_bos is None else bool(add_bos),
        add_space_prefix=None if add_prefix is None else bool(add_prefix),
    )
