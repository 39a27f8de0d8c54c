"""The one way pi2 writes a file: whole, never through a link, never over anything but a regular file.

The engine's rules (native/src/base/safe_write.h), on the host: the target must be a regular file or
absent -- a symbolic link, device node, FIFO, socket or directory there is refused with an OSError
("PATH: is a symbolic link ...", one `pi2: error:` line through cli.main) and left as it is. The data
goes to a temp file created exclusively (O_CREAT | O_EXCL | O_NOFOLLOW, a random name) beside the
target, is flushed and fsynced, and is renamed over the target only when complete; on any failure
(a full disk, Ctrl-C, an exception in the caller's writing) the temp file is removed and the target
keeps what it held. A predictable `PATH.partial` opened with O_TRUNC, which this replaces, let a
planted symlink of that name send the write to any file the user can write.

    write_text(path, text)                # plans, profiles, summaries
    with safe_open(path) as f: ...        # a writer that wants a file object (numpy, json.dump)
    fd, tmp = create_temp(path); ...; commit(tmp, path)   # writers that manage their own fd
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

_KINDS = (
    (stat.S_ISLNK, errno.ELOOP, "is a symbolic link (pi2 never writes through a link)"),
    (stat.S_ISDIR, errno.EISDIR, "is a directory"),
    (stat.S_ISCHR, errno.EINVAL, "is a device, not a regular file"),
    (stat.S_ISBLK, errno.EINVAL, "is a device, not a regular file"),
    (stat.S_ISFIFO, errno.EINVAL, "is a FIFO, not a regular file"),
    (stat.S_ISSOCK, errno.EINVAL, "is a socket, not a regular file"),
)


def check_target(path: str | os.PathLike) -> Path:
    """`path` is absent or a regular file (never followed if a link); else OSError naming what it is."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (creating the temp says why not)
        return path
    if stat.S_ISREG(mode):
        return path
    for test, code, text in _KINDS:
        if test(mode):
            raise OSError(code, text, str(path))
    raise OSError(errno.EINVAL, "is not a regular file", str(path))


def create_temp(path: str | os.PathLike) -> tuple[int, Path]:
    """A new, empty file beside `path` (same directory, so the rename stays on one file system), opened
    for writing: (fd, temp path). The target is checked first, so a refusal costs nothing."""
    path = check_target(path)
    for _ in range(16):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:  # a name taken (or planted): another one
            continue
    raise OSError(errno.EEXIST, "no free temporary name beside it", str(path))


def commit(tmp: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Rename a finished (closed, fsynced) temp file over `path`, checked again just before: a link or
    device planted meanwhile is refused, not replaced. The temp file is removed when this fails."""
    try:
        check_target(path)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # the rename itself durable; some file systems refuse this
        dir_fd = os.open(Path(path).parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return Path(path)


@contextlib.contextmanager
def safe_open(path: str | os.PathLike, mode: str = "wb", **kwargs) -> Iterator[IO]:
    """A file object on a temp file beside `path`, renamed over it when the block ends without an
    exception; removed, with the target untouched, when it raises (Ctrl-C included)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"safe_open writes whole files: mode 'w' or 'wb', not {mode!r}")
    fd, tmp = create_temp(path)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    commit(tmp, path)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with safe_open(path, "wb") as f:
        f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    with safe_open(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)
