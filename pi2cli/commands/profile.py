"""`pi2 profile`: the click front of pi2cli.plan.profile."""

from __future__ import annotations

import json
from pathlib import Path

import click


def print_profile(console, profile: dict, out: Path | None) -> None:
    from rich.table import Table

    t = profile["target"]
    cores = profile["cores"]
    clusters = ", ".join(f"{len(c['cpus'])}x {c['max_mhz']} MHz"
                         + (f" capacity {c['capacity']}" if c.get("capacity") else "")
                         + f" (cpu {','.join(map(str, c['cpus']))})"
                         for c in cores["clusters"]) or "no cpufreq information"  # fmt: skip
    mem = profile["memory"]["total_bytes"]
    console.print(f"[bold]{t['name']}[/bold] ({t['kind']}, {t['arch']}{', emulated' if t.get('emulated') else ''}): "
                  f"{cores['count']} cores ({clusters}), "
                  f"{f'{mem / 2**30:.1f} GiB memory' if mem else 'memory unknown'}", highlight=False)  # fmt: skip
    for m in profile["membw"]:
        console.print(f"memory read bandwidth, {m['threads']} thread{'s' if m['threads'] > 1 else ''}: "
                      f"{m['gb_per_s']:.1f} GB/s", highlight=False)  # fmt: skip
    s = profile["storage"]
    how = "O_DIRECT" if s["o_direct"] else "buffered: the page cache may serve them"
    console.print(f"random reads of {s['file']} ({s['method']}, {how}):", highlight=False)
    table = Table(header_style="bold")
    for col in ("block", "queue depth", "IOPS", "MB/s", "p50 us", "p99 us"):
        table.add_column(col, justify="right")
    for p in [*s["curve"], s["qd1"]]:
        table.add_row(f"{p['block'] // 1024} KiB", str(p["qd"]), f"{p['iops']:.0f}", f"{p['mb_per_s']:.0f}",
                      f"{p['lat_p50_us']:.0f}", f"{p['lat_p99_us']:.0f}")  # fmt: skip
    console.print(table)
    d = profile.get("decode")
    if d:
        console.print(f"decode calibration ({d['threads']} threads, {d['budget_bytes'] / 2**30:.1f} GiB budget, "
                      f"{d['timed_steps']} steps): {d['tbt_s'] * 1e3:.1f} ms a step, {d['compute_s'] * 1e3:.1f} ms "
                      f"of it compute, {d['io_wait_s'] * 1e3:.1f} ms waiting on reads; "
                      f"hit rate {d['hit_rate'] or 0:.2f}, {d['reads_per_token']:.0f} reads a step", highlight=False)  # fmt: skip
    if out:
        console.print(f"wrote {out} (pi2 plan --profile {out})", highlight=False)


@click.command(name="profile")
@click.option("--device", "--target", "-d", "device", default="local", show_default=True,
              help="Where to measure: local, qemu-arm64 (emulated: correctness only) or an adb serial "
                   "(`pi2 devices`). On a device pi2-probe is pushed to WORKDIR/bin first when missing.")  # fmt: skip
@click.option("--file", "-f", "file", required=True,
              help="A large file ON THE TARGET to read at random for the storage curve; the model file is the "
                   "natural choice (on a phone: WORKDIR/models/NAME-HASH.pi2, as `pi2 push -m` prints it). Only read.")  # fmt: skip
@click.option("--out", "-o", type=click.Path(dir_okay=False, path_type=Path), default=Path("profile.json"),
              show_default=True, help="Where to write the profile JSON (written whole or not at all).")  # fmt: skip
@click.option("--seconds", type=click.FloatRange(0.05, 60), default=2.0, show_default=True,
              help="Seconds per storage point (each block size is measured in 2 interleaved rounds of half that; the best round counts).")  # fmt: skip
@click.option("--membw-mib", type=click.IntRange(1, 4096), default=256, show_default=True,
              help="Buffer per thread for the memory bandwidth probe; keep it well above the last-level cache.")  # fmt: skip
@click.option("--calibrate/--no-calibrate", default=None,
              help="Also run the engine on --file for its decode calibration: the predictors' named curve and "
                   "a decode step's compute time (docs/PLAN.md) [default: when --file is a .pi2].")  # fmt: skip
@click.option("--calibrate-budget", default=None, metavar="SIZE",
              help="Memory budget of the calibration run [default: half the target's memory, at most the model].")  # fmt: skip
@click.option(
    "--json", "as_json", is_flag=True, help="Print the profile JSON on stdout instead of the table."
)
def command(device, file, out, seconds, membw_mib, calibrate, calibrate_budget, as_json):
    """Measure a device's cores, memory bandwidth and storage throughput with pi2-probe.

    Runs on the target: memory read bandwidth with 1 thread and with every core; random reads over
    --file with the engine's own reader (io_uring or a pread pool, O_DIRECT when the file system allows)
    at 4, 8, 16 and 64 KiB with 32 reads in flight, and 4 KiB with one in flight (latency). Cores come
    with their max frequency (cpufreq), so `pi2 plan` can put compute on big cores and I/O on little
    ones. When --file is a model (.pi2) the engine then decodes 40 tokens of it under a budget: which
    neurons its predictors name by hotness rank, and how long a step computes besides waiting on reads
    (`pi2 plan` predicts with both for that model). Keep the machine otherwise idle: other load lowers every figure (each storage point keeps
    the better of two interleaved rounds, which absorbs a short burst, not a busy disk).

    \b
    Examples:
      pi2 profile --file models/tsm7b/model.pi2
      pi2 profile --device R5CT1234 --file /data/local/tmp/pi2/models/model.pi2 --out phone.json
      pi2 plan --model models/tsm7b/model.pi2 --memory-budget 2651M --profile profile.json
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pi2cli.errors import Pi2Error
    from pi2cli.plan.profile import profile_target, write_json_atomic
    from pi2cli.units import parse_size

    budget = parse_size(calibrate_budget, what="--calibrate-budget") if calibrate_budget else None
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]probing[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:  # fmt: skip
        task = progress.add_task("", total=None)

        def step(index: int, total: int, desc: str) -> None:
            progress.update(task, completed=index, total=total, description=desc)

        profile = profile_target(device, file, seconds, membw_mib, step=step,
                                 message=lambda text: progress.console.print(f"[dim]{text}[/dim]"),
                                 calibrate=calibrate, calibrate_budget=budget)  # fmt: skip
    failed = profile.pop("decode_error", None)
    write_json_atomic(out, profile)
    if failed:  # the probes' profile is kept; the calibration's failure is the command's
        raise Pi2Error(f"{failed} (wrote {out} without the decode calibration; --no-calibrate skips it)")
    if as_json:
        click.echo(json.dumps(profile, indent=1))
    else:
        print_profile(Console(), profile, out)
