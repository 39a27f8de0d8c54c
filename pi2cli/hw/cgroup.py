"""Run a program inside a memory budget that really binds: a memory cgroup that counts the page cache.

A baseline that mmaps a model larger than the budget must really page from storage, or a comparison
with pi2 (which manages its own cache inside the budget) is meaningless. So a budgeted run:
  1. evicts the model file(s) from the page cache first (fdatasync + POSIX_FADV_DONTNEED), so nothing
     cached by an earlier run is silently reused;
  2. starts the program inside a fresh memory cgroup with the limit set (cgroup v2 `memory.max`, or
     v1 `memory.limit_in_bytes` plus `memory.memsw.limit_in_bytes` where swap accounting exists). The
     kernel charges page-cache pages a process faults in to its cgroup, so mmapped weights count;
  3. records the cgroup's peak usage and how often the limit was hit, then removes the cgroup, also
     when the run fails or is interrupted (Ctrl-C).

The cgroup is created as a child of the cgroup this process lives in (or of $PI2_CGROUP_PARENT, a
path relative to the memory hierarchy's root), so limits nest and nothing above is touched. Without
rights to create one, the run still happens but the record says `enforced: false` and why: a result
never claims a budget that was not there.

Every run returns a `budget` dict for the result JSON, e.g.
  {"limit_bytes": 104857600, "enforced": true, "how": "cgroup v1 memory.limit_in_bytes (page cache
   counted)", "cgroup": "/sys/fs/cgroup/memory/.../pi2-budget-123-ab12", "peak_bytes": 104857600,
   "limit_hits": 2101, "evicted": [{"path": "...", "resident_before": ..., "resident_after": 0}]}
"""

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.units import check_size

CGROUP_ROOT = Path("/sys/fs/cgroup")
PAGE = os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------------------------------- page cache
def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def resident_bytes(path: os.PathLike | str) -> int:
    """How many bytes of the file are in the page cache now (mincore over a mapping never touched)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = _libc()
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]  # fmt: skip
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap failed for {path}")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed for {path}")
            return sum(b & 1 for b in vec.raw) * PAGE
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def evict_from_page_cache(path: os.PathLike | str) -> dict:
    """Drop the file's pages from the page cache (dirty pages are written back first)."""
    path = os.fspath(path)
    before = resident_bytes(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):
            os.fdatasync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return {"path": path, "resident_before": before, "resident_after": resident_bytes(path)}


# ------------------------------------------------------------------------------------------ cgroups
@dataclass
class CgroupSupport:
    """Where a budget cgroup can be made on this machine, or why it cannot."""

    version: int  # 1 or 2; 0 when there is no usable memory controller
    parent: Path | None
    reason: str = ""

    @property
    def usable(self) -> bool:
        return self.version in (1, 2) and self.parent is not None


def _own_cgroup(version: int, proc_cgroup: str) -> str:
    for line in proc_cgroup.splitlines():
        hier, controllers, path = line.split(":", 2)
        if version == 2 and hier == "0" and controllers == "":
            return path
        if version == 1 and "memory" in controllers.split(","):
            return path
    return "/"


def detect_cgroup(root: Path = CGROUP_ROOT) -> CgroupSupport:
    """Find the memory controller (v1 `memory` hierarchy preferred when mounted, else v2 unified)."""
    try:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        return CgroupSupport(0, None, "no /proc/self/cgroup (not Linux?)")
    override = os.environ.get("PI2_CGROUP_PARENT")
    candidates = []
    v1 = root / "memory"
    if (v1 / "memory.limit_in_bytes").exists():
        candidates.append((1, v1))
    for v2 in (root, root / "unified"):
        if (v2 / "cgroup.controllers").exists():
            candidates.append((2, v2))
    if not candidates:
        return CgroupSupport(0, None, f"no memory cgroup controller mounted under {root}")
    reasons = []
    for version, mount in candidates:
        rel = override if override is not None else _own_cgroup(version, proc_cgroup)
        parent = mount / rel.lstrip("/")
        if version == 2:
            try:
                controllers = (parent / "cgroup.controllers").read_text().split()
            except OSError:
                controllers = []
            if "memory" not in controllers:
                reasons.append(f"cgroup v2 {parent} has no memory controller delegated")
                continue
            try:  # a child gets memory.max only where the parent hands the controller down
                subtree = (parent / "cgroup.subtree_control").read_text().split()
            except OSError:
                subtree = []
            if "memory" not in subtree:
                reasons.append(
                    f"cgroup v2 {parent} does not enable memory for its children (cgroup.subtree_control)"
                )
                continue
        if not os.access(parent, os.W_OK):
            reasons.append(f"no write access to {parent} (needs root or a delegated cgroup)")
            continue
        return CgroupSupport(version, parent)
    return CgroupSupport(0, None, "; ".join(reasons))


