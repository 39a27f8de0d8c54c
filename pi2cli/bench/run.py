"""`pi2 bench`: run engines x workloads on a target and record TTFT, TBT and memory, one result per run.

One run = one engine x one workload x one memory budget. For every conversation of the workload (and
every --repeat), each user turn's prompt is the whole conversation so far, rendered with the model's
own chat template, including the engine's OWN earlier answers; the engine process lives for the whole
run and keeps its KV cache across turns (pi2-engine chat; llama-server with cache_prompt). While it
runs, a sampler thread reads the engine process's memory (VmRSS, PSS where smaps_rollup exists) through
the target for the memory curve; the peak comes from the kernel, never from those polls
(counters.peak_rss_source says from where). Before each run the bench waits for the device to cool
below --cool-below where it reports a temperature. Every run is saved with
pi2cli.results.store.save_run, also when it fails (status aborted / device_vanished / failed / timeout,
with the turns finished so far); --run-timeout limits each run (pi2cli.bench.limit).

The functions here are plain; pi2cli/commands/bench.py is the click front. `Reporter` is how the
bench talks to a user (rich progress in the command, silence in tests).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pi2cli.bench.limit import RunLimit, RunTimedOut, check_run_timeout
from pi2cli.engines.base import TurnFailed
from pi2cli.errors import Pi2Error
from pi2cli.model_files import ModelFiles, context_for, resolve_model
from pi2cli.results import columns as C
from pi2cli.results import schema as S
from pi2cli.signals import signal_name
from pi2cli.targets.base import TargetError
from pi2cli.units import parse_size
from pi2cli.workloads import (
    Conversation,
    load_workload,
    workload_path,
)

DEFAULT_COOL_BELOW_PHONE = 45.0


# -------------------------------------------------------------------------------------------- reporting
class Reporter:
    """What the bench tells a user. The base class says nothing (tests, --json without a terminal)."""

    def message(self, text: str) -> None: ...

    def run_started(self, label: str, total_turns: int) -> None: ...

    def turn_started(self, label: str, conversation: str, turn: int, n_turns: int) -> None: ...

    def turn_done(self, label: str, decode_tps: float | None, ttft_ms: float | None) -> None: ...

    def run_done(self, label: str, status: str) -> None: ...


# ------------------------------------------------------------------------------------------- sampling
class MemorySampler:
    """Reads the engine process's memory through the target every `interval_s` in a thread: the memory
    curve (memory_samples). Never the peak: a poll misses whatever happened between two reads.

    wrapper=True: `pid` is pi2-rusage (pi2cli.hw.rusage), and the process sampled is the command it started."""

    def __init__(self, target, pid: int | None, interval_s: float = 0.5, wrapper: bool = False):
        self.target, self.interval_s = target, interval_s
        self.pid, self.wrapper_pid = (None, pid) if wrapper else (pid, None)
        self.samples: list[tuple[float, int, int | None]] = []  # (t_s, rss, pss)
        self.error: str | None = None
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> MemorySampler:
        if self.pid or self.wrapper_pid:
            self._thread.start()
        return self

    def sample_once(self) -> None:
        usage = self.target.read_memory(self.pid)
        if usage is not None:
            self.samples.append((round(time.monotonic() - self._t0, 3), usage.rss_bytes, usage.pss_bytes))

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


def wait_until_cool(target, below: float | None, timeout_s: float, reporter: Reporter) -> float | None:
    """Wait until the target reports a temperature below `below` (None / 0: no waiting). Returns the
    last temperature read (None when the target reports none)."""
    if not below:
        return None
    temp = target.temperature()
    if temp is None:
        return None
    deadline = time.monotonic() + timeout_s
    while temp >= below and time.monotonic() < deadline:
        reporter.message(f"{target.name} at {temp:.1f} °C: waiting to cool below {below:.0f} °C")
        time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
        temp = target.temperature() or temp
    if temp >= below:
        reporter.message(f"{target.name} still {temp:.1f} °C after {timeout_s:.0f} s: running anyway")
    return temp


# ---------------------------------------------------------------------------------------------- config
@dataclass
class BenchConfig:
    model: str
    engines: list[str] = field(default_factory=lambda: ["pi2"])
    workloads: list[str] = field(default_factory=lambda: ["multi-turn"])
    limit: int | None = None
    seed: int | None = None
    budgets: list[int | None] = field(default_factory=lambda: [None])
    device: str | None = None
    repeat: int | None = 1  # None: 1, or 3 in llama-bench mode
    threads: int | None = None
    n_gen: int | None = None  # tokens per turn; None: the workload's max_new_tokens of each turn
    ctx: int | None = None  # KV cache tokens of every engine; None: what the workload needs (context_for)
    ignore_eos: bool = True  # every engine generates exactly the same number of tokens
    results_dir: str | None = None
    cool_below: float | None = None  # None: 45 on phones, no waiting elsewhere; 0: never wait
    cool_timeout_s: float = 600.0
    tags: list[str] = field(default_factory=list)
    llamacpp_bin_dir: str | None = None
    mode: str = "chat"  # "chat": the workloads, multi-turn; "llama-bench": llama.cpp's own pp/tg benchmark
    n_prompt: int = 512  # llama-bench mode: prompt tokens of the pp test (-p)
    llmflash_window: int = 5  # llmflash: keep the neurons used by the last K tokens
    mlc_runner: str | None = None  # mlc-llm: the runner (URL or command); None: $PI2_MLC_RUNNER
    mlc_model: str | None = None  # mlc-llm: the model id the runner is given; None: $PI2_MLC_MODEL
    plan: str | None = None  # pi2: a plan file from `pi2 plan` (pi2-engine --plan)
    annotate: Callable[[dict], None] | None = None  # called on every run right before it is saved (pi2 farm)
    quality: bool = False  # sparse pi2 runs: also score them against the dense model (pi2cli.quality)
    run_timeout_s: float | None = (
        None  # each run's limit, engine start to stop (pi2cli.bench.limit); None: none
    )


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


def file_sha256(path: Path) -> str:
    """sha256, remembered across runs by (path, size, mtime) as pi2 push does (GB models hash once)."""
    from pi2cli.hw.push import sha256_file

    return sha256_file(Path(path))


# llama.cpp's LLAMA_FTYPE values (GGUF general.file_type) for the quantizations pi2 runs and a few more
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
              17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}  # fmt: skip


def model_facts(model: ModelFiles) -> dict:
    """quant, arch and whether the weights are synthetic, from the files' own metadata.

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


