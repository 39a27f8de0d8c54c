"""`pi2 farm schedule`: the nightly run as a systemd user timer (where systemd runs) or a crontab line.

The night's job is the same three commands a person would type, in order: run the farm (resuming the
night when it was interrupted), write the dashboard, and check for regressions (its exit status is the
job's, so a flagged night is a failed unit / a cron mail).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from pi2cli import safe_write
from pi2cli.errors import Pi2Error

UNIT = "pi2-farm"
# The first line of pi2's units and the line before pi2's crontab entry. Install and uninstall touch
# only what follows a marker matched exactly (the whole line, the farm file's path in it), so another
# line that merely mentions the path -- a backup job, a second farm -- is never edited.
MARKER = "# pi2 farm schedule: {farm} (written by pi2; the next line is its job)"
_NO_CRONTAB = re.compile(rb"no crontab for ")  # cron's answer to `crontab -l` for a user without one
# Cron turns % into a newline and ends the job at a newline; systemd expands % specifiers; a control
# character in a path is never what the user meant. Such a path cannot be written as one safe line.
_UNSAFE = re.compile(r"[%\x00-\x1f\x7f]")


def check_paths(**paths: Path) -> None:
    """Refuse (one line) a path that cron or systemd cannot carry as written."""
    for what, path in paths.items():
        bad = _UNSAFE.search(str(path))
        if bad:
            raise Pi2Error(
                f"{what.replace('_', ' ')} {str(path)!r} contains {bad.group()!r}: cron and systemd cannot carry "
                "a newline, '%' or a control character in a job line safely; move or rename it"
            )


def _pi2_exe() -> Path:
    return Path(sys.executable).with_name("pi2")


def night_script(farm_file: Path, report_dir: Path) -> str:
    check_paths(farm_file=farm_file, report_dir=report_dir, pi2_command=_pi2_exe())
    pi2 = shlex.quote(str(_pi2_exe()))
    f, out = shlex.quote(str(farm_file)), shlex.quote(str(report_dir))
    return (f"cd {shlex.quote(str(farm_file.parent))} && ( {pi2} farm run {f} || {pi2} farm run {f} --resume; "
            f"{pi2} farm report {f} --out {out}; {pi2} farm regressions {f} )")  # fmt: skip


def crontab_line(farm_file: Path, report_dir: Path, hour: int, minute: int) -> str:
    log = shlex.quote(str(farm_file.parent / "farm-cron.log"))
    return f"{minute} {hour} * * * {night_script(farm_file, report_dir)} >> {log} 2>&1"


def _systemd_quote(text: str) -> str:
    """One systemd command-line word: double quotes with C-style escapes, `$$` for a literal dollar
    (systemd expands $VAR itself). % never reaches here (check_paths)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$") + '"'


def systemd_units(farm_file: Path, report_dir: Path, hour: int, minute: int) -> dict[str, str]:
    script = night_script(farm_file, report_dir)  # it cds itself: WorkingDirectory= trims whitespace
    marker = MARKER.format(farm=farm_file)
    service = f"""{marker}
[Unit]
Description=pi2 nightly device farm

[Service]
Type=oneshot
ExecStart=/bin/sh -c {_systemd_quote(script)}
"""
    timer = f"""{marker}
[Unit]
Description=pi2 nightly device farm

[Timer]
OnCalendar=*-*-* {hour:02d}:{minute:02d}:00
Persistent=true

[Install]
WantedBy=timers.target
"""
    return {f"{UNIT}.service": service, f"{UNIT}.timer": timer}


def has_systemd_user() -> bool:
    if shutil.which("systemctl") is None:
        return False
    done = subprocess.run(["systemctl", "--user", "is-system-running"], capture_output=True, text=True)
    return done.stdout.strip() in ("running", "degraded")


def _unit_dir() -> Path:
    return Path.home() / ".config" / "systemd" / "user"


def _first_line(path: Path) -> bytes | None:
    """The first line of a unit file (pi2's carry its marker there), None when there is no such file."""
    try:
        with open(path, "rb") as f:
            return f.readline(4096).rstrip(b"\n")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise Pi2Error(f"{path}: cannot read: {err.strerror or err}") from None


def _systemctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", "--user", *args], capture_output=True, text=True)


