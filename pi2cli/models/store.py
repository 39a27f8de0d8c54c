"""The local model store: where registry models live on this machine, found by name.

Layout (under ~/.cache/pi2/models, or $PI2_MODELS_DIR):

    NAME/                 real weights (`pi2 models pull NAME`, then converted): model.pi2, model.gguf
    synthetic-NAME/       `pi2 models synth --like NAME` at full size: model.pi2, model.gguf

A name resolves to real weights first, then to the synthetic model; the synthetic one always says so
(`StoredModel.synthetic`, the label "synthetic-NAME"), so a result can never pass for the real model.
A name with nothing in the store is one error line: how to get it, how many GB, how long, and whether
the disk has the room.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.models.registry import ModelSpec, get_model
from pi2cli.paths import cache_dir

GiB = 1024**3
# Minutes per billion parameters for a full-size synth on 2 idle cores, measured (docs/MODELS.md): the
# 47B shape (46.9B parameters) in 13.4 min (2026-11-24). Cores shared with other work stretch it (48.8
# min at load 7-9). Only used to say how long it will take.
SYNTH_MIN_PER_BPARAM = 0.3
SPARE_BYTES = 8 * GiB  # never fill the disk: keep this much free after writing


def models_dir() -> Path:
    return Path(os.environ.get("PI2_MODELS_DIR") or cache_dir() / "models")


def real_dir(spec: ModelSpec) -> Path:
    return models_dir() / spec.name


def synthetic_dir(spec: ModelSpec) -> Path:
    return models_dir() / f"synthetic-{spec.name}"


@dataclass
class StoredModel:
    name: str  # registry name
    label: str  # what results call it: NAME, or synthetic-NAME
    pi2: Path | None
    gguf: Path | None
    synthetic: bool


def find(spec: ModelSpec) -> StoredModel | None:
    for folder, synthetic in ((real_dir(spec), False), (synthetic_dir(spec), True)):
        pi2, gguf = folder / "model.pi2", folder / "model.gguf"
        if pi2.is_file() or gguf.is_file():
            return StoredModel(spec.name, folder.name, pi2 if pi2.is_file() else None,
                               gguf if gguf.is_file() else None, synthetic)  # fmt: skip
    return None


def looks_like_name(text: str) -> bool:
    """A model argument that is a registry name rather than a path."""
    if os.sep in text or text.endswith((".pi2", ".gguf")) or Path(text).exists():
        return False
    try:
        get_model(text)
    except Pi2Error:
        return False
    return True


def free_bytes(path: Path) -> int:
    path = Path(path)
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def spare_bytes(need: int) -> int:
    """What must stay free after writing `need` bytes: 8 GiB for full-size models, a quarter of the
    write (+64 MiB) for small ones, so a test model is not refused on a nearly full disk."""
    return min(SPARE_BYTES, need // 4 + 64 * 1024 * 1024)


def check_room(folder: Path, sizes: dict[str, int], what: str) -> None:
    """Refuse (one line) when the files would leave less than spare_bytes() free."""
    need = sum(sizes.values())
    free = free_bytes(folder)
    spare = spare_bytes(need)
    if free - need < spare:
        raise Pi2Error(
            f"{what} needs {need / GiB:.1f} GiB in {folder} and {spare / GiB:.1f} GiB must stay free, "
            f"but only {free / GiB:.1f} GiB is free: free some space or set $PI2_MODELS_DIR to a larger disk"
        )


def describe_sizes(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name} {n / GiB:.1f} GiB ({n:,} bytes)" for name, n in sizes.items())


def synth_sizes(spec: ModelSpec) -> dict[str, int]:
    """Bytes a full-size `models synth --like NAME` writes (defaults: Q4_0, dense down copy only for
    dense FFNs; see synth.planned_sizes)."""
    from pi2cli.models import synth

    cfg = synth.default_config(spec.name)
    full = synth.synth_spec(cfg, synth.SYNTH_VOCAB)
    return synth.planned_sizes(cfg, full, synth.default_predictor_rank(full))


def missing_message(spec: ModelSpec) -> str:
    """The one line a command prints for a registry name that is not in the store."""
    sizes = synth_sizes(spec)
    need = sum(sizes.values())
    free = free_bytes(models_dir())
    minutes = max(1, round(spec.param_counts()["total"] / 1e9 * SYNTH_MIN_PER_BPARAM))
    room = (
        f"{free / GiB:.0f} GiB free there: enough"
        if free - need >= spare_bytes(need)
        else f"only {free / GiB:.0f} GiB free there: not enough (keep {SPARE_BYTES / GiB:.0f} GiB spare)"
    )
    pull = f"`pi2 models pull {spec.name}` (real weights, {spec.hf_repo})" if spec.hf_repo else None
    how = f"`pi2 models synth --like {spec.name}` (synthetic, ~{need / 1e9:.0f} GB, ~{minutes} min on 2 idle cores)"
    if pull:
        how = f"{pull}, or {how}"
    return f"model {spec.name} is not in {models_dir()}: get it with {how} (or `pi2 bench --synth`); {room}"


def model_arg(text: str, synth: bool = False) -> str:
    """What a command's --model becomes: a path stays as it is; a registry name becomes the stored
    model's file (.pi2, else .gguf). Missing: with `synth`, make the synthetic model first (sizes
    stated, disk checked); without, the one-line how-to-get-it error."""
    if not looks_like_name(text):
        return text
    spec = get_model(text)
    found = find(spec)
    if found is None and synth:
        synthesize_into_store(spec)
        found = find(spec)
    if found is None:
        raise Pi2Error(missing_message(spec))
    return str(found.pi2 or found.gguf)


def synthesize_into_store(spec: ModelSpec) -> Path:
    """`pi2 models synth --like NAME` into the store, with progress on stderr (`--synth`)."""
    import sys

    from pi2cli.models import info, synth

    if spec.activation == "silu":
        raise Pi2Error(f"{spec.name} is a dense SwiGLU model: there is no synthetic version; "
                       f"`pi2 models pull {spec.name}` fetches it")  # fmt: skip
    cfg = synth.default_config(spec.name)
    out = synthetic_dir(spec)
    full, fields, _sparsity, rank = synth.resolve(cfg)
    sizes = synth.planned_sizes(cfg, full, rank, fields)
    check_room(out, sizes, f"--synth {spec.name}")
    print(f"pi2: synthesizing {spec.name} (SYNTHETIC weights): {describe_sizes(sizes)} into {out}",
          file=sys.stderr, flush=True)  # fmt: skip
    info.run_with_progress(lambda progress: synth.synthesize(cfg, out, progress=progress), "synth")
    return out