# ------------------------------------------------------------------------------------------------ runs
@dataclass
class Prepared:
    """An engine ready to run on the target: where its binary and model are there."""

    driver: object
    model_local: Path
    model_remote: str
    binary_dir: str | None
    floor: dict = field(default_factory=dict)  # the bandwidth floor of its TBT (pi2cli.bench.floor)


def prepare_engine(driver, target, model: ModelFiles, reporter: Reporter) -> Prepared:
    """Local targets run the build and model in place; devices get them through pi2cli.hw.push (skipping
    what is already there)."""
    reason = driver.supports(target)
    if reason:
        raise Pi2Error(reason)
    local_model = model.for_engine(driver.model_suffix, driver.name)
    driver.configure(target, local_model)
    if getattr(driver, "policy", None) == "dense" and local_model.suffix == ".pi2":
        from pi2cli.models.convert_any import runs_dense_note

        note = runs_dense_note(local_model)  # a sparse-kind model without predictors: said, not hidden
        if note:
            reporter.message(f"{driver.name}: {note}")
    if target.on_this_machine:
        return Prepared(driver, local_model, str(local_model), None)
    from pi2cli.hw.push import collect_items, push_files

    workdir = target.workdir
    binaries = driver.binaries(target)
    extra = driver.extra_files()
    items = collect_items(target, workdir, engine=binaries, models=[local_model], **extra)
    names = [p.name for p in [*binaries, local_model, *(f for files in extra.values() for f in files)]]
    reporter.message(f"pushing {', '.join(names)} to {target.name}")
    report = push_files(target, items, workdir)
    copied = sum(1 for f in report.files if f.action == "copied")
    driver.files_pushed(workdir.rstrip("/"))
    reporter.message(f"{target.name}: {copied} copied, {len(report.files) - copied} already there")
    model_remote = next(i.remote for i in items if i.kind == "model")  # named by model and content hash
    return Prepared(driver, local_model, model_remote, f"{workdir.rstrip('/')}/bin")


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


