"""One error type for everything a user can get wrong: it prints one line and exits non-zero."""

import sys

import click

NOT_BUILT_EXIT = 2


class Pi2Error(click.ClickException):
    """A clear, single-line failure (bad input, missing tool, vanished device...)."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None) -> None:
        click.echo(f"pi2: error: {self.format_message()}", err=True, file=file or sys.stderr)


def not_built(name: str, issue: str) -> click.Command:
    """A command that exists in the interface but is not implemented yet: says so and exits 2."""

    @click.command(
        name=name,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
        help=f"(not built yet: {issue})",
    )
    @click.pass_context
    def command(ctx: click.Context) -> None:
        click.echo(f"pi2 {name}: not built yet ({issue})", err=True)
        ctx.exit(NOT_BUILT_EXIT)

    return command
