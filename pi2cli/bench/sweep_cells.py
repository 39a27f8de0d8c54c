"""The cells of `pi2 bench --mode pp-tg` (pi2cli/bench/sweep.py): one engine's repetitions of one
(pp P, tg N, threads, budget) cell, as turns of its run.

pi2 / llmflash: `pi2-engine generate --tokens` (exactly P ids) per repetition, its events stamped on the
target's monotonic clock, here (inside the budget's cgroup) or on an adb device (events read back and
removed). llama.cpp: llama-bench's pp test and its tg test at depth P under pi2-rusage, here or pushed
to an adb device. The run's recorder (pi2cli.bench.recorder) follows each process's memory on one clock
and keeps the last process's cgroup record.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pi2cli.bench.recorder import RunRecorder
from pi2cli.bench.sweep_config import Cell, SweepConfig, prompt_ids
from pi2cli.errors import Pi2Error
from pi2cli.results import schema as S
from pi2cli.targets.base import TargetError


def timed_out(what: str, timeout_s: float) -> Pi2Error:
    return Pi2Error(f"{what} did not finish within {timeout_s:.0f} s (stopped)")


def communicate_followed(proc: subprocess.Popen, stop, what: str, timeout_s: float) -> tuple[str, str]:
    """proc.communicate() for a process the recorder follows (`stop` ends the following): on a timeout
    or an interrupt the whole process group is killed and reaped, so no engine outlives its cell."""
    try:
        return proc.communicate(timeout=timeout_s)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, 9)
        proc.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise timed_out(what, timeout_s) from None
        raise
    finally:
        stop()


# -------------------------------------------------------------------------------------------- pi2 runs
@dataclass
class GenerateSample:
    """One `pi2-engine generate` process: its prompt/gen counts, TTFT, TBT samples and summary."""

    n_prompt: int
    n_gen: int
    ttft_ns: int
    samples_ns: list[int]
    summary: dict
    start: dict


def parse_generate_events(text: str, want_prompt: int) -> GenerateSample:
    """The engine's events of one generate run -> a GenerateSample; the prompt must be exactly
    want_prompt tokens (the engine's start event says how many it prefilled)."""
    import json

    start, turn, summary, times = {}, {}, {}, []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            raise Pi2Error(f"pi2-engine wrote a malformed event line: {line[:120]!r}") from None
        kind = ev.get("event")
        if kind == "token":
            times.append(float(ev["t"]))
        elif kind == "start":
            start = ev
        elif kind == "turn":
            turn = ev
        elif kind == "summary":
            summary = ev
    if not turn or "ttft_s" not in turn:
        raise Pi2Error("pi2-engine generate wrote no turn event (did it stop early?)")
    if int(start.get("n_prompt", turn.get("n_prompt", -1))) != want_prompt:
        raise Pi2Error(
            f"pi2-engine prefilled {start.get('n_prompt')} prompt tokens, not the {want_prompt} asked for"
        )
    return GenerateSample(
        want_prompt, len(times), round(float(turn["ttft_s"]) * 1e9), S.tbt_from_times(times), summary, start
    )


def run_generate_once(target, prepared, cell: Cell, ids: list[str], budget_bytes, timeout_s: float,
                      rec: RunRecorder) -> GenerateSample:  # fmt: skip
    """One `pi2-engine generate` on the target (inside the budget's cgroup here; on a device the
    engine still gets --memory-budget) and its events."""
    from pi2cli.engines.pi2.args import engine_argv
    from pi2cli.hw.cgroup import Budget

    driver = prepared.driver
    binary = f"{prepared.binary_dir}/pi2-engine" if prepared.binary_dir else str(driver.local_binary(target))
    flags = dict(driver.engine_options(budget_bytes), threads=cell.threads)
    tokens = ",".join(ids)
    if target.on_this_machine:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="pi2-sweep-") as tmp:
            events = Path(tmp) / "events.jsonl"
            argv = target.command_prefix() + engine_argv(binary, "generate", prepared.model_remote, events=events,
                                                         n_predict=cell.n_gen, ignore_eos=True, **flags)  # fmt: skip
            argv[argv.index("--events") : argv.index("--events")] = ["--tokens", tokens]
            local_budget = budget_bytes if budget_bytes else None
            with Budget(local_budget, evict=[prepared.model_local] if local_budget else []) as budget:
                proc = budget.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    errors="replace", start_new_session=True)  # fmt: skip
                _, err = communicate_followed(proc, rec.follow(proc.pid), "pi2-engine generate", timeout_s)
                rec.budget_record = budget.record() if local_budget else None
            if proc.returncode != 0:
                raise Pi2Error(f"pi2-engine generate failed (code {proc.returncode}): "
                               f"{(err.strip().splitlines() or ['no output'])[-1]}")  # fmt: skip
            return parse_generate_events(events.read_text(), cell.n_prompt)
    runs = f"{target.workdir.rstrip('/')}/runs"
    target.mkdir(runs)
    events = f"{runs}/sweep-{os.getpid()}-{int(time.time() * 1000)}.events.jsonl"
    argv = engine_argv(binary, "generate", prepared.model_remote, events=events, n_predict=cell.n_gen,
                       ignore_eos=True, **flags)  # fmt: skip
    argv[argv.index("--events") : argv.index("--events")] = ["--tokens", tokens]
    err: list[bytes] = []
    proc = target.run(argv, on_output=lambda name, data: err.append(data) if name == "stderr" else None)
    stop = rec.follow(proc.pid)
    try:
        code = proc.wait(timeout_s)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            proc.kill()
        if isinstance(exc, TimeoutError):
            raise timed_out(f"pi2-engine generate on {target.name}", timeout_s) from None
        raise
    finally:
        stop()
    try:
        text = target.read_text(events) or ""
    finally:
        with contextlib.suppress(TargetError):
            target.sh(f"rm -f {shlex.quote(events)}", timeout=10)
    if code != 0:
        tail = b"".join(err).decode(errors="replace").strip().splitlines()
        raise Pi2Error(
            f"pi2-engine generate failed on {target.name} (code {code}): {(tail or ['no output'])[-1]}"
        )
    return parse_generate_events(text, cell.n_prompt)