def save_failed_run(exc: BaseException, run: dict, sampler, target, budget_bytes: int | None,
                    budget_record: dict | None, cfg: BenchConfig, reporter, label: str, engine: str,
                    workload: str) -> RunOutcome:  # fmt: skip
    """A run that stopped on exc: marked failed (or aborted, device_vanished, timeout) and saved with what
    it measured. Ctrl-C and a vanished device end the whole bench (BenchInterrupted, DeviceVanished, both
    carrying the saved outcome); any other failure, a timeout too, returns it so the next run goes ahead."""
    from pi2cli.results import store

    status, error = classify_failure(exc)
    if status == "failed":
        error = killed_at_budget(budget_bytes, budget_record) + error
    S.mark_failed(run, status, error)
    _finish_samples(run, sampler)
    run["memory"] = memory_block(target, budget_bytes, budget_record)
    if cfg.annotate:
        cfg.annotate(run)
    path = store.save_run(run, cfg.results_dir)
    reporter.run_done(label, status)
    outcome = RunOutcome(engine, workload, budget_bytes, run, path)
    if isinstance(exc, KeyboardInterrupt) and status != "timeout":
        raise BenchInterrupted(outcome, signal_name(exc)) from None
    if status == "device_vanished":
        raise DeviceVanished(outcome, error) from None
    return outcome


