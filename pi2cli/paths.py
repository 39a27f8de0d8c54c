"""Where pi2 keeps things: the repository, the cache (~/.cache/pi2 or $PI2_CACHE), the results."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    path = Path(os.environ.get("PI2_CACHE") or Path.home() / ".cache" / "pi2")
    path.mkdir(parents=True, exist_ok=True)
    return path


def results_dir(override: str | os.PathLike | None = None) -> Path:
    return Path(override or os.environ.get("PI2_RESULTS") or REPO_ROOT / "results")


def host_build_dir() -> Path:
    """The native build for this host that `make engine` produces."""
    return Path(os.environ.get("PI2_BUILD_DIR") or REPO_ROOT / "build" / "host")
