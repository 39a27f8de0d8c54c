"""`pi2 models profile`: per-neuron activation frequencies of a .pi2 model over workload prompts.

Until pi2-engine reports activations, this runs the numpy reference forward (numpy_llama.Reference,
the engine's correctness oracle, over the model's own tensors dequantized from the .pi2) with its
recording hook, one prompt a pass, and counts, per layer and per expert, how often each neuron is active (its FFN activation is non-zero), plus co-activation
counts among the hottest neurons. The result is an .npz the converter (neuron order) and the planner
(hot-set sizes) read:

    freq/L or freq/L.E     float32 (n_ff,)  activation frequency per ORIGINAL neuron (0..n_ff-1)
    tokens/L or tokens/L.E int64 ()         tokens that reached this FFN block (MoE: routed tokens)
    coact/L[.E], coact_idx/L[.E]            int32 (K, K) co-activation counts among the K hottest
                                            neurons, and their original ids
    meta                                    JSON: model, workload, prompts, tokens, how measured
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from pi2cli.errors import Pi2Error

COACT_TOP = 256


def _open(path: Path):
    from pi2cli.models.pi2file import Pi2File, Pi2FormatError

    try:
        return Pi2File(path, verify=False)
    except (Pi2FormatError, OSError) as exc:
        raise Pi2Error(str(exc)) from None


def workload_texts(path: Path, limit: int | None = None) -> list[str]:
    """The first user turn (with its system prompt) of each conversation in a workload JSONL."""
    texts = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise Pi2Error(f"workload {path}: {exc.strerror}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            turns = item["turns"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise Pi2Error(f"workload {path}:{i}: not a JSON object with 'turns'") from None
        text = (item.get("system") or "") + ("\n" if item.get("system") else "") + str(turns[0])
        texts.append(text)
        if limit and len(texts) >= limit:
            break
    if not texts:
        raise Pi2Error(f"workload {path} has no prompts")
    return texts


def tokenize(model_path: Path, texts: Sequence[str], tokenizer_bin: Path | None = None) -> list[list[int]]:
    """Token ids of each text with the model's own vocabulary, via the native pi2-tokenize."""
    from pi2cli.paths import host_build_dir

    binary = Path(tokenizer_bin) if tokenizer_bin else host_build_dir() / "pi2-tokenize"
    if not binary.exists():
        raise Pi2Error(f"{binary} not found: build the engine first (make engine)")
    f = _open(model_path)
    if not f.tokenizer_blob:
        raise Pi2Error(f"{model_path} has no tokenizer section; pass token ids instead")
    with tempfile.NamedTemporaryFile(suffix=".vocab") as vocab:
        vocab.write(f.tokenizer_blob)
        vocab.flush()
        out = []
        for text in texts:
            done = subprocess.run(
                [str(binary), "--vocab", vocab.name], input=text.encode(), capture_output=True
            )
            if done.returncode != 0:
                raise Pi2Error(f"pi2-tokenize failed: {done.stderr.decode(errors='replace').strip()[:200]}")
            out.append([int(t) for t in done.stdout.split()])
    return out