def _install_systemd(farm_file: Path, report_dir: Path, hour: int, minute: int) -> str:
    unit_dir = _unit_dir()
    units = systemd_units(farm_file, report_dir, hour, minute)
    marker = MARKER.format(farm=farm_file).encode()
    for name in units:
        first = _first_line(unit_dir / name)
        if first is not None and first != marker:
            other = "another farm file's" if first.startswith(b"# pi2 farm schedule: ") else "not pi2's"
            raise Pi2Error(f"{unit_dir / name} exists and is {other}: left as it is, nothing installed "
                           "(pi2 farm schedule --uninstall its farm file first)")  # fmt: skip
    unit_dir.mkdir(parents=True, exist_ok=True)
    for name, text in units.items():  # never through a link planted at the unit or a temp name
        safe_write.write_text(unit_dir / name, text)
    done = _systemctl("daemon-reload")
    if done.returncode == 0:
        done = _systemctl("enable", "--now", f"{UNIT}.timer")
    if done.returncode != 0:
        raise Pi2Error(f"systemctl --user: {done.stderr.strip() or 'failed'} (units written to {unit_dir})")
    return f"installed {unit_dir}/{UNIT}.timer (runs daily at {hour:02d}:{minute:02d})"


def _uninstall_systemd(farm_file: Path) -> str:
    unit_dir = _unit_dir()
    marker = MARKER.format(farm=farm_file).encode()
    names = [n for n in (f"{UNIT}.timer", f"{UNIT}.service") if _first_line(unit_dir / n) == marker]
    if not names:
        return f"no pi2 timer for {farm_file} in {unit_dir} (nothing removed)"
    _systemctl("disable", "--now", f"{UNIT}.timer")  # fails harmlessly when it was never enabled
    for name in names:
        (unit_dir / name).unlink()
    _systemctl("daemon-reload")
    return f"removed {', '.join(str(unit_dir / n) for n in names)}"


def _read_crontab() -> bytes:
    """The user's crontab as bytes, b"" when they have none; any other failure refuses (one line):
    writing back what we failed to read would wipe it."""
    if shutil.which("crontab") is None:
        raise Pi2Error(
            "neither a systemd user session nor crontab here: add the printed line to your scheduler"
        )
    done = subprocess.run(["crontab", "-l"], capture_output=True)
    if done.returncode == 0:
        return done.stdout
    if _NO_CRONTAB.search(done.stderr):
        return b""
    why = done.stderr.decode("utf-8", "replace").strip().splitlines()
    raise Pi2Error(
        f"crontab -l failed ({why[0] if why else f'exit {done.returncode}'}): crontab left as it is"
    )


def _write_crontab(text: bytes) -> None:
    done = subprocess.run(["crontab", "-"], input=text, capture_output=True)
    if done.returncode != 0:
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise Pi2Error(f"crontab: {why[0] if why else 'failed'}")


def without_entry(crontab: bytes, farm_file: Path) -> tuple[bytes, int]:
    """crontab minus pi2's entries for farm_file (each its exact marker line and the line after it
    when that line is pi2's job for farm_file), every other byte kept; and how many were removed.
    A marker whose job line a person deleted by hand takes only itself: whatever they wrote below it
    is theirs."""
    marker = MARKER.format(farm=farm_file).encode()
    job = f" farm run {shlex.quote(str(farm_file))} ".encode()  # in every job line crontab_line writes
    lines = crontab.splitlines(keepends=True)
    kept, removed, i = [], 0, 0
    while i < len(lines):
        if lines[i].rstrip(b"\r\n") == marker:
            removed += 1
            i += 2 if i + 1 < len(lines) and job in lines[i + 1] else 1
            continue
        kept.append(lines[i])
        i += 1
    return b"".join(kept), removed


def _install_cron(farm_file: Path, report_dir: Path, hour: int, minute: int) -> str:
    line = crontab_line(farm_file, report_dir, hour, minute)
    rest, _ = without_entry(_read_crontab(), farm_file)
    if rest and not rest.endswith(b"\n"):
        rest += b"\n"  # a last line without its newline: the only byte pi2 adds to another's lines
    _write_crontab(rest + f"{MARKER.format(farm=farm_file)}\n{line}\n".encode())
    return f"installed a crontab line (runs daily at {hour:02d}:{minute:02d})"


def _uninstall_cron(farm_file: Path) -> str:
    current = _read_crontab()
    rest, removed = without_entry(current, farm_file)
    if not removed:
        return f"no pi2 crontab entry for {farm_file} (crontab left as it is)"
    _write_crontab(rest)
    return f"removed pi2's crontab entry for {farm_file}"


def install(farm_file: Path, report_dir: Path, hour: int, minute: int, kind: str) -> str:
    """Install the timer (systemd) or the crontab entry (cron); returns what was done."""
    if kind == "systemd":
        return _install_systemd(farm_file, report_dir, hour, minute)
    return _install_cron(farm_file, report_dir, hour, minute)


def uninstall(farm_file: Path, kind: str) -> str:
    """Remove pi2's timer (systemd) or crontab entry (cron) for farm_file, nothing else."""
    check_paths(farm_file=farm_file)
    if kind == "systemd":
        return _uninstall_systemd(farm_file)
    return _uninstall_cron(farm_file)
