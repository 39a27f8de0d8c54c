"""Build llama.cpp (the baseline) from a pinned source, once per target and flag set, into the cache.

The source is the PyPI sdist of llama-cpp-python, which vendors llama.cpp with its tools; pinning the
sdist (version and sha256) pins llama.cpp to one commit. `ensure_built(target)` downloads and checks the
sdist, unpacks the vendored llama.cpp, configures it with CMake for the target and builds only the
tools pi2 uses. The result lives in ~/.cache/pi2/llama.cpp/TARGET-KEY/bin where KEY hashes the source
and every CMake argument, so a changed flag is a new build and an unchanged one is never rebuilt.

Targets:
  host           this machine, tuned for its CPU (GGML_NATIVE). On x86 CPUs that advertise AMX the
                 AMX instructions are turned off: ggml's AMX kernels die with SIGILL in VMs that
                 advertise AMX without letting the process use it.
  linux-arm64    static aarch64 binaries from Debian's aarch64-linux-gnu cross compiler (run them
                 on an arm64 board or under qemu-aarch64); OpenMP off so the binaries are static.
  android-arm64  the Android NDK ($ANDROID_NDK_HOME) toolchain file, arm64-v8a, static tools.
"""

import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from pi2cli.builds.cmake_run import cmake_build, default_jobs
from pi2cli.errors import Pi2Error
from pi2cli.paths import cache_dir

SDIST_PACKAGE = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMACPP_COMMIT = "0c1e570"  # the llama.cpp commit that sdist vendors
VENDORED_PREFIX = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
# The sdist also ships the submodule's git metadata; with it llama.cpp's build info (llama-bench's
# build_commit) names the real commit instead of "unknown".
GIT_MODULE_PREFIX = f"llama_cpp_python-{SDIST_VERSION}/.git/modules/vendor/llama.cpp/"

TARGETS = ("host", "linux-arm64", "android-arm64")
TOOLS = (
    "llama-completion",
    "llama-cli",
    "llama-tokenize",
    "llama-bench",
    "llama-server",
    "llama-simple",
)
# Bumped when the way we build changes in a way the CMake arguments do not show.
BUILDER_VERSION = "1"
ANDROID_PLATFORM = "android-28"
# Every arm64 phone core of the last years (Cortex-A55/A76 and later) has dotprod; qemu's default CPU too.
ARM64_ARCH = "armv8.2-a+dotprod"
AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
COMPLETE_MARKER = "pi2-build.json"


# ---------------------------------------------------------------------------------------------- source
def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_sdist(src_dir: Path | None = None) -> Path:
    """The pinned sdist in the cache, downloaded with pip when absent, its sha256 always checked."""
    src_dir = src_dir or cache_dir() / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    target = src_dir / SDIST_NAME
    if not target.exists():
        with tempfile.TemporaryDirectory(dir=src_dir) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                   f"{SDIST_PACKAGE}=={SDIST_VERSION}", "-d", tmp]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / SDIST_NAME
            if done.returncode != 0 or not got.exists():
                tail = (done.stderr or done.stdout).strip()[-300:]
                raise Pi2Error(f"could not download {SDIST_PACKAGE}=={SDIST_VERSION} sdist: {tail}")
            _check_sha(got)
            got.rename(target)
    _check_sha(target)
    return target


def _check_sha(path: Path) -> None:
    actual = sha256_of(path)
    if actual != SDIST_SHA256:
        raise Pi2Error(
            f"{path} has sha256 {actual}, expected {SDIST_SHA256} ({SDIST_NAME}); delete it to re-download"
        )


def _extract_prefix(tar: tarfile.TarFile, prefix: str, dest: Path) -> int:
    count = 0
    for member in tar.getmembers():
        if not member.name.startswith(prefix):
            continue
        member.name = member.name[len(prefix) :]
        if member.name:
            tar.extract(member, dest, filter="data")
            count += 1
    return count


