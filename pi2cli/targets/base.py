"""The one interface every target implements: where engines run and files land.

A target is this machine (`local`), a phone through the adb server (`adb`), or arm64 builds under
qemu-user on this machine (`qemu`). Bench and push code talk only to `Target`; everything that can be
answered by a POSIX shell on the target (facts, hashes, free space, memory, temperature) is written once
here in `ShellTarget`, over the subclass's `sh()`.

Paths on the target are POSIX strings (`remote`); paths on this machine are `Path`s (`local`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

# progress(bytes_done_so_far) during a copy
Progress = Callable[[int], None]
# on_output(stream_name, data) with stream_name "stdout" or "stderr", called from a reader thread
OutputCallback = Callable[[str, bytes], None]


class TargetError(Exception):
    """Something went wrong on or with the target (vanished device, failed command). One line."""


class TransferError(TargetError):
    """A copy to or from the target did not complete (disconnect, write error)."""


@dataclass
class CommandResult:
    returncode: int
    stdout: str
    stderr: str

    def check(self, what: str) -> CommandResult:
        if self.returncode != 0:
            detail = (self.stderr or self.stdout).strip().splitlines()
            raise TargetError(
                f"{what} failed (exit {self.returncode}): {detail[-1] if detail else 'no output'}"
            )
        return self


@dataclass
class MemoryUsage:
    """Memory of one process on the target, bytes. PSS only where /proc/PID/smaps_rollup exists."""

    rss_bytes: int
    hwm_bytes: int
    pss_bytes: int | None = None

    def to_json(self) -> dict:
        return asdict(self)


@runtime_checkable
class ProcessHandle(Protocol):
    """A command started with Target.run. `pid` is the process id ON THE TARGET (for read_memory)."""

    pid: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int:
        """Exit code; raises TimeoutError when it is still running after `timeout` seconds."""
        ...

    def kill(self) -> None: ...


@runtime_checkable
class Target(Protocol):
    name: str  # what --device takes: "local", "qemu-arm64" or an adb serial
    kind: str  # "local" | "adb" | "qemu"
    arch: str  # "x86_64" | "arm64"
    workdir: str  # default working directory on the target (pi2 push puts things under it)
    emulated: bool  # True under qemu: results are for correctness only, never for speed

    def facts(self) -> dict: ...

    def push(self, local: Path, remote: str, progress: Progress | None = None, mode: int = 0o644) -> None: ...

    def pull(self, remote: str, local: Path) -> None: ...

    def exists(self, remote: str) -> bool: ...

    def hash(self, remote: str) -> str | None: ...

    def free_bytes(self, remote: str) -> int: ...

    def sh(self, command: str, timeout: float | None = 60) -> CommandResult: ...

    def run(
        self,
        argv: list[str],
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        on_output: OutputCallback | None = None,
    ) -> ProcessHandle: ...

    def read_memory(self, pid: int) -> MemoryUsage | None: ...

    def temperature(self) -> float | None: ...

    @property
    def on_this_machine(self) -> bool: ...

    @property
    def native_here(self) -> bool: ...

    def build_dirs(self, root: Path) -> list[Path]: ...

    def build_hint(self) -> str: ...


# One shell round trip gathers every fact; sections are separated by marker lines.
FACTS_SCRIPT = r"""
echo '@@uname'; uname -m 2>/dev/null
echo '@@cpuinfo'; cat /proc/cpuinfo 2>/dev/null
echo '@@meminfo'; cat /proc/meminfo 2>/dev/null
echo '@@freq'
for c in /sys/devices/system/cpu/cpu[0-9]*; do
  [ -e "$c/cpufreq/cpuinfo_max_freq" ] && echo "${c##*/} $(cat $c/cpufreq/cpuinfo_max_freq 2>/dev/null) $(cat $c/cpu_capacity 2>/dev/null)"