def profile_tokens(
    model_path: Path,
    sequences: Sequence[Sequence[int]],
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, np.ndarray]:
    """Run the reference forward (numpy_llama.Reference, the engine's oracle) over `sequences`, one
    sequence a pass, and count activations per neuron (original ids) with its recording hook. Each
    block's active sets are kept bit-packed (tokens x n_ff / 8 bytes a block) for the co-activation
    counts among the hottest neurons, taken at the end."""
    from pi2cli.models.numpy_llama import Reference

    f = _open(model_path)
    h = f.header
    seqs = [list(s) for s in sequences if len(s)]
    if not seqs:
        raise Pi2Error("no tokens to profile")
    ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in seqs])
    if ids.min() < 0 or ids.max() >= h.n_vocab:
        raise Pi2Error(f"token id {int(ids.max())} is outside the vocabulary ({h.n_vocab})")
    moe = h.arch == "moe"
    active: dict[str, list[np.ndarray]] = {}  # block key -> packed active sets, in bundle order

    def record(layer: int, expert: int | None, rows: np.ndarray, act: np.ndarray) -> None:
        active.setdefault(f"{layer}.{expert}" if moe else f"{layer}", []).append(
            np.packbits(act != 0, axis=1)
        )

    ref = Reference(f, emulate_rounding=False)
    for i, seq in enumerate(seqs):
        ref.forward(seq, record=record, logits=False)
        if progress:
            progress(f"prompt {i + 1}/{len(seqs)}", i + 1, len(seqs))
    result: dict[str, np.ndarray] = {}
    for layer in range(h.n_layer):
        for e in range(h.n_expert if moe else 1):
            key = f"{layer}.{e}" if moe else f"{layer}"
            packed = active.get(key)
            bits = (np.unpackbits(np.concatenate(packed), axis=1, count=h.n_ff).astype(bool) if packed
                    else np.zeros((0, h.n_ff), bool))  # fmt: skip
            order = f.ffn(layer, e if moe else None)["order"].astype(np.int64)
            freq = np.zeros(h.n_ff, dtype=np.float32)
            freq[order] = bits.mean(axis=0) if len(bits) else 0.0
            result[f"freq/{key}"] = freq
            result[f"tokens/{key}"] = np.asarray(len(bits), dtype=np.int64)
            hot_bundles = np.argsort(-bits.sum(axis=0), kind="stable")[: min(COACT_TOP, h.n_ff)]
            a = bits[:, hot_bundles].astype(np.float32)
            result[f"coact/{key}"] = (a.T @ a).astype(np.int32)
            result[f"coact_idx/{key}"] = order[hot_bundles].astype(np.int32)
    return result


def save_profile(path: Path, arrays: dict[str, np.ndarray], meta: dict) -> Path:
    from pi2cli import safe_write

    path = Path(path)
    with safe_write.safe_open(path) as f:  # a file object: numpy adds no ".npz" to the temp's name
        np.savez_compressed(f, meta=np.asarray(json.dumps(meta)), **arrays)
    return path


def load_profile(path: Path) -> tuple[dict[str, np.ndarray], dict]:
    try:
        with np.load(path, allow_pickle=False) as data:  # a profile may come from anyone: never unpickle
            arrays = {k: data[k] for k in data.files if k != "meta"}
            meta = json.loads(str(data["meta"])) if "meta" in data.files else {}
    except (OSError, ValueError) as exc:
        raise Pi2Error(f"{path}: not a pi2 activation profile ({exc})") from None
    return arrays, meta


def summarize(arrays: dict[str, np.ndarray], hot_fraction: float = 0.2) -> list[dict]:
    """Per block: mean sparsity and the share of activations the hottest `hot_fraction` carry."""
    rows = []
    for key in sorted(
        (k for k in arrays if k.startswith("freq/")), key=lambda k: [int(p) for p in k[5:].split(".")]
    ):
        freq = arrays[key]
        s = np.sort(freq)[::-1]
        total = float(s.sum())
        hot = float(s[: max(1, int(round(hot_fraction * len(s))))].sum() / total) if total else float("nan")
        rows.append({"block": key[5:], "tokens": int(arrays["tokens/" + key[5:]]),
                     "sparsity": float(1 - freq.mean()), "hot_coverage": hot})  # fmt: skip
    return rows


def hot_first_orders(path: Path, n_layer: int, n_expert: int, n_ff: int) -> dict[str, np.ndarray]:
    """Bundle order per FFN block from a profile, hottest neuron first (ties: lower id first).

    Keys are "L" (dense) or "L.E" (MoE), as in the profile's freq/ arrays; the value is the
    permutation for Pi2Writer.add_ffn(order=...). Every block of the model must be in the profile
    with n_ff frequencies: a profile of another model is refused, naming the block."""
    arrays, _ = load_profile(path)
    orders = {}
    for layer in range(n_layer):
        for e in range(n_expert or 1):
            key = f"{layer}.{e}" if n_expert else f"{layer}"
            freq = arrays.get(f"freq/{key}")
            if freq is None:
                raise Pi2Error(f"{path}: profile has no freq/{key} (a profile of another model?)")
            if freq.shape != (n_ff,):
                raise Pi2Error(f"{path}: freq/{key} has shape {freq.shape}, the model has {n_ff} neurons")
            orders[key] = np.argsort(-freq, kind="stable")
    return orders
