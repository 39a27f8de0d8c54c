"""A device-side adb daemon for tests: lets the real adb server, adbutils and `pi2 push` run end to end
without a phone.

It listens on 127.0.0.1 only and speaks the adb transport protocol (CNXN, OPEN/OKAY/WRTE/CLSE, optional
AUTH for the 'unauthorized' state) with these services: `shell:` (v1), `shell,v2,...:` (stdout, stderr,
stdin and exit codes in shell-protocol packets), `exec:` and `sync:` (STAT/LST2/STA2/LIST/LIS2/SEND/
RECV/DONE/QUIT). Commands really run on this machine with /bin/sh; the directory given with --root
plays /data/local/tmp. Its limits, and the faults it can inject, are in tests/adbd/README.md.

    python tests/adbd/adbd.py --root /tmp/dev --port 0 --port-file /tmp/dev.port

Written from the protocol descriptions (OVERVIEW.TXT, SYNC.TXT, the shell protocol), for tests only.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import queue
import re
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Transport commands: four ASCII bytes read as a little-endian u32.
A_CNXN, A_AUTH, A_OPEN = 0x4E584E43, 0x48545541, 0x4E45504F
A_OKAY, A_CLSE, A_WRTE = 0x59414B4F, 0x45534C43, 0x45545257
A_VERSION = 0x01000001  # the version that lets both sides skip payload checksums
MAX_PAYLOAD = 256 * 1024
AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3
HEADER = struct.Struct("<6I")

DEVICE_TMP = "/data/local/tmp"
FEATURES = "shell_v2,cmd,stat_v2,ls_v2,fixed_push_mkdir,fixed_push_symlink_timestamp"
SYNC_DATA_MAX = 64 * 1024
SENSOR_CLASSES = ("power_supply", "thermal")
SYS_CPU = "/sys/devices/system/cpu"
# --cpus: a phone's cores as a Snapdragon 8 Gen 3 groups them (1 big + 5 mid + 2 little), simplified to
# one max frequency per kind: (cpus, cpuinfo_max_freq in kHz, cpu_capacity). The capacities are made up
# in the shape arm64 kernels give them (1024 for the fastest core).
CPU_CLUSTERS = (((0, 1), 2265600, 325), ((2, 3, 4, 5, 6), 3148800, 870), ((7,), 3302400, 1024))

# Shell protocol packet ids.
SH_STDIN, SH_STDOUT, SH_STDERR, SH_EXIT, SH_CLOSE_STDIN, SH_WINDOW = range(6)


class Closed(Exception):
    """The stream (or the whole connection) went away."""


class Options:
    def __init__(self, args: argparse.Namespace, fakebin: Path):
        self.root = Path(args.root).resolve()
        self.fakebin = fakebin
        self.abi = args.abi
        self.qemu = args.qemu  # qemu-aarch64 binary that runs arm64 programs, or None
        self.unauthorized = args.unauthorized
        self.corrupt = args.corrupt
        self.disconnect_after = args.disconnect_after
        self.slow = args.slow  # bytes per second that SEND accepts, or None
        self.full_after = args.full_after  # bytes the "disk" takes before writes fail with ENOSPC, or None
        self.written = 0  # bytes written by SEND, across connections (for --full-after)
        self.received = 0  # sync DATA bytes received, across connections (for --disconnect-after)
        self.lock = threading.Lock()
        self.sensors = (
            Path(args.sensors).resolve() if args.sensors else None
        )  # plays /sys/class/{power_supply,thermal}
        self.cpus = Path(args.cpus).resolve() if args.cpus else None  # plays /sys/devices/system/cpu

    # Paths: the device's /data/local/tmp is our --root; nothing else is served for writing.
    def to_host(self, device_path: str) -> Path | None:
        if device_path == DEVICE_TMP or device_path.startswith(DEVICE_TMP + "/"):
            return Path(str(self.root) + device_path[len(DEVICE_TMP) :])
        return None

    def command_to_host(self, command: str) -> str:
        command = command.replace(DEVICE_TMP, str(self.root))
        if self.sensors:  # --sensors: the fuel gauge and thermal zones are files the test controls
            for name in SENSOR_CLASSES:
                command = command.replace(f"/sys/class/{name}", str(self.sensors / name))
        if self.cpus:  # --cpus: the cores and their cpufreq clusters are files the test controls
            command = command.replace(SYS_CPU, str(self.cpus))
        return wrap_arm64_programs(command, self.root, self.qemu) if self.qemu else command

    def output_to_device(self, data: bytes) -> bytes:
        if self.cpus:
            data = data.replace(str(self.cpus).encode(), SYS_CPU.encode())
        return data.replace(str(self.root).encode(), DEVICE_TMP.encode())


# A program path in command position: at the start, after ; & | ( or `exec`, or as the first operand
# after `sh -c SCRIPT NAME` (a script that ends in exec "$@"); optionally single-quoted, as shlex.quote
# writes paths.
_COMMAND_PATH = re.compile(r"(^|[;&|(]\s*|\bexec\s+|\bsh\s+-c\s+'[^']*'\s+\S+\s+)('?)(/[^\s;&|()'\"]+)\2")


def is_arm64_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return len(head) == 20 and head[:4] == b"\x7fELF" and head[18:20] == b"\xb7\x00"  # e_machine AArch64


def wrap_arm64_programs(command: str, root: Path, qemu: str) -> str:
    """--qemu: run arm64 ELF programs under --root through qemu-aarch64, as binfmt_misc would on a
    host that has it registered. Only paths in command position are wrapped, so `sha256sum BIN` still
    hashes the file."""

    def wrap(m: re.Match) -> str:
        lead, quote, path = m.group(1), m.group(2), m.group(3)
        if path.startswith(str(root) + "/") and is_arm64_elf(Path(path)):
            return f"{lead}{shlex.quote(qemu)} {quote}{path}{quote}"
        return m.group(0)

    return _COMMAND_PATH.sub(wrap, command)


class Stream:
    """One adb stream: bytes from the host arrive in `inbox`; `write` honours the OKAY flow control."""

    def __init__(self, conn: Connection, local_id: int, remote_id: int):
        self.conn, self.local_id, self.remote_id = conn, local_id, remote_id
        self.inbox: queue.Queue[bytes | None] = queue.Queue()
        self.can_send = threading.Event()
        self.can_send.set()
        self.closed = threading.Event()
        self.buffer = b""
        self.write_lock = threading.Lock()
        self.on_close = None  # called when the host closes the stream (kills a running command)

    def read_chunk(self) -> bytes:
        """Next WRTE payload from the host; acknowledged only now, so the host cannot run ahead of us."""
        chunk = self.inbox.get()
        if chunk is None:
            raise Closed()
        self.conn.send(A_OKAY, self.local_id, self.remote_id)
        return chunk

    def read_exact(self, n: int) -> bytes:
        while len(self.buffer) < n:
            self.buffer += self.read_chunk()
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def write(self, data: bytes) -> None:
        with self.write_lock:
            for start in range(0, len(data), self.conn.max_payload):
                while not self.can_send.wait(0.5):
                    if self.closed.is_set() or self.conn.dead.is_set():
                        raise Closed()
                if self.closed.is_set():
                    raise Closed()
                self.can_send.clear()
                self.conn.send(
                    A_WRTE, self.local_id, self.remote_id, data[start : start + self.conn.max_payload]
                )

    def close(self) -> None:
        """Our side is done: tell the host once."""
        if not self.closed.is_set():
            self.closed.set()
            self.conn.send(A_CLSE, self.local_id, self.remote_id)
            self.conn.drop(self.local_id)

    def closed_by_host(self) -> None:
        self.closed.set()
        self.inbox.put(None)
        self.can_send.set()
        if self.on_close:
            self.on_close()


class Connection:
    def __init__(self, sock: socket.socket, opts: Options):
        self.sock, self.opts = sock, opts
        self.send_lock = threading.Lock()
        self.streams: dict[int, Stream] = {}
        self.streams_lock = threading.Lock()
        self.next_id = 1
        self.max_payload = MAX_PAYLOAD
        self.dead = threading.Event()
        self.online = False

    def send(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        header = HEADER.pack(command, arg0, arg1, len(data), sum(data) & 0xFFFFFFFF, command ^ 0xFFFFFFFF)
        with self.send_lock:
            try:
                self.sock.sendall(header + data)
            except OSError as exc:
                self.dead.set()
                raise Closed() from exc

    def recv_exact(self, n: int) -> bytes:
        parts, left = [], n
        while left:
            part = self.sock.recv(min(left, 1 << 20))
            if not part:
                raise Closed()
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    def drop(self, local_id: int) -> None:
        with self.streams_lock:
            self.streams.pop(local_id, None)

    def banner(self) -> bytes:
        props = (
            "ro.product.name=pi2adbd;ro.product.model=pi2_test_adbd;ro.product.device=pi2adbd;"
            f"features={FEATURES}"
        )
        return f"device::{props}".encode()

    def serve(self) -> None:
        try:
            while True:
                command, arg0, arg1, length, _check, magic = HEADER.unpack(self.recv_exact(HEADER.size))
                if magic != command ^ 0xFFFFFFFF:
                    return  # not adb: drop the connection
                payload = self.recv_exact(length) if length else b""
                self.dispatch(command, arg0, arg1, payload)
        except (Closed, OSError):
            pass
        finally:
            self.dead.set()
            with self.streams_lock:
                streams = list(self.streams.values())
                self.streams.clear()
            for s in streams:
                s.closed_by_host()
            with contextlib.suppress(OSError):
                self.sock.close()

    def dispatch(self, command: int, arg0: int, arg1: int, payload: bytes) -> None:
        if command == A_CNXN:
            self.max_payload = max(4096, min(arg1, MAX_PAYLOAD))
            if self.opts.unauthorized:
                # Ask for a signature we will never accept: the host shows the device as 'unauthorized'.
                self.send(A_AUTH, AUTH_TOKEN, 0, os.urandom(20))
                return
            self.online = True
            self.send(A_CNXN, A_VERSION, MAX_PAYLOAD, self.banner())
        elif command == A_AUTH:
            if arg0 == AUTH_SIGNATURE:
                self.send(A_AUTH, AUTH_TOKEN, 0, os.urandom(20))
            # AUTH_RSAPUBLICKEY: a real phone now shows a dialog; we never answer.
        elif command == A_OPEN and self.online:
            service = payload.rstrip(b"\0").decode("utf-8", "replace")
            with self.streams_lock:
                local_id = self.next_id
                self.next_id += 1
                stream = Stream(self, local_id, arg0)
                self.streams[local_id] = stream
            handler = pick_service(service, stream, self.opts)
            if handler is None:
                self.drop(local_id)
                self.send(A_CLSE, 0, arg0)  # unknown service: refuse the open
                return
            self.send(A_OKAY, local_id, arg0)
            threading.Thread(target=run_service, args=(handler, stream), daemon=True).start()
        elif command in (A_WRTE, A_OKAY, A_CLSE):
            with self.streams_lock:
                stream = self.streams.get(arg1)
            if stream is None:
                return
            if command == A_WRTE:
                stream.inbox.put(payload)
            elif command == A_OKAY:
                stream.can_send.set()
            else:
                self.drop(arg1)
                stream.closed_by_host()


def run_service(handler, stream: Stream) -> None:
    try:
        handler()
    except Closed:
        pass
    finally:
        with contextlib.suppress(Closed):
            stream.close()


def pick_service(service: str, stream: Stream, opts: Options):
    if service.startswith("shell,v2") or service.startswith("shell,"):
        options, _, command = service.partition(":")
        if "v2" in options.split(","):
            return lambda: shell_v2(command, stream, opts)
        return lambda: shell_raw(command, stream, opts, merge_stderr=True)
    if service.startswith("shell:"):
        return lambda: shell_raw(service[len("shell:") :], stream, opts, merge_stderr=True)
    if service.startswith("exec:"):
        return lambda: shell_raw(service[len("exec:") :], stream, opts, merge_stderr=False)
    if service == "sync:":
        return lambda: SyncSession(stream, opts).serve()
    if service.startswith("tcp:"):
        return open_tcp(service, stream)
    return None


# ------------------------------------------------------------------------------------------ tcp:PORT
def open_tcp(service: str, stream: Stream):
    """`tcp:PORT` / `tcp:HOST:PORT`: what `adb forward tcp:LOCAL tcp:REMOTE` opens on the device for
    every connection to the host's LOCAL port. The connection is made here, before the open is
    answered, so a port nobody listens on is refused (CLSE) as adbd does; None then."""
    parts = service.split(":")[1:]
    host, port_text = ("127.0.0.1", parts[0]) if len(parts) == 1 else (parts[0], parts[-1])
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    if host not in ("127.0.0.1", "localhost"):
        return None  # loopback only: the test daemon never reaches beyond this machine
    try:
        sock = socket.create_connection(("127.0.0.1", int(port_text)), timeout=5)
    except OSError:
        return None
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return lambda: relay_tcp(sock, stream)


def relay_tcp(sock: socket.socket, stream: Stream) -> None:
    """Bytes both ways until either side closes; then the other side is closed too."""

    def host_to_socket() -> None:
        try:
            while True:
                sock.sendall(stream.read_chunk())
        except (Closed, OSError):
            pass
        finally:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)

    stream.on_close = lambda: _close_socket(sock)
    threading.Thread(target=host_to_socket, daemon=True).start()
    try:
        while data := sock.recv(MAX_PAYLOAD):
            stream.write(data)
    except OSError:
        pass
    finally:
        _close_socket(sock)


def _close_socket(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


# ---------------------------------------------------------------------------------------------- shell
def start_command(command: str, opts: Options, merge_stderr: bool) -> subprocess.Popen:
    if not command.strip():
        command = "echo 'pi2 test adbd: interactive shells are not supported' >&2; exit 1"
    env = dict(os.environ)
    env.update(PATH=f"{opts.fakebin}:{env.get('PATH', '/usr/bin:/bin')}", HOME=str(opts.root),
               TMPDIR=str(opts.root), PI2_ADBD=str(opts.root))  # fmt: skip
    return subprocess.Popen(
        ["/bin/sh", "-c", opts.command_to_host(command)],
        cwd=opts.root,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        start_new_session=True,  # its own process group, so a closed stream kills the whole command
    )


def kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def feed_stdin(stream: Stream, proc: subprocess.Popen, packets: bool) -> None:
    """Host -> command stdin. v1 streams carry raw bytes; v2 streams carry shell-protocol packets."""
    try:
        while True:
            if packets:
                kind, length = struct.unpack("<BI", stream.read_exact(5))
                data = stream.read_exact(length) if length else b""
                if kind == SH_CLOSE_STDIN:
                    break
                if kind != SH_STDIN:
                    continue  # window-size changes mean nothing without a pty
            else:
                data = stream.read_chunk()
            proc.stdin.write(data)
            proc.stdin.flush()
    except (Closed, OSError, ValueError):
        pass
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()


def pump(pipe, send) -> None:
    try:
        while chunk := pipe.read1(65536):
            send(chunk)
    except (Closed, OSError, ValueError):
        pass


def shell_raw(command: str, stream: Stream, opts: Options, merge_stderr: bool) -> None:
    proc = start_command(command, opts, merge_stderr)
    stream.on_close = lambda: kill_group(proc)
    threading.Thread(target=feed_stdin, args=(stream, proc, False), daemon=True).start()
    if not merge_stderr:
        threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()  # exec: drops stderr
    pump(proc.stdout, lambda b: stream.write(opts.output_to_device(b)))
    proc.wait()


def shell_v2(command: str, stream: Stream, opts: Options) -> None:
    proc = start_command(command, opts, merge_stderr=False)
    stream.on_close = lambda: kill_group(proc)

    def packet(kind: int, data: bytes) -> None:
        stream.write(struct.pack("<BI", kind, len(data)) + data)

    threading.Thread(target=feed_stdin, args=(stream, proc, True), daemon=True).start()
    err = threading.Thread(
        target=pump, args=(proc.stderr, lambda b: packet(SH_STDERR, opts.output_to_device(b))), daemon=True
    )
    err.start()
    pump(proc.stdout, lambda b: packet(SH_STDOUT, opts.output_to_device(b)))
    err.join()
    code = proc.wait()
    packet(SH_EXIT, bytes([code & 0xFF if code >= 0 else (128 - code) & 0xFF]))


# ----------------------------------------------------------------------------------------------- sync
class SyncSession:
    def __init__(self, stream: Stream, opts: Options):
        self.stream, self.opts = stream, opts

    def reply(self, ident: bytes, *fields: int, fmt: str = "", tail: bytes = b"") -> None:
        self.stream.write(ident + struct.pack("<" + fmt, *fields) + tail)

    def fail(self, message: str) -> None:
        data = message.encode()
        self.stream.write(b"FAIL" + struct.pack("<I", len(data)) + data)

    def serve(self) -> None:
        while True:
            ident = self.stream.read_exact(4)
            (length,) = struct.unpack("<I", self.stream.read_exact(4))
            if ident == b"QUIT":
                return
            if length > 4096:
                self.fail("path too long")
                return
            path = self.stream.read_exact(length).decode("utf-8", "replace")
            handler = {
                b"STAT": self.stat_v1, b"LSTA": self.stat_v1, b"STA2": self.stat_v2, b"LST2": self.stat_v2,
                b"LIST": self.list_v1, b"LIS2": self.list_v2, b"SEND": self.send, b"RECV": self.recv,
            }.get(ident)  # fmt: skip
            if handler is None:
                self.fail(f"unknown sync request {ident!r}")
                return
            if not handler(path, ident):
                return  # a failed SEND/RECV ends the session, as adbd does

    def lstat(self, path: str) -> os.stat_result | None:
        host = self.opts.to_host(path)
        if host is None:
            # Directories above /data/local/tmp exist (so pushes into it work); nothing else is served.
            if DEVICE_TMP.startswith(path.rstrip("/") + "/") or path in ("/", ""):
                return os.stat(self.opts.root)
            return None
        try:
            return os.lstat(host)
        except OSError:
            return None

    def stat_v1(self, path: str, _ident: bytes) -> bool:
        st = self.lstat(path)
        if st is None:
            self.reply(b"STAT", 0, 0, 0, fmt="III")
        else:
            self.reply(b"STAT", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime), fmt="III")
        return True

    @staticmethod
    def v2_fields(st: os.stat_result | None) -> tuple:
        if st is None:
            return (2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)  # error = ENOENT
        return (0, st.st_dev, st.st_ino, st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_size,
                int(st.st_atime), int(st.st_mtime), int(st.st_ctime))  # fmt: skip

    def stat_v2(self, path: str, ident: bytes) -> bool:
        self.reply(ident, *self.v2_fields(self.lstat(path)), fmt="IQQIIIIQqqq")
        return True

    def entries(self, path: str):
        host = self.opts.to_host(path)
        if host is None or not host.is_dir():
            return
        for name in [".", "..", *sorted(os.listdir(host))]:
            try:
                yield name, os.lstat(host / name)
            except OSError:
                continue

    def list_v1(self, path: str, _ident: bytes) -> bool:
        for name, st in self.entries(path):
            raw = name.encode()
            self.reply(b"DENT", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime), len(raw),
                       fmt="IIII", tail=raw)  # fmt: skip
        self.reply(b"DONE", 0, 0, 0, 0, fmt="IIII")
        return True

    def list_v2(self, path: str, _ident: bytes) -> bool:
        for name, st in self.entries(path):
            raw = name.encode()
            self.reply(b"DNT2", *self.v2_fields(st), len(raw), fmt="IQQIIIIQqqqI", tail=raw)
        self.reply(b"DONE", *self.v2_fields(None), 0, fmt="IQQIIIIQqqqI")
        return True

    def send(self, spec: str, _ident: bytes) -> bool:
        path, _, mode_text = spec.rpartition(",")
        if not path:
            path, mode_text = spec, "33188"
        host = self.opts.to_host(path)
        try:
            mode = int(mode_text) & 0o777
        except ValueError:
            mode = 0o644
        sink = None
        error = (
            None if host is not None else f"{path}: Permission denied (test adbd serves {DEVICE_TMP} only)"
        )
        if host is not None:
            try:
                host.parent.mkdir(parents=True, exist_ok=True)
                sink = open(host, "wb")  # noqa: SIM115 - closed below, after DONE
            except OSError as exc:
                error = f"{path}: {exc.strerror}"
        try:
            while True:
                ident = self.stream.read_exact(4)
                (length,) = struct.unpack("<I", self.stream.read_exact(4))
                if ident == b"DONE":
                    break
                if ident != b"DATA" or length > SYNC_DATA_MAX:
                    self.fail(f"bad sync packet {ident!r}")
                    return False
                data = self.stream.read_exact(length)
                self.count_received(len(data))
                if self.opts.slow:
                    time.sleep(len(data) / self.opts.slow)
                if sink is not None:
                    try:
                        self.write_data(sink, data)
                    except OSError as exc:
                        # adbd's answer to a failed write: FAIL with the reason once the host's DONE is in
                        # (what was sent meanwhile is read and dropped), never a dead stream.
                        error = f"write failed: {exc.strerror or exc}"
                        sink.close()
                        sink = None
                        host.unlink(missing_ok=True)
        finally:
            if sink is not None:
                sink.close()
        if error:
            self.fail(error)
            return False
        os.chmod(host, mode)
        os.utime(host, (length, length))  # DONE carries the mtime
        if self.opts.corrupt:
            corrupt_file(host)
        self.stream.write(b"OKAY" + struct.pack("<I", 0))
        return True

    def write_data(self, sink, data: bytes) -> None:
        """Write pushed bytes; with --full-after, the disk fills up as a real phone's does (ENOSPC)."""
        if self.opts.full_after is not None:
            with self.opts.lock:
                room = self.opts.full_after - self.opts.written
                self.opts.written += min(len(data), max(room, 0))
            if room < len(data):
                sink.write(data[: max(room, 0)])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        sink.write(data)

    def count_received(self, n: int) -> None:
        limit = self.opts.disconnect_after
        if limit is None:
            return
        with self.opts.lock:
            self.opts.received += n
            over = self.opts.received >= limit
        if over:
            # The phone is unplugged: the TCP connection drops and nothing answers any more.
            print("adbd: --disconnect-after reached, going away", file=sys.stderr, flush=True)
            os._exit(3)

    def recv(self, path: str, _ident: bytes) -> bool:
        host = self.opts.to_host(path)
        try:
            if host is None:
                raise PermissionError(f"{path}: Permission denied")
            with open(host, "rb") as f:
                while chunk := f.read(SYNC_DATA_MAX):
                    self.stream.write(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
        except OSError as exc:
            self.fail(str(exc.strerror or exc))
            return False
        self.stream.write(b"DONE" + struct.pack("<I", 0))
        return True


def corrupt_file(path: Path) -> None:
    """Fault injection: flip one byte in the middle, as a bad cable or a full disk might."""
    size = path.stat().st_size
    if size == 0:
        with open(path, "wb") as f:
            f.write(b"\0")
        return
    with open(path, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))


