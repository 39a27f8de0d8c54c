"""Tiny but complete .pi2 models written with the project's own writer, and the crafted (hostile)
variants of them that the engine must refuse: the inputs of tests/test_engine_hardening.py and the
seed corpus of the native fuzzer (native/fuzz, docs/FUZZ.md).

A tiny model has everything a real one has: a SentencePiece vocabulary, predictors (fc1, fc2,
thresholds), neuron bundles, a dense down copy, MoE experts when asked. It is ~90 KB, nearly all
page padding.

    python tests/crafted_models.py seeds DIR     # the fuzz seed corpus (DIR/pi2file, DIR/plan, DIR/chat, DIR/http)
    python tests/crafted_models.py crafted DIR   # the crafted files (run-sanitize.sh feeds them to ASan)
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np

from pi2cli.models.pi2file import (
    _ENTRY,
    _HEADER_CRC_AT,
    _SECTION,
    _SECTIONS_AT,
    ENTRY_BYTES,
    SEC_RESIDENT,
    SEC_TABLE,
    Pi2Header,
    Pi2Writer,
)
from pi2cli.models.tokenizer_blob import vocab_blob_from_fields

N_VOCAB = 64


def tiny_vocab_blob() -> bytes:
    """A SentencePiece-style vocabulary of N_VOCAB tokens: specials, the space marker, letters."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = ["<unk>", "<s>", "</s>", "\u2581"] + letters + ["\u2581" + c for c in letters]
    tokens += [f"<x{i}>" for i in range(N_VOCAB - len(tokens))]
    scores = [0.0, 0.0, 0.0, -1.0] + [-2.0] * 26 + [-1.5] * 26 + [-9.0] * (N_VOCAB - 56)
    types = [2, 3, 3] + [1] * (N_VOCAB - 3)
    return vocab_blob_from_fields(model="llama", tokens=tokens, scores=scores, token_types=types)