def run_one(
    cfg: BenchConfig,
    target,
    facts: dict,
    prepared: Prepared,
    model: ModelFiles,
    workload: str,
    conversations: list[Conversation],
    budget_bytes: int | None,
    reporter: Reporter,
) -> RunOutcome:
    """One engine x workload x budget: every conversation (x repeat) through one engine process."""
    from pi2cli.plan.budget import Budget
    from pi2cli.results import store

    driver = prepared.driver
    label = f"{driver.name} · {workload}" + (f" · {S.budget_label(budget_bytes)}" if budget_bytes else "")
    wl_path = workload_path(workload)
    run = S.new_run(
        engine=S.engine_info(**driver.engine_info(target)),
        model=S.model_info(model.name, path=str(prepared.model_local), sha256=file_sha256(prepared.model_local),
                           size_bytes=prepared.model_local.stat().st_size, **model_facts(model)),
        workload=S.workload_info(workload, n_prompts=len(conversations), sha256=file_sha256(wl_path),
                                 source=str(wl_path.name)),
        target=S.target_info(target.name, target.kind,
                             **{k: v for k, v in facts.items() if k not in ("name", "kind")}),
        memory=memory_block(target, budget_bytes, None),
        settings=S.settings_info(n_gen=cfg.n_gen, threads=cfg.threads, repetitions=cfg.repeat, warmup=0,
                                 temperature=0.0, seed=cfg.seed or 0, ctx=cfg.ctx, ignore_eos=cfg.ignore_eos,
                                 limit=cfg.limit, **driver.extra_settings),
        measurement=driver.measurement(target),
        tags=cfg.tags,
    )  # fmt: skip
    total_turns = cfg.repeat * sum(len(c.turns) for c in conversations)
    reporter.run_started(label, total_turns)
    temp = wait_until_cool(target, cfg.cool_below, cfg.cool_timeout_s, reporter)
    if temp is not None:
        run["target"]["temperature_c"] = temp
    session = sampler = held = None
    budget_record = None
    # A budget binds only on this machine (cgroup); on a device it is recorded as not enforced.
    # An engine pi2 does not start (an MLC server) cannot be put in a cgroup: recorded as not enforced.
    outside = driver.budget_outside()
    local_budget = budget_bytes if target.on_this_machine and not outside else None
    if budget_bytes and outside:
        budget_record = {"enforced": False, "how": f"not enforced: {outside}"}
    try:
        with Budget(local_budget, evict=[prepared.model_local] if local_budget else []) as budget:
            held = budget
            # the limit runs from the engine's start to its stop (not the cooling wait, nor --quality)
            with RunLimit(cfg.run_timeout_s) as limit:
                session = driver.open_chat(target, prepared.model_remote, binary_dir=prepared.binary_dir,
                                           threads=cfg.threads, n_ctx=cfg.ctx,
                                           budget=budget if local_budget else None, seed=cfg.seed or 0,
                                           budget_bytes=budget_bytes)  # fmt: skip
                sampler = MemorySampler(target, session.pid).start()
                for rep in range(cfg.repeat):
                    for conv in conversations:
                        answers: list[str] = []
                        for k, budget_tokens in enumerate(conv.max_new_tokens):
                            limit.where = (f"in {conv.id} turn {k + 1}/{len(conv.turns)}, "
                                           f"{len(S.measured_turns(run))} turn(s) finished")  # fmt: skip
                            n_predict = cfg.n_gen or budget_tokens
                            messages = conv.messages_for_turn(k, answers)
                            prompt = model.template.render(messages)
                            reporter.turn_started(label, conv.id, k + 1, len(conv.turns))
                            try:
                                t = session.turn(
                                    prompt, n_predict, ignore_eos=cfg.ignore_eos, messages=messages
                                )
                            except TurnFailed as exc:
                                # The engine is up but refused this turn: record it, go to the next conversation.
                                S.add_turn(run, n_prompt=0, n_gen=0, ttft_ns=None, prompt_id=f"{conv.id}#{k}",
                                           rep=rep, status="failed", error=str(exc))  # fmt: skip
                                reporter.message(f"{label}: {conv.id} turn {k + 1} failed: {exc}")
                                break
                            answers.append(t.text)
                            turn = S.add_turn(run, **turn_fields(t), prompt_id=f"{conv.id}#{k}", rep=rep)
                            reporter.turn_done(label, turn["decode_ts"],
                                               None if t.ttft_s is None else t.ttft_s * 1e3)  # fmt: skip
                limit.where = f"stopping the engine, {len(S.measured_turns(run))} turn(s) finished"
                sampler.stop()
                counters = session.close()
                session = None
            budget_record = budget.record() if local_budget else budget_record
        S.set_counters(run, **{k: v for k, v in counters.items() if v is not None})
        if budget_record and budget_record.get("peak_bytes") is not None:
            S.set_counters(run, budget_peak_bytes=budget_record["peak_bytes"])
    except (KeyboardInterrupt, Pi2Error, TargetError, OSError) as exc:
        if session is not None:
            session.kill()
        if local_budget and held is not None:  # a run that failed under its cgroup was still held to it
            budget_record = held.record()
        return save_failed_run(exc, run, sampler, target, budget_bytes, budget_record, cfg, reporter, label,
                               driver.name, workload)  # fmt: skip
    _finish_samples(run, sampler)
    run["memory"] = memory_block(target, budget_bytes, budget_record)
    if not S.measured_turns(run):
        first = next((t["error"] for t in run["turns"] if t["error"]), "no turn ran")
        S.mark_failed(run, "failed", f"every turn failed: {first}")
    from pi2cli.bench.floor import apply_floor

    invalid = apply_floor(run, prepared.floor)  # token times faster than the weights can be read: invalid
    if invalid:
        reporter.message(f"{label}: invalid: {invalid}")
    from pi2cli.plan.budget import peak_over_budget

    over = peak_over_budget(run["counters"].get("peak_rss_bytes"), run["memory"],
                            run["counters"].get("budget_peak_bytes"))  # fmt: skip
    if over:  # stored beside the peak, so no table shows a peak above its budget without a word why
        S.set_counters(run, peak_over_budget=over)
        reporter.message(f"{label}: {over}")
    if cfg.annotate:
        cfg.annotate(run)
    if cfg.quality:  # measured here, with the host engine, on the same file, policy and budget
        from pi2cli.quality.bench_hook import attach_quality

        reporter.message(
            f"{label}: " + attach_quality(run, prepared.model_local, workload, budget_bytes, cfg.threads)
        )
    path = store.save_run(run, cfg.results_dir)
    reporter.run_done(label, run["status"])
    return RunOutcome(driver.name, workload, budget_bytes, run, path)