done
echo '@@ncpu'; ls -d /sys/devices/system/cpu/cpu[0-9]* 2>/dev/null | wc -l
echo '@@getprop'; getprop 2>/dev/null
echo '@@ufs'
for f in /sys/devices/platform/*/device_descriptor/specification_version \
         /sys/devices/platform/soc/*/device_descriptor/specification_version \
         /sys/class/ufs*/*/device_descriptor/specification_version; do
  [ -r "$f" ] && cat "$f" 2>/dev/null && break
done
echo '@@blocks'
for b in /sys/block/*; do
  case "${b##*/}" in loop*|ram*|zram*|dm-*) continue;; esac
  echo "${b##*/} $(cat $b/queue/rotational 2>/dev/null)"
done
echo '@@battery'; dumpsys battery 2>/dev/null
echo '@@powersupply'
for p in /sys/class/power_supply/*; do
  [ -r "$p/capacity" ] && echo "${p##*/} $(cat $p/capacity 2>/dev/null) $(cat $p/temp 2>/dev/null)"
done
echo '@@thermal'
for z in /sys/class/thermal/thermal_zone*; do
  [ -r "$z/temp" ] && echo "$(cat $z/type 2>/dev/null | tr ' ' _) $(cat $z/temp 2>/dev/null)"
done
echo '@@end'
"""

THERMAL_SCRIPT = r"""
for z in /sys/class/thermal/thermal_zone*; do
  [ -r "$z/temp" ] && echo "$(cat $z/type 2>/dev/null | tr ' ' _) $(cat $z/temp 2>/dev/null)"
