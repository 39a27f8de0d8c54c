"""The vocabulary blob: the tokenizer data a .pi2 file stores verbatim for the native tokenizer.

The byte layout is documented at the top of native/src/tokenizer/vocab_blob.h (and parsed there); this module
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
# pi2_pre_type_from_name in native/src/tokenizer/pretok.c). Grouped by the pre-tokenizer regex llama.cpp uses.
BPE_PRE_TOKENIZERS = {
    "default": ("default",),
    "gpt2": (
        "gpt-2",
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
        pre = ""  # SentencePiece has no pre-tokenizer; GGUF files say "default" or nothing
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


# ---------- Hugging Face model directories (safetensors checkpoints) ----------
#
# Read the way llama.cpp's convert_hf_to_gguf.py reads them, so a .pi2 converted from safetensors
# tokenizes like the GGUF llama.cpp would have made: tokenizer.model (SentencePiece) first, else a
# byte-level BPE tokenizer.json; added tokens become control (special) or user-defined tokens; the
# vocabulary is padded with "[PADn]" to config.json's vocab_size.

TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 1, 2, 3, 4, 5, 6

# pre-tokenizer regexes as tokenizer.json spells them
_LLAMA3_SPLIT = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace("\\p{N}{1,3}", "\\p{N}")


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise Pi2Error("tokenizer.model is truncated or not a SentencePiece model")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _proto_fields(buf: bytes):
    """(field number, value) for each field of one protobuf message: ints for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise Pi2Error("tokenizer.model is not a SentencePiece model (unexpected protobuf wire type)")
        if pos > len(buf):
            raise Pi2Error("tokenizer.model is truncated")
        yield field, value


def read_sentencepiece_model(path) -> tuple[list[tuple[bytes, float, int]], bool]:
    """The pieces (text, score, GGUF token type) of a SentencePiece tokenizer.model, and whether it
    adds a dummy space prefix. Parses the protobuf directly: no sentencepiece dependency."""
    from pathlib import Path

    data = Path(path).read_bytes()
    pieces: list[tuple[bytes, float, int]] = []
    add_dummy_prefix = True
    model_type = 1  # UNIGRAM is protobuf's default
    for field, value in _proto_fields(data):
        if field == 1 and isinstance(value, bytes):  # repeated SentencePiece
            text, score, ptype = b"", 0.0, 1
            for f, v in _proto_fields(value):
                if f == 1:
                    text = v
                elif f == 2 and len(v) == 4:
                    score = struct.unpack("<f", v)[0]
                elif f == 3:
                    ptype = v
            # llama.cpp's converter: unknown / control / unused / byte keep their type, the rest
            # (normal, user-defined pieces) are normal
            gtype = ptype if ptype in (TYPE_UNKNOWN, TYPE_CONTROL, TYPE_UNUSED, TYPE_BYTE) else TYPE_NORMAL
            pieces.append((text, score, gtype))
        elif field == 2 and isinstance(value, bytes):  # TrainerSpec
            for f, v in _proto_fields(value):
                if f == 3:
                    model_type = v
        elif field == 3 and isinstance(value, bytes):  # NormalizerSpec
            for f, v in _proto_fields(value):
                if f == 3:
                    add_dummy_prefix = bool(v)
    if not pieces:
        raise Pi2Error(f"{path} holds no SentencePiece pieces")
    if model_type != 2:
        kind = {1: "unigram", 3: "word", 4: "char"}.get(model_type, str(model_type))
        raise Pi2Error(
            f"{path} is a SentencePiece {kind} model; only BPE models (Llama, Mistral) are supported"
        )
    return pieces, add_dummy_prefix


def _looks_special(text: str) -> bool:
    """llama.cpp's converter marks these added tokens control even when not flagged special."""
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def _bpe_pre_name(pre_tokenizer: dict | None) -> str:
    """GGUF pre name for a tokenizer.json pre_tokenizer, for the layouts pi2 knows."""

    def kind(pt: dict) -> str:
        return pt.get("type", "")

    if not pre_tokenizer:
        raise Pi2Error(
            "tokenizer.json has no pre_tokenizer; convert the model with llama.cpp and use the GGUF"
        )
    if kind(pre_tokenizer) == "ByteLevel" and pre_tokenizer.get("use_regex", True):
        return "gpt-2"
    if kind(pre_tokenizer) == "Sequence":
        seq = pre_tokenizer.get("pretokenizers", [])
        kinds = [kind(p) for p in seq]
        if (
            kinds == ["Digits", "ByteLevel"]
            and seq[0].get("individual_digits")
            and seq[1].get("use_regex", True)
        ):
            return "smollm"
        if kinds == ["Split", "ByteLevel"] and not seq[1].get("use_regex", True):
            regex = seq[0].get("pattern", {}).get("Regex")
            if regex == _LLAMA3_SPLIT:
                return "llama3"
            if regex == _QWEN2_SPLIT:
                return "qwen2"
    raise Pi2Error(
        "tokenizer.json uses a pre-tokenizer pi2 does not recognise; convert the model with llama.cpp's "
        "convert_hf_to_gguf.py and give pi2 the GGUF instead"
    )