def turn_fields(t) -> dict:
    """add_turn's arguments for one TurnMetrics. TTFT and TBT come from the per-token times wherever
    the engine gives them (the same for every engine); an engine that reports only rates (an MLC
    command runner) gets its own prefill/decode rates recorded instead (extra.rates_from = "engine")."""
    times = t.token_times_s
    samples = [round((b - a) * 1e9) for a, b in zip(times, times[1:], strict=False)]
    n_gen = t.n_gen if t.n_gen is not None else (len(t.token_ids) or len(times))
    rate_only = not samples and n_gen > 1 and bool(t.decode_tps)
    extra = {"n_prompt_total": t.n_prompt, "n_prompt_cached": t.n_prompt_cached,
             "engine_prefill_tps": t.prefill_tps, "engine_decode_tps": t.decode_tps, "stop": t.stop_type,
             "text": t.text}  # fmt: skip
    if rate_only:
        extra["rates_from"] = "engine"
    if getattr(t, "clock", None):  # whose clock the token times are on (llama.cpp: the server's own)
        extra["clock"] = t.clock
    if getattr(t, "host_ttft_s", None) is not None:
        extra["host_ttft_ms"] = round(t.host_ttft_s * 1e3, 3)
    server = {
        k: t.timings[k] for k in ("prompt_ms", "predicted_ms", "predicted_per_token_ms") if k in t.timings
    }
    if server:
        extra["engine_timings"] = server
    io = t.timings.get("sparse") or {}
    if io:
        extra["storage_reads"] = io["reads"]
    return dict(
        n_prompt=t.n_prompt_processed, n_gen=n_gen, ttft_ns=None if t.ttft_s is None else round(t.ttft_s * 1e9),
        samples_ns=samples, extra=extra,
        prefill_ts=(t.prefill_tps or None) if rate_only and (t.ttft_s is None or not t.n_prompt_processed) else None,
        decode_ts=t.decode_tps if rate_only else None,
        bytes_read=io.get("bytes_read"), cache_hits=io.get("hits"), cache_misses=io.get("misses"),
        io_ns=io.get("io_ns"), compute_ns=io.get("compute_ns"),
    )  # fmt: skip


def _finish_samples(run: dict, sampler: MemorySampler | None) -> None:
    if sampler is None:
        return
    sampler.stop()
    for t_s, rss, pss in sampler.samples:
        S.add_memory_sample(run, t_s, rss, pss)
    pss = [p for _, _, p in sampler.samples if p is not None]  # no kernel peak of PSS exists: polled
    if pss:
        S.set_counters(run, peak_pss_bytes=max(pss))


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


MODES = ("chat", "llama-bench")


def apply_engine_options(drivers: list, cfg: BenchConfig) -> None:
    """The bench options that belong to one engine (each driver declares its own: llama.cpp's build,
    llmflash's window, MLC's runner, pi2's plan): every one that was given goes to its driver."""
    given = {name: value for name, value in vars(cfg).items() if value is not None}
    for d in drivers:
        for name in d.options:
            if name in given:
                d.set_option(name, given[name])


def plan_budget(cfg: BenchConfig) -> None:
    """With --plan and no --memory-budget, the bench runs under the plan's budget (enforced as any)."""
    if not cfg.plan or any(b is not None for b in cfg.budgets):
        return
    from pi2cli.plan.plan import load_plan

    value = load_plan(cfg.plan).get("memory_budget")
    if value is not None:
        cfg.budgets = [parse_size(value, what=f"plan {cfg.plan}: memory_budget")]


