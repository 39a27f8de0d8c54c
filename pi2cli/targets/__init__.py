"""Targets: where pi2 runs engines and puts files. `get_target(name)` resolves what --device takes.

local        this machine (the default)
qemu-arm64   arm64 builds under qemu-user here (correctness only)
SERIAL       a device as `adb devices` shows it (HOST:PORT devices are `adb connect`ed on first use)
"""

from __future__ import annotations

from pi2cli.targets.base import (
    CommandResult,
    MemoryUsage,
    ProcessHandle,
    Target,
    TargetError,
    TransferError,
)

__all__ = [
    "CommandResult", "MemoryUsage", "ProcessHandle", "Target", "TargetError", "TransferError",
    "get_target", "list_targets",
]  # fmt: skip

LOCAL, QEMU = "local", "qemu-arm64"


def get_target(name: str | None = None, workdir: str | None = None) -> Target:
    name = name or LOCAL
    if name == LOCAL:
        from pi2cli.targets.local import LocalTarget

        return LocalTarget(workdir=workdir)
    if name == QEMU:
        from pi2cli.targets.qemu import QemuTarget

        return QemuTarget(workdir=workdir)
    from pi2cli.targets.adb import AdbTarget

    return AdbTarget(name, workdir=workdir)


def list_targets() -> list[dict]:
    """Every target with its state: local, qemu-arm64 (when qemu-aarch64 is installed) and each adb
    device the adb server knows, including unauthorized and offline ones. No facts gathered here."""
    from pi2cli.targets.adb import list_adb_devices
    from pi2cli.targets.qemu import qemu_available

    rows = [{"name": LOCAL, "kind": "local", "state": "ready"}]
    rows.append(
        {"name": QEMU, "kind": "qemu", "state": "ready" if qemu_available() else "missing qemu-aarch64"}
    )
    for serial, state, tags in list_adb_devices():
        rows.append({"name": serial, "kind": "adb", "state": state, "tags": tags})
    return rows
