"""Where pi2 writes: checked before any work starts, and a place to keep a result when the real one fails.

A benchmark that runs for an hour and then cannot save (read-only directory, a path under a regular
file) loses the hour; so every command that writes checks its output location first, by creating and
removing a probe file there (permissions alone say nothing for root, a read-only mount or a full quota).
A save that still fails at the end (the disk filled up meanwhile) goes to unsaved_dir() instead.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from pi2cli.errors import Pi2Error


def os_error_text(err: OSError, path: str | os.PathLike | None = None) -> str:
    """'PATH: reason' for an OSError, the form every `pi2: error:` about a file takes."""
    where = path if path is not None else (err.filename if err.filename is not None else "")
    reason = err.strerror or str(err) or type(err).__name__
    return f"{where}: {reason}" if where != "" else reason


def check_dir_writable(path: str | os.PathLike, what: str = "output directory", note: str = "",
                       create: bool = True) -> Path:  # fmt: skip
    """Create `path` (and parents) if missing and prove a file can be written in it; else one Pi2Error
    "WHAT PATH: reason NOTE". create=False leaves a missing directory missing and probes the nearest
    existing ancestor instead (for commands that may still refuse for another reason)."""
    path = Path(path).expanduser()
    try:
        probe_dir = path
        if create:
            path.mkdir(parents=True, exist_ok=True)
        else:
            while not probe_dir.exists() and probe_dir.parent != probe_dir:
                probe_dir = probe_dir.parent
            if not probe_dir.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(probe_dir))
        fd, probe = tempfile.mkstemp(prefix=".pi2-write-probe.", dir=probe_dir)
        os.close(fd)
        os.unlink(probe)
    except FileExistsError:  # mkdir's word for "a file is in the way"
        raise Pi2Error(f"{what} {path}: {os.strerror(errno.ENOTDIR)}{note}") from None
    except OSError as err:
        raise Pi2Error(f"{what} {os_error_text(err, path)}{note}") from None
    return path


def check_file_writable(path: str | os.PathLike, what: str = "output file") -> Path:
    """`path` can be written (atomically, beside itself, by pi2cli.safe_write): its directory is
    writable and it is a regular file or absent -- not a directory, link, device or FIFO. Nothing is
    created but the missing parent directories."""
    from pi2cli.safe_write import check_target

    path = Path(path).expanduser()
    if path.is_dir() and not path.is_symlink():
        raise Pi2Error(f"{what} {path}: is a directory (give a file name)")
    check_dir_writable(path.parent if str(path.parent) else Path("."), what=f"{what} {path}: directory")
    try:
        check_target(path)
    except OSError as err:
        raise Pi2Error(f"{what} {os_error_text(err)}") from None
    return path


def unsaved_dir() -> Path:
    """Where a result goes when its own directory refuses it: ~/.cache/pi2/unsaved (or $PI2_UNSAVED_DIR),
    else the system temporary directory; the first one that takes a probe file."""
    candidates = [os.environ.get("PI2_UNSAVED_DIR"), Path.home() / ".cache" / "pi2" / "unsaved",
                  Path(tempfile.gettempdir()) / "pi2-unsaved"]  # fmt: skip
    for candidate in candidates:
        if not candidate:
            continue
        try:
            return check_dir_writable(candidate)
        except Pi2Error:
            continue
    raise Pi2Error("no writable place for unsaved results (~/.cache/pi2/unsaved and the temp dir refused)")
