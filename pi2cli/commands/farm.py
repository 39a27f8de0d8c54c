"""`pi2 farm`: the click front of pi2cli.farm (all logic lives there)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from pi2cli.commands.live import LiveDisplay
from pi2cli.errors import Pi2Error

FARM_FILE = click.argument("farm_file", type=click.Path(dir_okay=False, path_type=Path))


@click.group(name="farm")
def command() -> None:
    """Nightly device-farm runs with thermal gating, raw samples and regression flags.

    A farm file (TOML, docs/FARM.md) lists devices and a matrix of models x engines x workloads x
    budgets. In order, every night:

    \b
      pi2 farm check farm.toml            # valid? which devices answer?
      pi2 farm run farm.toml              # one night; --resume completes an interrupted one
      pi2 farm report farm.toml --out site
      pi2 farm regressions farm.toml      # exit 1 when a series got slower
      pi2 farm schedule farm.toml --install
    """


@command.command(name="check")
@FARM_FILE
def check(farm_file) -> None:
    """Validate FARM_FILE and say which devices are reachable (one line per problem)."""
    from pi2cli.farm.check import check_farm

    farm, good, problems = check_farm(farm_file)
    for line in good:
        click.echo(line)
    for line in problems:
        click.echo(f"pi2: error: {farm_file}: {line}", err=True)
    if problems:
        sys.exit(1)
    click.echo(f"{farm_file}: ok ({len(farm.devices)} devices, results in {farm.results_dir})")


class Display(LiveDisplay):
    """Worker events as a rich progress bar per device on a terminal, else one plain line each."""

    def __init__(self, console):
        self.console = console
        self.progress = None
        self.tasks: dict[str, int] = {}
        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("[bold]{task.fields[device]}"), BarColumn(), MofNCompleteColumn(),
                                     TextColumn("{task.fields[now]}"), TimeElapsedColumn(), console=console)  # fmt: skip
            self.live = self.progress

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def event(self, e: dict) -> None:
        device, kind = e["device"], e["event"]
        if self.progress is None:
            line = plain_line(e)
            if line:
                self.say(line)
            return
        if kind == "plan":
            self.tasks[device] = self.progress.add_task("", total=e["total"], completed=e["done"], device=device,
                                                        now="")  # fmt: skip
        elif device in self.tasks:
            task = self.tasks[device]
            if kind == "cell_started":
                self.progress.update(task, now=f"{e['engine']} · {e['workload']}")
            elif kind == "cell_done":
                self.progress.update(task, advance=1, now=e["status"])
            elif kind in ("lost", "finished"):
                self.progress.update(task, now="LOST" if kind == "lost" else "done")
            if kind in ("message", "lost"):
                self.progress.console.print(f"[dim]{plain_line(e)}[/dim]", highlight=False)


def plain_line(e: dict) -> str | None:
    d, kind = e["device"], e["event"]
    if kind == "plan":
        return f"[{d}] {e['total']} cells, {e['done']} finished before"
    if kind == "cell_started":
        return f"[{d}] running {e['engine']} · {e['workload']}"
    if kind == "cell_done":
        speed = f", {e['decode_tps']:.1f} tok/s" if e.get("decode_tps") else ""
        return f"[{d}] {e['status']}{speed}" + (f": {e['error']}" if e.get("error") else "")
    if kind == "message":
        return f"[{d}] {e['text']}"
    if kind == "lost":
        return f"[{d}] LOST: {e['error']} ({len(e.get('undone', []))} cells left undone)"
    if kind == "finished":
        return f"[{d}] finished ({e['failed']} failed)"
    return None


@command.command(name="run")
@FARM_FILE
@click.option(
    "--resume", is_flag=True, help="Complete the newest night (or --night): finished cells are skipped."
)
@click.option("--night", default=None, help="The night's date, YYYY-MM-DD (default: today in UTC).")
def run(farm_file, resume, night) -> None:
    """Run one night of FARM_FILE's matrix, one worker per device in parallel.

    Builds each engine once per target, pushes once per device (unchanged files are skipped), gates
    every run (idle, cool, charged enough; the wait is recorded), and records each run's raw token times,
    energy and conditions. A device that vanishes is waited for, then marked lost without stopping the
    others; `--resume` completes its cells later. Exit 1 when a cell failed or a device was lost.
    """
    from rich.console import Console

    from pi2cli.farm.run import run_farm

    console = Console(stderr=True)
    with Display(console) as display:
        outcome = run_farm(farm_file, resume=resume, night=night, say=display.say, on_event=display.event)
    for d in outcome.devices.values():
        state = "LOST" if d.lost else "ok"
        click.echo(f"{d.name}: {state}, {d.ok} ok, {d.failed} failed, {d.done_before} finished before"
                   + (f", {len(d.undone)} undone ({d.error})" if d.lost else "") + f"; log {d.log}")  # fmt: skip
    click.echo(f"night {outcome.night}: {'complete' if outcome.complete else 'incomplete'}")
    if not outcome.complete:
        sys.exit(1)


def _analyse(farm_file, window, alpha, min_effect):
    from pi2cli.farm.file import load_farm
    from pi2cli.farm.history import build_series, farm_runs
    from pi2cli.farm.regressions import assess_all

    farm = load_farm(farm_file)
    runs = farm_runs(farm.results_dir, farm.name)
    if not runs:
        raise Pi2Error(
            f"farm {farm.name!r} has no runs in {farm.results_dir} (run `pi2 farm run {farm_file}`)"
        )
    series = build_series(runs)
    verdicts = assess_all(series, window=window, alpha=alpha, min_effect=min_effect)
    return farm, runs, series, verdicts


def stats_options(func):
    func = click.option("--min-effect", type=click.FloatRange(0, 10), default=0.02, show_default=True,
                        help="Smallest slowdown worth a flag (0.02: 2%).")(func)  # fmt: skip
    func = click.option("--alpha", type=click.FloatRange(0, 1, min_open=True), default=0.05, show_default=True,
                        help="Significance level of the change-point test.")(func)  # fmt: skip
    return click.option("--window", type=click.IntRange(2), default=7, show_default=True,
                        help="Earlier nights compared with the newest.")(func)  # fmt: skip


@command.command(name="regressions")
@FARM_FILE
@stats_options
@click.option("--json", "as_json", is_flag=True, help="Every series' verdict as JSON.")
def regressions(farm_file, window, alpha, min_effect, as_json) -> None:
    """Flag series whose newest night is slower than earlier nights; exit 1 when any is flagged.

    Per series (device, model, engine, workload, budget), from every token's time: a change-point test
    over the nightly medians and a bootstrap interval of the ratio (docs/FARM.md).
    """
    _farm, _runs, _series, verdicts = _analyse(farm_file, window, alpha, min_effect)
    flagged = [v for v in verdicts if v.flagged]
    if as_json:
        click.echo(json.dumps({"series": [v.to_json() for v in verdicts]}, indent=1))
    else:
        for v in flagged:
            click.echo(f"REGRESSION {' · '.join(v.key)}: {(v.ratio - 1):+.1%} time per token since {v.change_night} "
                       f"(ratio {v.ratio:.3f}, 95% CI [{v.low:.3f}, {v.high:.3f}], p={v.p_value:.2g})")  # fmt: skip
        from pi2cli.farm.regressions import summary_line

        click.echo(summary_line(verdicts))
    if flagged:
        sys.exit(1)


@command.command(name="report")
@FARM_FILE
@click.option(
    "--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Directory for index.html."
)
@stats_options
def report(farm_file, out, window, alpha, min_effect) -> None:
    """Write a static HTML dashboard: summary, nightly trend per series, thermal record per device."""
    from pi2cli.farm.dashboard import write_dashboard
    from pi2cli.outputs import check_dir_writable

    check_dir_writable(out, "--out", " (nothing was written)", create=False)
    farm, runs, series, verdicts = _analyse(farm_file, window, alpha, min_effect)
    path = write_dashboard(out, farm.name, runs, series, verdicts,
                           {"window": window, "alpha": alpha, "min_effect": f"{min_effect:.0%}"})  # fmt: skip
    click.echo(str(path))


@command.command(name="schedule")
@FARM_FILE
@click.option("--at", "at", default="02:00", show_default=True, help="Time of day, HH:MM (local time).")
@click.option("--report-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the nightly dashboard goes (default: farm-report beside the farm file).")  # fmt: skip
@click.option("--kind", type=click.Choice(["auto", "systemd", "cron"]), default="auto", show_default=True)
@click.option(
    "--install", is_flag=True, help="Install it (systemd user timer or crontab), not just print it."
)
@click.option(
    "--uninstall", is_flag=True, help="Remove the timer or crontab entry --install wrote for FARM_FILE."
)
def schedule(farm_file, at, report_dir, kind, install, uninstall) -> None:
    """Print (or --install / --uninstall) a systemd timer or crontab line that runs the farm every night.

    Only pi2's own entry is touched: the line after a marker line naming FARM_FILE (cron) or units whose
    first line is that marker (systemd); every other crontab line is kept byte for byte."""
    from pi2cli.farm import schedule as sch
    from pi2cli.farm.file import load_farm

    if install and uninstall:
        raise Pi2Error("--install and --uninstall: choose one")
    if uninstall:
        kind = ("systemd" if sch.has_systemd_user() else "cron") if kind == "auto" else kind
        click.echo(sch.uninstall(farm_file.resolve(), kind))
        return
    load_farm(farm_file)  # a broken file is refused now, not at 2 am
    try:
        hour, minute = (int(x) for x in at.split(":"))
        if not (0 <= hour < 24 and 0 <= minute < 60):
            raise ValueError
    except ValueError:
        raise Pi2Error(f"--at {at!r}: use HH:MM, e.g. 02:30") from None
    farm_file = farm_file.resolve()
    report_dir = (report_dir or farm_file.parent / "farm-report").resolve()
    if kind == "auto":
        kind = "systemd" if sch.has_systemd_user() else "cron"
    if install:
        click.echo(sch.install(farm_file, report_dir, hour, minute, kind))
    elif kind == "systemd":
        for name, text in sch.systemd_units(farm_file, report_dir, hour, minute).items():
            click.echo(f"# ~/.config/systemd/user/{name}\n{text}")
        click.echo(
            f"# then: systemctl --user daemon-reload && systemctl --user enable --now {sch.UNIT}.timer"
        )
    else:
        click.echo(sch.crontab_line(farm_file, report_dir, hour, minute))
