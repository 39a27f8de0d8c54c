"""The `pi2` command surface: every group is listed, and unbuilt commands say so and exit 2."""

import subprocess
import sys

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
