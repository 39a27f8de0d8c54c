"""One device's share of a farm night, in its own process: `python -m pi2cli.farm.worker FILE DEVICE NIGHT`.

A process per device keeps devices apart: each has its own adb server address (a phone on another
machine's server), a device that hangs or vanishes stops only its own worker, and the parent only reads
events. Events are JSON lines on stdout ({"event": ..., "device": ...}); everything else goes to stderr,
which the parent keeps in a log file.

For each cell not finished yet: gate the device (pi2cli.farm.gating), sample the battery gauge, run
the cell through pi2cli.bench.run.run_bench (which pushes with hash skipping, so files are copied once per
device), and store the gate, conditions and energy in the run's `farm` block just before bench saves
it, so a run is written once, whole. A device that vanishes is waited for (reconnect_timeout_s) and the
cell retried once; a device that does not come back is reported lost with the cells it leaves undone,
and the worker exits 3.
"""

from __future__ import annotations

import json
import signal
import sys
import time

from pi2cli import signals
from pi2cli.errors import Pi2Error
from pi2cli.farm.file import Cell, Farm, cells_for, load_farm
from pi2cli.targets.base import TargetError

EXIT_LOST = 3


def emit(event: str, device: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, "device": device, **fields}) + "\n")
    sys.stdout.flush()


class EventReporter:
    """bench's Reporter, as events the parent shows."""

    def __init__(self, device: str):
        self.device = device

    def message(self, text: str) -> None:
        emit("message", self.device, text=text)

    def run_started(self, label: str, total_turns: int) -> None: ...

    def turn_started(self, label: str, conversation: str, turn: int, n_turns: int) -> None: ...

    def turn_done(self, label: str, decode_tps: float | None, ttft_ms: float | None) -> None:
        emit("turn", self.device, decode_tps=decode_tps)

    def run_done(self, label: str, status: str) -> None: ...


def connect(name: str, timeout_s: float, poll_s: float = 1.0):
    """The device, waiting up to timeout_s for it to answer; TargetError when it never does."""
    from pi2cli.targets import get_target

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            target = get_target(name)
            target.sh("true", timeout=10).check("a shell on the device")
            return target
        except TargetError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(poll_s)


def run_cell(farm: Farm, cell: Cell, target, night: str, attempt: int) -> dict:
    """One cell through bench; returns the saved run's status and figures."""
    from pi2cli.bench.run import BenchConfig, run_bench
    from pi2cli.farm.conditions import EnergySampler, conditions
    from pi2cli.farm.gating import wait_for_gate
    from pi2cli.farm.sensors import read_sensors

    gate = wait_for_gate(target, farm.gate, say=lambda t: emit("message", cell.device, text=t))
    facts = target.facts()
    energy = EnergySampler(target, farm.energy_interval_s).start()

    def annotate(run: dict) -> None:
        energy.stop()
        try:
            after = read_sensors(target)
        except (TargetError, OSError):
            after = None  # the device is gone: recorded as unknown
        tokens = sum(t["n_gen"] for t in run["turns"] if t["status"] == "ok")
        sensors = gate.pop("sensors")
        run["farm"] = {"name": farm.name, "night": night, "cell": cell.key, "device": cell.device,
                       "attempt": attempt, "gate": gate, "conditions": conditions(run, sensors, after, facts),
                       "energy": energy.block(tokens)}  # fmt: skip

    cfg = BenchConfig(model=cell.model, engines=[cell.engine], workloads=[cell.workload],
                      limit=farm.conversations, seed=farm.seed or None, budgets=[cell.budget], device=cell.device,
                      repeat=farm.repetitions, threads=farm.threads, n_gen=farm.n_gen,
                      results_dir=str(farm.results_dir), cool_below=0, tags=["farm", f"night:{night}"],
                      annotate=annotate)  # fmt: skip
    try:
        (outcome,) = run_bench(cfg, EventReporter(cell.device))
    finally:
        energy.stop()
    row = outcome.row()
    return {"status": row["status"], "error": row["error"], "decode_tps": row["decode_tps"],
            "run_id": outcome.run["run_id"]}  # fmt: skip


def device_answers(name: str) -> bool:
    try:
        connect(name, 0)
        return True
    except TargetError:
        return False


def work(farm: Farm, device_name: str, night: str, skip: set[str]) -> int:
    device = next(d for d in farm.devices if d.name == device_name)
    every = cells_for(farm, device)
    cells = [c for c in every if c.key not in skip]
    emit("plan", device_name, total=len(every), done=len(every) - len(cells))
    try:
        target = connect(device_name, farm.reconnect_timeout_s)
    except TargetError as exc:
        emit("lost", device_name, error=str(exc), undone=[c.key for c in cells])
        return EXIT_LOST
    failed = 0
    for i, cell in enumerate(cells):
        emit("cell_started", device_name, cell=cell.key, engine=cell.engine, workload=cell.workload)
        for attempt in (1, 2):
            try:
                result = run_cell(farm, cell, target, night, attempt)
                lost = result["status"] == "device_vanished"
            except KeyboardInterrupt as stop:  # with an outcome: bench stopped the engine, stored the run
                if saved := getattr(stop, "outcome", None):
                    emit("cell_done", device_name, cell=cell.key, status="aborted", run_id=saved.run["run_id"],
                         error=f"aborted: {signals.signal_name(stop)}")  # fmt: skip
                raise
            except (Pi2Error, TargetError) as exc:
                message = str(exc)
                lost = not device_answers(device_name)
                result = {"status": "device_vanished" if lost else "error", "error": message}
            if not lost:
                break
            emit("message", device_name, text=f"lost contact ({result['error']}): waiting up to "
                                              f"{farm.reconnect_timeout_s:g} s for it to come back")  # fmt: skip
            try:
                target = connect(device_name, farm.reconnect_timeout_s)
            except TargetError as exc:
                emit("lost", device_name, error=str(exc), undone=[c.key for c in cells[i:]])
                return EXIT_LOST
        failed += result["status"] != "ok"
        emit("cell_done", device_name, cell=cell.key, **result)
    emit("finished", device_name, failed=failed)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    farm_file, device_name, night, skip_file = args
    farm = load_farm(farm_file)
    with open(skip_file) as f:
        skip = set(json.load(f))
    # The parent owns the stop: Ctrl-C in its terminal reaches this process too, and a second unwinding
    # (the parent's SIGTERM) in the middle of the first would cut short the storing of the aborted run.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signals.install()  # SIGTERM / SIGHUP (the parent's stop, `systemctl stop`) unwind as Ctrl-C does
    try:
        return work(farm, device_name, night, skip)
    except KeyboardInterrupt as stop:
        emit("stopped", device_name, signal=signals.signal_name(stop))
        return signals.exit_code(stop)
    except Pi2Error as exc:
        emit("lost", device_name, error=str(exc), undone=[])
        return 1


if __name__ == "__main__":
    sys.exit(main())
