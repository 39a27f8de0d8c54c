"""An Android phone (or anything that speaks adb) through the adb server, via adbutils.

Commands run through the shell v2 protocol when the device offers it (separate stdout/stderr and a
real exit code), else shell v1 with an exit-code marker. Files go over the sync protocol in 64 KiB
DATA packets (adbutils' own push sends 4 KiB ones and reports no progress).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import struct
import threading
import time
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.targets.base import (
    PID_MARKER,
    CommandResult,
    OutputCallback,
    Progress,
    ShellTarget,
    TargetError,
    TransferError,
    normalize_arch,
    wrap_command,
)

SYNC_DATA_MAX = 64 * 1024
DEVICE_WORKDIR = "/data/local/tmp/pi2"
STATE_HELP = {
    "unauthorized": "accept the 'Allow USB debugging?' prompt on the phone",
    "offline": "reconnect the cable or run `adb reconnect`",
    "no permissions": "fix the udev rules for the phone (see `adb devices` help)",
}
EXIT_MARKER = "__PI2_EXIT__="


def adb_client():
    """The adb server client. ANDROID_ADB_SERVER_HOST/PORT choose the server (as for adb itself)."""
    import adbutils

    _start_server_quietly()
    return adbutils.AdbClient()


def _start_server_quietly() -> None:
    """Start a local adb server when none answers, with its "* daemon not running; starting now" chatter
    captured: adbutils would start it with adb's output on our stderr, breaking the one-line rule."""
    import socket
    import subprocess

    host = os.environ.get("ANDROID_ADB_SERVER_HOST", "127.0.0.1")
    port = adb_server_port()
    try:
        socket.create_connection((host, port), timeout=2).close()
        return
    except OSError:
        pass
    if host not in ("127.0.0.1", "localhost"):
        return  # a remote server is not ours to start
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([adb_binary(), "start-server"], capture_output=True, timeout=20, check=False)


def adb_server_port() -> int:
    """ANDROID_ADB_SERVER_PORT, checked: 99999 made socket raise OverflowError, "x" ValueError."""
    text = os.environ.get("ANDROID_ADB_SERVER_PORT", "") or "5037"
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65535):
        raise Pi2Error(f"ANDROID_ADB_SERVER_PORT={text!r} is not a port (1..65535)")
    return int(text)


def adb_binary() -> str:
    import adbutils

    return adbutils.adb_path()


def list_adb_devices() -> list[tuple[str, str, dict]]:
    """(serial, state, tags) of every device the adb server knows, including unauthorized/offline ones.

    An unreachable adb server yields an empty list (adbutils starts one when it can)."""
    import adbutils

    try:
        return [(d.serial, d.state, d.tags) for d in adb_client().list(extended=True)]
    except (adbutils.AdbError, OSError):
        return []


def looks_like_network_serial(name: str) -> bool:
    return re.fullmatch(r"[\w.\-]+:\d{1,5}", name) is not None


def adb_errors():
    """The exceptions that mean the device or its adb server went away."""
    import adbutils

    return (adbutils.AdbError, OSError, EOFError, struct.error)


class AdbProcess:
    """A command running on the device through one shell-v2 stream."""

    def __init__(self, target: AdbTarget, command: str, on_output: OutputCallback | None):
        self.target = target
        self.pid: int | None = None
        self.returncode: int | None = None
        self.error: str | None = None
        self._pid_seen = threading.Event()
        self._done = threading.Event()
        self._on_output = on_output
        self._stderr_head = b""
        self.conn = target.open_shell(command, timeout=None)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        self._pid_seen.wait(10)

    def _emit(self, name: str, data: bytes) -> None:
        if name == "stderr" and self.pid is None:
            # The wrapper prints the pid before exec'ing the command; keep it out of the output.
            self._stderr_head += data
            m = PID_MARKER.search(self._stderr_head)
            if not m and len(self._stderr_head) < 256:
                return
            if m:
                self.pid = int(m.group(1))
                data = self._stderr_head[: m.start()] + self._stderr_head[m.end() :]
            else:
                data = self._stderr_head
            self._pid_seen.set()
        if data and self._on_output:
            self._on_output(name, data)

    def _read(self) -> None:
        try:
            self.returncode = read_shell_v2(self.conn, self._emit)
            if self.pid is None and self._stderr_head and self._on_output:
                self._on_output("stderr", self._stderr_head)  # it died before exec (e.g. cd failed)
        except adb_errors() as exc:
            self.error = f"lost the device {self.target.name} while the command ran: {exc}"
            self.returncode = -1
        finally:
            self._pid_seen.set()
            self._done.set()
            self.conn.close()

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise TimeoutError(f"process {self.pid} on {self.target.name} still running after {timeout} s")
        if self.error:
            raise TargetError(self.error)
        return self.returncode

    def kill(self) -> None:
        if not self._done.is_set() and self.pid:
            with contextlib.suppress(TargetError):
                self.target.sh(f"kill -9 {self.pid} 2>/dev/null; true", timeout=10)
        if not self._done.wait(5):
            self.conn.close()
            self._done.wait(5)