# ------------------------------------------------------------------------------------- fake programs
def write_fakebin(directory: Path, abi: str, free_bytes: int | None, qemu: bool = False) -> None:
    """`getprop`, `dumpsys battery` and (with --free-bytes) `df`: the Android answers a phone gives.
    With --qemu the device says it is emulated (ro.kernel.qemu=1, as Android's own emulator does).

    Everything else is the host's own program.
    """
    arm = abi.startswith("arm64")
    props = {
        "ro.product.model": "pi2_test_adbd",
        "ro.product.manufacturer": "pi2",
        "ro.product.cpu.abi": abi,
        "ro.build.version.release": "14",
        "ro.build.version.sdk": "34",
        "ro.soc.manufacturer": "pi2",
        "ro.soc.model": "test-adbd (host CPU)",
        "ro.boot.hardware": "pi2adbd",
        "ro.boot.storage": "test",
    }
    if qemu:
        props["ro.kernel.qemu"] = "1"
    lines = "\n".join(f"{k}={v}" for k, v in props.items())
    (directory / "props").write_text(lines + "\n")
    getprop = f"""#!/bin/sh
# pi2 test adbd: fake getprop (the daemon's fixed properties)
if [ $# -eq 0 ]; then
  sed 's/^\\([^=]*\\)=\\(.*\\)$/[\\1]: [\\2]/' {shlex.quote(str(directory / "props"))}
else
  sed -n "s/^$1=//p" {shlex.quote(str(directory / "props"))}
fi
"""
    dumpsys = """#!/bin/sh
# pi2 test adbd: fake dumpsys (battery and power). With --sensors the battery's level and temperature
# are the fake gauge's files and the screen state is SENSORS/screen (off unless a test writes "on").
S=${PI2_ADBD_SENSORS:-}
if [ "$1" = battery ]; then
  level=100; temp=300
  if [ -n "$S" ]; then level=$(cat "$S/power_supply/battery/capacity"); temp=$(cat "$S/power_supply/battery/temp"); fi
  printf 'Current Battery Service state:\\n  AC powered: false\\n  level: %s\\n  scale: 100\\n  temperature: %s\\n' "$level" "$temp"
elif [ "$1" = power ]; then
  screen=off; [ -n "$S" ] && [ -r "$S/screen" ] && screen=$(cat "$S/screen")
  if [ "$screen" = on ]; then echo '  mWakefulness=Awake'; echo 'Display Power: state=ON'
  else echo '  mWakefulness=Asleep'; echo 'Display Power: state=OFF'; fi
else
  echo "Can't find service: $1" >&2; exit 1
fi
"""
    scripts = {"getprop": getprop, "dumpsys": dumpsys}
    if arm:
        scripts["uname"] = '#!/bin/sh\nif [ "$1" = -m ]; then echo aarch64; else exec /bin/uname "$@"; fi\n'
    if free_bytes is not None:
        kib = free_bytes // 1024
        scripts["df"] = f"""#!/bin/sh
# pi2 test adbd: --free-bytes makes every filesystem this small
echo 'Filesystem     1K-blocks    Used Available Use% Mounted on'
echo '/dev/block/dm-9 {kib + 1000} 1000 {kib} 1% /data'
"""
    for name, text in scripts.items():
        path = directory / name
        path.write_text(text)
        path.chmod(0o755)