done
echo '@@battery'; dumpsys battery 2>/dev/null | grep -i temperature
"""


def split_sections(text: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@@"):
            current = line[2:].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def parse_getprop(text: str) -> dict[str, str]:
    props = {}
    for m in re.finditer(r"^\[([^\]]+)\]: \[(.*)\]\s*$", text, re.M):
        props[m.group(1)] = m.group(2)
    return props


def parse_cpu_clusters(freq_text: str) -> list[dict]:
    """CPUs grouped by max frequency and capacity, slowest first: [{"cpus": [0, 1], "max_mhz": 2265,
    "capacity": 325}, ...]. Lines are "cpuN MAX_KHZ [CAPACITY]"; capacity (arm64's cpu_capacity, 1024 for
    the fastest core, scaled by its microarchitecture and max frequency) is left out where the kernel has
    none. It tells apart cores of one max frequency but different designs (MediaTek's Helio P60: four
    A73 and four A53 cores, all 2.0 GHz), and ranks them by speed rather than by clock alone."""
    by_key: dict[tuple[int, int | None], list[int]] = {}
    for line in freq_text.splitlines():
        parts = line.split()
        if (
            len(parts) in (2, 3)
            and parts[0].startswith("cpu")
            and parts[0][3:].isdigit()
            and parts[1].isdigit()
        ):
            cap = int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else None
            by_key.setdefault((int(parts[1]), cap), []).append(int(parts[0][3:]))
    out = []
    for (khz, cap), cpus in sorted(by_key.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0])):
        out.append(
            {"cpus": sorted(cpus), "max_mhz": khz // 1000, **({"capacity": cap} if cap is not None else {})}
        )
    return out


def parse_thermal(text: str) -> dict[str, float]:
    """zone type -> degrees C (sysfs gives millidegrees; some old kernels give degrees)."""
    zones = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and re.fullmatch(r"-?\d+", parts[1]):
            value = int(parts[1])
            zones[parts[0]] = value / 1000 if abs(value) > 200 else float(value)
    return zones


def parse_battery(dumpsys: str, power_supply: str) -> dict:
    out: dict = {}
    level = re.search(r"^\s*level:\s*(\d+)", dumpsys, re.M)
    temp = re.search(r"^\s*temperature:\s*(-?\d+)", dumpsys, re.M)
    if level:
        out["level_percent"] = int(level.group(1))
    if temp:
        out["temperature_c"] = int(temp.group(1)) / 10  # dumpsys reports tenths of a degree
    if not out:
        for line in power_supply.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                out["level_percent"] = int(parts[1])
                if len(parts) >= 3 and re.fullmatch(r"-?\d+", parts[2]):
                    out["temperature_c"] = int(parts[2]) / 10
                break
    return out


def ufs_version(spec: str) -> str | None:
    """device_descriptor/specification_version is BCD: 0x0310 -> "UFS 3.1"."""
    spec = spec.strip()
    if not spec:
        return None
    try:
        value = int(spec, 16)
    except ValueError:
        return None
    return f"UFS {value >> 8:x}.{(value >> 4) & 0xF:x}"


def parse_facts(text: str) -> dict:
    s = split_sections(text)
    props = parse_getprop(s.get("getprop", ""))
    cpuinfo = s.get("cpuinfo", "")
    model = None
    for key in ("model name", "Hardware", "Processor", "cpu model"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", cpuinfo, re.M)
        if m:
            model = m.group(1).strip()
            break
    soc = props.get("ro.soc.model") or props.get("ro.board.platform") or props.get("ro.hardware") or model
    mem = re.search(r"^MemTotal:\s*(\d+)\s*kB", s.get("meminfo", ""), re.M)
    ncpu = s.get("ncpu", "").strip()
    clusters = parse_cpu_clusters(s.get("freq", ""))
    storage = None
    ufs = ufs_version(s.get("ufs", ""))
    if ufs:
        storage = ufs
    elif props.get("ro.boot.storage") or props.get("ro.boot.bootdevice"):
        storage = props.get("ro.boot.storage") or props.get("ro.boot.bootdevice")
    else:
        kinds = []
        for line in s.get("blocks", "").splitlines():
            parts = line.split()
            if len(parts) == 2:
                kind = "hdd" if parts[1] == "1" else ("nvme" if parts[0].startswith("nvme") else "ssd")
                kinds.append(f"{parts[0]} ({kind})")
        storage = ", ".join(kinds) or None
    thermal = parse_thermal(s.get("thermal", ""))
    facts = {
        "arch": normalize_arch(s.get("uname", "").strip() or props.get("ro.product.cpu.abi", "")),
        "cpu_model": model,
        "soc": soc,
        "cores": int(ncpu)
        if ncpu.isdigit() and int(ncpu) > 0
        else sum(len(c["cpus"]) for c in clusters) or None,
        "clusters": clusters,
        "ram_bytes": int(mem.group(1)) * 1024 if mem else None,
        "storage": storage,
        "android": props.get("ro.build.version.release"),
        "sdk": props.get("ro.build.version.sdk"),
        "model": props.get("ro.product.model"),
        "manufacturer": props.get("ro.product.manufacturer"),
        "battery": parse_battery(s.get("battery", ""), s.get("powersupply", "")) or None,
        # Android's emulator (and the test adbd's --qemu) set ro.kernel.qemu / ro.boot.qemu: the
        # timings are then the emulator's, so runs must be recorded as emulated.
        "emulated": props.get("ro.kernel.qemu") == "1" or props.get("ro.boot.qemu") == "1",
        "temperature_c": max_temperature(thermal),
    }
    return facts


def max_temperature(zones: dict[str, float]) -> float | None:
    """The hottest CPU/SoC zone, else the hottest zone; None without thermal zones."""
    if not zones:
        return None
    cpu = [v for k, v in zones.items() if re.search(r"cpu|soc|tsens|x86_pkg|cluster|big|little", k, re.I)]
    return round(max(cpu or zones.values()), 1)


def normalize_arch(value: str) -> str:
    value = value.strip().lower()
    if value in ("aarch64", "arm64", "arm64-v8a", "armv8l"):
        return "arm64"
    if value in ("x86_64", "amd64", "x86-64"):
        return "x86_64"
    return value or "unknown"


def parse_status_memory(status: str, smaps_rollup: str) -> MemoryUsage | None:
    def kib(text: str, key: str) -> int | None:
        m = re.search(rf"^{key}:\s*(\d+)\s*kB", text, re.M)
        return int(m.group(1)) * 1024 if m else None

    rss, hwm = kib(status, "VmRSS"), kib(status, "VmHWM")
    if rss is None:
        return None
    return MemoryUsage(
        rss_bytes=rss, hwm_bytes=hwm if hwm is not None else rss, pss_bytes=kib(smaps_rollup, "Pss")
    )


def parse_df_available(text: str) -> int:
    """Available bytes from `df -Pk` (or toybox `df -k`) output; the last data line wins."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) < 2:
        raise TargetError(f"cannot read free space from df output: {text.strip()[:120]!r}")
    tokens = " ".join(lines[1:]).split()
    # Filesystem 1K-blocks Used Available Use% Mounted-on: the number before the NN% column.
    for i, tok in enumerate(tokens):
        if tok.endswith("%") and i >= 1 and tokens[i - 1].isdigit():
            return int(tokens[i - 1]) * 1024
    raise TargetError(f"cannot read free space from df output: {text.strip()[:120]!r}")


