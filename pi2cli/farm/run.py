"""`pi2 farm run`: one night of the matrix on every device, devices in parallel.

Order: check the file and the results directory; decide the night and which cells are finished
(--resume); build each engine once per build target the devices need (here, before any worker
starts, so no two workers build the same thing); then start one worker process per device
(pi2cli.farm.worker) and show their events: a rich progress bar per device on a terminal, plain lines
otherwise. A device that is lost stops only its own worker; the night's summary says which cells it
left undone, and `pi2 farm run FILE --resume` does them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.farm.file import Device, Farm, load_farm
from pi2cli.farm.history import farm_runs, finished_cells, nights_of

PI2_ENGINES = ("pi2", "llmflash")  # both run pi2-engine


@dataclass
class DeviceOutcome:
    name: str
    total: int = 0
    done_before: int = 0
    ok: int = 0
    failed: int = 0
    lost: bool = False
    error: str | None = None
    undone: list[str] = field(default_factory=list)
    exit_code: int | None = None
    log: Path | None = None


@dataclass
class FarmOutcome:
    night: str
    devices: dict[str, DeviceOutcome]

    @property
    def complete(self) -> bool:
        return all(not d.lost and d.failed == 0 and d.exit_code == 0 for d in self.devices.values())


def device_env(device: Device) -> dict[str, str]:
    """The worker's environment: ours, the device's own variables, and its adb server's address."""
    env = {**os.environ, **device.env}
    if device.adb_server:
        host, port = device.adb_server.rsplit(":", 1)
        env.update(ANDROID_ADB_SERVER_HOST=host, ANDROID_ADB_SERVER_PORT=port)
    return env


@contextlib.contextmanager
def environment(env: dict[str, str]):
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def choose_night(farm: Farm, night: str | None, resume: bool, runs: list[dict]) -> str:
    """The night to run: --night, else (with --resume) the newest one recorded, else today (UTC)."""
    if night is not None:
        try:
            dt.date.fromisoformat(night)
        except ValueError:
            raise Pi2Error(f"--night {night!r}: use a date such as 2026-11-24") from None
        return night
    if resume:
        recorded = nights_of(runs)
        if not recorded:
            raise Pi2Error(f"--resume: farm {farm.name!r} has no night in {farm.results_dir} to resume")
        return recorded[-1]
    return dt.datetime.now(dt.UTC).date().isoformat()


def build_all(farm: Farm, say: Callable[[str], None]) -> None:
    """Each engine build a device needs, once per build target, before the workers start."""
    from pi2cli.builds.engine_build import ensure_engine_built
    from pi2cli.engines.llamacpp.driver import build_target_for
    from pi2cli.targets import get_target
    from pi2cli.targets.base import TargetError

    pi2_targets, llama_targets = set(), set()
    for device in farm.devices:
        engines = [e for e in farm.engines if device.engines is None or e in device.engines]
        if device.kind == "local":
            arch_target = None
        else:
            try:
                with environment(device_env(device)):
                    target = get_target(device.name)
            except TargetError as exc:
                say(f"{device.name}: not reachable now ({exc}); its worker will wait for it")
                continue
            arch_target = target
        if any(e in PI2_ENGINES for e in engines):
            if device.kind == "local":
                pi2_targets.add("host")
            elif device.kind == "qemu":
                pi2_targets.add("linux-arm64")
            else:
                pi2_targets.add("android-arm64" if arch_target.arch == "arm64" else "host")
        if "llama.cpp" in engines and arch_target is not None:
            with contextlib.suppress(Pi2Error):
                which = build_target_for(arch_target)
                if which != "host":
                    llama_targets.add(which)
    from pi2cli.paths import host_build_dir

    if "host" in pi2_targets and (host_build_dir() / "pi2-engine").is_file():
        pi2_targets.discard("host")  # `make engine` keeps this one current (bench runs it as is)
    for which in sorted(pi2_targets):
        say(f"pi2-engine for {which}: checking the build (a full build takes about 1-3 minutes on 2 cores; "
            f"log: build/{which}/build.log)")  # fmt: skip
        ensure_engine_built(which, show=sys.stderr.isatty())
    for which in sorted(llama_targets):
        from pi2cli.builds.baselines.llamacpp_build import ensure_built

        say(f"llama.cpp for {which}: checking the build (a full build takes about 6-10 minutes on 2 cores; "
            f"cached in ~/.cache/pi2)")  # fmt: skip
        ensure_built(which, show_progress=sys.stderr.isatty())


