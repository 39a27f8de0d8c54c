"""One bench run's record, the same in every mode (chat, llama-bench, pp-tg): the run dict, the memory
budget's cgroup record, the memory curve, the failure path and the save.

    rec = RunRecorder(new_run(...), target=..., budget_bytes=..., label=..., engine=..., workload=...,
                      reporter=..., results_dir=...)
    try:
        with rec.budget(local_bytes, evict=[model]) as budget:   # the engine's cgroup, recorded on the way out
            proc = budget.popen(...)
            rec.on_failure(kill_it)                              # how a failure stops the engine now
            stop = rec.follow(proc.pid)                          # memory samples while it runs
            ... turns into rec.run ...
            stop(); rec.on_failure(None)
    except RUN_STOPS as exc:
        return rec.fail(exc)                                     # saved as failed / aborted / timeout / ...
    rec.finish()                                                 # samples, budget peak, memory block
    return rec.save()

A failed run is saved with what it measured, its status from the exception (classify_failure) and,
when the budget ended it, the budget as its reason (killed_at_budget); Ctrl-C and a vanished device
end the whole bench (BenchInterrupted, DeviceVanished, both carrying the saved outcome).

The memory curve comes from MemorySampler threads that read the engine's memory through the target; a
run of several processes (a pp-tg cell) follows each in turn on one clock, so its curves line up.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pi2cli.bench.config import Reporter
from pi2cli.bench.limit import RunTimedOut
from pi2cli.errors import Pi2Error
from pi2cli.results import schema as S
from pi2cli.signals import signal_name
from pi2cli.targets.base import TargetError

# What ends a run and is saved with it: Ctrl-C / SIGTERM / a --run-timeout (KeyboardInterrupt), the engine
# failing (Pi2Error, OSError), the device gone (TargetError). Anything else is a bug and stays a traceback.
RUN_STOPS = (KeyboardInterrupt, Pi2Error, TargetError, OSError)


# ---------------------------------------------------------------------------------------------- outcome
@dataclass
class RunOutcome:
    engine: str
    workload: str
    budget_bytes: int | None
    run: dict
    path: Path

    def row(self) -> dict:
        """What --json prints per run."""
        s = self.run["summary"]
        counters = self.run["counters"]
        decode = S.decode_rate(self.run)

        def ms(ns):
            return None if ns is None else round(ns / 1e6, 3)

        return {
            "engine": self.engine,
            "policy": self.run["engine"].get("policy"),
            "workload": self.workload,
            "budget_bytes": self.budget_bytes,
            "status": self.run["status"],
            "error": self.run["error"],
            "run_id": self.run["run_id"],
            "result_file": str(self.path),
            "n_turns": s["n_turns"],
            "ttft_ms": ms(s["ttft_avg_ns"]),
            "tbt_p50_ms": ms(s["tbt_p50_ns"]),
            "tbt_p90_ms": ms(s["tbt_p90_ns"]),
            "tbt_p99_ms": ms(s["tbt_p99_ns"]),
            # THE decode statistic (schema.decode_rate), as every table, list and report shows it
            "decode_tps": None if decode is None else round(decode, 3),
            "prefill_tps": None if s["prefill_avg_ts"] is None else round(s["prefill_avg_ts"], 3),
            "peak_rss_bytes": s["peak_rss_bytes"],
            "peak_rss_source": s.get("peak_rss_source"),
            "hit_rate": counters.get("hit_rate"),
            "io_share": counters.get("io_share"),
            "storage_bytes_read": counters.get("storage_bytes_read"),
        }


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP: the current run was saved as aborted (its outcome is attached)."""

    def __init__(self, outcome: RunOutcome, signal_name: str = "SIGINT"):
        super().__init__("interrupted")
        self.outcome = outcome
        self.signal_name = signal_name


class DeviceVanished(Pi2Error):
    def __init__(self, outcome: RunOutcome, error: str):
        super().__init__(f"{error} (the run is saved as device_vanished: {outcome.path})")
        self.outcome = outcome


# ----------------------------------------------------------------------------------------- a new run
def file_sha256(path: Path) -> str:
    """sha256, remembered across runs by (path, size, mtime) as pi2 push does (GB models hash once)."""
    from pi2cli.hw.push import sha256_file

    return sha256_file(Path(path))


# llama.cpp's LLAMA_FTYPE values (GGUF general.file_type) for the quantizations pi2 runs and a few more
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
              17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}  # fmt: skip


def model_facts(model) -> dict:
    """quant, arch and whether the weights are synthetic, from the files' own metadata (`model`: a
    ModelFiles, its .pi2 and GGUF twin).

    Synthetic models say so in both forms (the .pi2's metadata JSON, the twin's `pi2.synthetic` key);
    either is enough, so a result can never present synthetic weights as a real model.
    """
    from pi2cli.models.gguf_meta import read_gguf_metadata
    from pi2cli.models.pi2file import Pi2File

    facts = {"quant": None, "arch": None, "synthetic": False}
    if model.gguf is not None:
        try:
            keys = {"general.file_type", "general.architecture", "pi2.synthetic"}
            meta = read_gguf_metadata(model.gguf, keys)
        except (Pi2Error, OSError, ValueError):
            meta = {}
        facts["quant"] = FILE_TYPES.get(meta.get("general.file_type"))
        facts["arch"] = meta.get("general.architecture")
        facts["synthetic"] = bool(meta.get("pi2.synthetic"))
    if model.pi2 is not None and model.pi2.exists():
        with contextlib.suppress(Pi2Error, OSError, ValueError):
            facts["synthetic"] |= bool(Pi2File(model.pi2, verify=False).metadata.get("synthetic"))
    return facts