def run_bench(cfg: BenchConfig, reporter: Reporter | None = None) -> list[RunOutcome]:
    """Resolve everything first (so a typo fails before anything runs), then every run in turn."""
    from pi2cli.engines import get_driver
    from pi2cli.targets import get_target

    reporter = reporter or Reporter()
    if cfg.repeat is None:
        cfg.repeat = DEFAULT_LLAMA_BENCH_REPEAT if cfg.mode == "llama-bench" else 1
    if cfg.repeat < 1:
        raise Pi2Error(f"--repeat must be at least 1, got {cfg.repeat}")
    if cfg.mode != "llama-bench" and cfg.n_gen is not None and cfg.n_gen < 1:
        raise Pi2Error(f"--n-gen must be at least 1, got {cfg.n_gen}")
    if cfg.mode not in MODES:
        raise Pi2Error(f"--mode {cfg.mode!r}: use one of {', '.join(MODES)}")
    check_run_timeout(cfg.run_timeout_s)
    from pi2cli.results import store

    store.check_writable(
        cfg.results_dir
    )  # a read-only or impossible --results-dir fails now, not after the runs
    drivers = [get_driver(name) for name in dict.fromkeys(cfg.engines)]
    if cfg.plan and "pi2" not in [d.name for d in drivers]:
        raise Pi2Error("--plan is for the pi2 engine (-e pi2); no pi2 run was asked for")
    apply_engine_options(drivers, cfg)
    plan_budget(cfg)
    if cfg.mode == "llama-bench":
        return run_llama_bench_mode(cfg, drivers, reporter)
    workloads = {name: load_workload(name, cfg.limit, cfg.seed) for name in dict.fromkeys(cfg.workloads)}
    try:
        target = get_target(cfg.device)
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    for d in drivers:
        reason = d.supports(target)
        if reason:
            raise Pi2Error(reason)
    if cfg.cool_below is None:
        cfg.cool_below = 0 if target.on_this_machine else DEFAULT_COOL_BELOW_PHONE
    model = resolve_model(cfg.model, convert_missing_pi2=any(d.model_suffix == ".pi2" for d in drivers),
                          reporter=reporter)  # fmt: skip
    if cfg.ctx is None:
        cfg.ctx = max(context_for(c, model.template, cfg.n_gen) for c in workloads.values())
    from pi2cli.plan.min_budget import check_bench

    # the engine's own smallest budget for these settings, the same rule on every path (nothing run yet)
    check_bench([d.name for d in drivers], model.pi2, cfg.budgets, cfg.ctx, cfg.threads, model.name)
    try:
        facts = target.facts()
        prepared = [prepare_engine(d, target, model, reporter) for d in drivers]
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    from pi2cli.plan.min_budget import check_on_target

    check_on_target(target, prepared, cfg.budgets, cfg.ctx, cfg.threads, model.name)  # another build: ask it
    from pi2cli.bench.floor import tbt_floor

    for prep in prepared:  # measured before any engine runs, on a quiet device
        prep.floor = tbt_floor(target, prep.model_local, prep.driver.policy, cfg.threads, prep.driver.name)
    outcomes: list[RunOutcome] = []
    for budget in cfg.budgets:
        for name, conversations in workloads.items():
            for prep in prepared:
                outcome = run_one(cfg, target, facts, prep, model, name, conversations, budget, reporter)
                outcomes.append(outcome)
    return outcomes


# ------------------------------------------------------------------------------------- llama-bench mode
DEFAULT_LLAMA_BENCH_N_GEN = 128
DEFAULT_LLAMA_BENCH_REPEAT = 3