@dataclass
class ShellTarget:
    """Shared implementation for targets that have a POSIX shell (all of ours). Subclasses provide
    sh(), run(), push() and pull()."""

    name: str
    kind: str
    arch: str
    workdir: str
    emulated: bool = False
    _facts: dict | None = field(default=None, repr=False)

    def sh(self, command: str, timeout: float | None = 60) -> CommandResult:  # pragma: no cover
        raise NotImplementedError

    @property
    def on_this_machine(self) -> bool:
        """True for targets that run here (local, qemu-user): their files are used in place (no push),
        their events files read directly, and a memory cgroup binds their processes."""
        return False

    @property
    def native_here(self) -> bool:
        """True for this machine itself, not emulated: programs built for the host (llama-bench, an MLC
        runner command, the host's llama-server) run on it as they are."""
        return False

    def build_dirs(self, root: Path) -> list[Path]:
        """The engine builds under `root` (build/) whose binaries run on this target, best first: a
        phone takes the NDK build, else the static Linux one; an x86-64 device (an emulator, the test
        adbd) runs the host build."""
        if self.arch != "arm64":
            return [root / "host"]
        return [root / "android-arm64", root / "linux-arm64"]

    def build_hint(self) -> str:
        """The command that makes a build for this target."""
        return "pi2 build --target android-arm64" if self.arch == "arm64" else "make engine"

    def facts(self) -> dict:
        if self._facts is None:
            facts = parse_facts(self.sh(FACTS_SCRIPT, timeout=30).stdout)
            facts.update(name=self.name, kind=self.kind, emulated=self.emulated or bool(facts.get("emulated")),
                         workdir=self.workdir)  # fmt: skip
            if not facts.get("arch") or facts["arch"] == "unknown":
                facts["arch"] = self.arch
            self._facts = facts
        return dict(self._facts)

    def exists(self, remote: str) -> bool:
        return self.sh(f"[ -e {shlex.quote(remote)} ]").returncode == 0

    def hash(self, remote: str) -> str | None:
        return self.hashes([remote]).get(remote)

    def hashes(self, remotes: list[str]) -> dict[str, str]:
        """sha256 of each file that exists, in one round trip; missing files are left out."""
        if not remotes:
            return {}
        # Each file is hashed from stdin and its line tagged with its position in the list: `sha256sum
        # FILE` escapes a name holding a backslash or a newline (a leading backslash, "\\n" in the name),
        # so the line matched no file and such a push failed as "arrived corrupted".
        out = self.sh(_indexed_loop(remotes, 'sha256sum < "$f"'), timeout=None)
        found = {}
        for index, rest in _indexed_lines(out.stdout, len(remotes)):
            digest = rest.split(" ", 1)[0]
            if re.fullmatch(r"[0-9a-f]{64}", digest):
                found[remotes[index]] = digest
        return found

    def stats(self, remotes: list[str]) -> dict[str, tuple[int, int]]:
        """(size, mtime) of each file that exists, one round trip."""
        if not remotes:
            return {}
        out = self.sh(_indexed_loop(remotes, "stat -c '%s %Y' \"$f\""))
        found = {}
        for index, rest in _indexed_lines(out.stdout, len(remotes)):
            parts = rest.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                found[remotes[index]] = (int(parts[0]), int(parts[1]))
        return found

    def free_bytes(self, remote: str) -> int:
        # df needs an existing path: walk up to the nearest one that exists.
        q = shlex.quote(remote)
        out = self.sh(f'p={q}; while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done; df -Pk "$p" '
                      f'2>/dev/null || df -k "$p"')  # fmt: skip
        return parse_df_available(out.stdout)

    def mkdir(self, remote: str) -> None:
        self.sh(f"mkdir -p {shlex.quote(remote)}").check(f"mkdir {remote}")

    def remove(self, remote: str) -> None:
        self.sh(f"rm -f {shlex.quote(remote)}").check(f"rm {remote}")

    def rename(self, src: str, dst: str) -> None:
        self.sh(f"mv -f {shlex.quote(src)} {shlex.quote(dst)}").check(f"mv {src}")

    def read_text(self, remote: str) -> str | None:
        out = self.sh(f"cat {shlex.quote(remote)} 2>/dev/null")
        return out.stdout if out.returncode == 0 else None

    def read_memory(self, pid: int) -> MemoryUsage | None:
        out = self.sh(f"cat /proc/{int(pid)}/status 2>/dev/null; echo @@smaps; "
                      f"cat /proc/{int(pid)}/smaps_rollup 2>/dev/null; true")  # fmt: skip
        status, _, rollup = out.stdout.partition("@@smaps")
        return parse_status_memory(status, rollup)

    def temperature(self) -> float | None:
        out = self.sh(THERMAL_SCRIPT).stdout
        zones_text, _, battery = out.partition("@@battery")
        temp = max_temperature(parse_thermal(zones_text))
        if temp is None:
            m = re.search(r"temperature:\s*(-?\d+)", battery)
            temp = int(m.group(1)) / 10 if m else None
        return temp


