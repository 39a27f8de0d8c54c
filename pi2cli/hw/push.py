"""Put engine binaries, models, plans and workloads on a target, copying only what changed.

For each file: hash it here (sha256, cached by path+size+mtime), look on the target (a manifest of
what pi2 pushed before, checked against the file's size and mtime; `sha256sum` on the target when the
manifest cannot vouch), skip it when the content is already there, else copy it to NAME.partial,
verify the sha256 on the target, and only then rename it to NAME. A transfer that breaks, a corrupted
copy or Ctrl-C never leaves a file under its real name that looks complete.

Layout under the working directory: bin/ (engine binaries), models/, plans/, workloads/. A model lands
as models/NAME-HASH.EXT (model_remote_name: its name, e.g. the directory of DIR/model.pi2, and the
first 12 hex digits of its sha256), so two models -- every synthetic one is DIR/model.pi2 -- never
replace each other on the device, and a model's .pi2 and .gguf twin stay apart from another's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pi2cli import safe_write
from pi2cli.errors import Pi2Error
from pi2cli.paths import REPO_ROOT, cache_dir
from pi2cli.targets.base import Progress, Target, TargetError, TransferError
from pi2cli.units import format_size

MANIFEST_NAME = ".pi2-manifest.json"
PARTIAL_SUFFIX = ".partial"


@dataclass
class PushItem:
    local: Path
    remote: str  # absolute path on the target
    kind: str  # "engine" | "model" | "plan" | "workload"
    mode: int = 0o644
    size: int = 0
    sha256: str = ""


@dataclass
class PushResult:
    remote: str
    local: str
    kind: str
    size: int
    sha256: str
    action: str  # "copied" | "skipped"
    seconds: float = 0.0
    bytes_per_s: float | None = None


@dataclass
class PushReport:
    target: str
    workdir: str
    files: list[PushResult] = field(default_factory=list)

    @property
    def copied_bytes(self) -> int:
        return sum(f.size for f in self.files if f.action == "copied")

    def to_json(self) -> dict:
        return {"target": self.target, "workdir": self.workdir, "files": [asdict(f) for f in self.files],
                "copied": sum(f.action == "copied" for f in self.files),
                "skipped": sum(f.action == "skipped" for f in self.files),
                "copied_bytes": self.copied_bytes}  # fmt: skip


# ------------------------------------------------------------------------------------ what to push
def build_dirs_for(target: Target, build_root: Path | None = None) -> list[Path]:
    """Where engine builds for this target live, best first."""
    root = build_root or Path(os.environ.get("PI2_BUILD_ROOT") or REPO_ROOT / "build")
    return target.build_dirs(root)


def engine_files(target: Target, build_root: Path | None = None) -> list[Path]:
    """The pi2-* programs of the first build directory for the target that has any."""
    dirs = build_dirs_for(target, build_root)
    for d in dirs:
        found = sorted(p for p in d.glob("pi2-*") if p.is_file() and os.access(p, os.X_OK))
        if found:
            return found
    where = " or ".join(str(d) for d in dirs)
    raise Pi2Error(f"no engine build for {target.name} ({target.arch}) in {where}: run `{target.build_hint()}` first, "
                   f"or pass --no-engine")  # fmt: skip


def default_workloads(root: Path | None = None) -> list[Path]:
    root = root or REPO_ROOT / "workloads"
    return sorted(p for p in root.glob("*.jsonl") if p.is_file()) if root.is_dir() else []


def collect_items(
    target: Target,
    workdir: str,
    engine: list[Path] | None = None,
    models: list[Path] = (),
    plans: list[Path] = (),
    workloads: list[Path] = (),
) -> list[PushItem]:
    items: list[PushItem] = []
    groups = [("engine", "bin", engine or [], 0o755), ("model", "models", models, 0o644),
              ("plan", "plans", plans, 0o644), ("workload", "workloads", workloads, 0o644)]  # fmt: skip
    for kind, sub, paths, mode in groups:
        for path in paths:
            path = Path(path)
            if not path.is_file():
                raise Pi2Error(f"{kind} file not found: {path}")
            items.append(PushItem(local=path, remote=f"{workdir.rstrip('/')}/{sub}/{path.name}", kind=kind,
                                  mode=mode, size=path.stat().st_size))  # fmt: skip
    check_unique([i for i in items if i.kind != "model"])  # models: once named by their hash (name_models)
    return items


def check_unique(items: list[PushItem]) -> None:
    remotes = [i.remote for i in items]
    dup = {r for r in remotes if remotes.count(r) > 1}
    if dup:
        raise Pi2Error(f"two files would land on the same name: {', '.join(sorted(dup))}")


def name_models(items: list[PushItem]) -> None:
    """Model items get their device name, NAME-HASH.EXT, once their sha256 is known (push_files hashes
    them with a progress bar, so a GB model is not hashed silently before)."""
    for item in items:
        if item.kind == "model" and item.sha256:
            item.remote = f"{item.remote.rsplit('/', 1)[0]}/{model_remote_name(item.local, item.sha256)}"
    check_unique(items)


def model_remote_name(path: Path, sha256: str) -> str:
    """NAME-HASH.EXT for a model on the device: NAME is the file's stem, or its directory's name for
    DIR/model.X (as `pi2 models synth` and the store write them); HASH the sha256's first 12 hex digits."""
    stem = path.stem
    name = path.parent.name if stem in ("model", "") and path.parent.name else stem
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "model"
    return f"{name[:64]}-{sha256[:12]}{path.suffix}"