def pi2_cell(run: dict, target, prepared, cell: Cell, cfg: SweepConfig, n_vocab: int, reporter, label: str,
             rec: RunRecorder) -> None:  # fmt: skip
    """Warm-up and measured repetitions of one pi2/llmflash cell, as turns of `run`."""
    ids = [str(i) for i in prompt_ids(n_vocab, cell.n_prompt)]
    peak = 0
    summary: dict = {}
    for k in range(cfg.warmup + cfg.repeat):
        warm = k < cfg.warmup
        reporter.turn_started(label, "warm-up" if warm else f"rep {k - cfg.warmup + 1}", k + 1,
                              cfg.warmup + cfg.repeat)  # fmt: skip
        g = run_generate_once(target, prepared, cell, ids, cell.budget, cfg.timeout_s, rec)
        turn = S.add_turn(run, n_prompt=g.n_prompt, n_gen=g.n_gen, ttft_ns=g.ttft_ns, samples_ns=g.samples_ns,
                          prompt_id=cell.workload, rep=0 if warm else k - cfg.warmup, warmup=warm,
                          peak_rss_bytes=g.summary.get("peak_rss_bytes"),
                          extra={"threads": g.start.get("threads"), "load_s": g.start.get("load_s")})  # fmt: skip
        peak = max(peak, int(g.summary.get("peak_rss_bytes") or 0))
        summary = g.summary
        reporter.turn_done(label, turn["decode_ts"], g.ttft_ns / 1e6)
    from pi2cli.engines.pi2.chat import summary_counters

    counters = {k: v for k, v in summary_counters(summary).items() if k not in ("peak_rss_bytes",)}
    S.set_counters(run, **counters)
    if peak:
        S.set_counters(run, peak_rss_bytes=peak, peak_rss_source=S.PEAK_RSS_ENGINE)


# -------------------------------------------------------------------------------------- llama.cpp runs
@dataclass
class LlamaBenchPlace:
    """Where llama-bench runs: here (bin_dir), or on a device (pushed: its bin directory and model there)."""

    bin_dir: Path
    remote_bin: str | None = None
    remote_model: str | None = None


def prepare_llama_bench(driver, target, gguf: Path, reporter) -> LlamaBenchPlace:
    """Here: the host build in place. On a device: llama-bench of the build for its architecture, this
    pi2 build's pi2-rusage (its peak memory) and the GGUF, pushed as every engine is (content hashes)."""
    from pi2cli.hw.push import collect_items, engine_files, push_files

    bin_dir = driver.bin_dir if target.native_here else driver.bin_dir_for(target)
    binary = bin_dir / "llama-bench"
    if not binary.is_file():
        raise Pi2Error(f"llama-bench not found in {bin_dir} (run `pi2 build --engine llama.cpp`)")
    if target.on_this_machine:
        return LlamaBenchPlace(bin_dir)
    rusage = [p for p in engine_files(target) if p.name == "pi2-rusage"]
    if not rusage:
        raise Pi2Error(
            f"no pi2-rusage in the pi2 build for {target.name}: rebuild it ({target.build_hint()})"
        )
    workdir = target.workdir.rstrip("/")
    items = collect_items(target, workdir, engine=[binary, *rusage], models=[gguf])
    reporter.message(f"pushing llama-bench, pi2-rusage, {gguf.name} to {target.name}")
    push_files(target, items, workdir)
    remote_model = next(i.remote for i in items if i.kind == "model")
    return LlamaBenchPlace(bin_dir, f"{workdir}/bin", remote_model)