def run_llama_bench_mode(cfg: BenchConfig, drivers: list, reporter: Reporter) -> list[RunOutcome]:
    """`--mode llama-bench`: llama.cpp's own pp/tg benchmark on the GGUF, one run per memory budget."""
    from pi2cli.hw.rusage import wrapper_binary
    from pi2cli.targets import get_target

    others = [d.name for d in drivers if d.name != "llama.cpp"]
    if others:
        raise Pi2Error(f"--mode llama-bench runs llama.cpp's llama-bench; engine '{others[0]}' has no such "
                       f"mode (use --mode chat, or -e llama.cpp alone)")  # fmt: skip
    if cfg.n_prompt < 0 or (cfg.n_gen or 0) < 0 or (cfg.n_prompt == 0 and cfg.n_gen == 0):
        raise Pi2Error("--mode llama-bench needs --n-prompt or --n-gen above 0 (pp and tg tests)")
    try:
        target = get_target(cfg.device)
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    if not target.native_here:
        raise Pi2Error(
            f"--mode llama-bench runs on this machine only (target {target.name} is {target.kind})"
        )
    model = resolve_model(cfg.model, convert_missing_pi2=False, reporter=reporter, template=False)
    wrapper_binary()  # measures llama-bench's peak memory: missing, nothing runs
    (driver,) = drivers
    return [
        llama_bench_run(cfg, target, target.facts(), driver, model, budget, reporter)
        for budget in cfg.budgets
    ]


def llama_bench_run(cfg: BenchConfig, target, facts: dict, driver, model: ModelFiles, budget_bytes: int | None,
                    reporter: Reporter) -> RunOutcome:  # fmt: skip
    """One llama-bench process (inside the budget's cgroup, model evicted first; its memory curve sampled
    like any engine's, its peak RSS the kernel's ru_maxrss through pi2-rusage) -> one result: a turn per
    test and repetition (pp: n_prompt and prefill_ts; tg: n_gen and decode_ts; llama-bench times no first
    token, so TTFT and TBT stay unknown) and llama-bench's own JSON records, unchanged, in
    run["llama_bench"]."""
    import os
    import subprocess

    from pi2cli.engines.llamacpp import (
        LLAMA_BENCH_HOW,
        check_llama_bench_exit,
        llama_bench_command,
        parse_llama_bench_json,
    )
    from pi2cli.hw.rusage import Measured
    from pi2cli.plan.budget import Budget
    from pi2cli.results import store

    n_gen = DEFAULT_LLAMA_BENCH_N_GEN if cfg.n_gen is None else cfg.n_gen
    reps = cfg.repeat
    gguf = model.for_engine(".gguf", "llama.cpp")
    cmd = llama_bench_command(gguf, bin_dir=driver.bin_dir, n_prompt=cfg.n_prompt, n_gen=n_gen,
                              threads=cfg.threads, repetitions=reps)  # fmt: skip
    workload = f"llama-bench-pp{cfg.n_prompt}-tg{n_gen}"
    label = f"llama.cpp · {workload}" + (f" · {S.budget_label(budget_bytes)}" if budget_bytes else "")
    run = S.new_run(
        engine=S.engine_info(**driver.engine_info(target)),
        model=S.model_info(model.name, path=str(gguf), sha256=file_sha256(gguf), size_bytes=gguf.stat().st_size,
                           **model_facts(model)),
        workload=S.workload_info(workload, n_prompts=int(cfg.n_prompt > 0) + int(n_gen > 0),
                                 source="llama-bench synthetic tokens (-p / -n)"),
        target=S.target_info(target.name, target.kind,
                             **{k: v for k, v in facts.items() if k not in ("name", "kind")}),
        memory=memory_block(target, budget_bytes, None),
        settings=S.settings_info(n_gen=n_gen, threads=cfg.threads, repetitions=reps, warmup=0, mode="llama-bench",
                                 n_prompt=cfg.n_prompt, load_mode="mmap", repack=False, command=cmd[1:]),
        measurement=LLAMA_BENCH_HOW,
        tags=cfg.tags,
    )  # fmt: skip
    reporter.run_started(label, 1)
    reporter.turn_started(label, f"pp{cfg.n_prompt}/tg{n_gen}", 1, 1)
    proc = sampler = None
    budget_record = None
    measured = None
    try:
        with Budget(budget_bytes, evict=[gguf] if budget_bytes else []) as budget:
            measured = Measured(cmd)  # pi2-rusage joins the cgroup, and llama-bench with it
            with RunLimit(cfg.run_timeout_s) as limit:
                proc = budget.popen(measured.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
                limit.where = f"in llama-bench pp{cfg.n_prompt}/tg{n_gen} x{reps}"
                sampler = MemorySampler(target, proc.pid, wrapper=True).start()
                out, err = proc.communicate()
            sampler.stop()
            budget_record = budget.record() if budget_bytes else None
        usage = measured.usage()
        S.set_counters(run, peak_rss_bytes=usage.maxrss_bytes, peak_rss_source=S.PEAK_RSS_WRAPPER)
        check_llama_bench_exit(usage.returncode, err)
        records = parse_llama_bench_json(out)
        add_llama_bench_turns(run, records)
        run["llama_bench"] = records
        if budget_record and budget_record.get("peak_bytes") is not None:
            S.set_counters(run, budget_peak_bytes=budget_record["peak_bytes"])
    except (KeyboardInterrupt, Pi2Error, OSError) as exc:
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, 9)  # pi2-rusage and llama-bench (its own session)
                proc.wait(10)
        return save_failed_run(exc, run, sampler, target, budget_bytes, budget_record, cfg, reporter, label,
                               driver.name, workload)  # fmt: skip
    finally:
        if measured is not None:
            measured.cleanup()
    _finish_samples(run, sampler)
    run["memory"] = memory_block(target, budget_bytes, budget_record)
    path = store.save_run(run, cfg.results_dir)
    tg = run["summary"]["avg_ts"]
    reporter.turn_done(label, tg, None)
    reporter.run_done(label, run["status"])
    return RunOutcome(driver.name, workload, budget_bytes, run, path)