class MemoryCgroup:
    """One short-lived memory cgroup with a hard limit; use as a context manager (removed on exit)."""

    def __init__(self, limit_bytes: int, support: CgroupSupport | None = None):
        self.limit_bytes = check_size(int(limit_bytes))
        self.support = support or detect_cgroup()
        if not self.support.usable:
            raise Pi2Error(f"cannot enforce a memory budget: {self.support.reason}")
        self.version = self.support.version
        name = f"pi2-budget-{os.getpid()}-{secrets.token_hex(3)}"
        self.path = self.support.parent / name
        self._created = False

    # v1 and v2 name their files differently
    def _file(self, v1: str, v2: str) -> Path:
        return self.path / (v1 if self.version == 1 else v2)

    def __enter__(self) -> "MemoryCgroup":
        try:
            self.path.mkdir()
        except OSError as err:
            raise Pi2Error(f"cannot create cgroup {self.path}: {err.strerror}") from err
        self._created = True
        try:
            if self.version == 1:
                (self.path / "memory.limit_in_bytes").write_text(str(self.limit_bytes))
                memsw = self.path / "memory.memsw.limit_in_bytes"
                if memsw.exists():  # without it a process could swap its way past the limit
                    memsw.write_text(str(self.limit_bytes))
            else:
                (self.path / "memory.max").write_text(str(self.limit_bytes))
                with contextlib.suppress(OSError):
                    (self.path / "memory.swap.max").write_text("0")
        except OSError as err:
            self.remove()
            raise Pi2Error(f"cannot set the memory limit on {self.path}: {err.strerror}") from err
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    @property
    def how(self) -> str:
        if self.version == 1:
            return "cgroup v1 memory.limit_in_bytes (page cache counted)"
        return "cgroup v2 memory.max (page cache counted)"

    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def add(self, pid: int) -> None:
        self.procs_file().write_text(str(pid))

    def _read_int(self, v1: str, v2: str) -> int | None:
        try:
            return int(self._file(v1, v2).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def usage_bytes(self) -> int | None:
        return self._read_int("memory.usage_in_bytes", "memory.current")

    def peak_bytes(self) -> int | None:
        """Highest charge seen (v1 max_usage_in_bytes; v2 memory.peak, kernels >= 5.19)."""
        return self._read_int("memory.max_usage_in_bytes", "memory.peak")

    def limit_hits(self) -> int | None:
        """How often the limit was reached (v1 failcnt; v2 the `max` count in memory.events)."""
        if self.version == 1:
            return self._read_int("memory.failcnt", "")
        return self._keyed("memory.events", "max")

    def stat(self) -> dict[str, int]:
        try:
            lines = (self.path / "memory.stat").read_text().splitlines()
        except OSError:
            return {}
        out = {}
        for line in lines:
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
        return out

    def oom_kills(self) -> int | None:
        """Processes the kernel's OOM killer ended inside the cgroup (v1 memory.oom_control, v2
        memory.events: `oom_kill`, kernels >= 4.13), so a run killed at its budget can say so."""
        return self._keyed("memory.oom_control" if self.version == 1 else "memory.events", "oom_kill")

    def _keyed(self, name: str, key: str) -> int | None:
        """`key`'s value in one of the cgroup's flat keyed files ("key value" lines); None if unreadable."""
        try:
            for line in (self.path / name).read_text().splitlines():
                k, value = line.split()
                if k == key:
                    return int(value)
        except (OSError, ValueError):
            pass
        return None

    def major_faults(self) -> int | None:
        """Page faults inside the cgroup that had to read from storage (memory.stat pgmajfault)."""
        stat = self.stat()
        return stat.get("total_pgmajfault", stat.get("pgmajfault"))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs_file().read_text().split()]
        except OSError:
            return []

    def remove(self) -> None:
        """Kill what is left inside, then remove the cgroup directory (retrying while it drains)."""
        if not self._created:
            return
        for _ in range(50):
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                self._created = False
                return
            except FileNotFoundError:
                self._created = False
                return
            except OSError:
                time.sleep(0.05)

    def record(self) -> dict:
        return {
            "limit_bytes": self.limit_bytes,
            "enforced": True,
            "how": self.how,
            "cgroup": str(self.path),
            "peak_bytes": self.peak_bytes(),
            "limit_hits": self.limit_hits(),
            "oom_kills": self.oom_kills(),
            "major_faults": self.major_faults(),
        }


