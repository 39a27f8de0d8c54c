"""The farm file: which devices, which matrix, how often, under which limits and gates (TOML).

Read with tomllib and checked field by field here, so every problem is one line naming the field.
docs/FARM.md describes the format; farm/example.toml is a complete example. Relative model paths and
results_dir are relative to the farm file, so a farm file can live beside its models.
"""

from __future__ import annotations

import math
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.units import parse_size

ENGINES = ("pi2", "llmflash", "llama.cpp", "mlc-llm")
WORKLOADS = ("multi-turn", "code", "math", "role-play")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SERVER_RE = re.compile(r"^[\w.\-]+:(\d{1,5})$")
MAX_FARM_BYTES = 1 << 20
# The engine's own bounds (native/src/engine/session_options.c: --n-predict in [0, 2^20], --threads in [1, 1024];
# `pi2-engine capabilities --json` lists flags, not their ranges), so a farm file the engine would refuse
# at 2 am is refused by `farm check` now.
MAX_N_GEN = 1 << 20
MAX_THREADS = 1024
MAX_SEED = (1 << 64) - 1  # --seed is a u64


@dataclass
class Gate:
    """What a device must be before each run (None: not checked)."""

    max_cpu_temp_c: float | None = 45.0  # hottest CPU/SoC thermal zone
    max_battery_temp_c: float | None = 38.0
    min_battery_percent: int | None = 20
    screen_off: bool = True  # phones only (dumpsys power)
    wait_timeout_s: float = 900.0  # then the run goes ahead, recorded as gated out of time
    poll_s: float = 10.0


@dataclass
class Device:
    name: str  # local | qemu-arm64 | an adb serial (USB serial or HOST:PORT)
    adb_server: str | None = None  # HOST:PORT of the adb server the phone is plugged into (None: this one)
    engines: list[str] | None = None  # restrict the matrix's engines on this device
    env: dict[str, str] = field(default_factory=dict)  # environment of this device's worker

    @property
    def kind(self) -> str:
        return {"local": "local", "qemu-arm64": "qemu"}.get(self.name, "adb")


@dataclass
class Farm:
    path: Path
    name: str
    devices: list[Device]
    models: list[str]
    engines: list[str]
    workloads: list[str]
    budgets: list[int | None]
    repetitions: int = 1
    conversations: int | None = 1  # --limit per workload
    n_gen: int | None = 32
    threads: int | None = None
    seed: int = 0
    reconnect_timeout_s: float = 60.0
    results_dir: Path = Path("results")
    gate: Gate = field(default_factory=Gate)
    energy_interval_s: float = 0.5


def _err(path: Path, text: str) -> Pi2Error:
    return Pi2Error(f"{path}: {text}")