def run_farm(path: str | Path, *, resume: bool = False, night: str | None = None, build: bool = True,
             say: Callable[[str], None] = lambda _t: None,
             on_event: Callable[[dict], None] | None = None) -> FarmOutcome:  # fmt: skip
    """One night of the farm; on_event sees every worker event (the display, and tests)."""
    from pi2cli.results import store

    farm = load_farm(path)
    store.check_writable(farm.results_dir)
    runs = farm_runs(farm.results_dir, farm.name)
    night = choose_night(farm, night, resume, runs)
    done = finished_cells(runs, night)
    if done and not resume:
        raise Pi2Error(f"night {night} of farm {farm.name!r} already has {len(done)} finished cell(s) in "
                       f"{farm.results_dir}: `pi2 farm run {path} --resume` completes it (nothing was run)")  # fmt: skip
    if build:
        build_all(farm, say)
    logs = farm.results_dir / "farm-logs" / farm.name / night
    logs.mkdir(parents=True, exist_ok=True)
    outcome = FarmOutcome(night, {d.name: DeviceOutcome(d.name, log=logs / f"{safe(d.name)}.log")
                                  for d in farm.devices})  # fmt: skip
    lock = threading.Lock()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(sorted(done), f)
        skip_file = f.name
    try:
        procs = []
        for device in farm.devices:
            log = open(outcome.devices[device.name].log, "ab")  # noqa: SIM115 - closed below
            proc = subprocess.Popen([sys.executable, "-m", "pi2cli.farm.worker", str(path), device.name, night,
                                     skip_file], stdout=subprocess.PIPE, stderr=log, env=device_env(device))  # fmt: skip
            procs.append((device, proc, log))
        threads = [threading.Thread(target=_read_events, args=(p, outcome.devices[d.name], lock, on_event),
                                    daemon=True) for d, p, _ in procs]  # fmt: skip
        for t in threads:
            t.start()
        for (_device, proc, log), t in zip(procs, threads, strict=True):
            t.join()
            proc.wait()
            log.close()
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP (pi2cli.signals): the workers store theirs first
        stop_workers([p for _d, p, _log in procs])
        raise
    finally:
        os.unlink(skip_file)
    for device, proc, _log in procs:
        d = outcome.devices[device.name]
        d.exit_code = proc.returncode
        if proc.returncode not in (0, 1) and not d.lost:
            d.lost, d.error = True, f"worker exited {proc.returncode} (log: {d.log})"
    return outcome


STOP_GRACE_S = 10.0  # how long a stopped worker has to stop its engine and store its run as aborted


def stop_workers(procs: list[subprocess.Popen], grace_s: float = STOP_GRACE_S) -> None:
    """Ask every worker still running to stop (SIGTERM: it stops its engine and stores the cell in
    progress as aborted, as bench does), then kill those that have not within grace_s. A `kill -TERM`
    reaches the parent alone: without this the workers, and the engines they run, outlived it."""
    import signal
    import time

    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_events(proc, device: DeviceOutcome, lock: threading.Lock, on_event) -> None:
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind = event.get("event")
        if kind == "plan":
            device.total, device.done_before = event["total"], event["done"]
        elif kind == "cell_done":
            if event["status"] == "ok":
                device.ok += 1
            else:
                device.failed += 1
        elif kind == "lost":
            device.lost, device.error, device.undone = True, event["error"], event.get("undone", [])
        if on_event:
            with lock:
                on_event(event)


def safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
