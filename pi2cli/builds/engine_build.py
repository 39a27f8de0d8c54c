"""Building pi2-engine (and the other pi2-* programs in native/) for a target.

Builds land in build/TARGET (host, linux-arm64, android-arm64), the directories `pi2 push` takes the
engine from. A build records a hash of everything that decides the binaries (every file under native/,
the CMake arguments, the compiler) in build/TARGET/pi2-build.json; when nothing changed, the build is
reused without running CMake at all.

One binary serves every core of an architecture: SIMD kernels (AVX2 on x86; NEON, dotprod and i8mm on
arm64) are compiled into it side by side and chosen at run time, so the "dotprod" and "i8mm" variants
of an Android build are the same file, which falls back to plain NEON on older cores.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pi2cli import safe_write
from pi2cli.builds.cmake_run import cmake_build, default_jobs
from pi2cli.errors import Pi2Error
from pi2cli.paths import REPO_ROOT

TARGETS = ("host", "linux-arm64", "android-arm64")
DEFAULT_ANDROID_API = 28
RECORD = "pi2-build.json"
NATIVE = REPO_ROOT / "native"


def ndk_home() -> str:
    return os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT") or ""


def cmake_args(target: str, *, ndk: str | None = None, android_api: int = DEFAULT_ANDROID_API) -> list[str]:
    """CMake configure arguments for a target; raises Pi2Error naming what is missing."""
    args = ["-DCMAKE_BUILD_TYPE=Release"]
    if target == "host":
        return args
    if target == "linux-arm64":
        if shutil.which("aarch64-linux-gnu-gcc") is None:
            raise Pi2Error(
                "aarch64-linux-gnu-gcc not found: apt-get install gcc-aarch64-linux-gnu (or make setup)"
            )
        return args + [f"-DCMAKE_TOOLCHAIN_FILE={NATIVE / 'cmake-aarch64-linux-gnu.cmake'}"]
    if target == "android-arm64":
        ndk = ndk_home() if ndk is None else ndk
        toolchain = Path(ndk) / "build" / "cmake" / "android.toolchain.cmake"
        if not ndk or not toolchain.exists():
            # No NDK: Debian's cross compiler makes static binaries that Android runs from /data/local/tmp.
            return cmake_args("linux-arm64")
        return args + [
            f"-DCMAKE_TOOLCHAIN_FILE={toolchain}",
            "-DANDROID_ABI=arm64-v8a",
            f"-DANDROID_PLATFORM=android-{android_api}",
        ]
    raise Pi2Error(f"unknown build target '{target}' (known: {', '.join(TARGETS)})")


def source_hash(args: list[str], root: Path = NATIVE) -> str:
    """Hash of the native sources, the CMake arguments and the compiler versions."""
    digest = hashlib.sha256(json.dumps(args).encode())
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes())
    for compiler in ("cc", "aarch64-linux-gnu-gcc"):
        if shutil.which(compiler):
            version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
            digest.update(version.encode())
    return digest.hexdigest()[:16]


def build_dir_for(target: str) -> Path:
    return Path(os.environ.get("PI2_BUILD_ROOT") or REPO_ROOT / "build") / target


def _up_to_date(build_dir: Path, key: str) -> bool:
    try:
        record = json.loads((build_dir / RECORD).read_text())
    except (OSError, ValueError):
        return False
    return record.get("key") == key and (build_dir / "pi2-engine").exists()


def ensure_engine_built(
    target: str = "host",
    *,
    jobs: int | None = None,
    android_api: int = DEFAULT_ANDROID_API,
    show: bool = True,
) -> tuple[Path, bool]:
    """(directory holding pi2-engine for `target`, whether it was rebuilt now)."""
    args = cmake_args(target, android_api=android_api)
    key = source_hash(args)
    build_dir = build_dir_for(target)
    if target == "android-arm64" and "-DANDROID_ABI=arm64-v8a" not in args and show:
        print(
            "pi2 build: no Android NDK (ANDROID_NDK_HOME / ANDROID_NDK_ROOT unset or invalid): building static "
            "arm64 binaries with aarch64-linux-gnu-gcc instead; they run on Android from /data/local/tmp",
            file=sys.stderr,
        )
    if _up_to_date(build_dir, key):
        return build_dir, False
    if shutil.which("cmake") is None:
        raise Pi2Error("cmake not found: apt-get install cmake ninja-build (or make setup)")
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / RECORD).unlink(missing_ok=True)  # a half-done rebuild never looks current
    _build(build_dir, target, args, jobs or default_jobs(), show)
    record = {"target": target, "key": key, "cmake_args": args, "built_at": time.time()}
    safe_write.write_text(build_dir / RECORD, json.dumps(record, indent=2) + "\n")
    return build_dir, True


def _build(build_dir: Path, target: str, args: list[str], jobs: int, show: bool) -> None:
    cmake_build(NATIVE, build_dir, name="pi2-engine", label="pi2-engine", target=target, args=args, jobs=jobs,
                show=show, takes="about 1-3 minutes on 2 cores")  # fmt: skip
    if not (build_dir / "pi2-engine").exists():
        log_path = build_dir / "build.log"  # where cmake_build wrote every line
        raise Pi2Error(f"pi2-engine build for {target} produced no pi2-engine (log: {log_path})")
