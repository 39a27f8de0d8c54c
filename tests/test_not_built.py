"""Commands that are not built yet must say so in one line and exit 2, with no fake output."""

from click.testing import CliRunner

from pi2cli.cli import COMMANDS, cli


def test_unbuilt_commands_exit_2_with_one_line():
    runner = CliRunner()
    for name in COMMANDS:
        command = cli.get_command(None, name)
        if "not built yet" not in (command.help or ""):
            continue
        result = runner.invoke(cli, [name, "--anything"])
        assert result.exit_code == 2, name
        assert result.stdout == ""
        assert "not built yet" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_help_lists_no_stub_as_working():
    """`pi2 --help` reads the COMMANDS table: a command still a stub must say so there too."""
    for name, line in COMMANDS.items():
        stub = "not built yet" in (cli.get_command(None, name).help or "")
        assert stub == ("not built yet" in line), name
