"""Options shared by `pi2 results`, `pi2 compare`, `pi2 report` (and later `pi2 bench`)."""

import datetime as dt
import re

import click

from pi2cli.errors import Pi2Error
from pi2cli.results import schema

results_dir_option = click.option(
    "--results-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Results directory holding runs/*.json and pi2.sqlite [default: $PI2_RESULTS, else results/].",
)
index_option = click.option(
    "--index",
    "index_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="SQLite index file [default: $PI2_RESULTS_INDEX, else RESULTS_DIR/pi2.sqlite].",
)


class ThreadsFilter(click.ParamType):
    """--threads: a positive count, or `default` for runs that left the count to the engine (stored as 0)."""

    name = "N|default"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "default":
            return 0
        if text.isdigit() and int(text) > 0:
            return int(text)
        self.fail(f"{value!r}: a thread count (1, 2, ...) or 'default'", param, ctx)


def filter_options(func):
    """--model / --engine / --workload / --device / --threads / --since, the filters the index understands."""
    for option in reversed([
        click.option("--model", default=None, help="Only models whose name contains this (any case)."),
        click.option("--engine", default=None, help="Only this engine: a name (pi2, llama.cpp) or label (pi2:dense)."),
        click.option("--workload", default=None, help="Only this workload (dialogue, code, math, roleplay, ...)."),
        click.option("--device", default=None, help="Only runs on this device: its name (local, an adb serial such as 127.0.0.1:5555) or kind (local, adb, qemu-arm64)."),
        click.option("--threads", type=ThreadsFilter(), default=None, help="Only runs with this many threads ('default': the engine's own choice)."),
        click.option("--since", default=None, help="Only runs from this time on: 2026-11-21, 2026-11-21T08:00, or 7d / 12h / 30m ago."),
    ]):  # fmt: skip
        func = option(func)
    return func


wide_option = click.option(
    "--wide",
    is_flag=True,
    help="Every column (device, threads, commit, intervals...) in one wide table; "
    "by default the tables fit 120 columns.",
)


_RELATIVE = re.compile(r"^(\d+)\s*([dhm])$")


def parse_since(text: str | None, now: dt.datetime | None = None) -> str | None:
    """--since as an ISO UTC time: absolute ISO dates/times or a relative 7d / 12h / 30m."""
    if not text:
        return None
    match = _RELATIVE.match(text.strip())
    if match:
        amount, unit = int(match.group(1)), match.group(2)
        delta = {"d": dt.timedelta(days=amount), "h": dt.timedelta(hours=amount),
                 "m": dt.timedelta(minutes=amount)}[unit]  # fmt: skip
        return ((now or dt.datetime.now(dt.UTC)) - delta).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        schema.parse_time(text.strip())
    except ValueError:
        raise Pi2Error(
            f"--since {text!r}: not a time (use 2026-11-21, 2026-11-21T08:00, 7d, 12h or 30m)"
        ) from None
    return text.strip()