def peak_over_budget(peak_bytes: int | None, memory: dict, cgroup_peak_bytes: int | None) -> str | None:
    """Why a run's peak RSS is above its budget (one line), or None when it is not. The peak is the
    kernel's VmHWM, which counts every resident page the process maps; a cgroup charges a page to the
    cgroup that first brought it in, so file pages already cached (the binary, its libraries) count in
    RSS and not against the limit."""
    budget = memory.get("budget_bytes")
    if not budget or not peak_bytes or peak_bytes <= budget:
        return None
    from pi2cli.units import format_size

    over = f"peak RSS {format_size(peak_bytes)} is above the {format_size(budget)} budget"
    if not memory.get("enforced"):
        return f"{over}: {memory.get('how') or 'the budget was not enforced'}"
    if cgroup_peak_bytes is not None and cgroup_peak_bytes <= budget:
        return (f"{over}: the cgroup's own peak was {format_size(cgroup_peak_bytes)}; RSS also counts pages "
                f"charged elsewhere (the binary and libraries already in the page cache)")  # fmt: skip
    return f"{over} ({memory.get('how') or 'enforced'})"


def not_enforced_record(limit_bytes: int | None, reason: str) -> dict:
    return {"limit_bytes": limit_bytes, "enforced": False, "how": f"not enforced: {reason}"}


# ------------------------------------------------------------------------------------- running
@dataclass
class BudgetedRun:
    returncode: int
    stdout: str
    stderr: str
    budget: dict = field(default_factory=dict)


def _join_cgroup(procs_file: Path):
    """preexec_fn: the child moves itself into the cgroup before exec, so every page it touches counts."""

    def join() -> None:
        with open(procs_file, "w") as f:
            f.write(str(os.getpid()))

    return join


class Budget:
    """A memory budget for one or more processes: evict files, then start processes inside the limit.

    with Budget(2_500_000_000, evict=[model]) as budget:
        proc = budget.popen([...])           # as subprocess.Popen, started inside the cgroup
        ...
        record = budget.record()             # dict for the result JSON (peak, limit hits, how)

    limit_bytes None means no budget (the record says so); `required=True` turns "cannot enforce"
    into a Pi2Error instead of a recorded `enforced: false`.
    """

    def __init__(self, limit_bytes: int | None, evict: list | tuple = (), required: bool = False):
        self.limit_bytes = limit_bytes
        self.evict = [Path(p) for p in evict]
        self.required = required
        self.cgroup: MemoryCgroup | None = None
        self.evicted: list[dict] = []
        self.reason = ""

    def __enter__(self) -> "Budget":
        for path in self.evict:
            self.evicted.append(evict_from_page_cache(path))
        if self.limit_bytes is None:
            self.reason = "no budget requested"
            return self
        support = detect_cgroup()
        if not support.usable:
            if self.required:
                raise Pi2Error(f"cannot enforce a memory budget: {support.reason}")
            self.reason = support.reason
            return self
        self.cgroup = MemoryCgroup(self.limit_bytes, support).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.cgroup is not None:
            self._final = self.cgroup.record()
            self.cgroup.remove()

    def popen(self, cmd: list[str], **kwargs) -> subprocess.Popen:
        if self.cgroup is not None:
            if "preexec_fn" in kwargs:
                raise ValueError("Budget.popen sets preexec_fn itself")
            kwargs["preexec_fn"] = _join_cgroup(self.cgroup.procs_file())
        try:
            return subprocess.Popen(cmd, **kwargs)
        except subprocess.SubprocessError as err:  # the child could not join the cgroup
            raise Pi2Error(f"cannot start {cmd[0]} inside cgroup {self.cgroup.path}: {err}") from err

    def record(self) -> dict:
        if self.cgroup is not None:
            out = getattr(self, "_final", None) or self.cgroup.record()
        else:
            out = not_enforced_record(self.limit_bytes, self.reason)
        out["evicted"] = self.evicted
        return out


def run_budgeted(
    cmd: list[str],
    limit_bytes: int | None,
    evict: list | tuple = (),
    required: bool = False,
    timeout: float | None = None,
    env: dict | None = None,
) -> BudgetedRun:
    """Run cmd to completion inside a memory budget; stdout/stderr captured as text."""
    with Budget(limit_bytes, evict=evict, required=required) as budget:
        proc = budget.popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=env
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:  # timeout, Ctrl-C: never leave the child behind
            proc.kill()
            proc.communicate()
            raise
    return BudgetedRun(proc.returncode, out, err, budget.record())