def add_llama_bench_turns(run: dict, records: list[dict]) -> None:
    """One turn per llama-bench test and repetition, from its samples_ns / samples_ts."""
    for record in records:
        try:
            n_p, n_g = int(record["n_prompt"]), int(record["n_gen"])
            times = [int(v) for v in record["samples_ns"]]
            rates = [float(v) for v in record["samples_ts"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise Pi2Error(
                f"llama-bench record without n_prompt/n_gen/samples_ns/samples_ts: {exc}"
            ) from None
        if (n_p > 0) == (n_g > 0) or len(times) != len(rates):
            raise Pi2Error(
                f"llama-bench record pp{n_p}/tg{n_g}: expected a pp or a tg test with one rate per time"
            )
        test = f"pp{n_p}" if n_p else f"tg{n_g}"
        for rep, (t_ns, ts) in enumerate(zip(times, rates, strict=True)):
            S.add_turn(run, n_prompt=n_p, n_gen=n_g, ttft_ns=None, prefill_ts=ts if n_p else None,
                       decode_ts=ts if n_g else None, prompt_id=test, rep=rep,
                       extra={"test": test, "t_ns": t_ns, "rates_from": "engine"})  # fmt: skip


# ----------------------------------------------------------------------------------------------- table
# The columns (header and formatting) are declared once in pi2cli.results.columns; this picks the bench's.
# The table fits 120 columns: the status alone in its cell, each failure's reason on a line after it.
TABLE_COLUMNS = C.select("engine", "workload", "budget_held", "threads", "status_label", "n_turns", "ttft_ms",
                         "tbt_p50_ms", "tbt_p90_ms", "tbt_p99_ms", "decode_ts", "peak_rss_mib")  # fmt: skip
TABLE_TEXT_COLUMNS = 5  # engine .. status: left-aligned and never folded (the figures' headers wrap instead)


def table_rows(outcomes: list[RunOutcome]) -> list[list[str]]:
    return [[col.cell(o.run) for col in TABLE_COLUMNS] for o in outcomes]


def table_reasons(outcomes: list[RunOutcome]) -> list[str]:
    """One line per run that is not ok: which run, its status and why (the table shows the status only)."""
    from pi2cli.results.columns import status_cell

    return [f"{o.engine} / {o.workload}: {status_cell(o.run['status'], o.run['error'], width=200)}"
            for o in outcomes if o.run["status"] != S.STATUS_OK]  # fmt: skip
