"""`local`: this machine. Files are copied into a working directory under the pi2 cache."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import subprocess
import threading
from pathlib import Path

from pi2cli.paths import cache_dir
from pi2cli.targets.base import (
    CommandResult,
    OutputCallback,
    Progress,
    ShellTarget,
    TargetError,
    TransferError,
    normalize_arch,
)

COPY_CHUNK = 4 << 20


class LocalProcess:
    """A command on this machine, in its own process group so kill() takes its children too."""

    def __init__(self, argv: list[str], env: dict | None, cwd: str | None, on_output: OutputCallback | None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        try:
            self.popen = subprocess.Popen(argv, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          start_new_session=True)  # fmt: skip
        except OSError as exc:
            raise TargetError(f"cannot start {argv[0]}: {exc.strerror}") from exc
        self.pid: int | None = self.popen.pid
        self.readers = [
            threading.Thread(target=self._pump, args=(self.popen.stdout, "stdout", on_output), daemon=True),
            threading.Thread(target=self._pump, args=(self.popen.stderr, "stderr", on_output), daemon=True),
        ]
        for t in self.readers:
            t.start()

    @staticmethod
    def _pump(pipe, name: str, on_output: OutputCallback | None) -> None:
        while chunk := pipe.read1(65536):
            if on_output:
                on_output(name, chunk)

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(f"process {self.pid} still running after {timeout} s") from exc
        for t in self.readers:
            t.join(5)
        return code

    def kill(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


class LocalTarget(ShellTarget):
    def __init__(self, name: str = "local", workdir: str | None = None):
        super().__init__(name=name, kind="local", arch=normalize_arch(platform.machine()),
                         workdir=workdir or str(cache_dir() / "targets" / name))  # fmt: skip

    def sh(self, command: str, timeout: float | None = 60) -> CommandResult:
        try:
            out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise TargetError(f"command timed out after {timeout} s on {self.name}") from exc
        return CommandResult(out.returncode, out.stdout.decode(errors="replace"),
                             out.stderr.decode(errors="replace"))  # fmt: skip

    def push(self, local: Path, remote: str, progress: Progress | None = None, mode: int = 0o644) -> None:
        dst = Path(remote)
        try:
            dst.parent.mkdir(parents=True, exist_ok=True)
            done = 0
            with open(local, "rb") as src, open(dst, "wb") as out:
                while chunk := src.read(COPY_CHUNK):
                    out.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done)
            os.chmod(dst, mode)
        except OSError as exc:
            raise TransferError(f"copy to {remote} failed: {exc.strerror or exc}") from exc

    def pull(self, remote: str, local: Path) -> None:
        try:
            shutil.copyfile(remote, local)
        except OSError as exc:
            raise TransferError(f"copy from {remote} failed: {exc.strerror or exc}") from exc

    @property
    def on_this_machine(self) -> bool:
        return True

    @property
    def native_here(self) -> bool:
        return not self.emulated  # qemu-user (a LocalTarget too) runs another architecture's programs

    def build_dirs(self, root: Path) -> list[Path]:
        """`make engine`'s build ($PI2_BUILD_DIR overrides it)."""
        return [Path(os.environ["PI2_BUILD_DIR"])] if os.environ.get("PI2_BUILD_DIR") else [root / "host"]

    def build_hint(self) -> str:
        return "make engine"

    def command_prefix(self) -> list[str]:
        return []

    def run(self, argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
            on_output: OutputCallback | None = None) -> LocalProcess:  # fmt: skip
        return LocalProcess(self.command_prefix() + list(argv), env, cwd, on_output)
