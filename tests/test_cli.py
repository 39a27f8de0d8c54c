"""The `pi2` command surface: every group is listed, and unbuilt commands say so and exit 2."""

import subprocess
import sys

import click
from click.testing import CliRunner

from pi2cli.cli import COMMANDS, cli

EXPECTED = [
    "build", "devices", "push", "models", "convert", "generate", "workloads",
    "profile", "plan", "serve", "bench", "quality", "compare", "report", "results", "farm", "repro",
]  # fmt: skip


def test_help_lists_every_command_group_with_help():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in EXPECTED:
        line = next((ln for ln in result.output.splitlines() if ln.strip().startswith(name + " ")), None)
        assert line is not None, f"{name} missing from pi2 --help"
        assert len(line.split()) > 2, f"{name} has no one-line help"
    assert set(COMMANDS) == set(EXPECTED)


def test_every_command_module_loads():
    for name in EXPECTED:
        assert cli.get_command(None, name) is not None


def test_unknown_command_fails():
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2


def test_installed_entry_point_runs():
    out = subprocess.run(
        [sys.executable, "-m", "pi2cli", "--version"], capture_output=True, text=True, check=True
    )
    assert "pi2" in out.stdout


def test_a_library_error_is_one_line_with_its_exit_code(monkeypatch, tmp_path):
    # Pi2Error is a plain exception (the library layers do not depend on click); the command layer turns
    # it into `pi2: error: ...` and its exit code, under click's runner and under `pi2` itself
    from pi2cli.errors import Pi2Error
    from pi2cli.results import store

    assert not isinstance(Pi2Error("x"), click.ClickException)

    def refuse(*args, **kwargs):
        raise Pi2Error("the run file is gone", exit_code=2)

    monkeypatch.setattr(store, "load_run", refuse)
    result = CliRunner().invoke(cli, ["results", "show", "r1", "--results-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr == "pi2: error: the run file is gone\n" and result.stdout == ""

    done = subprocess.run([sys.executable, "-m", "pi2cli", "results", "show", "r1", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == f"pi2: error: no run 'r1' in {tmp_path / 'runs'} (see `pi2 results list`)\n"