def read_shell_v2(conn, emit) -> int:
    """Read shell-protocol packets (id u8, length u32, data) until the exit packet; returns the code."""
    while True:
        header = conn.read_exact(5)
        kind, length = header[0], struct.unpack("<I", header[1:5])[0]
        data = conn.read_exact(length) if length else b""
        if kind == 1:
            emit("stdout", data)
        elif kind == 2:
            emit("stderr", data)
        elif kind == 3:
            return data[0] if data else 255


class AdbTarget(ShellTarget):
    def __init__(self, serial: str, workdir: str | None = None):
        super().__init__(name=serial, kind="adb", arch="unknown", workdir=workdir or DEVICE_WORKDIR)
        states = {s: st for s, st, _tags in list_adb_devices()}
        connect_reply = ""
        if serial not in states and looks_like_network_serial(serial):
            try:
                connect_reply = adb_client().connect(serial, timeout=10).strip()
            except adb_errors() as exc:
                raise TargetError(f"cannot connect to {serial}: {exc}") from exc
            for _ in range(20):  # the server finishes the handshake in the background
                states = {s: st for s, st, _tags in list_adb_devices()}
                if states.get(serial) not in (None, "offline", "connecting", "authorizing"):
                    break
                time.sleep(0.1)
        state = states.get(serial)
        if state is None and connect_reply and not connect_reply.startswith(("connected", "already")):
            raise TargetError(f"cannot connect to {serial}: {connect_reply}")
        if state is None:
            known = ", ".join(sorted(states)) or "none"
            raise TargetError(f"no device {serial!r} (adb devices: {known}; `pi2 devices` lists targets)")
        if state != "device":
            raise TargetError(f"device {serial} is {state}: {STATE_HELP.get(state, 'check `adb devices`')}")
        self.device = adb_client().device(serial)
        try:
            self.features = set(self.device.get_features().split(","))
            self.arch = normalize_arch(self.sh("uname -m").stdout.strip())
        except adb_errors() as exc:
            raise TargetError(f"device {serial} does not answer: {exc}") from exc

    # -- commands ---------------------------------------------------------------------------------
    def open_shell(self, command: str, timeout: float | None):
        conn = self.device.open_transport(timeout=timeout)
        conn.send_command(("shell,v2,raw:" if "shell_v2" in self.features else "shell:") + command)
        conn.check_okay()
        return conn

    def sh(self, command: str, timeout: float | None = 60) -> CommandResult:
        out, err = bytearray(), bytearray()
        try:
            if "shell_v2" in self.features:
                conn = self.open_shell(command, timeout)
                try:
                    code = read_shell_v2(conn, lambda n, d: (out if n == "stdout" else err).extend(d))
                finally:
                    conn.close()
            else:
                conn = self.open_shell(f"{command}; echo {EXIT_MARKER}$?", timeout)
                try:
                    while chunk := conn.conn.recv(65536):
                        out.extend(chunk)
                finally:
                    conn.close()
                text = out.decode(errors="replace")
                head, marker, tail = text.rpartition(EXIT_MARKER)
                code = int(tail.strip()) if marker and tail.strip().isdigit() else 255
                out = bytearray(head.encode())
        except TimeoutError as exc:
            raise TargetError(f"command timed out after {timeout} s on {self.name}") from exc
        except adb_errors() as exc:
            raise TargetError(f"lost the device {self.name}: {exc}") from exc
        return CommandResult(code, out.decode(errors="replace"), err.decode(errors="replace"))

    def run(self, argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
            on_output: OutputCallback | None = None) -> AdbProcess:  # fmt: skip
        try:
            # The default cwd is the working directory, created on first use; a given cwd must exist.
            command = wrap_command(argv, env, cwd or self.workdir, make_cwd=cwd is None)
            return AdbProcess(self, command, on_output)
        except adb_errors() as exc:
            raise TargetError(f"cannot start {argv[0]} on {self.name}: {exc}") from exc

    # -- port forwards ----------------------------------------------------------------------------
    def forward(self, remote_port: int, local_port: int = 0) -> int:
        """`adb forward tcp:LOCAL_PORT tcp:REMOTE_PORT`; LOCAL_PORT 0: the adb server picks a free port
        here and says which. Returns the port here: every connection to 127.0.0.1:THAT_PORT reaches
        127.0.0.1:REMOTE_PORT on the device. (adbutils' own forward() never reads the second OKAY, so a
        port already taken here would pass as forwarded.)"""
        try:
            conn = adb_client().make_connection(timeout=30)
            try:
                conn.send_command(
                    f"host-serial:{self.name}:forward:tcp:{int(local_port)};tcp:{int(remote_port)}"
                )
                conn.check_okay()  # the server took the request
                conn.check_okay()  # the forward is installed (else FAIL + why)
                # the server names the port only when it picked it
                port = conn.read_string_block().strip() if not local_port else str(int(local_port))
            finally:
                conn.close()
        except adb_errors() as exc:
            raise TargetError(f"cannot forward a port to {self.name}:{remote_port}: {exc}") from exc
        if not port.isdigit():
            raise TargetError(f"the adb server did not say which port it forwards to {self.name}: {port!r}")
        return int(port)

    def forwards(self) -> list:
        """This device's forwards (adbutils ForwardItem: serial, local, remote)."""
        try:
            return [f for f in adb_client().forward_list() if f.serial == self.name]
        except adb_errors() as exc:
            raise TargetError(f"lost the device {self.name}: {exc}") from exc

    def remove_forward(self, local_port: int) -> None:
        """Remove `tcp:local_port`; no error when it is already gone (the adb server drops a vanished
        device's forwards itself)."""
        try:
            self.device.forward_remove(f"tcp:{int(local_port)}", raise_non_found=False)
        except adb_errors() as exc:
            raise TargetError(f"cannot remove the forward tcp:{local_port} of {self.name}: {exc}") from exc

    # -- files ------------------------------------------------------------------------------------
    def push(self, local: Path, remote: str, progress: Progress | None = None, mode: int = 0o644) -> None:
        """Sync SEND of one file. Raises TransferError if the device goes away or refuses it."""
        try:
            conn = self.device.open_transport(timeout=60)
        except adb_errors() as exc:
            raise TransferError(f"lost the device {self.name}: {exc}") from exc
        sock = conn.conn
        try:
            conn.send_command("sync:")
            conn.check_okay()
            spec = f"{remote},{stat.S_IFREG | mode}".encode()
            sock.sendall(b"SEND" + struct.pack("<I", len(spec)) + spec)
            done = 0
            with open(local, "rb") as src:
                while chunk := src.read(SYNC_DATA_MAX):
                    sock.sendall(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
                    done += len(chunk)
                    if progress:
                        progress(done)
            sock.sendall(b"DONE" + struct.pack("<I", int(os.stat(local).st_mtime)))
            status = conn.read_exact(8)
            if status[:4] == b"FAIL":
                (length,) = struct.unpack("<I", status[4:])
                message = conn.read_exact(length).decode(errors="replace")
                if "No space left" in message or "ENOSPC" in message:
                    raise TransferError(f"no space left on device {self.name} while copying to {remote} "
                                        f"({message}; free some space there)")  # fmt: skip
                raise TransferError(f"device {self.name} refused {remote}: {message}")
            if status[:4] != b"OKAY":
                raise TransferError(f"unexpected reply {status[:4]!r} from {self.name} after {remote}")
            sock.sendall(b"QUIT" + struct.pack("<I", 0))
        except TransferError:
            raise
        except adb_errors() as exc:
            raise TransferError(f"lost the device {self.name} while copying to {remote}: {exc}") from exc
        finally:
            conn.close()

    def pull(self, remote: str, local: Path) -> None:
        try:
            self.device.sync.pull(remote, str(local))
        except adb_errors() as exc:
            raise TransferError(f"copy from {self.name}:{remote} failed: {exc}") from exc