# ------------------------------------------------------------------------------------------ hashes
def sha256_file(path: Path, cache_path: Path | None = None, progress: Progress | None = None) -> str:
    """sha256 of a local file, remembered by (path, size, mtime) so GB models hash once.
    progress(bytes_hashed) is called only when the file is really read."""
    cache_path = cache_path or cache_dir() / "hash-cache.json"
    st = path.stat()
    key = str(path.resolve())
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    hit = cache.get(key)
    if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
        return hit[2]
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
            done += len(chunk)
            if progress:
                progress(done)
    digest = h.hexdigest()
    cache[key] = [st.st_size, st.st_mtime_ns, digest]
    with contextlib.suppress(OSError):  # a cache: losing it costs a re-hash
        safe_write.write_text(cache_path, json.dumps(cache))
    return digest


def read_manifest(target: Target, workdir: str) -> dict:
    text = target.read_text(f"{workdir.rstrip('/')}/{MANIFEST_NAME}")
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def write_manifest(target: Target, workdir: str, manifest: dict) -> None:
    remote = f"{workdir.rstrip('/')}/{MANIFEST_NAME}"
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    try:
        target.push(Path(f.name), remote + PARTIAL_SUFFIX)
        target.rename(remote + PARTIAL_SUFFIX, remote)
    finally:
        os.unlink(f.name)


def already_there(target: Target, items: list[PushItem], manifest: dict) -> set[str]:
    """Remote paths whose content already equals the local file's sha256."""
    stats = target.stats([i.remote for i in items])
    same: set[str] = set()
    to_hash: list[PushItem] = []
    for item in items:
        st = stats.get(item.remote)
        if st is None or st[0] != item.size:
            continue
        entry = manifest.get(item.remote) or {}
        if entry.get("size") == st[0] and entry.get("mtime") == st[1] and entry.get("sha256") == item.sha256:
            same.add(item.remote)  # the manifest vouches for it: no need to re-read GBs on the phone
        else:
            to_hash.append(item)
    if to_hash:
        digests = target.hashes([i.remote for i in to_hash])
        same.update(i.remote for i in to_hash if digests.get(i.remote) == i.sha256)
    return same