def run_llama_bench_here(cmd: list[str], cell: Cell, gguf: Path, rec: RunRecorder, timeout_s: float):
    """llama-bench under pi2-rusage inside the budget's cgroup (model evicted first): (stdout, stderr, usage)."""
    from pi2cli.hw.cgroup import Budget
    from pi2cli.hw.rusage import Measured

    with Measured(cmd) as measured, Budget(cell.budget, evict=[gguf] if cell.budget else []) as budget:
        proc = budget.popen(measured.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        out, err = communicate_followed(proc, rec.follow(proc.pid, wrapper=True), "llama-bench", timeout_s)
        rec.budget_record = budget.record() if cell.budget else None
        return out, err, measured.usage()


def run_llama_bench_on_device(target, place: LlamaBenchPlace, cmd: list[str], timeout_s: float):
    """The same command on the device, on llama-bench's own clock there, under the pushed pi2-rusage
    (its report read back and removed): (stdout, stderr, usage). No memory curve: a sampler would follow
    pi2-rusage, not llama-bench; the peak is the kernel's ru_maxrss, as here."""
    from pi2cli.hw.rusage import parse_report

    runs = f"{target.workdir.rstrip('/')}/runs"
    report = f"{runs}/llama-bench-{os.getpid()}-{int(time.time() * 1000)}.rusage.json"
    target.mkdir(runs)
    argv = [f"{place.remote_bin}/pi2-rusage", "-o", report, "--", f"{place.remote_bin}/llama-bench", *cmd[1:]]
    argv[argv.index("-m") + 1] = place.remote_model
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    proc = target.run(argv, on_output=lambda name, data: chunks.setdefault(name, []).append(data))
    try:
        proc.wait(timeout_s)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            proc.kill()
        if isinstance(exc, TimeoutError):
            raise timed_out(f"llama-bench on {target.name}", timeout_s) from None
        raise
    try:
        usage = parse_report(target.read_text(report) or "")
    finally:
        with contextlib.suppress(TargetError):
            target.sh(f"rm -f {shlex.quote(report)}", timeout=10)
    text = {k: b"".join(v).decode(errors="replace") for k, v in chunks.items()}
    return text["stdout"], text["stderr"], usage


def llama_cell(run: dict, target, driver, gguf: Path, place: LlamaBenchPlace, cell: Cell, cfg: SweepConfig,
               reporter, label: str, rec: RunRecorder) -> list[dict]:  # fmt: skip
    """llama-bench's pp test and its tg test at depth P for one cell; returns its JSON records."""
    from pi2cli.engines.llamacpp.server import (
        check_llama_bench_exit,
        llama_bench_command,
        parse_llama_bench_json,
    )

    records: list[dict] = []
    peak = 0
    extra = [] if cfg.warmup else ["--no-warmup"]
    tests = (("pp", dict(n_prompt=cell.n_prompt, n_gen=0), []),
             ("tg", dict(n_prompt=0, n_gen=cell.n_gen), ["-d", str(cell.n_prompt)]))  # fmt: skip
    for i, (test, sizes, more) in enumerate(tests):
        reporter.turn_started(label, f"llama-bench {test}", i + 1, 2)
        cmd = llama_bench_command(gguf, bin_dir=place.bin_dir, threads=cell.threads, repetitions=cfg.repeat,
                                  extra_args=more + extra, **sizes)  # fmt: skip
        if target.on_this_machine:
            out, err, usage = run_llama_bench_here(cmd, cell, gguf, rec, cfg.timeout_s)
        else:
            out, err, usage = run_llama_bench_on_device(target, place, cmd, cfg.timeout_s)
        check_llama_bench_exit(usage.returncode, err)
        peak = max(peak, usage.maxrss_bytes or 0)
        got = parse_llama_bench_json(out)
        for record in got:
            try:
                times = [int(v) for v in record["samples_ns"]]
                rates = [float(v) for v in record["samples_ts"]]
            except (KeyError, TypeError, ValueError) as exc:
                raise Pi2Error(f"llama-bench record without samples_ns/samples_ts: {exc}") from None
            for rep, (t_ns, ts) in enumerate(zip(times, rates, strict=True)):
                S.add_turn(run, n_prompt=cell.n_prompt if test == "pp" else 0,
                           n_gen=cell.n_gen if test == "tg" else 0, ttft_ns=None,
                           prefill_ts=ts if test == "pp" else None, decode_ts=ts if test == "tg" else None,
                           prompt_id=f"{test}{cell.n_prompt if test == 'pp' else cell.n_gen}", rep=rep,
                           extra={"test": test, "t_ns": t_ns, "n_depth": cell.n_prompt if test == "tg" else 0,
                                  "rates_from": "engine"})  # fmt: skip
        records += got
        reporter.turn_done(label, None if test == "pp" else run["turns"][-1]["decode_ts"], None)
    if peak:
        S.set_counters(run, peak_rss_bytes=peak, peak_rss_source=S.PEAK_RSS_WRAPPER)
    return records