def wrap_command(argv: list[str], env: dict[str, str] | None, cwd: str | None, make_cwd: bool = False) -> str:
    """A shell line that reports the real pid first (on stderr) and then becomes the command."""
    parts = []
    if cwd and make_cwd:
        parts.append(f"mkdir -p {shlex.quote(cwd)};")
    if cwd:
        parts.append(f"cd {shlex.quote(cwd)} || exit 127;")
    parts.append("echo __PI2_PID__=$$ >&2;")
    parts.append("exec")
    if env:
        parts.append("env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()))
    parts.append(" ".join(shlex.quote(a) for a in argv))
    return " ".join(parts)


PID_MARKER = re.compile(rb"__PI2_PID__=(\d+)\n")


def _indexed_loop(remotes: list[str], command: str) -> str:
    """A shell loop running `command` on each existing file "$f", its output prefixed with the file's
    position in `remotes`: names (which may hold newlines or backslashes) never come back to be parsed."""
    quoted = " ".join(shlex.quote(r) for r in remotes)
    return (
        f'i=0; for f in {quoted}; do [ -f "$f" ] && printf "%s " "$i" && {command}; i=$((i + 1)); done; true'
    )


def _indexed_lines(stdout: str, n: int):
    """(index, rest of line) for each "INDEX rest" line of an _indexed_loop's output."""
    for line in stdout.splitlines():
        head, _, rest = line.partition(" ")
        if head.isdigit() and int(head) < n:
            yield int(head), rest
