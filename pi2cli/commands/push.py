"""`pi2 push`: copy engine, models, plans and workloads to a device, skipping what is already there."""

import contextlib
import json
from pathlib import Path

import click


@click.command(name="push")
@click.option("--device", "-d", default="local", show_default=True,
              help="Target: local, qemu-arm64 or an adb serial (`pi2 devices` lists them; HOST:PORT is "
                   "adb-connected on first use).")  # fmt: skip
@click.option("--model", "-m", "models", multiple=True,
              help="Model file to push (repeatable), or a registry name found in the local store; lands in "
                   "WORKDIR/models/NAME-HASH.EXT (its name and the first 12 hex digits of its sha256, so models "
                   "never replace each other on the device).")  # fmt: skip
@click.option("--plan", "plans", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Plan JSON to push (repeatable); lands in WORKDIR/plans/.")  # fmt: skip
@click.option("--workdir", default=None,
              help="Working directory on the device [default: /data/local/tmp/pi2 on phones, "
                   "~/.cache/pi2/targets/NAME here].")  # fmt: skip
@click.option("--no-engine", is_flag=True, help="Do not push engine binaries.")
@click.option("--no-workloads", is_flag=True, help="Do not push workloads/*.jsonl.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON report (per file: copied or skipped).")
def command(device, models, plans, workdir, no_engine, no_workloads, as_json):
    """Copy engine binaries, models, plans and workloads to a device's working directory.

    Engine binaries are the pi2-* programs of the build for the device's architecture (build/host,
    or build/android-arm64 / build/linux-arm64 for arm64). Files whose content is already there
    (sha256 on the device) are skipped; copies go to NAME.partial, are verified by sha256 on the
    device and only then renamed, so an interrupted push never leaves a file that looks complete.
    Free space is checked before copying.

    \b
    Examples:
      pi2 push --device R5CT1234 -m models/llama-7b.pi2
      pi2 push --device 127.0.0.1:5555 --no-engine -m smollm2.gguf --json
      pi2 push --device qemu-arm64
    """
    from pi2cli.errors import Pi2Error
    from pi2cli.hw.push import collect_items, default_workloads, engine_files, push_files
    from pi2cli.targets import TargetError, get_target

    try:
        target = get_target(device, workdir=workdir)
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    workdir = target.workdir
    engine = [] if no_engine else engine_files(target)
    workloads = [] if no_workloads else default_workloads()
    from pi2cli.models.store import model_arg

    models = [Path(model_arg(m)) for m in models]
    items = collect_items(target, workdir, engine=engine, models=list(models), plans=list(plans),
                          workloads=workloads)  # fmt: skip
    if not items:
        raise Pi2Error("nothing to push (give --model/--plan, or drop --no-engine)")

    progress_for = None
    progress = None
    if not as_json:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,  # fmt: skip
        )

        progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                            TransferSpeedColumn(), TimeRemainingColumn(), transient=False)  # fmt: skip

        @contextlib.contextmanager
        def progress_for(item, stage):
            if stage == "copy":
                task = progress.add_task(item.local.name, total=item.size)
                yield lambda done: progress.update(task, completed=done)
                progress.update(task, completed=item.size)
                return
            # Hashing: a bar only when the file is really read (not cached), removed when done.
            tasks = []

            def hashed(done):
                if not tasks:
                    tasks.append(progress.add_task(f"sha256 {item.local.name}", total=item.size))
                progress.update(tasks[0], completed=done)

            yield hashed
            if tasks:
                progress.remove_task(tasks[0])

    with progress or contextlib.nullcontext():
        report = push_files(target, items, workdir, progress_for=progress_for)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=1))
        return
    data = report.to_json()
    for f in report.files:  # where each model is on the device: its name there carries its hash
        if f.kind == "model":
            click.echo(f"{f.local} -> {f.remote} ({f.action})")
    click.echo(f"{target.name}:{workdir}: {data['copied']} copied ({data['copied_bytes']} bytes), "
               f"{data['skipped']} unchanged")  # fmt: skip