def write_tiny_model(path: str | Path, arch: str = "llama", wtype: str = "Q4_0", seed: int = 0) -> Path:
    """A 1-layer model (n_embd 32, n_ff 32; 2 experts of 1 used for moe) with predictors and a vocabulary."""
    rng = np.random.default_rng(seed)
    moe = arch == "moe"
    n_embd, n_ff, rank = 32, 32, 8
    h = Pi2Header(arch=arch, ffn_act="drelu", n_vocab=N_VOCAB, n_embd=n_embd, n_layer=1, n_head=2,
                  n_head_kv=1, n_ff=n_ff, n_expert=2 if moe else 0, n_expert_used=1 if moe else 0,
                  neuron_type=wtype, has_predictor=True, n_ctx_train=256)  # fmt: skip

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm():
        return np.ones(n_embd, np.float32)

    experts = [0, 1] if moe else [None]
    with Pi2Writer(path, h, tokenizer_blob=tiny_vocab_blob(), metadata={"crafted": "tiny"}) as w:
        w.add_tensor("token_embd.weight", mat(N_VOCAB, n_embd), wtype)
        w.add_tensor("output_norm.weight", norm(), "F32")
        w.add_tensor("output.weight", mat(N_VOCAB, n_embd), wtype)
        w.add_tensor("blk.0.attn_norm.weight", norm(), "F32")
        w.add_tensor("blk.0.ffn_norm.weight", norm(), "F32")
        w.add_tensor("blk.0.attn_q.weight", mat(n_embd, n_embd), wtype)
        w.add_tensor("blk.0.attn_k.weight", mat(n_embd // 2, n_embd), wtype)
        w.add_tensor("blk.0.attn_v.weight", mat(n_embd // 2, n_embd), wtype)
        w.add_tensor("blk.0.attn_output.weight", mat(n_embd, n_embd), wtype)
        if moe:
            w.add_tensor("blk.0.ffn_gate_inp.weight", mat(2, n_embd), "F32")
        for e in experts:
            sfx = "" if e is None else f".{e}"
            w.add_ffn(0, mat(n_ff, n_embd), mat(n_ff, n_embd), mat(n_embd, n_ff), expert=e,
                      order=rng.permutation(n_ff))  # fmt: skip
            w.add_tensor(f"blk.0.pred_fc1{sfx}", mat(rank, n_embd), "F16")
            w.add_tensor(f"blk.0.pred_fc2{sfx}", mat(n_ff, rank), "F16")
        w.add_tensor("blk.0.pred_threshold", np.full(len(experts), 0.5, np.float32), "F32")
    return Path(path)


# ---- editing a written file (then fixing its checksums, so only the edit is wrong) ----------------


def _sections(raw: bytearray) -> list[tuple[int, int, int]]:
    return [_SECTION.unpack_from(raw, _SECTIONS_AT + i * _SECTION.size)[:3] for i in range(5)]


def _set_section(raw: bytearray, sec: int, offset: int, size: int, crc: int) -> None:
    _SECTION.pack_into(raw, _SECTIONS_AT + sec * _SECTION.size, offset, size, crc, 0)


def fix_checksums(raw: bytearray) -> bytearray:
    """Recompute the table, tokenizer, metadata, resident and header checksums."""
    for sec, (off, size, _) in enumerate(_sections(raw)):
        if sec != 0:
            _set_section(raw, sec, off, size, zlib.crc32(raw[off : off + size]))
    struct.pack_into("<I", raw, _HEADER_CRC_AT, zlib.crc32(bytes(raw[:_HEADER_CRC_AT])))
    return raw


def entries(raw: bytes) -> list[list]:
    off, size, _ = _sections(bytearray(raw))[SEC_TABLE]
    return [list(_ENTRY.unpack_from(raw, off + i)) for i in range(0, size, ENTRY_BYTES)]


def patch_entry(path: Path, name: str, **fields) -> None:
    """Rewrite one table entry's fields (type, n_dims, ne0..ne3, region, offset, nbytes)."""
    keys = ["name", "type", "n_dims", "ne0", "ne1", "ne2", "ne3", "region", "pad", "offset", "nbytes"]
    raw = bytearray(Path(path).read_bytes())
    table_off = _sections(raw)[SEC_TABLE][0]
    for i, e in enumerate(entries(raw)):
        if e[0].rstrip(b"\0").decode() == name:
            for k, v in fields.items():
                e[keys.index(k)] = v
            _ENTRY.pack_into(raw, table_off + i * ENTRY_BYTES, *e)
            Path(path).write_bytes(fix_checksums(raw))
            return
    raise KeyError(name)


def patch_tensor_data(path: Path, name: str, data: bytes) -> None:
    """Overwrite the start of one tensor's data (its region's checksum fixed after)."""
    raw = bytearray(Path(path).read_bytes())
    for e in entries(raw):
        if e[0].rstrip(b"\0").decode() == name:
            region_off = _sections(raw)[e[7]][0]
            raw[region_off + e[9] : region_off + e[9] + len(data)] = data
            Path(path).write_bytes(fix_checksums(raw))
            return
    raise KeyError(name)


def craft_overflowing_threshold(path: Path) -> Path:
    """blk.0.pred_threshold as [1, 2^32, 2^32]: 2^64 rows wrap to 0 bytes in 64 bits, so it claims 0
    bytes at the end of the resident region, which this file moves to its very end: reading the
    threshold reads past the end of the mapping (SIGSEGV before the checked arithmetic)."""
    write_tiny_model(path)
    raw = bytearray(Path(path).read_bytes())
    off, size, _ = _sections(raw)[SEC_RESIDENT]
    region = bytes(raw[off : off + size])
    region += b"\0" * (-len(region) % 4096)
    end = len(raw)
    raw += region
    _set_section(raw, SEC_RESIDENT, end, len(region), 0)
    struct.pack_into("<Q", raw, 120, len(raw))  # file_bytes
    Path(path).write_bytes(fix_checksums(raw))
    patch_entry(
        path, "blk.0.pred_threshold", n_dims=3, ne1=1 << 32, ne2=1 << 32, nbytes=0, offset=len(region)
    )
    return Path(path)


def craft_overflowing_norm(path: Path) -> Path:
    """output_norm.weight as [32, 2^32, 2^32, 1] claiming 0 bytes (the bind_vec_f32 overflow)."""
    write_tiny_model(path)
    patch_entry(path, "output_norm.weight", n_dims=3, ne1=1 << 32, ne2=1 << 32, nbytes=0)
    return Path(path)


def craft_many_tensors(path: Path, n: int = 100_000, duplicate: bool = False) -> Path:
    """The tiny model plus n extra F32 [1] tensors sharing one resident page (names t0, t1, ...;
    the last one repeats the first when duplicate)."""
    write_tiny_model(path)
    raw = bytearray(Path(path).read_bytes())
    secs = _sections(raw)
    t_off, t_size, _ = secs[SEC_TABLE]
    extra = bytearray()
    for i in range(n):
        name = b"t0" if duplicate and i == n - 1 else b"t%d" % i
        extra += _ENTRY.pack(name, 0, 1, 1, 1, 1, 1, SEC_RESIDENT, 0, 0, 4)
    table = bytes(raw[t_off : t_off + t_size]) + bytes(extra)
    # the new table goes at the end of the file (page-aligned); the old table's pages stay as padding
    end = len(raw)
    raw += table + b"\0" * (-len(table) % 4096)
    _set_section(raw, SEC_TABLE, end, len(table), 0)
    struct.pack_into("<I", raw, 112, len(table) // ENTRY_BYTES)  # n_tensors
    struct.pack_into("<Q", raw, 120, len(raw))  # file_bytes
    Path(path).write_bytes(fix_checksums(raw))
    return Path(path)


# ---- the fuzz seed corpus -------------------------------------------------------------------------

PLAN_SEEDS = {
    "full.json": {"format": "pi2-plan", "version": 1, "policy": "powerinfer2", "memory_budget": "64M",
                  "threads": 2, "affinity": "0,1", "hot_fraction": 0.2, "hot_share": 0.5, "cluster": 32,
                  "two_phase": False, "lookahead": True, "io": "pread", "io_threads": 2, "io_affinity": "0",
                  "pred_threshold": 0.4, "model": "m.pi2", "why": "seed", "predicted_tps": 3.5},
    "bytes.json": {"format": "pi2-plan", "version": 1, "memory_budget": 2779774976, "policy": "cache"},
}  # fmt: skip
CHAT_SEEDS = {
    "turn.json": {"prompt": "hello \u00e9\u4e16 \\n", "n_predict": 8, "ignore_eos": True, "reset": False},
    "escapes.json": {"prompt": '\ud83d\ude00 tab\t quote" nul\u0001', "n_predict": 0},
}


def _http(method: str, path: str, body: dict | None = None, headers: str = "") -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    length = f"Content-Length: {len(data)}\r\n" if body is not None else ""
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}{length}\r\n".encode() + data


# Requests to `pi2-engine serve` (the http fuzz target's seeds): each route, streamed and not.
HTTP_SEEDS = {
    "health.http": _http("GET", "/health"),
    "models.http": _http("GET", "/v1/models", headers="Authorization: Bearer k\r\n"),
    "chat.http": _http(
        "POST",
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi \u00e9"},
                {"role": "assistant", "content": [{"type": "text", "text": "yes"}]},
            ],
            "max_tokens": 8,
            "temperature": 0.7,
            "top_p": 0.9,
            "seed": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),  # fmt: skip
    "completion.http": _http(
        "POST",
        "/v1/completions",
        {"model": "m", "prompt": "Once", "max_tokens": 4, "stop": ["\n", "END"], "n": 1, "user": "u"},
        headers="Expect: 100-continue\r\n",
    ),  # fmt: skip
}


def write_seeds(out: Path) -> None:
    (out / "pi2file").mkdir(parents=True, exist_ok=True)
    write_tiny_model(out / "pi2file" / "llama_q4_0.pi2")
    write_tiny_model(out / "pi2file" / "moe_q8_0.pi2", arch="moe", wtype="Q8_0", seed=1)
    for target, seeds in (("plan", PLAN_SEEDS), ("chat", CHAT_SEEDS)):
        (out / target).mkdir(parents=True, exist_ok=True)
        for name, obj in seeds.items():
            (out / target / name).write_text(json.dumps(obj) + ("\n" if target == "chat" else ""))
    (out / "http").mkdir(parents=True, exist_ok=True)
    for name, data in HTTP_SEEDS.items():
        (out / "http" / name).write_bytes(data)


def write_crafted(out: Path) -> list[Path]:
    """The crafted files the engine must refuse with one line each (native/tests/run-sanitize.sh)."""
    out.mkdir(parents=True, exist_ok=True)
    return [
        craft_overflowing_threshold(out / "overflowing_threshold.pi2"),
        craft_overflowing_norm(out / "overflowing_norm.pi2"),
        craft_many_tensors(out / "duplicate_among_100k.pi2", duplicate=True),
    ]


if __name__ == "__main__":
    commands = {"seeds": write_seeds, "crafted": write_crafted}
    if len(sys.argv) != 3 or sys.argv[1] not in commands:
        sys.exit("usage: python tests/crafted_models.py seeds|crafted DIR")
    commands[sys.argv[1]](Path(sys.argv[2]))
