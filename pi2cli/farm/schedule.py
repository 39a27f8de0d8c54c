"""`pi2 farm schedule`: the nightly run as a systemd user timer (where systemd runs) or a crontab line.

The night's job is the same three commands a person would type, in order: run the farm (resuming the
night when it was interrupted), write the dashboard, and check for regressions (its exit status is the
job's, so a flagged night is a failed unit / a cron mail).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from pi2cli.errors import Pi2Error

UNIT = "pi2-farm"


def night_script(farm_file: Path, report_dir: Path) -> str:
    pi2 = shlex.quote(str(Path(sys.executable).with_name("pi2")))
    f, out = shlex.quote(str(farm_file)), shlex.quote(str(report_dir))
    return (f"{pi2} farm run {f} || {pi2} farm run {f} --resume; "
            f"{pi2} farm report {f} --out {out}; {pi2} farm regressions {f}")  # fmt: skip


def crontab_line(farm_file: Path, report_dir: Path, hour: int, minute: int) -> str:
    log = shlex.quote(str(farm_file.parent / "farm-cron.log"))
    script = night_script(farm_file, report_dir)
    return f"{minute} {hour} * * * cd {shlex.quote(str(farm_file.parent))} && ( {script} ) >> {log} 2>&1"


def systemd_units(farm_file: Path, report_dir: Path, hour: int, minute: int) -> dict[str, str]:
    script = night_script(farm_file, report_dir)
    service = f"""[Unit]
Description=pi2 nightly device farm ({farm_file.name})

[Service]
Type=oneshot
WorkingDirectory={farm_file.parent}
ExecStart=/bin/sh -c {shlex.quote(script)}
"""
    timer = f"""[Unit]
Description=pi2 nightly device farm ({farm_file.name})

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


def install(farm_file: Path, report_dir: Path, hour: int, minute: int, kind: str) -> str:
    """Install the timer (systemd) or the crontab line (cron); returns what was done."""
    if kind == "systemd":
        unit_dir = Path.home() / ".config" / "systemd" / "user"
        unit_dir.mkdir(parents=True, exist_ok=True)
        for name, text in systemd_units(farm_file, report_dir, hour, minute).items():
            (unit_dir / name).write_text(text)
        done = subprocess.run(["systemctl", "--user", "daemon-reload"], capture_output=True, text=True)
        if done.returncode == 0:
            done = subprocess.run(["systemctl", "--user", "enable", "--now", f"{UNIT}.timer"], capture_output=True,
                                  text=True)  # fmt: skip
        if done.returncode != 0:
            raise Pi2Error(
                f"systemctl --user: {done.stderr.strip() or 'failed'} (units written to {unit_dir})"
            )
        return f"installed {unit_dir}/{UNIT}.timer (runs daily at {hour:02d}:{minute:02d})"
    if shutil.which("crontab") is None:
        raise Pi2Error(
            "neither a systemd user session nor crontab here: add the printed line to your scheduler"
        )
    line = crontab_line(farm_file, report_dir, hour, minute)
    current = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    lines = (
        [ln for ln in current.stdout.splitlines() if str(farm_file) not in ln]
        if current.returncode == 0
        else []
    )
    done = subprocess.run(
        ["crontab", "-"], input="\n".join([*lines, line]) + "\n", capture_output=True, text=True
    )
    if done.returncode != 0:
        raise Pi2Error(f"crontab: {done.stderr.strip() or 'failed'}")
    return f"installed a crontab line (runs daily at {hour:02d}:{minute:02d})"