def new_run(driver, target, facts: dict, model, model_file: Path, *, workload: dict, budget_bytes: int | None,
            settings: dict, measurement: str, tags: list[str]) -> dict:  # fmt: skip
    """A run with no turns yet and the blocks every mode fills alike: the engine (driver.engine_info),
    the model file it runs (hash, size, quant / arch / synthetic), the target's facts, the budget."""
    return S.new_run(
        engine=S.engine_info(**driver.engine_info(target)),
        model=S.model_info(model.name, path=str(model_file), sha256=file_sha256(model_file),
                           size_bytes=model_file.stat().st_size, **model_facts(model)),
        workload=workload,
        target=S.target_info(target.name, target.kind,
                             **{k: v for k, v in facts.items() if k not in ("name", "kind")}),
        memory=memory_block(target, budget_bytes, None),
        settings=settings,
        measurement=measurement,
        tags=tags,
    )  # fmt: skip


NOT_ENFORCED_ON_DEVICE = (
    "not enforced on adb devices (no cgroup control): pi2-engine sizes its neuron cache to the budget "
    "itself, llama.cpp and the page cache are held to nothing"
)


def memory_block(target, budget_bytes: int | None, budget_record: dict | None) -> dict:
    if budget_bytes is None:
        return S.memory_info(None)
    if not target.on_this_machine:  # the same label for every engine: none is held by the OS there
        return S.memory_info(budget_bytes, enforced=False, how=NOT_ENFORCED_ON_DEVICE)
    rec = budget_record or {}
    return S.memory_info(budget_bytes, enforced=bool(rec.get("enforced")), how=rec.get("how"))


# ------------------------------------------------------------------------------------------- sampling
class MemorySampler:
    """Reads the engine process's memory through the target every `interval_s` in a thread: the memory
    curve (memory_samples). Never the peak: a poll misses whatever happened between two reads.

    wrapper=True: `pid` is pi2-rusage (pi2cli.hw.rusage), and the process sampled is the command it
    started. t0: the monotonic time the samples count from (None: now)."""

    def __init__(self, target, pid: int | None, interval_s: float = 0.5, wrapper: bool = False,
                 t0: float | None = None):  # fmt: skip
        self.target, self.interval_s = target, interval_s
        self.pid, self.wrapper_pid = (None, pid) if wrapper else (pid, None)
        self.samples: list[tuple[float, int, int | None]] = []  # (t_s, rss, pss)
        self.error: str | None = None
        self._stop = threading.Event()
        self.t0 = time.monotonic() if t0 is None else t0
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> MemorySampler:
        if self.pid or self.wrapper_pid:
            self._thread.start()
        return self

    def sample_once(self) -> None:
        usage = self.target.read_memory(self.pid)
        if usage is not None:
            self.samples.append((round(time.monotonic() - self.t0, 3), usage.rss_bytes, usage.pss_bytes))

    def _loop(self) -> None:
        from pi2cli.hw.rusage import engine_pid

        while self.pid is None and not self._stop.is_set():  # the wrapper has not forked the engine yet
            self.pid = engine_pid(self.wrapper_pid)
            if self.pid is None:
                self._stop.wait(0.002)
        while not self._stop.is_set():
            try:
                self.sample_once()
            except (TargetError, OSError) as exc:
                self.error = str(exc)
                return
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)


# ------------------------------------------------------------------------------------------- failures
def classify_failure(exc: BaseException) -> tuple[str, str]:
    """(status, one-line error) for a run that stopped."""
    if isinstance(exc, RunTimedOut):  # before KeyboardInterrupt, which it is (it unwinds as Ctrl-C does)
        return "timeout", exc.reason
    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C, or SIGTERM / SIGHUP (pi2cli.signals)
        name = signal_name(exc)
        return (
            "aborted",
            f"aborted: {name}{' (Ctrl-C)' if name == 'SIGINT' else ''}; the engine process was stopped",
        )
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, TargetError) and re.search(r"lost the device|does not answer|connect", text):
        return "device_vanished", text
    return "failed", text


def killed_at_budget(budget_bytes: int | None, budget_record: dict | None) -> str:
    """A prefix for a failed run's reason when its enforced budget ended it (the cgroup's OOM killer, or
    the limit reached), so the reason is the budget, not the engine's last log line; else ""."""
    rec = budget_record or {}
    if not budget_bytes or not rec.get("enforced"):
        return ""
    from pi2cli.units import format_size

    size = format_size(budget_bytes)
    if rec.get("oom_kills"):
        return f"killed by the out-of-memory killer at the {size} budget: "
    if rec.get("limit_hits"):
        return f"stopped at the {size} budget, its limit reached {rec['limit_hits']} times: "
    return ""