def _special_fields(model_dir, n_vocab: int) -> dict:
    """The special token ids and add-BOS flag of a Hugging Face directory, as vocab_blob_from_fields'
    keyword arguments (None where the directory names none)."""
    import gguf

    special = gguf.SpecialVocab(model_dir, load_merges=False, n_vocab=n_vocab)
    ids, add = special.special_token_ids, special.add_special_token
    return {f"{k}_id": ids.get(k) for k in ("bos", "eos", "unk", "pad")} | {"add_bos": add.get("bos")}


def _config_vocab_size(model_dir) -> int | None:
    import json
    from pathlib import Path

    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return None
    size = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
    return int(size) if isinstance(size, int) and size > 0 else None


def vocab_blob_from_hf_dir(model_dir) -> bytes:
    """The vocab blob for a Hugging Face model directory (tokenizer.model or tokenizer.json)."""
    import json
    from pathlib import Path

    model_dir = Path(model_dir)
    vocab_size = _config_vocab_size(model_dir)
    sp_path = model_dir / "tokenizer.model"
    if sp_path.is_file():
        pieces, add_dummy_prefix = read_sentencepiece_model(sp_path)
        n = vocab_size or len(pieces)
        tokens = [f"[PAD{i}]".encode() for i in range(n)]
        scores = [-10000.0] * n
        types = [TYPE_UNUSED] * n
        for i, (text, score, ttype) in enumerate(pieces[:n]):
            tokens[i], scores[i], types[i] = text, score, ttype
        added = model_dir / "added_tokens.json"
        if added.is_file():
            for text, tid in json.loads(added.read_text(encoding="utf-8")).items():
                if 0 <= tid < n:
                    tokens[tid], scores[tid], types[tid] = text.encode(), -1000.0, TYPE_USER_DEFINED
        config = model_dir / "tokenizer_config.json"
        if config.is_file():
            decoder = json.loads(config.read_text(encoding="utf-8")).get("added_tokens_decoder", {})
            for tid_text, data in decoder.items():
                tid, text = int(tid_text), data["content"]
                if not 0 <= tid < n:
                    continue
                if data.get("special") or _looks_special(text):
                    types[tid] = TYPE_CONTROL
                else:
                    text = text.replace("\u2581", " ")
                    types[tid] = TYPE_USER_DEFINED
                tokens[tid], scores[tid] = text.encode(), -1000.0
        return vocab_blob_from_fields(
            model="llama",
            tokens=tokens,
            scores=scores,
            token_types=types,
            pre="default",
            add_space_prefix=add_dummy_prefix,
            **_special_fields(model_dir, len(tokens)),
        )

    tj_path = model_dir / "tokenizer.json"
    if not tj_path.is_file():
        raise Pi2Error(f"{model_dir} has neither tokenizer.model nor tokenizer.json")
    tj = json.loads(tj_path.read_text(encoding="utf-8"))
    model = tj.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise Pi2Error(
            f"{tj_path}: only byte-level BPE tokenizer.json files are supported (found {model.get('type')!r}"
            f"{', byte_fallback' if model.get('byte_fallback') else ''}); SentencePiece models need tokenizer.model"
        )
    pre = _bpe_pre_name(tj.get("pre_tokenizer"))
    vocab: dict[str, int] = model.get("vocab", {})
    added_tokens = tj.get("added_tokens", [])
    n = max([*vocab.values(), *(t["id"] for t in added_tokens), -1]) + 1
    n = max(n, vocab_size or 0)
    tokens = [f"[PAD{i}]".encode() for i in range(n)]
    types = [TYPE_UNUSED] * n
    for text, tid in vocab.items():
        tokens[tid], types[tid] = text.encode(), TYPE_NORMAL
    for tok in added_tokens:
        text = tok["content"]
        tokens[tok["id"]] = text.encode()
        types[tok["id"]] = TYPE_CONTROL if tok.get("special") or _looks_special(text) else TYPE_USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return vocab_blob_from_fields(
        model="gpt2",
        tokens=tokens,
        token_types=types,
        merges=merges,
        pre=pre,
        **_special_fields(model_dir, len(tokens)),
    )
