"""Click options more than one command declares the same way."""

from __future__ import annotations

from pathlib import Path

import click


def input_file_option(*decls: str, help: str):
    """An optional input file (`--profile`, `--tokenizer-gguf`, ...): must exist and not be a directory
    (click says so in one line before the command runs); a Path, None when not given."""
    return click.option(*decls, type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
                        help=help)  # fmt: skip
