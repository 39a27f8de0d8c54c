"""`qemu-arm64`: arm64 builds run under qemu-user on this machine. For correctness only: every timing
and memory figure from it is the emulator's, and facts()["emulated"] says so."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pi2cli.targets.base import TargetError
from pi2cli.targets.local import LocalTarget

SYSROOTS = ("/usr/aarch64-linux-gnu",)


def qemu_binary() -> str | None:
    return shutil.which(os.environ.get("PI2_QEMU_AARCH64", "qemu-aarch64"))


def qemu_available() -> bool:
    return qemu_binary() is not None


class QemuTarget(LocalTarget):
    def __init__(self, workdir: str | None = None):
        super().__init__(name="qemu-arm64", workdir=workdir)
        self.kind = "qemu"
        self.arch = "arm64"
        self.emulated = True
        binary = qemu_binary()
        if binary is None:
            raise TargetError("qemu-arm64 needs qemu-aarch64 (Debian: apt-get install qemu-user)")
        self.qemu = binary
        # Dynamic arm64 binaries need the cross sysroot; static ones ignore it.
        self.sysroot = next((s for s in SYSROOTS if Path(s).is_dir()), None)

    def build_dirs(self, root: Path) -> list[Path]:
        """qemu-user has a glibc userland: the Linux cross build first."""
        return [root / "linux-arm64", root / "android-arm64"]

    def build_hint(self) -> str:
        return "pi2 build --target linux-arm64"

    def command_prefix(self) -> list[str]:
        prefix = [self.qemu]
        if self.sysroot:
            prefix += ["-L", self.sysroot]
        return prefix

    def facts(self) -> dict:
        facts = super().facts()
        facts.update(arch="arm64", emulated=True, soc=f"qemu-user arm64 on {facts.get('cpu_model')}",
                     note="emulated: correctness only, timings are not the hardware's")  # fmt: skip
        return facts
