"""`pi2 farm schedule --install/--uninstall` touch only pi2's own entry (the line after pi2's exact
marker line), keep every other crontab byte, never write a crontab they failed to read, and refuse a
path cron or systemd cannot carry (newline, %, control characters). Against the real `crontab` (as
root: for the user `nobody`, restored afterwards) and `systemd-analyze verify` where installed."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from pi2cli.cli import cli
from pi2cli.farm import schedule as sch

FARM = """name = "n"
[[device]]
name = "local"
[matrix]
models = ["m/model.pi2"]
engines = ["pi2"]
workloads = ["code"]
"""
REAL_CRONTAB = shutil.which("crontab")


def _farm(dir_: Path) -> Path:
    dir_.mkdir(parents=True, exist_ok=True)
    path = dir_ / "farm.toml"
    path.write_text(FARM)
    return path


def _on_path(monkeypatch, bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / name
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def nobody_crontab(tmp_path, monkeypatch):
    """`crontab` on PATH is the real one acting for the user nobody; nobody's crontab is restored after."""
    if REAL_CRONTAB is None or os.geteuid() != 0:
        pytest.skip("needs the real crontab and root (to edit the user nobody's crontab, not this user's)")
    saved = subprocess.run([REAL_CRONTAB, "-u", "nobody", "-l"], capture_output=True)
    _on_path(monkeypatch, tmp_path / "bin", "crontab", f'exec {REAL_CRONTAB} -u nobody "$@"\n')
    yield lambda: subprocess.run([REAL_CRONTAB, "-u", "nobody", "-l"], capture_output=True, check=True).stdout
    if saved.returncode == 0:
        subprocess.run([REAL_CRONTAB, "-u", "nobody", "-"], input=saved.stdout, check=True)
    else:
        subprocess.run([REAL_CRONTAB, "-u", "nobody", "-r"], capture_output=True)


def test_install_and_uninstall_keep_five_lines_that_mention_the_farm_path(tmp_path, nobody_crontab):
    farm = _farm(tmp_path / "lab").resolve()
    others = (
        f"# nightly backup of {farm}\n"
        f"0 1 * * * cp {farm} /var/backups/\n"
        f"30 4 * * 0 tar czf /tmp/farm.tgz {farm.parent}\n"
        f"MAILTO=ops  # {farm}.bak\n"
        f"15 5 * * * grep -c device {farm} >> /tmp/devices.log\n"
    ).encode()
    subprocess.run(["crontab", "-"], input=others, check=True)
    for at in ("03:15", "04:20"):  # a second install replaces pi2's entry, still keeping the rest
        r = CliRunner().invoke(
            cli, ["farm", "schedule", str(farm), "--kind", "cron", "--install", "--at", at]
        )
        assert r.exit_code == 0, r.output
        now = nobody_crontab()
        assert now.startswith(others) and now.count(b"farm regressions") == 1
        marker, job = now[len(others) :].decode().splitlines()
        assert marker == sch.MARKER.format(farm=farm)
        hour, minute = at.split(":")
        assert job.startswith(f"{int(minute)} {int(hour)} * * * cd ")
    r = CliRunner().invoke(cli, ["farm", "schedule", str(farm), "--kind", "cron", "--uninstall"])
    assert r.exit_code == 0 and "removed" in r.stdout, r.output
    assert nobody_crontab() == others
    r = CliRunner().invoke(cli, ["farm", "schedule", str(farm), "--kind", "cron", "--uninstall"])
    assert r.exit_code == 0 and "no pi2 crontab entry" in r.stdout and nobody_crontab() == others


def test_install_with_no_crontab_yet_creates_one(tmp_path, nobody_crontab):
    subprocess.run(["crontab", "-r"], capture_output=True)
    farm = _farm(tmp_path / "lab").resolve()
    r = CliRunner().invoke(cli, ["farm", "schedule", str(farm), "--kind", "cron", "--install"])
    assert r.exit_code == 0, r.output
    assert nobody_crontab().decode().splitlines()[0] == sch.MARKER.format(farm=farm)


def test_a_crontab_that_cannot_be_read_is_never_overwritten(tmp_path, monkeypatch):
    wrote = tmp_path / "wrote"
    _on_path(monkeypatch, tmp_path / "bin", "crontab",
             f'if [ "$1" = "-l" ]; then echo "crontab: cannot open /var/spool/cron: Permission denied" >&2; exit 1; fi\n'
             f'cat > {wrote}\n')  # fmt: skip
    farm = _farm(tmp_path / "lab")
    for flag in ("--install", "--uninstall"):
        r = CliRunner().invoke(cli, ["farm", "schedule", str(farm), "--kind", "cron", flag])
        assert r.exit_code == 1 and not wrote.exists(), r.output
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Permission denied" in lines[0] and "left as it is" in lines[0]


