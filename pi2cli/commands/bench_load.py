"""`pi2 bench --mode load`: the click side of pi2cli.bench.load (progress, the summary, --json)."""

from __future__ import annotations

import json
import sys
import time

import click

from pi2cli.commands.live import LiveDisplay
from pi2cli.errors import Pi2Error

PLAIN_EVERY_S = 5.0  # progress lines when stderr is not a terminal: one every this many seconds


class Progress(LiveDisplay):
    """A live line on a terminal (rich); a plain line every few seconds otherwise; nothing with --json
    when stderr is not a terminal (as the other modes)."""

    def __init__(self, console, duration_s: float, live: bool, plain: bool):
        self.console, self.duration_s, self.plain = console, duration_s, plain
        self.live = console.status("starting the clients") if live else None
        self.last_plain = time.monotonic()

    def __call__(self, elapsed_s: float, counts: dict, tokens: int) -> None:
        phase = "load" if elapsed_s < self.duration_s else "finishing the requests in flight"
        text = (f"{phase} {min(elapsed_s, self.duration_s):.0f}/{self.duration_s:g} s: {counts['completed']} "
                f"completed, {counts['rejected']} rejected, {counts['failed']} failed, {counts['timed_out']} "
                f"timed out, {tokens / elapsed_s if elapsed_s > 0 else 0:.1f} tok/s")  # fmt: skip
        if self.live:
            self.live.update(text)
        elif self.plain and time.monotonic() - self.last_plain >= PLAIN_EVERY_S:
            self.last_plain = time.monotonic()
            click.echo(text, err=True)


def summary_lines(outcome) -> list[str]:
    from pi2cli.bench.load import load_lines
    from pi2cli.results import schema as S

    run, load = outcome.run, outcome.run["load"]
    lines = [f"pi2 bench --mode load: {S.engine_label(run)} at {run['settings']['url']}, model "
             f"{S.model_label(run)}, {load['concurrency']} clients, {load['duration_s']:g} s "
             f"(window {load['window_s']:.1f} s): {S.status_text(run)}"]  # fmt: skip
    lines += [f"  {line}" for line in load_lines(run)]
    lines.append(f"  {outcome.path}")
    return lines


def load_command(*, url, concurrency, duration, model, engines, max_tokens, api_key, request_timeout, workloads,
                 limit, seed, tags, results_dir, as_json, unused) -> None:  # fmt: skip
    """--mode load: pi2cli.bench.load does the work; a summary (or --json's {"runs": [...]}) when done."""
    from rich.console import Console

    from pi2cli.bench.load import LoadConfig, run_load

    if url is None:
        raise Pi2Error("--mode load needs --url, the OpenAI-compatible server to load (http://HOST:PORT)")
    if concurrency is None or duration is None:
        raise Pi2Error("--mode load needs -c/--concurrency N and --duration SECONDS")
    if unused:
        raise Pi2Error(
            f"{unused[0]} does not go with --mode load (it drives a server already running at --url)"
        )
    if len(workloads) > 1:
        raise Pi2Error("--mode load takes one --workload (each load is one run)")
    if len(engines) > 1:
        raise Pi2Error("--mode load names one engine with -e (the server's; default: what /v1/models says)")
    cfg = LoadConfig(url=url, concurrency=concurrency, duration_s=duration, model=model,
                     engine=engines[0] if engines else None, max_tokens=max_tokens, api_key=api_key,
                     workload=workloads[0], limit=limit, seed=seed, results_dir=results_dir, tags=list(tags),
                     **({"request_timeout_s": request_timeout} if request_timeout is not None else {}))  # fmt: skip
    console = Console(stderr=True)
    with Progress(console, duration, live=console.is_terminal, plain=not as_json) as progress:
        outcome = run_load(cfg, progress)
    if as_json:
        click.echo(json.dumps({"runs": [dict(outcome.row(), load=outcome.run["load"])]}, indent=1))
    else:
        for line in summary_lines(outcome):
            click.echo(line)
    if outcome.run["status"] != "ok":
        sys.exit(1)
