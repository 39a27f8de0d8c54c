"""The real text quality is measured on, and the text CATS calibrates on, held apart.

Both come from a workload's records (workloads/README.md: ShareGPT, MT-Bench, HumanEval and the
grade-school problems, with their licences): every user turn of a record, records joined by a blank
line. A record belongs to the calibration part when the first byte of sha256(its id) is divisible by 5
(about a fifth), to the evaluation part otherwise: a fixed split by id, so no record is in both and
adding records elsewhere never moves one across.

Chunks follow llama.cpp's llama-perplexity, so its figures and ours are on the same tokens: the text is
tokenized once (BOS first when the vocabulary asks for it, control-token texts left as text), cut into
chunks of `ctx` tokens each evaluated in a fresh context (the first token replaced by BOS when the
vocabulary has one it adds), and only the second half of each chunk is scored: logits at positions
ctx/2 .. ctx-2 against the tokens after them.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pi2cli.errors import Pi2Error, failure_line
from pi2cli.models.pi2file import Pi2File, Pi2FormatError
from pi2cli.paths import host_build_dir
from pi2cli.workloads import read_workload


def is_calibration(record_id: str) -> bool:
    return hashlib.sha256(record_id.encode()).digest()[0] % 5 == 0


def workload_text(name: str, part: str) -> str:
    """part: "evaluation" or "calibration"."""
    if part not in ("evaluation", "calibration"):
        raise ValueError(part)
    records = [r for r in read_workload(name) if is_calibration(r.id) == (part == "calibration")]
    return "\n\n".join("\n".join(r.turns) for r in records)


@dataclass
class Tokenized:
    ids: np.ndarray  # int32
    bos: int | None  # the BOS id when the vocabulary adds one


def tokenize(model: Path, text: str) -> Tokenized:
    """The model's own tokenizer (pi2-tokenize over the file's tokenizer section)."""
    tool = host_build_dir() / "pi2-tokenize"
    if not tool.is_file():
        raise Pi2Error(f"{tool} is not built (run `make engine`)", exit_code=2)
    try:
        blob = Pi2File(model, verify=False).tokenizer_blob
    except (Pi2FormatError, OSError) as err:
        raise Pi2Error(f"{model}: {err}") from err
    if not blob:
        raise Pi2Error(f"{model} has no tokenizer section: quality needs the model's tokenizer")
    with tempfile.NamedTemporaryFile(suffix=".vocab") as f:
        f.write(blob)
        f.flush()

        def run(txt: str, *flags: str) -> list[int]:
            done = subprocess.run([str(tool), "--vocab", f.name, "--no-special", *flags], input=txt,
                                  capture_output=True, text=True)  # fmt: skip
            if done.returncode != 0:
                raise Pi2Error(f"pi2-tokenize failed: {failure_line(done.stderr, '?', 'pi2-tokenize')}")
            return [int(x) for x in done.stdout.split()]

        ids = run(text)
        probe, bare = run("a"), run("a", "--no-bos")
    bos = probe[0] if len(probe) == len(bare) + 1 else None
    return Tokenized(np.asarray(ids, dtype=np.int32), bos)


def chunks(tok: Tokenized, ctx: int, max_chunks: int) -> list[np.ndarray]:
    """llama-perplexity's chunks: whole chunks of ctx tokens, BOS first where the vocabulary adds it."""
    if ctx < 4:
        raise Pi2Error(f"--ctx {ctx}: need at least 4 tokens a chunk")
    n = min(len(tok.ids) // ctx, max_chunks)
    if n < 1:
        raise Pi2Error(f"the text has {len(tok.ids)} tokens, fewer than one chunk of {ctx}")
    out = []
    for j in range(n):
        c = tok.ids[j * ctx : (j + 1) * ctx].copy()
        if tok.bos is not None:
            c[0] = tok.bos
        out.append(c)
    return out


def scored(ctx: int) -> tuple[int, int]:
    """[first, last) logits rows scored in a chunk; row i predicts token i+1."""
    return ctx // 2, ctx - 1