@pytest.mark.parametrize("name", ["a\n* * * * * touch /tmp/pwned\n#", "a%b", "a\x1bb", "a\tb"])
def test_a_path_cron_or_systemd_cannot_carry_is_refused_in_one_line(tmp_path, monkeypatch, name):
    wrote = tmp_path / "wrote"
    _on_path(monkeypatch, tmp_path / "bin", "crontab", f'[ "$1" = "-l" ] && exit 0; cat > {wrote}\n')
    farm = _farm(tmp_path / name)
    for args in (["--kind", "cron"], ["--kind", "systemd"], ["--kind", "cron", "--install"]):
        r = CliRunner().invoke(cli, ["farm", "schedule", str(farm), *args])
        assert r.exit_code == 1, (args, r.output)
        lines = r.stderr.strip().splitlines()
        assert (
            len(lines) == 1 and lines[0].startswith("pi2: error: farm file ") and "cannot carry" in lines[0]
        )
        assert r.stdout == "" and not wrote.exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("name", ["plain", "with space", "it's", 'say "hi"', "cost$HOME", "back\\slash"])
def test_the_units_pass_systemd_analyze_verify(tmp_path, name):
    farm = _farm(tmp_path / name).resolve()
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    for unit, text in sch.systemd_units(farm, tmp_path / "report", 2, 30).items():
        (unit_dir / unit).write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", str(unit_dir / f"{sch.UNIT}.service")],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and "error" not in done.stderr.lower(), done.stderr


def test_systemd_install_refuses_a_unit_it_did_not_write_and_uninstall_removes_only_its_own(
    tmp_path, monkeypatch
):
    calls = tmp_path / "calls"
    _on_path(monkeypatch, tmp_path / "bin", "systemctl", f'echo "$@" >> {calls}\n')
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    unit_dir = tmp_path / "home" / ".config" / "systemd" / "user"
    unit_dir.mkdir(parents=True)
    theirs = b"[Unit]\nDescription=someone else's pi2-farm\n"
    (unit_dir / "pi2-farm.service").write_bytes(theirs)
    farm = _farm(tmp_path / "lab").resolve()
    r = CliRunner().invoke(cli, ["farm", "schedule", str(farm), "--kind", "systemd", "--install"])
    assert r.exit_code == 1 and "not pi2's" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert (unit_dir / "pi2-farm.service").read_bytes() == theirs and not (
        unit_dir / "pi2-farm.timer"
    ).exists()
    r = CliRunner().invoke(cli, ["farm", "schedule", str(farm), "--kind", "systemd", "--uninstall"])
    assert r.exit_code == 0 and (unit_dir / "pi2-farm.service").read_bytes() == theirs
    (unit_dir / "pi2-farm.service").unlink()
    r = CliRunner().invoke(cli, ["farm", "schedule", str(farm), "--kind", "systemd", "--install"])
    assert r.exit_code == 0, r.output
    assert "enable --now pi2-farm.timer" in calls.read_text()
    r = CliRunner().invoke(cli, ["farm", "schedule", str(farm), "--kind", "systemd", "--uninstall"])
    assert r.exit_code == 0 and not any(unit_dir.iterdir()), r.output


def test_a_marker_whose_job_line_was_removed_by_hand_takes_only_itself():
    """A user who deleted pi2's job line by hand and wrote their own below the marker keeps their line:
    only a line that is pi2's job for this farm file goes with the marker."""
    farm = Path("/srv/lab/farm.toml")
    marker = sch.MARKER.format(farm=farm).encode()
    theirs = b"7 7 * * * /usr/local/bin/my-backup\n"
    assert sch.without_entry(b"5 5 * * * echo hi\n" + marker + b"\n" + theirs, farm) == (
        b"5 5 * * * echo hi\n" + theirs, 1)  # fmt: skip
    ours = (sch.crontab_line(farm, farm.parent / "r", 3, 15) + "\n").encode()
    assert sch.without_entry(theirs + marker + b"\n" + ours, farm) == (theirs, 1)
    assert sch.without_entry(marker, farm) == (b"", 1)  # a marker on the last line, no newline


def test_systemd_install_never_writes_through_a_link_planted_at_a_temp_name(tmp_path, monkeypatch):
    _on_path(monkeypatch, tmp_path / "bin", "systemctl", "exit 0\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    unit_dir = tmp_path / "home" / ".config" / "systemd" / "user"
    unit_dir.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me\n")
    for name in ("pi2-farm.service", "pi2-farm.timer"):  # the fixed temp names pi2 once used
        (unit_dir / f".{name}.pi2-tmp").symlink_to(victim)
    farm = _farm(tmp_path / "lab").resolve()
    r = CliRunner().invoke(cli, ["farm", "schedule", str(farm), "--kind", "systemd", "--install"])
    assert r.exit_code == 0, r.output
    assert victim.read_bytes() == b"keep me\n"
    assert (unit_dir / "pi2-farm.timer").read_text().startswith(sch.MARKER.format(farm=farm))
    (unit_dir / "pi2-farm.timer").unlink()
    (unit_dir / "pi2-farm.timer").symlink_to(victim)  # a link at the unit itself: refused, left as it is
    r = CliRunner().invoke(cli, ["farm", "schedule", str(farm), "--kind", "systemd", "--install"])
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1, r.output
    assert victim.read_bytes() == b"keep me\n" and (unit_dir / "pi2-farm.timer").is_symlink()