def write_sensors(directory: Path) -> None:
    """--sensors: a battery whose gauge reads 400 mA at 3.9 V, 80 %, 30.0 °C, and two thermal zones at
    35 °C, as sysfs lays them out. Files already there are kept: a test sets them (a hot phone, a low
    battery) before or while the daemon runs."""
    files = {
        "power_supply/battery/type": "Battery",
        "power_supply/battery/status": "Discharging",
        "power_supply/battery/capacity": "80",
        "power_supply/battery/temp": "300",
        "power_supply/battery/current_now": "-400000",  # microamps, negative while discharging (as many phones)
        "power_supply/battery/voltage_now": "3900000",  # microvolts
        "thermal/thermal_zone0/type": "cpu-0-0",
        "thermal/thermal_zone0/temp": "35000",
        "thermal/thermal_zone1/type": "soc",
        "thermal/thermal_zone1/temp": "35000",
    }
    for rel, value in files.items():
        path = directory / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value + "\n")


def write_cpus(directory: Path) -> None:
    """--cpus: /sys/devices/system/cpu of a 1 + 5 + 2 phone (CPU_CLUSTERS): per CPU its cpu_capacity and
    cpufreq (cpuinfo_max_freq, scaling_max_freq, scaling_cur_freq, scaling_governor, related_cpus), and
    online/possible. Files already there are kept: a test may change a cluster before the daemon runs."""
    n = sum(len(cpus) for cpus, _, _ in CPU_CLUSTERS)
    files = {"online": f"0-{n - 1}", "possible": f"0-{n - 1}", "present": f"0-{n - 1}"}
    for cpus, khz, capacity in CPU_CLUSTERS:
        for cpu in cpus:
            files[f"cpu{cpu}/cpu_capacity"] = str(capacity)
            files[f"cpu{cpu}/online"] = "1"
            for name, value in (
                ("cpuinfo_max_freq", khz),
                ("scaling_max_freq", khz),
                ("scaling_cur_freq", khz),
                ("scaling_governor", "schedutil"),
                ("related_cpus", " ".join(map(str, cpus))),
            ):
                files[f"cpu{cpu}/cpufreq/{name}"] = str(value)
    for rel, value in files.items():
        path = directory / rel
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", required=True, help="host directory that plays /data/local/tmp")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: pick a free one)")
    parser.add_argument("--port-file", help="write the chosen port here once listening")
    parser.add_argument("--abi", default="x86_64", help="ro.product.cpu.abi to report (arm64-v8a also "
                        "makes `uname -m` say aarch64)")  # fmt: skip
    parser.add_argument("--qemu", nargs="?", const="qemu-aarch64", default=None, metavar="QEMU",
                        help="run arm64 ELF programs under --root through qemu-aarch64 (or QEMU), as "
                             "binfmt_misc would; pair with --abi arm64-v8a")  # fmt: skip
    parser.add_argument("--unauthorized", action="store_true", help="never accept the host's key")
    parser.add_argument("--corrupt", action="store_true", help="flip a byte in every file pushed")
    parser.add_argument("--disconnect-after", type=int, default=None, metavar="BYTES",
                        help="vanish (exit) once this many bytes were pushed")  # fmt: skip
    parser.add_argument("--slow", type=int, default=None, metavar="BYTES_PER_S",
                        help="accept pushed data at most this fast")  # fmt: skip
    parser.add_argument("--free-bytes", type=int, default=None, help="make `df` report this much free space")
    parser.add_argument("--sensors", default=None, metavar="DIR",
                        help="serve a fake fuel gauge and thermal zones from DIR (created with defaults): "
                             "/sys/class/power_supply and /sys/class/thermal in commands are DIR's")  # fmt: skip
    parser.add_argument("--cpus", default=None, metavar="DIR",
                        help="serve a 1 + 5 + 2 phone's cores and cpufreq clusters from DIR (created with "
                             "defaults): /sys/devices/system/cpu in commands is DIR")  # fmt: skip
    parser.add_argument("--full-after", type=int, default=None, metavar="BYTES",
                        help="the disk is full after this many pushed bytes: writes fail with ENOSPC")  # fmt: skip
    args = parser.parse_args(argv)

    Path(args.root).mkdir(parents=True, exist_ok=True)
    fakebin = Path(tempfile.mkdtemp(prefix="pi2-adbd-bin-"))
    write_fakebin(fakebin, args.abi, args.free_bytes, qemu=bool(args.qemu))
    if args.sensors:
        write_sensors(Path(args.sensors))
        os.environ["PI2_ADBD_SENSORS"] = str(Path(args.sensors).resolve())  # for the fake dumpsys
    if args.cpus:
        write_cpus(Path(args.cpus))
    opts = Options(args, fakebin)

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", args.port))
    server.listen(8)
    port = server.getsockname()[1]
    if args.port_file:
        tmp = Path(args.port_file + ".tmp")
        tmp.write_text(str(port))
        tmp.rename(args.port_file)
    print(f"adbd: listening on 127.0.0.1:{port}, /data/local/tmp = {opts.root}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        sock, _addr = server.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=Connection(sock, opts).serve, daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
