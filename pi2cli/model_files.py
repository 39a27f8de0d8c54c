"""A model named on the command line, made into its files: the .pi2 for pi2-engine, its GGUF twin for
llama.cpp, and the chat template the workloads are rendered with (`ModelFiles`, `resolve_model`), plus
the KV context a workload needs (`context_for`). Below bench/, plan/ and farm/, which all resolve models
this way; above workloads.py, whose chat templates it uses. `reporter`: anything with `.message(text)`
(bench/run.py's Reporter)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.workloads import ChatTemplate, Conversation, gguf_chat_template

DEFAULT_CTX = 4096  # the largest KV cache a bench run reserves (bench's own cap on context_for)


@dataclass
class ModelFiles:
    """The same weights in both forms: .pi2 for pi2-engine, the GGUF twin for llama.cpp."""

    name: str
    pi2: Path | None
    gguf: Path | None
    template: ChatTemplate

    def for_engine(self, suffix: str, engine: str) -> Path:
        path = self.pi2 if suffix == ".pi2" else self.gguf
        if path is None:
            have = self.pi2 or self.gguf
            raise Pi2Error(f"{engine} runs a {suffix} model and there is none next to {have} "
                           f"(expected {Path(have).with_suffix(suffix)}; {twin_hint(Path(have), suffix)})")  # fmt: skip
        return path


def twin_hint(have: Path, suffix: str) -> str:
    """How to make the missing form of a model: a CATS .pi2's twin comes from its source GGUF."""
    if suffix == ".gguf" and have.suffix == ".pi2":
        from pi2cli.models.pi2file import Pi2File, Pi2FormatError

        with contextlib.suppress(Pi2FormatError, OSError, ValueError):
            pred = Pi2File(have, verify=False).metadata.get("predictor") or {}
            if isinstance(pred, dict) and pred.get("kind") == "cats-gate":  # a CATS .pi2 (quality/cats.py)
                s = pred.get("sparsity_target")
                return (f"a CATS model's twin is its dense source's GGUF: `pi2 convert SRC --sparsify cats --sparsity "
                        f"{s} --out {have.name} --gguf-twin {have.with_suffix('.gguf').name}` writes it")  # fmt: skip
    return "`pi2 convert SRC --out X.pi2 --gguf-twin X.gguf` writes both"


def model_display_name(path: Path) -> str:
    stem = path.stem
    return path.parent.name if stem in ("model", "") and path.parent.name else stem


def resolve_model(
    model: str, *, convert_missing_pi2: bool = True, reporter=None, template: bool = True
) -> ModelFiles:
    """A .pi2 path (its GGUF twin next to it when there is one: DIR/X.pi2 + DIR/X.gguf) or a .gguf
    (converted to the .pi2 beside it when missing and wanted). The chat template comes from the GGUF, or
    from the .pi2's metadata (a CATS .pi2 keeps its source's); template=False: not needed (pp-tg)."""
    path = Path(model).expanduser()
    if not path.exists():
        raise Pi2Error(
            f"model {model}: no such file (give a .pi2, a .gguf or a registry name: `pi2 models list`)"
        )
    if path.is_dir():
        found = sorted(path.glob("*.pi2")) or sorted(path.glob("*.gguf"))
        if len(found) != 1:
            raise Pi2Error(
                f"model directory {path} must hold exactly one .pi2 (or .gguf); found {len(found)}"
            )
        path = found[0]
    if path.suffix == ".pi2":
        pi2, gguf = path, path.with_suffix(".gguf")
        gguf = gguf if gguf.is_file() else None
    elif path.suffix == ".gguf":
        gguf, pi2 = path, path.with_suffix(".pi2")
        if not pi2.is_file():
            pi2 = None
            if convert_missing_pi2:
                pi2 = convert_for_pi2(gguf, reporter)
    else:
        raise Pi2Error(f"model {model}: expected a .pi2 or .gguf file")
    chat = None
    if template:
        chat = gguf_chat_template(gguf) if gguf is not None else pi2_chat_template(pi2)
    return ModelFiles(model_display_name(path), pi2, gguf, chat)


def pi2_chat_template(pi2: Path) -> ChatTemplate:
    """The chat template a .pi2 without a twin keeps in its metadata (CATS output), else one line."""
    from pi2cli.models.pi2file import Pi2File

    with contextlib.suppress(Pi2Error, OSError, ValueError):
        meta = Pi2File(pi2, verify=False).metadata.get("chat_template")
        if isinstance(meta, dict) and isinstance(meta.get("template"), str):
            return ChatTemplate(meta["template"], str(meta.get("bos") or ""), str(meta.get("eos") or ""))
    raise Pi2Error(f"{pi2}: no GGUF twin {pi2.with_suffix('.gguf')} next to it and no chat template in it: "
                   f"the chat workloads need one (`pi2 convert SRC --gguf-twin` writes the twin; "
                   f"--mode pp-tg needs none)")  # fmt: skip


def convert_for_pi2(gguf: Path, reporter=None) -> Path:
    from pi2cli.models.convert import convert_gguf

    out = gguf.with_suffix(".pi2")
    if reporter:
        reporter.message(f"converting {gguf.name} -> {out.name} for pi2-engine")
    convert_gguf(gguf, out)
    return out


def context_for(conversations: list[Conversation], template: ChatTemplate, n_gen: int | None) -> int:
    """KV cache tokens that hold the longest conversation, so no engine reserves memory a run never uses
    (under a budget, a 4096-token cache took memory the neuron cache needed). An upper bound: a token is
    at least one byte of the rendered text (byte-level BPE and byte fallback), each answer is its token
    budget plus 16 for the template's markers; rounded up to 256, between 512 and DEFAULT_CTX."""
    need = 0
    for conv in conversations:
        budgets = [n_gen or m for m in conv.max_new_tokens]
        text = template.render(conv.messages_for_turn(len(conv.turns) - 1, [""] * (len(conv.turns) - 1)))
        need = max(need, len(text.encode()) + sum(b + 16 for b in budgets))
    return min(DEFAULT_CTX, max(512, (need + 255) // 256 * 256))