# -------------------------------------------------------------------------------------------- push
def check_free_space(target: Target, workdir: str, needed: int) -> int:
    free = target.free_bytes(workdir)
    if needed > free:
        raise Pi2Error(f"not enough space on {target.name}: {format_size(needed)} to copy but only "
                       f"{format_size(free)} free at {workdir} (free some space or push fewer models)")  # fmt: skip
    return free


def push_one(target: Target, item: PushItem, progress: Progress | None) -> float:
    """Copy to NAME.partial, verify the hash on the target, rename. Returns the seconds the copy took.

    Ctrl-C anywhere before the rename removes the .partial; a vanished device leaves at most a
    .partial behind, which the next push replaces."""
    partial = item.remote + PARTIAL_SUFFIX
    try:
        start = time.monotonic()
        try:
            target.push(item.local, partial, progress=progress, mode=item.mode)
        except TransferError as exc:
            with contextlib.suppress(TargetError):
                target.remove(partial)  # usually impossible when the device vanished; .partial says it all
            raise Pi2Error(f"{exc} ({item.local.name} not installed; run pi2 push again)") from None
        seconds = time.monotonic() - start
        digest = target.hash(partial)
        if digest != item.sha256:
            with contextlib.suppress(TargetError):
                target.remove(partial)
            raise Pi2Error(f"{item.local.name} arrived corrupted on {target.name} (sha256 "
                           f"{digest or 'missing'} instead of {item.sha256[:16]}...); removed it, run pi2 "
                           f"push again")  # fmt: skip
    except KeyboardInterrupt:
        # The device may still be draining data we sent into the closed stream: remove, give it a
        # moment to notice the stream is gone, remove again.
        with contextlib.suppress(TargetError, KeyboardInterrupt):
            target.sh(f"rm -f {shlex.quote(partial)}; sleep 0.3; rm -f {shlex.quote(partial)}", timeout=10)
        raise
    target.rename(partial, item.remote)
    return seconds


# progress_for(item, stage) with stage "hash" (local sha256, only called back when not cached) or "copy"
ProgressFactory = Callable[[PushItem, str], contextlib.AbstractContextManager]


@contextlib.contextmanager
def _no_progress(_item: PushItem, _stage: str):
    yield None


def push_files(
    target: Target,
    items: list[PushItem],
    workdir: str | None = None,
    progress_for: ProgressFactory | None = None,
    hash_cache: Path | None = None,
) -> PushReport:
    """Push `items`, skipping those already on the target. progress_for(item, stage) is a context
    manager yielding a Progress callback (or None) while a file is hashed here and while it is copied."""
    workdir = workdir or target.workdir
    progress_for = progress_for or _no_progress
    report = PushReport(target=target.name, workdir=workdir)
    try:
        for item in items:
            with progress_for(item, "hash") as progress:
                item.sha256 = sha256_file(item.local, hash_cache, progress)
        name_models(items)  # models/NAME-HASH.EXT: item.remote is where each one is on the device
        manifest = read_manifest(target, workdir)
        same = already_there(target, items, manifest)
        todo = [i for i in items if i.remote not in same]
        for item in items:
            if item.remote in same:
                report.files.append(PushResult(item.remote, str(item.local), item.kind, item.size, item.sha256,
                                               "skipped"))  # fmt: skip
        if not todo:
            return report
        check_free_space(target, workdir, sum(i.size for i in todo))
        for parent in sorted({i.remote.rsplit("/", 1)[0] for i in todo}):
            target.mkdir(parent)
        for item in todo:
            with progress_for(item, "copy") as progress:
                seconds = push_one(target, item, progress)
            report.files.append(PushResult(item.remote, str(item.local), item.kind, item.size, item.sha256,
                                           "copied", round(seconds, 3),
                                           round(item.size / seconds) if seconds > 0 else None))  # fmt: skip
            st = target.stats([item.remote]).get(item.remote)
            if st:
                manifest[item.remote] = {"sha256": item.sha256, "size": st[0], "mtime": st[1]}
                write_manifest(target, workdir, manifest)
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    return report