def _list_of_str(path: Path, value, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _err(path, f"{where} must be a non-empty list of strings")
    return value


def _number(path: Path, table: dict, key: str, where: str, default, *, integer=False, low=0.0, high=None,
            none_ok=False):  # fmt: skip
    if key not in table:
        return default
    value = table[key]
    if none_ok and value in ("none", "off"):
        return None
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    # TOML has nan and inf: neither is a count, a time or a temperature (nan passes every < test)
    if (
        not ok
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value < low
        or (high is not None and value > high)
    ):
        kind = "an integer" if integer else "a finite number"
        span = f">= {low:g}" if high is None else f"in [{low:g}, {high}]"
        extra = ' or "none"' if none_ok else ""
        raise _err(path, f"{where}.{key} must be {kind} {span}{extra}, got {value!r}")
    return value


def _unknown(path: Path, table: dict, known: set[str], where: str) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise _err(path, f"{where}: unknown key {extra[0]!r} (known: {', '.join(sorted(known))})")


def load_farm(path: str | Path) -> Farm:
    """Parse and check a farm file; one Pi2Error naming the first problem."""
    path = Path(path)
    try:
        text = _read_text(path)
    except FileNotFoundError:
        raise Pi2Error(f"farm file {path}: no such file") from None
    except OSError as err:
        raise _err(path, f"cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise _err(path, "not a text file") from None
    return parse_farm(parse_toml(text, path), path)


def _read_text(path: Path) -> str:
    """A regular file of at most MAX_FARM_BYTES (a FIFO would block, /dev/zero would never end)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file")
        raw = f.read(MAX_FARM_BYTES + 1)
    if len(raw) > MAX_FARM_BYTES:
        raise OSError(0, f"over {MAX_FARM_BYTES >> 20} MiB, not a farm file")
    return raw.decode("utf-8")


def parse_toml(text: str, path: Path) -> dict:
    """tomllib, with every way it fails as one line (deep nesting raises RecursionError, not its own error)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise _err(path, f"not valid TOML: {err}") from None
    except RecursionError:
        raise _err(path, "not valid TOML: nested too deeply") from None


def parse_farm(data: dict, path: Path) -> Farm:
    _unknown(path, data, {"name", "results_dir", "repetitions", "device", "matrix", "limits", "gate"}, "farm")
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise _err(path, f"name must be letters, digits, '.', '_' or '-' (at most 64), got {name!r}")
    devices = [_device(path, d, i) for i, d in enumerate(_tables(path, data.get("device"), "device"))]
    seen = [d.name for d in devices]
    dup = sorted({n for n in seen if seen.count(n) > 1})
    if dup:
        raise _err(path, f"device {dup[0]!r} is listed twice")
    matrix = data.get("matrix")
    if not isinstance(matrix, dict):
        raise _err(path, "needs a [matrix] table (models, engines, workloads, budgets)")
    _unknown(path, matrix, {"models", "engines", "workloads", "budgets"}, "matrix")
    models = _list_of_str(path, matrix.get("models"), "matrix.models")
    engines = _list_of_str(path, matrix.get("engines", ["pi2"]), "matrix.engines")
    workloads = _list_of_str(path, matrix.get("workloads", ["multi-turn"]), "matrix.workloads")
    for e in engines:
        if e not in ENGINES:
            raise _err(path, f"matrix.engines: unknown engine {e!r} (known: {', '.join(ENGINES)})")
    for w in workloads:
        if w not in WORKLOADS:
            raise _err(path, f"matrix.workloads: unknown workload {w!r} (known: {', '.join(WORKLOADS)})")
    for d in devices:
        for e in d.engines or []:
            if e not in engines:
                raise _err(path, f"device {d.name!r}: engine {e!r} is not in matrix.engines")
    budgets = [
        _budget(path, b) for b in _list_of_str(path, matrix.get("budgets", ["none"]), "matrix.budgets")
    ]
    base = path.parent
    farm = Farm(path=path, name=name, devices=devices,
                models=[str((base / m).resolve()) if not Path(m).is_absolute() else m for m in models],
                engines=engines, workloads=workloads, budgets=budgets)  # fmt: skip
    farm.repetitions = _number(path, data, "repetitions", "farm", 1, integer=True, low=1)
    farm.results_dir = (base / str(data.get("results_dir", "results"))).resolve()
    limits = data.get("limits", {})
    if not isinstance(limits, dict):
        raise _err(path, "[limits] must be a table")
    _unknown(path, limits, {"conversations", "n_gen", "threads", "seed", "reconnect_timeout_s",
                            "energy_interval_s"}, "limits")  # fmt: skip
    farm.conversations = _number(
        path, limits, "conversations", "limits", 1, integer=True, low=1, none_ok=True
    )
    farm.n_gen = _number(
        path, limits, "n_gen", "limits", 32, integer=True, low=1, high=MAX_N_GEN, none_ok=True
    )
    farm.threads = _number(path, limits, "threads", "limits", None, integer=True, low=1, high=MAX_THREADS)
    farm.seed = _number(path, limits, "seed", "limits", 0, integer=True, high=MAX_SEED)
    farm.reconnect_timeout_s = _number(path, limits, "reconnect_timeout_s", "limits", 60.0)
    farm.energy_interval_s = _number(path, limits, "energy_interval_s", "limits", 0.5, low=0.05)
    farm.gate = _gate(path, data.get("gate", {}))
    return farm


def _tables(path: Path, value, where: str) -> list[dict]:
    if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
        raise _err(path, f"needs at least one [[{where}]] table")
    return value


def _device(path: Path, table: dict, i: int) -> Device:
    where = f"device[{i}]"
    _unknown(path, table, {"name", "adb_server", "engines", "env"}, where)
    name = table.get("name")
    if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name):
        raise _err(path, f"{where}.name must be local, qemu-arm64 or an adb serial, got {name!r}")
    server = table.get("adb_server")
    port = _SERVER_RE.match(server) if isinstance(server, str) else None
    if server is not None and (port is None or not 1 <= int(port.group(1)) <= 65535):
        raise _err(
            path, f"{where} ({name}): adb_server must be HOST:PORT with a port in 1..65535, got {server!r}"
        )
    if server is not None and name in ("local", "qemu-arm64"):
        raise _err(path, f"{where} ({name}): adb_server is for adb devices only")
    engines = table.get("engines")
    if engines is not None:
        engines = _list_of_str(path, engines, f"{where}.engines")
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise _err(path, f"{where} ({name}): env must be a table of strings")
    return Device(name=name, adb_server=server, engines=engines, env=dict(env))


def _budget(path: Path, text: str) -> int | None:
    if text.strip().lower() in ("none", "unlimited", "0"):
        return None
    return parse_size(text, what=f"{path}: matrix.budgets")


def _gate(path: Path, table) -> Gate:
    if not isinstance(table, dict):
        raise _err(path, "[gate] must be a table")
    _unknown(path, table, {"max_cpu_temp_c", "max_battery_temp_c", "min_battery_percent", "screen_off",
                           "wait_timeout_s", "poll_s"}, "gate")  # fmt: skip
    g = Gate()
    g.max_cpu_temp_c = _number(path, table, "max_cpu_temp_c", "gate", g.max_cpu_temp_c, none_ok=True)
    g.max_battery_temp_c = _number(
        path, table, "max_battery_temp_c", "gate", g.max_battery_temp_c, none_ok=True
    )
    g.min_battery_percent = _number(path, table, "min_battery_percent", "gate", g.min_battery_percent,
                                    integer=True, none_ok=True)  # fmt: skip
    screen = table.get("screen_off", g.screen_off)
    if not isinstance(screen, bool):
        raise _err(path, f"gate.screen_off must be true or false, got {screen!r}")
    g.screen_off = screen
    g.wait_timeout_s = _number(path, table, "wait_timeout_s", "gate", g.wait_timeout_s)
    g.poll_s = _number(path, table, "poll_s", "gate", g.poll_s, low=0.01)
    return g


# ------------------------------------------------------------------------------------------ the cells
@dataclass(frozen=True)
class Cell:
    """One run of the matrix on one device: what resume counts as done or not."""

    device: str
    model: str
    engine: str
    workload: str
    budget: int | None

    @property
    def key(self) -> str:
        budget = "none" if self.budget is None else str(self.budget)
        return f"{self.device}|{self.model}|{self.engine}|{self.workload}|{budget}"


def cells_for(farm: Farm, device: Device) -> list[Cell]:
    engines = [e for e in farm.engines if device.engines is None or e in device.engines]
    return [Cell(device.name, m, e, w, b) for m in farm.models for b in farm.budgets for w in farm.workloads
            for e in engines]  # fmt: skip
