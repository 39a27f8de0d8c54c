"""Start and stop the test adb daemon and a private adb server, with bounded timeouts.

Each AdbServer listens on its own port (never the default 5037) with its own HOME (its adbkey), so test
runs do not collide with each other or with a developer's phone.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ADBD = Path(__file__).with_name("adbd.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TestDevice:
    """One adbd process; `serial` is what `adb connect` and --device take."""

    __test__ = False  # not a pytest test class

    def __init__(self, workdir: Path, *flags: str):
        workdir.mkdir(parents=True, exist_ok=True)
        self.root = workdir / "data_local_tmp"
        port_file = workdir / "adbd.port"
        self.log = open(workdir / "adbd.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, str(ADBD), "--root", str(self.root), "--port-file",
                                      str(port_file), *flags], stdout=self.log, stderr=self.log)  # fmt: skip
        deadline = time.monotonic() + 10
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"test adbd did not start: {(workdir / 'adbd.log').read_text()}")
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        self.serial = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


class AdbServer:
    """A private adb server (the adb binary adbutils ships) on a free port."""

    def __init__(self, home: Path):
        import adbutils

        self.adb = adbutils.adb_path()
        self.port = free_port()
        home.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "HOME": str(home), "ANDROID_ADB_SERVER_PORT": str(self.port)}
        self.env.pop("ANDROID_SERIAL", None)
        self.call("start-server", timeout=30)

    def call(self, *args: str, timeout: float = 20) -> str:
        out = subprocess.run([self.adb, "-P", str(self.port), *args], env=self.env, capture_output=True,
                             text=True, timeout=timeout)  # fmt: skip
        return out.stdout + out.stderr

    def state(self, serial: str) -> str | None:
        for line in self.call("devices").splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == serial:
                return parts[1]
        return None

    def connect(self, serial: str, want: str = "device", timeout: float = 10) -> None:
        self.call("connect", serial)
        deadline = time.monotonic() + timeout
        while self.state(serial) != want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{serial} never became {want!r}: {self.call('devices')}")
            time.sleep(0.05)

    @contextlib.contextmanager
    def device(self, workdir: Path, *flags: str):
        """A TestDevice connected to this server for the duration of the block, then disconnected and
        stopped."""
        dev = TestDevice(workdir, *flags)
        try:
            self.connect(dev.serial)
            yield dev
        finally:
            self.call("disconnect", dev.serial, timeout=10)
            dev.stop()

    def stop(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self.call("kill-server", timeout=10)


@contextlib.contextmanager
def private_device(tmp_path: Path, monkeypatch, name: str = "phone", *flags: str):
    """One TestDevice on an adb server of its own, pi2's adb client pointed at that server (through
    monkeypatch) for the block; the server is stopped after it, however the block ends."""
    server = AdbServer(tmp_path / "adbhome")
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(server.port))
    try:
        with server.device(tmp_path / name, *flags) as dev:
            yield dev
    finally:
        server.stop()