def unpack_source(sdist: Path, src_dir: Path | None = None) -> Path:
    """Unpack only the vendored llama.cpp tree of the sdist (once), with its git metadata; its root."""
    src_dir = src_dir or sdist.parent
    root = src_dir / f"llama.cpp-{LLAMACPP_COMMIT}"
    marker = root / ".pi2-unpacked"
    if not marker.exists():
        tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=src_dir))
        try:
            with tarfile.open(sdist) as tar:
                _extract_prefix(tar, VENDORED_PREFIX, tmp)
            if not (tmp / "CMakeLists.txt").exists():
                raise Pi2Error(f"{sdist} holds no vendored llama.cpp ({VENDORED_PREFIX})")
            (tmp / ".pi2-unpacked").write_text(f"{SDIST_NAME} {SDIST_SHA256}\n")
            shutil.rmtree(root, ignore_errors=True)
            tmp.rename(root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    attach_git_metadata(sdist, root)
    return root


def attach_git_metadata(sdist: Path, root: Path) -> bool:
    """Give the unpacked tree the submodule's git dir (next to it, as ROOT.git) so `git rev-parse`
    inside it answers the pinned commit. The sdist's gitlink and core.worktree are relative to the
    sdist layout, so both are rewritten as absolute paths. False when the sdist has no git metadata."""
    git_dir = root.parent / (root.name + ".git")
    gitlink = root / ".git"
    wanted = f"gitdir: {git_dir}\n"
    if (git_dir / "HEAD").exists() and gitlink.is_file() and gitlink.read_text() == wanted:
        return True
    tmp = Path(tempfile.mkdtemp(prefix=".git-", dir=root.parent))
    try:
        with tarfile.open(sdist) as tar:
            if _extract_prefix(tar, GIT_MODULE_PREFIX, tmp) == 0 or not (tmp / "HEAD").exists():
                return False
        config = tmp / "config"
        if config.exists():
            lines = config.read_text().splitlines()
            lines = [f"\tworktree = {root}" if ln.strip().startswith("worktree =") else ln for ln in lines]
            config.write_text("\n".join(lines) + "\n")
        shutil.rmtree(git_dir, ignore_errors=True)
        tmp.rename(git_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gitlink.write_text(wanted)
    return True


# ------------------------------------------------------------------------------------------ flags, key
def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether this x86 CPU advertises AMX (any of amx_tile/amx_int8/amx_bf16 in /proc/cpuinfo)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    return any(flag in flags for flag in AMX_FLAGS)


def cmake_args(
    target: str,
    *,
    host_machine: str | None = None,
    host_has_amx: bool | None = None,
    ndk_home: str | None = None,
) -> list[str]:
    """The CMake configure arguments for a target (pure: the facts it needs can be passed in)."""
    if target not in TARGETS:
        raise Pi2Error(f"unknown llama.cpp build target '{target}' (known: {', '.join(TARGETS)})")
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",  # self-contained tools: the bin dir can be moved or pushed alone
        "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",  # the prebuilt web UI is a download; the API is all we use
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DGGML_CCACHE=OFF",
    ]
    if target == "host":
        machine = (host_machine or platform.machine()).lower()
        args.append("-DGGML_NATIVE=ON")
        amx = cpu_has_amx() if host_has_amx is None else host_has_amx
        if machine in ("x86_64", "amd64") and amx:
            args += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    elif target == "linux-arm64":
        for tool in ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++"):
            if shutil.which(tool) is None:
                raise Pi2Error(
                    f"{tool} not found: install Debian's gcc-aarch64-linux-gnu g++-aarch64-linux-gnu"
                )
        args += [
            "-DCMAKE_SYSTEM_NAME=Linux",
            "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
            "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc",
            "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++",
            "-DCMAKE_EXE_LINKER_FLAGS=-static",
            "-DGGML_NATIVE=OFF",
            f"-DGGML_CPU_ARM_ARCH={ARM64_ARCH}",
            "-DGGML_OPENMP=OFF",
        ]
    else:  # android-arm64
        ndk = ndk_home if ndk_home is not None else os.environ.get("ANDROID_NDK_HOME", "")
        toolchain = Path(ndk) / "build" / "cmake" / "android.toolchain.cmake"
        if not ndk or not toolchain.exists():
            raise Pi2Error(
                "android-arm64 needs the Android NDK: set ANDROID_NDK_HOME to an NDK "
                f"(r26 or later) holding build/cmake/android.toolchain.cmake (got '{ndk}')"
            )
        args += [
            f"-DCMAKE_TOOLCHAIN_FILE={toolchain}",
            "-DANDROID_ABI=arm64-v8a",
            f"-DANDROID_PLATFORM={ANDROID_PLATFORM}",
            "-DGGML_NATIVE=OFF",
            f"-DGGML_CPU_ARM_ARCH={ARM64_ARCH}",
            "-DGGML_OPENMP=OFF",
            "-DLLAMA_CURL=OFF",
        ]
    return args


def cache_key(target: str, args: list[str], source_sha256: str = SDIST_SHA256) -> str:
    """Hash of everything that decides the binaries: source, target, CMake arguments, builder version."""
    blob = json.dumps([BUILDER_VERSION, source_sha256, target, args, list(TOOLS)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def build_root() -> Path:
    return cache_dir() / "llama.cpp"


def build_dir_for(target: str, key: str) -> Path:
    return build_root() / f"{target}-{key}"


def is_complete(build_dir: Path) -> bool:
    bin_dir = build_dir / "bin"
    return (build_dir / COMPLETE_MARKER).exists() and all((bin_dir / t).exists() for t in TOOLS)


def ensure_built(target: str = "host", jobs: int | None = None, show_progress: bool = True) -> Path:
    """The bin dir holding llama.cpp's tools for `target`, building them first when not cached.

    Safe to call from several processes at once: a file lock lets one build while the others wait.
    """
    args = cmake_args(target)
    key = cache_key(target, args)
    build_dir = build_dir_for(target, key)
    if is_complete(build_dir):
        return build_dir / "bin"
    for tool in ("cmake",):
        if shutil.which(tool) is None:
            raise Pi2Error(f"{tool} not found: install it (Debian: apt-get install cmake ninja-build)")
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_root() / f".{target}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(build_dir):  # another process built it while we waited
            return build_dir / "bin"
        source = unpack_source(fetch_sdist())
        _build(source, build_dir, target, args, jobs or default_jobs(), show_progress)
    return build_dir / "bin"


def _build(source: Path, build_dir: Path, target: str, args: list[str], jobs: int, show: bool) -> None:
    started = time.monotonic()
    cmake_build(source, build_dir, name="llama.cpp", label=f"llama.cpp {LLAMACPP_COMMIT}", target=target, args=args,
                jobs=jobs, show=show, takes="about 6-10 minutes on 2 cores", build_targets=TOOLS)  # fmt: skip
    log_path = build_dir / "build.log"
    missing = [t for t in TOOLS if not (build_dir / "bin" / t).exists()]
    if missing:
        raise Pi2Error(f"llama.cpp build for {target} produced no {', '.join(missing)} (log: {log_path})")
    record = {
        "target": target,
        "sdist": SDIST_NAME,
        "sdist_sha256": SDIST_SHA256,
        "llama_cpp_commit": LLAMACPP_COMMIT,
        "cmake_args": args,
        "tools": list(TOOLS),
        "build_seconds": round(time.monotonic() - started, 1),
    }
    partial = build_dir / (COMPLETE_MARKER + ".partial")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.rename(build_dir / COMPLETE_MARKER)


def build_record(bin_dir: Path) -> dict:
    """What a finished build recorded about itself (target, source, flags, build time)."""
    try:
        return json.loads((bin_dir.parent / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return {}
