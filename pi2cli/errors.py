"""One error type for everything a user can get wrong: it prints one line and exits non-zero.

A plain exception, so the library layers (models, plan, results, ...) raise it without depending on
the command-line toolkit; the command layer (pi2cli/cli.py) turns it into click's error, which prints
`pi2: error: MESSAGE` and exits with exit_code."""


class Pi2Error(Exception):
    """A clear, single-line failure (bad input, missing tool, vanished device...). str() is the line."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def failure_line(output: str, default: str, program: str = "") -> str:
    """What a failed tool of ours said: the last line of its output (its one-line error), without the
    `PROGRAM: ` and `error: ` it starts with, so the line can be wrapped in the host's own words;
    `default` when it printed nothing."""
    lines = (output or "").strip().splitlines()
    line = lines[-1].strip() if lines else default
    return line.removeprefix(f"{program}: " if program else "").removeprefix("error: ")