# ------------------------------------------------------------------------------------------- the run
class RunRecorder:
    """One run from its first turn to its file (see the module's docstring for the shape of its use)."""

    def __init__(self, run: dict, *, target, budget_bytes: int | None, label: str, engine: str, workload: str,
                 reporter: Reporter, results_dir: str | None,
                 annotate: Callable[[dict], None] | None = None):  # fmt: skip
        self.run = run
        self.target, self.budget_bytes = target, budget_bytes
        self.label, self.engine, self.workload = label, engine, workload
        self.reporter, self.results_dir, self._annotate = reporter, results_dir, annotate
        # the cgroup's record (pi2cli.hw.cgroup.Budget.record), or why no cgroup binds the engine
        self.budget_record: dict | None = None
        self._held = None  # the Budget the engine runs in, while it is held to one
        self._stop_engine: Callable[[], None] | None = None
        self._samplers: list[MemorySampler] = []
        self._t0: float | None = None  # the memory curve's zero: its first process's start
        self._annotated = False

    # ----------------------------------------------------------------------------------- while it runs
    @contextlib.contextmanager
    def budget(self, limit_bytes: int | None, evict: list | tuple = ()) -> Iterator:
        """The engine's memory cgroup (pi2cli.hw.cgroup.Budget; limit_bytes None: none, and the record
        stays whatever was set), its record taken when the body ends, before the cgroup goes."""
        from pi2cli.hw.cgroup import Budget

        with Budget(limit_bytes, evict=evict) as budget:
            self._held = budget if limit_bytes else None
            yield budget
            if limit_bytes:
                self.budget_record = budget.record()
            self._held = None  # recorded: a failure after this keeps that record

    def on_failure(self, stop: Callable[[], None] | None) -> None:
        """How a failure stops the engine now (it must not raise); None once the engine has stopped."""
        self._stop_engine = stop

    def follow(self, pid: int | None, wrapper: bool = False) -> Callable[[], None]:
        """Sample this process's memory until the returned stop() (or the run's end); every process
        of the run on one clock, from the first one's start."""
        sampler = MemorySampler(self.target, pid, wrapper=wrapper, t0=self._t0)
        self._t0 = sampler.t0
        self._samplers.append(sampler.start())
        return sampler.stop

    # ------------------------------------------------------------------------------------ how it ends
    def fail(self, exc: BaseException) -> RunOutcome:
        """The run stopped on exc: the engine stopped, the run marked failed (or aborted, device_vanished,
        timeout) and saved with what it measured. Ctrl-C and a vanished device end the whole bench
        (BenchInterrupted, DeviceVanished); any other failure, a timeout too, returns the outcome so the
        next run goes ahead."""
        if self._stop_engine is not None:
            self._stop_engine()
            self._stop_engine = None
        if self._held is not None:  # a run that failed under its cgroup was still held to it
            self.budget_record = self._held.record()
        status, error = classify_failure(exc)
        if status == "failed":
            error = killed_at_budget(self.budget_bytes, self.budget_record) + error
        S.mark_failed(self.run, status, error)
        self._take_samples()
        self.run["memory"] = memory_block(self.target, self.budget_bytes, self.budget_record)
        outcome = self.save()
        if isinstance(exc, KeyboardInterrupt) and status != "timeout":
            raise BenchInterrupted(outcome, signal_name(exc)) from None
        if status == "device_vanished":
            raise DeviceVanished(outcome, error) from None
        return outcome

    def finish(self) -> None:
        """The engine ran to its end: the cgroup's peak, the memory curve and the memory block."""
        if self.budget_record and self.budget_record.get("peak_bytes") is not None:
            S.set_counters(self.run, budget_peak_bytes=self.budget_record["peak_bytes"])
        self._take_samples()
        self.run["memory"] = memory_block(self.target, self.budget_bytes, self.budget_record)

    def annotate(self) -> None:
        """The caller's last word on the run (pi2 farm: energy and conditions), once, before the save
        and before anything else runs (--quality)."""
        if self._annotate and not self._annotated:
            self._annotate(self.run)
        self._annotated = True

    def save(self) -> RunOutcome:
        """Annotated, stored (pi2cli.results.store.save_run: summarised, validated, indexed), reported."""
        from pi2cli.results import store

        self.annotate()
        path = store.save_run(self.run, self.results_dir)
        self.reporter.run_done(self.label, self.run["status"])
        return RunOutcome(self.engine, self.workload, self.budget_bytes, self.run, path)

    def _take_samples(self) -> None:
        for sampler in self._samplers:
            sampler.stop()
            for t_s, rss, pss in sampler.samples:
                S.add_memory_sample(self.run, t_s, rss, pss)
        pss = [p for s in self._samplers for _, _, p in s.samples if p is not None]
        if pss:  # no kernel peak of PSS exists: polled
            S.set_counters(self.run, peak_pss_bytes=max(pss))
        self._samplers = []
